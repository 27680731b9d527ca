"""Build the fixture models under tests/fixtures/: tiny random-weight decoders exported as users export them.

Run with a Python environment that has torch, transformers, optimum-onnx, onnxruntime-genai,
onnxscript, tokenizers, onnx and onnxruntime (not needed by CI, which only reads the committed
files)::

    # the versions the committed fixtures were made with (the manifest records them per export)
    python -m venv fx && fx/bin/pip install torch==2.15.0 transformers==4.57.6 optimum-onnx==0.1.0 \
        optimum==2.1.0 onnxscript==0.7.2 tokenizers==0.22.2 onnx==1.23.2 onnxruntime==1.32.0
    # optimum-onnx pins transformers < 4.58, the genai builder needs a newer one: a second venv that
    # sees the first one's packages (a .pth file naming its site-packages), named by GENAI_PYTHON
    python -m venv fx-genai && echo "$PWD/fx/lib/python3.11/site-packages" \
        > fx-genai/lib/python3.11/site-packages/fx.pth && \
        fx-genai/bin/pip install transformers==5.24.0 onnxruntime-genai==0.18.0
    GENAI_PYTHON=fx-genai/bin/python fx/bin/python scripts/make_fixtures.py   # every architecture and exporter
    python scripts/make_fixtures.py --arch llama gpt2  # a subset (the manifest keeps the others)
    python scripts/make_fixtures.py --exporter optimum

Each architecture is built from a config in code (fixed seed, no hub download; hidden 64,
2 layers, 4 query / 2 KV heads where the architecture has GQA, vocab 256), its weights rounded
to multiples of 1/32 (exact in fp32 and fp16, and compressible), saved with a small local
word-level tokenizer, then exported with:

* ``dynamo``: ``torch.onnx.export(..., dynamo=True)`` at the default opset;
* ``dynamo23``: the same at opset 23 (standard Attention / RotaryEmbedding / RMSNormalization);
* ``torchscript``: ``torch.onnx.export(..., dynamo=False)``;
* ``optimum``: ``optimum.exporters.onnx.main_export(task="text-generation-with-past")``;
* ``genai``: ``python -m onnxruntime_genai.models.builder -i <dir> -o <out> -p fp32 -e cpu``;
* ``genai-int4``: the same with ``-p int4`` (every linear layer a com.microsoft ``MatMulNBits`` of
  block-quantized weights), for a few architectures (``INT4_ARCHS``), to keep the fixtures small;
* ``dynamo23-fp16``, ``torchscript-fp16``: the model cast to float16, for a few architectures
  (``FP16_ARCHS``; neither optimum nor the builder makes float16 CPU models).

The torch exporters trace a wrapper with the inputs ``input_ids, attention_mask, position_ids,
past_key_values.{i}.key/value`` and the outputs ``logits, present.{i}.key/value`` (optimum's names).
Every model is stored as one self-contained ``<arch>-<exporter>.onnx.xz`` (external data inlined);
``manifest.json`` describes each one (architecture, exporter and version, opsets, ops, inputs and
outputs, past/present pairs, how to drive it, the config) and records every export that failed
(exporter, version, error line) instead of a model.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import hashlib
import io
import json
import lzma
import os
import subprocess
import sys
import tempfile
import traceback
from typing import Any, Dict, List, Optional, Tuple

import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures")
SEED = 1234
GRID = 32.0  # weights are rounded to multiples of 1/GRID
VOCAB = 256
MAX_POS = 128
GENAI_MAX_LENGTH = 64  # the shared past/present buffer length the genai exports are driven with

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=MAX_POS,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)

# architecture -> (transformers config class, model class, config kwargs)
ARCHS: Dict[str, Tuple[str, str, Dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(COMMON, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(COMMON, tie_word_embeddings=True, use_sliding_window=False)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(COMMON, tie_word_embeddings=False, use_sliding_window=False)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(COMMON, sliding_window=8, tie_word_embeddings=False)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict({k: v for k, v in COMMON.items() if k != "head_dim"}, original_max_position_embeddings=MAX_POS,
                  tie_word_embeddings=False, sliding_window=None)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(COMMON, sliding_window=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                    query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"],
                    hidden_activation="gelu_pytorch_tanh")),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(COMMON, sliding_window=8, query_pre_attn_scalar=16, rope_local_base_freq=10000.0,
                    layer_types=["sliding_attention", "full_attention"], hidden_activation="gelu_pytorch_tanh")),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=MAX_POS, n_inner=128,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)),
    # architectures whose layers differ from the Llama pattern in ways an exporter shows in the graph:
    # partial rotary (a rotated slice of each head), parallel attention + MLP, LayerNorm with bias,
    # learned positions with an offset, q/k norms, scaling multipliers, interleaved rotary (GPT-J)
    "gptneox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, rotary_pct=0.25, max_position_embeddings=MAX_POS,
                     use_parallel_residual=True, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    "phi": ("PhiConfig", "PhiForCausalLM",
            dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, partial_rotary_factor=0.5,
                 max_position_embeddings=MAX_POS, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                 max_position_embeddings=MAX_POS, word_embed_proj_dim=64, do_layer_norm_before=True,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM",
                 dict(COMMON, partial_rotary_factor=0.25, use_qkv_bias=True,
                      tie_word_embeddings=False)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(COMMON, tie_word_embeddings=False)),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(COMMON, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.125,
                     logits_scaling=2.0, tie_word_embeddings=False)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_inner=128,
                  n_positions=MAX_POS, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)),
    # rotary scaling as released checkpoints configure it (Llama 3.x, Phi-3 128k / Phi-3.5), and a
    # mixture of experts (Mixtral: router TopK and expert gathers in the graph)
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(COMMON, tie_word_embeddings=False,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=32))),
    "phi3longrope": ("Phi3Config", "Phi3ForCausalLM",
                     dict({k: v for k, v in COMMON.items() if k != "head_dim"}, original_max_position_embeddings=32,
                          tie_word_embeddings=False, sliding_window=None,
                          rope_scaling=dict(type="longrope", short_factor=[1.0, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0, 2.5],
                                            long_factor=[1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]))),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(COMMON, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
                     sliding_window=None)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM",
                   dict(COMMON, use_bias=True, sliding_window=None, tie_word_embeddings=False)),
    # mixture of experts whose routing the TorchScript export keeps dynamic (TopK, OneHot, NonZero,
    # ScatterElements); Qwen2/3-MoE, GPT-OSS, Granite-MoE and Mixtral bake the traced prompt's
    # per-expert token counts into Split sizes instead
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(COMMON, num_experts=4, num_experts_per_tok=2, intermediate_size=64, tie_word_embeddings=False)),
}
# architectures transformers runs only with its eager attention (no sdpa implementation)
EAGER = {"gptj": "eager"}
# what is known about exports that do not match transformers (manifest "note"; found by reading the graphs)
NOTES = {
    "mistral-genai": "the builder applies sliding_window only to layers whose layer_types say sliding_attention; "
                     "Mistral's config has no layer_types, so every GroupQueryAttention has local_window_size=-1 "
                     "(no window): equal to transformers until the context exceeds the window",
    "phi3-genai": "the builder wires lm_head to layer 0's post_attention_layernorm output; layer 1 and the final "
                  "norm are computed but unused, so the logits differ from transformers from the first token",
}
NOTES["phi3longrope-genai"] = NOTES["phi3-genai"]
EXPORTERS = ["dynamo", "dynamo23", "torchscript", "optimum", "genai", "genai-int4", "dynamo23-fp16",
             "torchscript-fp16"]
# the float16 exports (the model cast with .half() before a torch exporter runs) are made for these only
FP16_ARCHS = ("llama", "qwen3", "gemma2", "gpt2")
# the builder's int4 exports (genai-int4) are made for these only
INT4_ARCHS = ("llama", "qwen3")
for _arch in INT4_ARCHS:
    NOTES[f"{_arch}-genai-int4"] = (
        "int4 weights (com.microsoft MatMulNBits, block 32, accuracy_level 4): the logits differ from transformers' "
        "float model by the weight quantization, and the greedy tokens with them; the tests compare with onnxruntime "
        "at accuracy_level 0 (float activations; at 4 onnxruntime quantizes them to int8)")


# -- models ------------------------------------------------------------------------------------
def build_model(arch: str) -> Any:
    """The architecture's model with seeded weights rounded to multiples of 1/GRID."""
    import torch
    import transformers

    cfg_cls, model_cls, kwargs = ARCHS[arch]
    torch.manual_seed(SEED)
    config = getattr(transformers, cfg_cls)(**kwargs)
    config._attn_implementation = EAGER.get(arch, "sdpa")
    model = getattr(transformers, model_cls)(config).eval()
    gen = torch.Generator().manual_seed(SEED)
    tied = bool(config.tie_word_embeddings)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                # token embeddings: large enough for clear argmax margins, small enough when tied that
                # the input token's own logit does not dominate every step (greedy would then repeat it)
                embed = "embed" in name or "wte" in name or "wpe" in name
                std = (0.2 if tied else 0.5) if embed else p.shape[-1] ** -0.5
                w = torch.randn(p.shape, generator=gen) * std
            elif name.endswith("bias"):
                w = torch.randn(p.shape, generator=gen) * 0.1
            else:  # norm scales: around their neutral value (Gemma's RMSNorm scales by 1 + w); Gemma's
                # post-attention/-feedforward norms scale the layers' outputs up to the scaled embedding's size
                base = (4.0 if "post_" in name else 0.0) if arch.startswith("gemma") else 1.0
                w = base + torch.randn(p.shape, generator=gen) * 0.1
            p.copy_(torch.round(w * GRID) / GRID)
    return model


def save_hf_folder(model: Any, folder: str) -> None:
    """save_pretrained plus a word-level tokenizer over the vocabulary (some tools insist on one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(folder, safe_serialization=True)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"t{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    fast.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)


def layer_count(model: Any) -> int:
    c = model.config
    return int(getattr(c, "num_hidden_layers", None) or c.n_layer)


def kv_geometry(model: Any) -> Tuple[int, int]:
    c = model.config
    heads = int(getattr(c, "num_attention_heads", None) or c.n_head)
    kv = int(getattr(c, "num_key_value_heads", None) or getattr(c, "num_kv_heads", None) or heads)
    hidden = int(getattr(c, "hidden_size", None) or c.n_embd)
    hd = int(getattr(c, "head_dim", None) or hidden // heads)
    return kv, hd


# -- torch exporters ---------------------------------------------------------------------------
def torch_export(model: Any, path: str, dynamo: bool, opset: Optional[int]) -> None:
    """torch.onnx.export of a flat-input wrapper around the HF model (DynamicCache built inside)."""
    import torch
    from transformers.cache_utils import DynamicCache

    n = layer_count(model)

    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):  # type: ignore[no-untyped-def]
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(n)])
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True, return_dict=True)
            flat = []
            for layer in out.past_key_values.layers:
                flat += [layer.keys, layer.values]
            return (out.logits, *flat)

    kv, hd = kv_geometry(model)
    batch, seq, past_len = 2, 3, 5
    ids = torch.randint(4, VOCAB, (batch, seq))
    mask = torch.ones(batch, past_len + seq, dtype=torch.int64)
    pos = torch.arange(past_len, past_len + seq).unsqueeze(0).expand(batch, seq).contiguous()
    dtype = next(model.parameters()).dtype
    past = [torch.randn(batch, kv, past_len, hd, dtype=dtype) for _ in range(2 * n)]
    past_names = [f"past_key_values.{i}.{w}" for i in range(n) for w in ("key", "value")]
    present_names = [f"present.{i}.{w}" for i in range(n) for w in ("key", "value")]
    axes: Dict[str, Dict[int, str]] = {"input_ids": {0: "batch_size", 1: "sequence_length"},
                                       "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
                                       "position_ids": {0: "batch_size", 1: "sequence_length"},
                                       "logits": {0: "batch_size", 1: "sequence_length"}}
    axes.update({p: {0: "batch_size", 2: "past_sequence_length"} for p in past_names})
    axes.update({p: {0: "batch_size", 2: "total_sequence_length"} for p in present_names})
    kwargs: Dict[str, Any] = dict(input_names=["input_ids", "attention_mask", "position_ids", *past_names],
                                  output_names=["logits", *present_names], dynamic_axes=axes, dynamo=dynamo)
    if opset is not None:
        kwargs["opset_version"] = opset
    patches: Any = contextlib.nullcontext()
    if dynamo:
        dim = torch.export.Dim
        b, s, p = dim("batch_size"), dim("sequence_length"), dim("past_sequence_length")
        kwargs.pop("dynamic_axes")
        kwargs.update(external_data=False, dynamic_shapes=({0: b, 1: s}, {0: b, 1: dim.DYNAMIC}, {0: b, 1: s},
                                                           tuple({0: b, 2: p} for _ in past)))
    else:
        patches = torchscript_patches()
    with torch.no_grad(), patches:
        torch.onnx.export(Flat().eval(), (ids, mask, pos, *past), path, **kwargs)


@contextlib.contextmanager
def torchscript_patches() -> Any:
    """The mask/cache patches optimum applies so that TorchScript can trace transformers >= 4.53
    (the masks are built with vmap, DynamicLayer.update concatenates onto an empty tensor)."""
    import transformers.masking_utils as mu
    from optimum.exporters.onnx import model_patcher as mp
    from transformers.cache_utils import DynamicLayer

    saved = (mu.find_packed_sequence_indices, DynamicLayer.update)
    mu.ALL_MASK_ATTENTION_FUNCTIONS.register("sdpa", mp.sdpa_mask_without_vmap)
    mu.ALL_MASK_ATTENTION_FUNCTIONS.register("eager", mp.eager_mask_without_vmap)
    mu.find_packed_sequence_indices = mp.find_packed_sequence_indices_patched
    DynamicLayer.update = mp.patched_dynamic_layer_update
    try:
        yield
    finally:
        mu.ALL_MASK_ATTENTION_FUNCTIONS.register("sdpa", mu.sdpa_mask)
        mu.ALL_MASK_ATTENTION_FUNCTIONS.register("eager", mu.eager_mask)
        mu.find_packed_sequence_indices, DynamicLayer.update = saved


def export_optimum(folder: str, out: str) -> str:
    from optimum.exporters.onnx import main_export

    main_export(folder, out, task="text-generation-with-past", do_validation=False, local_files_only=True)
    return os.path.join(out, "model.onnx")


def export_genai(folder: str, out: str, cache: str, precision: str = "fp32") -> str:
    """The onnxruntime-genai builder, run by GENAI_PYTHON when set (it may need a newer transformers
    than optimum-onnx allows); precision is its ``-p`` (``fp32``, or ``int4`` for the genai-int4 exports)."""
    cmd = [os.environ.get("GENAI_PYTHON", sys.executable), "-m", "onnxruntime_genai.models.builder", "-i", folder, "-o", out,
           "-p", precision, "-e", "cpu", "-c", cache]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr or r.stdout).strip().splitlines() if ln.strip()]
        raise RuntimeError((lines[-1] if lines else f"builder exited {r.returncode}").replace(folder, "<model dir>"))
    return os.path.join(out, "model.onnx")


@functools.lru_cache(maxsize=None)
def exporter_version(exporter: str) -> str:
    """The versions of the packages that made an export (the builder's from its own interpreter)."""
    from importlib.metadata import version

    tf = f"transformers {version('transformers')}"
    exporter = exporter.removesuffix("-fp16")
    if exporter in ("dynamo", "dynamo23", "torchscript"):
        extra = f", onnxscript {version('onnxscript')}" if "dynamo" in exporter else ""
        return f"torch {version('torch')}{extra}, {tf}"
    if exporter == "optimum":
        return f"optimum-onnx {version('optimum-onnx')}, optimum {version('optimum')}, torch {version('torch')}, {tf}"
    code = ("from importlib.metadata import version as v; "
            "print(f\"onnxruntime-genai {v('onnxruntime-genai')}, transformers {v('transformers')}\")")
    r = subprocess.run([os.environ.get("GENAI_PYTHON", sys.executable), "-c", code], capture_output=True, text=True)
    return r.stdout.strip() or "onnxruntime-genai (version unknown)"


# -- faithfulness ------------------------------------------------------------------------------
CHECK_PROMPT = [5, 17, 42, 99, 7, 130]
CHECK_STEPS = 16


def hf_greedy(model: Any) -> Tuple[List[int], Any]:
    """Greedy tokens after the prefill and each step, and the last-position logits of every run,
    computed by transformers itself (the reference each export is checked against)."""
    import numpy as np
    import torch
    from transformers.cache_utils import DynamicCache

    cache, x, tokens, logits = DynamicCache(), torch.tensor([CHECK_PROMPT]), [], []
    with torch.no_grad():
        for _ in range(CHECK_STEPS + 1):
            lg = model(input_ids=x, past_key_values=cache, use_cache=True).logits[0, -1]
            logits.append(lg.float().numpy())
            tokens.append(int(lg.argmax()))
            x = torch.tensor([[tokens[-1]]])
    return tokens, np.stack(logits)


def check_export(entry: Dict[str, Any], data: bytes, want: Tuple[List[int], Any]) -> Dict[str, Any]:
    """The export in onnxruntime, driven as the tests drive it, against transformers' own greedy run."""
    import numpy as np
    import onnxruntime

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import _fixtures

    sess = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    steps = _fixtures.Decoder(entry, sess).generate(np.array([CHECK_PROMPT], dtype=np.int64), CHECK_STEPS)
    tokens = [int(t) for t in _fixtures.greedy_tokens(steps)[0]]
    logits = np.stack([st.outputs["logits"][0, -1] for st in steps]).astype(np.float32)
    diff = [i for i, (a, b) in enumerate(zip(tokens, want[0])) if a != b]
    return {"prompt": CHECK_PROMPT, "steps": CHECK_STEPS, "tokens_equal": not diff,
            "first_token_difference": diff[0] if diff else None,
            "max_abs_logit_diff": float(np.abs(logits - want[1]).max()), "tokens": tokens}


# -- manifest ----------------------------------------------------------------------------------
def _dims(t: onnx.TypeProto) -> List[Any]:
    return [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
            for d in t.tensor_type.shape.dim]


def _value_info(v: onnx.ValueInfoProto) -> Dict[str, Any]:
    return {"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
            "shape": _dims(v.type)}


def _ops(m: onnx.ModelProto) -> List[str]:
    seen = set()

    def walk(g: onnx.GraphProto) -> None:
        for node in g.node:
            seen.add(f"{node.domain if node.domain not in ('', 'ai.onnx') else ''}/{node.op_type}")
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)

    walk(m.graph)
    return sorted(seen)


def _pairs(inputs: List[str], outputs: List[str]) -> List[Dict[str, str]]:
    """(past input, present output) by layer index and key/value, whatever the naming scheme."""
    import re

    def key(name: str) -> Optional[Tuple[int, str]]:
        m = re.search(r"(\d+)\D*?(key|value)", name)
        return (int(m.group(1)), m.group(2)) if m else None

    pasts = {key(n): n for n in inputs if n.startswith("past") and key(n)}
    presents = {key(n): n for n in outputs if n.startswith("present") and key(n)}
    return [{"past": pasts[k], "present": presents[k], "layer": k[0]} for k in sorted(pasts) if k in presents]


def describe(m: onnx.ModelProto, arch: str, exporter: str, cfg: Dict[str, Any], genai_cfg: Optional[Dict[str, Any]],
             kv: int, hd: int) -> Dict[str, Any]:
    """The manifest entry of one exported model."""
    inits = {i.name for i in m.graph.initializer}
    inputs = [_value_info(v) for v in m.graph.input if v.name not in inits]
    outputs = [_value_info(v) for v in m.graph.output]
    in_names = [i["name"] for i in inputs]
    pairs = _pairs(in_names, [o["name"] for o in outputs])
    past_set = {p["past"] for p in pairs}
    drive: Dict[str, Any] = {
        "token_input": "input_ids",
        "other_inputs": [n for n in in_names if n != "input_ids" and n not in past_set],
        "kv_heads": kv, "head_dim": hd,
        "past_layout": "batch, kv_heads, past_sequence_length, head_dim",
        "empty_past_prefill": True,
        "shared_buffer": False,
    }
    if genai_cfg is not None:
        dec = genai_cfg.get("model", {}).get("decoder", {})
        share = bool(genai_cfg.get("search", {}).get("past_present_share_buffer", False))
        # layers listed in the decoder's sliding_window get window-sized buffers (GroupQueryAttention
        # sliding_window_cache=1); capacity = window (+ cache_slack), the size the op's CUDA kernel requires
        sw = dec.get("sliding_window") or {}
        windowed = set(sw.get("layers", []))
        drive.update({"shared_buffer": share, "max_length": GENAI_MAX_LENGTH if share else None,
                      "past_layout": "batch, kv_heads, max_length, head_dim" if share else drive["past_layout"],
                      "genai_config": {"decoder": {k: dec.get(k) for k in ("inputs", "outputs", "num_key_value_heads",
                                                                          "head_size", "num_hidden_layers",
                                                                          "sliding_window")},
                                       "search": genai_cfg.get("search", {})}})
        if share:
            drive["past_capacity"] = {
                p["past"]: (int(sw["window_size"]) + int(sw.get("cache_slack") or 0) if p["layer"] in windowed
                            else GENAI_MAX_LENGTH) for p in pairs}
    return {
        "architecture": arch, "exporter": exporter, "exporter_version": exporter_version(exporter),
        "opset": next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None),
        "opset_imports": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "ir_version": m.ir_version, "nodes": len(m.graph.node), "ops": _ops(m),
        "inputs": inputs, "outputs": outputs, "past_present": pairs, "drive": drive, "config": cfg,
    }


# -- storage (shared with scripts/train_fixture.py) --------------------------------------------
MANIFEST_PATH = os.path.join(OUT_DIR, "manifest.json")
ABOUT = ("Tiny decoders exported by scripts/make_fixtures.py (random weights) and scripts/train_fixture.py "
         "(entries with trained: true); each fixture is "
         "<name>.onnx.xz (one self-contained ONNX file). 'drive' says how to feed it: "
         "past inputs start empty (or, with shared_buffer, as zeros of past_capacity positions: max_length, "
         "or the window for sliding_window_cache layers), "
         "attention_mask covers past + new tokens, position_ids count from the past length.")


def load_manifest() -> Dict[str, Any]:
    """tests/fixtures/manifest.json as it is (or an empty one), with the current ``about`` text."""
    os.makedirs(OUT_DIR, exist_ok=True)
    manifest: Dict[str, Any] = {"fixtures": {}, "failures": []}
    if os.path.exists(MANIFEST_PATH):
        with open(MANIFEST_PATH) as f:
            manifest = json.load(f)
    manifest["about"] = ABOUT
    return manifest


def store_fixture(manifest: Dict[str, Any], name: str, data: bytes, entry: Dict[str, Any]) -> Dict[str, Any]:
    """Write ``<name>.onnx.xz`` (xz -9e of the serialized model ``data``) and record ``entry`` with
    its file, sizes and sha256 under ``manifest["fixtures"][name]``; returns the entry."""
    fname = f"{name}.onnx.xz"
    blob = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
    with open(os.path.join(OUT_DIR, fname), "wb") as f:
        f.write(blob)
    entry.update({"file": fname, "onnx_bytes": len(data), "xz_bytes": len(blob),
                  "sha256": hashlib.sha256(data).hexdigest()})
    manifest["fixtures"][name] = entry
    return entry


def save_manifest(manifest: Dict[str, Any]) -> None:
    """Write the manifest, fixtures and failures sorted by name."""
    manifest["fixtures"] = dict(sorted(manifest["fixtures"].items()))
    manifest["failures"].sort(key=lambda x: x["name"])
    with open(MANIFEST_PATH, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


# -- driver ------------------------------------------------------------------------------------
def run_export(arch: str, exporter: str, model: Any, folder: str, work: str) -> Tuple[onnx.ModelProto, Optional[dict]]:
    out = os.path.join(work, exporter)
    os.makedirs(out, exist_ok=True)
    genai_cfg = None
    if exporter.removesuffix("-fp16") in ("dynamo", "dynamo23", "torchscript"):
        path = os.path.join(out, "model.onnx")
        base = exporter.removesuffix("-fp16")
        torch_export(model, path, dynamo=base != "torchscript", opset=23 if base == "dynamo23" else None)
    elif exporter == "optimum":
        path = export_optimum(folder, out)
    else:
        path = export_genai(folder, out, os.path.join(work, "genai-cache"),
                            precision="int4" if exporter == "genai-int4" else "fp32")
        with open(os.path.join(out, "genai_config.json")) as f:
            genai_cfg = json.load(f)
    return onnx.load(path, load_external_data=True), genai_cfg


def _error_line(exc: BaseException) -> str:
    """The root cause's type and first line (a builder's failure: its last output line)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", nargs="*", default=list(ARCHS), choices=list(ARCHS))
    ap.add_argument("--exporter", nargs="*", default=EXPORTERS, choices=EXPORTERS)
    args = ap.parse_args(argv)

    manifest = load_manifest()
    for arch in args.arch:
        model = build_model(arch)
        want = hf_greedy(model)
        model16 = copy.deepcopy(model).half() if arch in FP16_ARCHS else None
        want16 = hf_greedy(model16) if model16 is not None else None
        kv, hd = kv_geometry(model)
        cfg = {"class": ARCHS[arch][0], **ARCHS[arch][2]}
        with tempfile.TemporaryDirectory() as work:
            folder = os.path.join(work, "hf")
            save_hf_folder(model, folder)
            for exporter in args.exporter:
                fp16 = exporter.endswith("-fp16")
                if (fp16 and model16 is None) or (exporter == "genai-int4" and arch not in INT4_ARCHS):
                    continue
                name = f"{arch}-{exporter}"
                fname = f"{name}.onnx.xz"
                manifest["fixtures"].pop(name, None)
                manifest["failures"] = [x for x in manifest["failures"] if x["name"] != name]
                if os.path.exists(os.path.join(OUT_DIR, fname)):
                    os.remove(os.path.join(OUT_DIR, fname))
                print(f"== {name}", flush=True)
                stage = "export"
                try:
                    log = io.StringIO()
                    with contextlib.redirect_stdout(log):
                        m, genai_cfg = run_export(arch, exporter, model16 if fp16 else model, folder, work)
                    entry = describe(m, arch, exporter, cfg, genai_cfg, kv, hd)
                    data = m.SerializeToString()
                    stage = "onnxruntime"  # an export onnxruntime cannot run is no fixture either
                    entry["matches_transformers"] = check_export(entry, data, want16 if fp16 else want)
                except Exception as exc:  # record the failure instead of a model
                    traceback.print_exc(limit=3)
                    manifest["failures"].append({"name": name, "architecture": arch, "exporter": exporter,
                                                 "exporter_version": exporter_version(exporter), "stage": stage,
                                                 "error": _error_line(exc)})
                    print(f"   FAILED ({stage}): {_error_line(exc)}", flush=True)
                    continue
                if name in NOTES:
                    entry["note"] = NOTES[name]
                store_fixture(manifest, name, data, entry)
                chk = entry["matches_transformers"]
                print(f"   ok: {len(m.graph.node)} nodes, {len(data)} B -> {entry['xz_bytes']} B xz; vs transformers: tokens "
                      f"{'equal' if chk['tokens_equal'] else 'DIFFER'}, max logit diff {chk['max_abs_logit_diff']:.2g}",
                      flush=True)
    save_manifest(manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
