"""Built-in decoder models with seeded weights, built in memory (nothing is downloaded).

Three builders return an ``onnx.ModelProto`` for the same family of tiny-to-medium decoders:

* :func:`llama_decoder` -- Llama/Qwen style: embedding ``Gather``, N layers of
  ``RMSNormalization`` (opset 23), Q/K/V ``MatMul``, ``RotaryEmbedding`` (opset 23), standard
  ``Attention`` (opset 23 or 24) with ``past_key_values.{i}.key/.value`` inputs and
  ``present.{i}.key/.value`` outputs, output projection, SiLU-gated MLP, final norm, logits.
* :func:`gpt2_decoder` -- GPT-2 style: ``LayerNormalization``, learned position embedding,
  fused or separate QKV, past/present through explicit ``Concat`` nodes on the sequence axis and
  a decomposed ``MatMul -> scale -> causal mask (Trilu + Where, or additive) -> Softmax ->
  MatMul`` attention, GELU MLP. This is the second pattern the cache rewrite must recognise.
* :func:`llama_decoder_gqa_ort` -- the same Llama weights expressed with
  ``com.microsoft.GroupQueryAttention`` (rotary inside the op, past and present sharing one
  pre-allocated buffer, ``seqlens_k`` / ``total_sequence_length`` derived from an
  ``attention_mask`` input), for onnxruntime's shared-buffer path. Same config and seed as
  :func:`llama_decoder` give bit-identical weights, so logits are comparable.

Every model stores its :class:`DecoderConfig` and kind in ``metadata_props`` so
:func:`greedy_generate` can drive any object with ``run(output_names, feeds)``
(``onnxruntime.InferenceSession`` or ``onnx_light_kv.InferenceSession``).

Tensor layouts (B batch, S new tokens, P past tokens, T = P + S):
``input_ids`` / ``position_ids`` int64 ``[B, S]``; past and present ``[B, kv_heads, P|T,
head_dim]``; ``logits`` ``[B, S, vocab]`` in the model dtype. The GQA variant's past and present
are ``[B, kv_heads, capacity, head_dim]`` buffers of which the first T positions are valid.

Only numpy and onnx are imported.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

try:
    from ._system import physical_memory
    from ._validate import integer, real
except ImportError:  # loaded from its file alone (the package mid-build): the siblings by path
    import importlib.util as _ilu

    def _sibling(name: str) -> Any:
        spec = _ilu.spec_from_file_location("_olkv_src" + name, os.path.join(os.path.dirname(__file__), name + ".py"))
        assert spec is not None and spec.loader is not None
        mod = _ilu.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    physical_memory = _sibling("_system").physical_memory
    _v = _sibling("_validate")
    integer, real = _v.integer, _v.real

__all__ = [
    "DecoderConfig",
    "GenerationResult",
    "llama_decoder",
    "gpt2_decoder",
    "llama_decoder_gqa_ort",
    "build",
    "config_of",
    "kind_of",
    "model_bytes",
    "save_model",
    "past_names",
    "present_names",
    "greedy_generate",
]

KINDS = ("llama", "gpt2", "llama_gqa_ort")
_META_CONFIG = "onnx_light_kv.config"
_META_KIND = "onnx_light_kv.kind"
_NP_DTYPES = {"float32": np.float32, "float16": np.float16}
_ONNX_DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


@dataclass(frozen=True)
class DecoderConfig:
    """Geometry and numerics of a built-in decoder.

    ``intermediate`` defaults to ``4 * hidden`` (GPT-2) or ``8/3 * hidden`` rounded to 16 (Llama)
    when 0. For GPT-2 ``kv_heads`` is ignored (multi-head attention uses ``q_heads``).
    ``opset`` selects the Attention version (23 or 24) of the Llama model.
    Weight values depend only on (kind family, geometry, seed): the Llama and the GQA variant
    share them.
    """

    layers: int = 2
    hidden: int = 64
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    vocab: int = 256
    intermediate: int = 0
    dtype: str = "float32"
    max_positions: int = 512
    seed: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    opset: int = 23
    logit_scale: float = 8.0

    def __post_init__(self) -> None:
        """Validate every field (``TypeError`` for a wrong type, ``ValueError`` for a value out
        of range or a model whose weights and position tables would not fit the memory)."""
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if not isinstance(self.dtype, str) or self.dtype not in _NP_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_NP_DTYPES)}, got {self.dtype!r}")
        for name in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "vocab", "max_positions"):
            put(name, integer(getattr(self, name), name, lo=1))
        put("intermediate", integer(self.intermediate, "intermediate", lo=0))
        put("seed", integer(self.seed, "seed", lo=0))
        put("opset", integer(self.opset, "opset", lo=23, hi=24))
        put("rope_theta", real(self.rope_theta, "rope_theta"))
        put("norm_eps", real(self.norm_eps, "norm_eps", lo=0.0))
        put("logit_scale", real(self.logit_scale, "logit_scale"))
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if self.q_heads % self.kv_heads != 0:
            raise ValueError(f"q_heads={self.q_heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        need, have = self.build_bytes(), physical_memory()
        if need > have // 2:
            raise ValueError(f"this geometry needs about {need / 2**30:.1f} GiB to build (weights and position "
                             f"tables), more than half of this machine's {have / 2**30:.1f} GiB")

    def build_bytes(self) -> int:
        """About how many bytes building the model takes: its weights (the widest kind's) and
        the float64 rotary/position tables (a few copies of ``max_positions x head_dim``)."""
        attn = self.hidden * self.q_heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        ffn = 3 * self.hidden * max(self.ffn("llama"), self.ffn("gpt2"))
        params = self.layers * (attn + ffn) + 2 * self.vocab * self.hidden + self.max_positions * self.hidden
        return params * 4 + 4 * self.max_positions * self.head_dim * 8

    @property
    def np_dtype(self) -> type:
        """The numpy dtype of weights, activations, past/present and logits."""
        return _NP_DTYPES[self.dtype]

    @property
    def onnx_dtype(self) -> int:
        """The ``TensorProto`` element type matching :attr:`dtype`."""
        return _ONNX_DTYPES[self.dtype]

    def ffn(self, kind: str) -> int:
        """The MLP intermediate size for a model kind ("llama*" or "gpt2")."""
        if self.intermediate:
            return self.intermediate
        if kind == "gpt2":
            return 4 * self.hidden
        return max(16, int(round(self.hidden * 8 / 3 / 16)) * 16)

    def heads_kv(self, kind: str) -> int:
        """Number of K/V heads in the past/present tensors of a model kind."""
        return self.q_heads if kind == "gpt2" else self.kv_heads

    def replace(self, **changes: Any) -> "DecoderConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass(repr=False)
class GenerationResult:
    """What :func:`greedy_generate` observed.

    ``tokens``: ``[B, steps + 1]`` generated ids (the prefill produces the first one).
    ``step_logits``: ``steps + 1`` arrays ``[B, vocab]``, the last-position logits of each run.
    ``prefill_logits``: ``[B, S, vocab]`` logits of the prompt run.
    ``presents``: the last run's present tensors by output name, cut to the valid length
    ``[B, kv_heads, T, head_dim]`` (the GQA buffer's unused tail is removed).
    """

    tokens: np.ndarray
    step_logits: List[np.ndarray]
    prefill_logits: np.ndarray
    presents: Dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def logits(self) -> np.ndarray:
        """``[steps + 1, B, vocab]`` stack of :attr:`step_logits`."""
        return np.stack(self.step_logits)

    def __repr__(self) -> str:
        # a summary, never the arrays (this module also loads standalone, without the package)
        def arr(a: np.ndarray) -> str:
            return f"{a.dtype}[{', '.join(map(str, a.shape))}]"

        return (f"GenerationResult(tokens={arr(self.tokens)}, steps={len(self.step_logits)}, "
                f"prefill_logits={arr(self.prefill_logits)}, presents=<{len(self.presents)} tensors>)")


# --------------------------------------------------------------------------------------------
# names and metadata


def past_names(layers: int) -> List[str]:
    """Past input names in feed order: key, value for layer 0, then layer 1, ..."""
    return [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def present_names(layers: int) -> List[str]:
    """Present output names in graph order: key, value for layer 0, then layer 1, ..."""
    return [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def config_of(model: onnx.ModelProto) -> DecoderConfig:
    """The :class:`DecoderConfig` a built-in model was made from (from ``metadata_props``)."""
    for prop in model.metadata_props:
        if prop.key == _META_CONFIG:
            return DecoderConfig(**json.loads(prop.value))
    raise ValueError("model has no onnx_light_kv.config metadata; it was not built by this module")


def kind_of(model: onnx.ModelProto) -> str:
    """The builder kind ("llama", "gpt2", "llama_gqa_ort") recorded in a built-in model."""
    for prop in model.metadata_props:
        if prop.key == _META_KIND:
            return prop.value
    raise ValueError("model has no onnx_light_kv.kind metadata; it was not built by this module")


def model_bytes(model: onnx.ModelProto) -> bytes:
    """Serialized model (what ``InferenceSession(bytes)`` accepts)."""
    return model.SerializeToString()


def save_model(model: onnx.ModelProto, path: Union[str, os.PathLike], external_data: bool = False) -> str:
    """Write a model to ``path`` and return the path.

    ``external_data=True`` stores the initializers in ``<file name>.data`` next to it (the layout
    exporters use for models over 2 GiB); otherwise the file is self-contained.
    """
    path = os.fspath(path)
    if external_data:
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, path)
    return path


def build(kind: str, config: Optional[DecoderConfig] = None, **overrides: Any) -> onnx.ModelProto:
    """Build a model by kind name. ``overrides`` are the kind's builder keywords (for example
    :func:`llama_decoder`'s ``attention_mask_input``; see each builder) and fields of
    :class:`DecoderConfig`, which change ``config`` (or the defaults). An unknown keyword raises
    ``TypeError`` naming the builder's keywords and the config fields."""
    builders: Dict[str, Callable[..., onnx.ModelProto]] = {
        "llama": llama_decoder,
        "gpt2": gpt2_decoder,
        "llama_gqa_ort": llama_decoder_gqa_ort,
    }
    if kind not in builders:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")
    return builders[kind](config, **overrides)


def _resolve(config: Optional[DecoderConfig], overrides: Dict[str, Any]) -> DecoderConfig:
    cfg = config or DecoderConfig()
    fields = {f.name for f in dataclasses.fields(DecoderConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        import inspect

        caller = inspect.stack()[1].function
        builder = globals().get(caller)
        own = [p for p in inspect.signature(builder).parameters if p not in ("config", "overrides")] if builder else []
        raise TypeError(f"{caller}() got unknown keyword(s) {', '.join(unknown)}: it takes "
                        f"{', '.join(own) or 'no keywords of its own'} and the DecoderConfig fields "
                        f"({', '.join(sorted(fields))})")
    return cfg.replace(**overrides) if overrides else cfg


# --------------------------------------------------------------------------------------------
# graph construction helper


class _Graph:
    """Accumulates nodes/initializers with unique names; small sugar over onnx.helper."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.cfg = cfg
        self.nodes: List[onnx.NodeProto] = []
        self.inits: List[onnx.TensorProto] = []
        self._n = 0
        self._consts: Dict[Tuple[str, bytes], str] = {}

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, name: str = "",
           domain: str = "", outputs: Optional[Sequence[str]] = None, **attrs: Any) -> Any:
        self._n += 1
        base = name or f"{op_type}_{self._n}"
        outs = list(outputs) if outputs else [f"{base}_out{j}" if n_out > 1 else f"{base}_out" for j in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=base, domain=domain, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        arr = np.asarray(value, dtype=dtype)
        key = (str(arr.dtype) + str(arr.shape), arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(f"const_{len(self._consts)}", arr)
        return self._consts[key]

    def weight(self, name: str, value: np.ndarray) -> str:
        return self.init(name, value.astype(self.cfg.np_dtype))

    def model(self, kind: str, name: str, inputs: List[onnx.ValueInfoProto],
              outputs: List[onnx.ValueInfoProto], extra_opsets: Sequence[Tuple[str, int]] = ()) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        opsets = [helper.make_opsetid("", self.cfg.opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=10,
                                  producer_name="onnx_light_kv.models")
        helper.set_model_props(model, {_META_KIND: kind,
                                       _META_CONFIG: json.dumps(dataclasses.asdict(self.cfg), sort_keys=True)})
        return model


def _vi(name: str, elem: int, shape: Sequence[Union[int, str]]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


# --------------------------------------------------------------------------------------------
# weights


def _llama_weights(cfg: DecoderConfig) -> Dict[str, np.ndarray]:
    """Seeded float32 weights of the Llama family; the draw order is part of the contract."""
    rng = np.random.default_rng(cfg.seed)
    h, qd, kvd, ffn = cfg.hidden, cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn("llama")

    def lin(n_in: int, n_out: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_in, n_out)) * (gain / np.sqrt(n_in))).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w: Dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.standard_normal((cfg.vocab, h)).astype(np.float32)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = lin(h, qd, 2.0)
        w[p + "self_attn.k_proj.weight"] = lin(h, kvd, 2.0)
        w[p + "self_attn.v_proj.weight"] = lin(h, kvd)
        w[p + "self_attn.o_proj.weight"] = lin(qd, h, 0.5)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = lin(h, ffn)
        w[p + "mlp.up_proj.weight"] = lin(h, ffn)
        w[p + "mlp.down_proj.weight"] = lin(ffn, h, 0.5)
    w["model.norm.weight"] = norm(h)
    w["lm_head.weight"] = lin(h, cfg.vocab, cfg.logit_scale)
    return w


def _rope_cache(cfg: DecoderConfig) -> Tuple[np.ndarray, np.ndarray]:
    """``cos``/``sin`` caches ``[max_positions, head_dim / 2]`` (non-interleaved rotary)."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(half, dtype=np.float64) * 2.0 / cfg.head_dim))
    angles = np.arange(cfg.max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(cfg.np_dtype), np.sin(angles).astype(cfg.np_dtype)


# --------------------------------------------------------------------------------------------
# Llama


def _rms_norm(g: _Graph, x: str, scale: str, variant: str) -> str:
    eps = g.cfg.norm_eps
    if variant == "op":
        return g.op("RMSNormalization", [x, scale], axis=-1, epsilon=eps)
    if variant == "simplified":
        # onnxruntime registers SimplifiedLayerNormalization in the default domain.
        return g.op("SimplifiedLayerNormalization", [x, scale], axis=-1, epsilon=eps, stash_type=1)
    if variant == "decomposed":
        xf = g.op("Cast", [x], to=TensorProto.FLOAT)
        ms = g.op("ReduceMean", [g.op("Pow", [xf, g.const(2.0, np.float32)]), g.const([-1])], keepdims=1)
        inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [ms, g.const(eps, np.float32)])])])
        y = g.op("Cast", [g.op("Mul", [xf, inv])], to=g.cfg.onnx_dtype)
        return g.op("Mul", [y, scale])
    raise ValueError(f"unknown rms norm variant {variant!r}; expected op, simplified or decomposed")


def _heads(g: _Graph, x: str, heads: int) -> str:
    """``[B, S, heads * D] -> [B, heads, S, D]``."""
    r = g.op("Reshape", [x, g.const([0, 0, heads, g.cfg.head_dim])])
    return g.op("Transpose", [r], perm=[0, 2, 1, 3])


def _merge_heads(g: _Graph, x: str, heads: int) -> str:
    """``[B, heads, S, D] -> [B, S, heads * D]``."""
    t = g.op("Transpose", [x], perm=[0, 2, 1, 3])
    return g.op("Reshape", [t, g.const([0, 0, heads * g.cfg.head_dim])])


def _derived_positions(g: _Graph, past0: str) -> str:
    """``position_ids [B, S]`` = past length + arange(S), built from Shape/Range/Expand."""
    plen = g.op("Squeeze", [g.op("Shape", [past0], start=2, end=3), g.const([0])])
    slen = g.op("Squeeze", [g.op("Shape", ["input_ids"], start=1, end=2), g.const([0])])
    rng = g.op("Range", [plen, g.op("Add", [plen, slen]), g.const(1)])
    return g.op("Expand", [g.op("Unsqueeze", [rng, g.const([0])]), g.op("Shape", ["input_ids"])])


def _llama_mlp(g: _Graph, x: str, w: Dict[str, str], p: str) -> str:
    gate = g.op("MatMul", [x, w[p + "mlp.gate_proj.weight"]])
    up = g.op("MatMul", [x, w[p + "mlp.up_proj.weight"]])
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate])])  # SiLU
    return g.op("MatMul", [g.op("Mul", [act, up]), w[p + "mlp.down_proj.weight"]])


def llama_decoder(config: Optional[DecoderConfig] = None, *, norm: str = "op",
                  position_ids_input: bool = True, attention_mask_input: bool = False,
                  **overrides: Any) -> onnx.ModelProto:
    """Llama-style decoder with standard ONNX ``Attention`` and past/present per layer.

    Inputs: ``input_ids`` int64 ``[B, S]``; ``position_ids`` int64 ``[B, S]`` (unless
    ``position_ids_input=False``: then derived from the past length with Shape/Range/Expand);
    ``attention_mask`` int64 ``[B, P + S]`` (only with ``attention_mask_input=True``; 1 = attend,
    applied together with ``is_causal``); ``past_key_values.{i}.key/.value``
    ``[B, kv_heads, P, head_dim]``.
    Outputs: ``logits [B, S, vocab]``, ``present.{i}.key/.value [B, kv_heads, P + S, head_dim]``.
    ``norm``: "op" (RMSNormalization-23), "simplified" (SimplifiedLayerNormalization, the
    onnxruntime contrib op registered in the default domain; ``onnx.checker`` rejects such a
    model) or "decomposed" (Cast/Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul).
    ``overrides`` replace fields of ``config``.
    """
    cfg = _resolve(config, overrides)
    g = _Graph(cfg)
    w = {k: g.weight(k, v) for k, v in _llama_weights(cfg).items()}
    cos, sin = _rope_cache(cfg)
    cos_n, sin_n = g.init("rope.cos_cache", cos), g.init("rope.sin_cache", sin)
    dt, kvh, d = cfg.onnx_dtype, cfg.kv_heads, cfg.head_dim

    inputs = [_vi("input_ids", TensorProto.INT64, ["batch", "seq"])]
    if position_ids_input:
        inputs.append(_vi("position_ids", TensorProto.INT64, ["batch", "seq"]))
        pos = "position_ids"
    else:
        pos = _derived_positions(g, "past_key_values.0.key")
    mask = ""
    if attention_mask_input:
        inputs.append(_vi("attention_mask", TensorProto.INT64, ["batch", "total_seq"]))
        mask_b = g.op("Cast", ["attention_mask"], to=TensorProto.BOOL)
        # [B, 1, S, T]: onnxruntime does not broadcast the mask's query axis.
        full = g.op("Concat", [g.op("Shape", ["input_ids"], start=0, end=1), g.const([1]),
                               g.op("Shape", ["input_ids"], start=1, end=2),
                               g.op("Shape", ["attention_mask"], start=1, end=2)], axis=0)
        mask = g.op("Expand", [g.op("Unsqueeze", [mask_b, g.const([1, 2])]), full])
    for name in past_names(cfg.layers):
        inputs.append(_vi(name, dt, ["batch", kvh, "past_seq", d]))

    h = g.op("Gather", [w["model.embed_tokens.weight"], "input_ids"], axis=0)
    outputs: List[onnx.ValueInfoProto] = []
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        x = _rms_norm(g, h, w[p + "input_layernorm.weight"], norm)
        q = _heads(g, g.op("MatMul", [x, w[p + "self_attn.q_proj.weight"]]), cfg.q_heads)
        k = _heads(g, g.op("MatMul", [x, w[p + "self_attn.k_proj.weight"]]), kvh)
        v = _heads(g, g.op("MatMul", [x, w[p + "self_attn.v_proj.weight"]]), kvh)
        q = g.op("RotaryEmbedding", [q, cos_n, sin_n, pos], interleaved=0)
        k = g.op("RotaryEmbedding", [k, cos_n, sin_n, pos], interleaved=0)
        pk, pv = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        y = g.op("Attention", [q, k, v, mask, pk, pv], name=f"attn_{i}",
                 outputs=[f"attn_{i}_out", f"present.{i}.key", f"present.{i}.value"], is_causal=1)[0]
        attn = g.op("MatMul", [_merge_heads(g, y, cfg.q_heads), w[p + "self_attn.o_proj.weight"]])
        h = g.op("Add", [h, attn])
        x = _rms_norm(g, h, w[p + "post_attention_layernorm.weight"], norm)
        h = g.op("Add", [h, _llama_mlp(g, x, w, p)])
        for kv in ("key", "value"):
            outputs.append(_vi(f"present.{i}.{kv}", dt, ["batch", kvh, "total_seq", d]))
    x = _rms_norm(g, h, w["model.norm.weight"], norm)
    g.op("MatMul", [x, w["lm_head.weight"]], outputs=["logits"])
    outputs.insert(0, _vi("logits", dt, ["batch", "seq", cfg.vocab]))
    return g.model("llama", "llama_decoder", inputs, outputs)


def llama_decoder_gqa_ort(config: Optional[DecoderConfig] = None, **overrides: Any) -> onnx.ModelProto:
    """The :func:`llama_decoder` weights with ``com.microsoft.GroupQueryAttention`` (onnxruntime only).

    Inputs: ``input_ids`` int64 ``[B, S]``; ``attention_mask`` int64 ``[B, P + S]`` (all ones
    for unpadded batches; ``seqlens_k = sum(mask) - 1`` and ``total_sequence_length = P + S``
    are computed in the graph, like onnxruntime-genai exports); ``past_key_values.{i}.key/.value``
    ``[B, kv_heads, capacity, head_dim]`` buffers, of which the first P positions are valid.
    Outputs: ``logits``, ``present.{i}.key/.value`` with the buffer's shape: bind them to the
    past buffers (IOBinding) for onnxruntime's shared-buffer path, or feed them back.
    Rotary runs inside the op (``do_rotary=1``) with positions ``P .. P + S - 1``; prompts
    therefore start at position 0, as :func:`greedy_generate` does.
    """
    cfg = _resolve(config, overrides)
    g = _Graph(cfg)
    w = {k: g.weight(k, v) for k, v in _llama_weights(cfg).items()}
    cos, sin = _rope_cache(cfg)
    cos_n, sin_n = g.init("rope.cos_cache", cos), g.init("rope.sin_cache", sin)
    dt, kvh, d = cfg.onnx_dtype, cfg.kv_heads, cfg.head_dim

    inputs = [_vi("input_ids", TensorProto.INT64, ["batch", "seq"]),
              _vi("attention_mask", TensorProto.INT64, ["batch", "total_seq"])]
    for name in past_names(cfg.layers):
        inputs.append(_vi(name, dt, ["batch", kvh, "capacity", d]))
    total = g.op("ReduceSum", ["attention_mask", g.const([1])], keepdims=0)
    seqlens_k = g.op("Cast", [g.op("Sub", [total, g.const(1)])], to=TensorProto.INT32)
    total_len = g.op("Cast", [g.op("Squeeze", [g.op("Shape", ["attention_mask"], start=1, end=2), g.const([0])])],
                     to=TensorProto.INT32)

    h = g.op("Gather", [w["model.embed_tokens.weight"], "input_ids"], axis=0)
    outputs: List[onnx.ValueInfoProto] = []
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        x = _rms_norm(g, h, w[p + "input_layernorm.weight"], "op")
        q = g.op("MatMul", [x, w[p + "self_attn.q_proj.weight"]])
        k = g.op("MatMul", [x, w[p + "self_attn.k_proj.weight"]])
        v = g.op("MatMul", [x, w[p + "self_attn.v_proj.weight"]])
        y = g.op("GroupQueryAttention",
                 [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens_k, total_len, cos_n, sin_n],
                 name=f"gqa_{i}", domain="com.microsoft",
                 outputs=[f"gqa_{i}_out", f"present.{i}.key", f"present.{i}.value"],
                 num_heads=cfg.q_heads, kv_num_heads=kvh, do_rotary=1, rotary_interleaved=0)[0]
        h = g.op("Add", [h, g.op("MatMul", [y, w[p + "self_attn.o_proj.weight"]])])
        x = _rms_norm(g, h, w[p + "post_attention_layernorm.weight"], "op")
        h = g.op("Add", [h, _llama_mlp(g, x, w, p)])
        for kv in ("key", "value"):
            outputs.append(_vi(f"present.{i}.{kv}", dt, ["batch", kvh, "capacity", d]))
    x = _rms_norm(g, h, w["model.norm.weight"], "op")
    g.op("MatMul", [x, w["lm_head.weight"]], outputs=["logits"])
    outputs.insert(0, _vi("logits", dt, ["batch", "seq", cfg.vocab]))
    return g.model("llama_gqa_ort", "llama_decoder_gqa_ort", inputs, outputs, extra_opsets=[("com.microsoft", 1)])


# --------------------------------------------------------------------------------------------
# GPT-2


def _gpt2_weights(cfg: DecoderConfig) -> Dict[str, np.ndarray]:
    """Seeded float32 GPT-2 weights (QKV stored fused as ``[hidden, 3 * heads * head_dim]``)."""
    rng = np.random.default_rng(cfg.seed + 7919)
    h, ad, ffn = cfg.hidden, cfg.q_heads * cfg.head_dim, cfg.ffn("gpt2")

    def lin(n_in: int, n_out: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_in, n_out)) * (gain / np.sqrt(n_in))).astype(np.float32)

    def vec(n: int, mean: float, std: float) -> np.ndarray:
        return (mean + std * rng.standard_normal(n)).astype(np.float32)

    w: Dict[str, np.ndarray] = {
        "transformer.wte.weight": rng.standard_normal((cfg.vocab, h)).astype(np.float32),
        "transformer.wpe.weight": (0.5 * rng.standard_normal((cfg.max_positions, h))).astype(np.float32),
    }
    for i in range(cfg.layers):
        p = f"transformer.h.{i}."
        w[p + "ln_1.weight"], w[p + "ln_1.bias"] = vec(h, 1.0, 0.1), vec(h, 0.0, 0.1)
        w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = lin(h, 3 * ad, 2.0), vec(3 * ad, 0.0, 0.1)
        w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = lin(ad, h, 0.5), vec(h, 0.0, 0.1)
        w[p + "ln_2.weight"], w[p + "ln_2.bias"] = vec(h, 1.0, 0.1), vec(h, 0.0, 0.1)
        w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = lin(h, ffn), vec(ffn, 0.0, 0.1)
        w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = lin(ffn, h, 0.5), vec(h, 0.0, 0.1)
    w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = vec(h, 1.0, 0.1), vec(h, 0.0, 0.1)
    # Untied on purpose: a tied head makes random weights repeat the input token forever.
    w["lm_head.weight"] = lin(h, cfg.vocab, cfg.logit_scale)
    return w


def _layer_norm(g: _Graph, x: str, scale: str, bias: str, variant: str) -> str:
    eps = g.cfg.norm_eps
    if variant == "op":
        return g.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=eps)
    if variant == "decomposed":
        axes = g.const([-1])
        xf = g.op("Cast", [x], to=TensorProto.FLOAT)
        centered = g.op("Sub", [xf, g.op("ReduceMean", [xf, axes], keepdims=1)])
        var = g.op("ReduceMean", [g.op("Pow", [centered, g.const(2.0, np.float32)]), axes], keepdims=1)
        y = g.op("Div", [centered, g.op("Sqrt", [g.op("Add", [var, g.const(eps, np.float32)])])])
        return g.op("Add", [g.op("Mul", [g.op("Cast", [y], to=g.cfg.onnx_dtype), scale]), bias])
    raise ValueError(f"unknown layer norm variant {variant!r}; expected op or decomposed")


def _gelu(g: _Graph, x: str, variant: str) -> str:
    dt = g.cfg.np_dtype
    if variant == "op":
        return g.op("Gelu", [x])
    if variant == "op_tanh":
        return g.op("Gelu", [x], approximate="tanh")
    if variant == "erf":  # 0.5 * x * (1 + erf(x / sqrt(2)))
        e = g.op("Erf", [g.op("Div", [x, g.const(np.sqrt(2.0), dt)])])
        return g.op("Mul", [g.op("Mul", [x, g.const(0.5, dt)]), g.op("Add", [e, g.const(1.0, dt)])])
    if variant == "tanh":  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        cube = g.op("Mul", [g.op("Pow", [x, g.const(3.0, dt)]), g.const(0.044715, dt)])
        t = g.op("Tanh", [g.op("Mul", [g.op("Add", [x, cube]), g.const(np.sqrt(2.0 / np.pi), dt)])])
        return g.op("Mul", [g.op("Mul", [x, g.const(0.5, dt)]), g.op("Add", [t, g.const(1.0, dt)])])
    raise ValueError(f"unknown gelu variant {variant!r}; expected op, op_tanh, erf or tanh")


def gpt2_decoder(config: Optional[DecoderConfig] = None, *, fused_qkv: bool = True, mask: str = "where",
                 layernorm: str = "op", gelu: str = "op", position_ids_input: bool = True,
                 **overrides: Any) -> onnx.ModelProto:
    """GPT-2 style decoder: explicit ``Concat`` past/present and decomposed causal attention.

    Inputs: ``input_ids`` / ``position_ids`` int64 ``[B, S]`` (``position_ids`` derived with
    Shape/Range/Expand when ``position_ids_input=False``), ``past_key_values.{i}.key/.value``
    ``[B, q_heads, P, head_dim]``. Outputs: ``logits``, ``present.{i}.key/.value``
    ``[B, q_heads, P + S, head_dim]`` = ``Concat(past, new, axis=2)``.
    Per layer: ``LayerNormalization``; QKV as one MatMul + Split (``fused_qkv``) or three;
    ``scores = MatMul(q, Transpose(present_k)) / sqrt(D)``; the causal mask is
    ``Trilu(ones[S, T], k=P, upper=0)`` built from Shape/ConstantOfShape, applied with
    ``Where(Equal(tri, 0), lowest, scores)`` (``mask="where"``) or added as
    ``(tri - 1) * big`` (``mask="additive"``); Softmax; MatMul with present_v; GELU MLP
    (``gelu``: "op", "op_tanh", "erf", "tanh"). ``layernorm``: "op" or "decomposed".
    """
    cfg = _resolve(config, overrides)
    if mask not in ("where", "additive"):
        raise ValueError(f"unknown mask variant {mask!r}; expected where or additive")
    g = _Graph(cfg)
    dt, nh, d = cfg.onnx_dtype, cfg.q_heads, cfg.head_dim
    ad = nh * d
    npdt = cfg.np_dtype
    raw = _gpt2_weights(cfg)
    if not fused_qkv:
        for i in range(cfg.layers):
            p = f"transformer.h.{i}.attn.c_attn."
            fw, fb = raw.pop(p + "weight"), raw.pop(p + "bias")
            for j, part in enumerate(("q", "k", "v")):
                raw[p + part + ".weight"] = fw[:, j * ad:(j + 1) * ad]
                raw[p + part + ".bias"] = fb[j * ad:(j + 1) * ad]
    w = {k: g.weight(k, v) for k, v in raw.items()}

    inputs = [_vi("input_ids", TensorProto.INT64, ["batch", "seq"])]
    if position_ids_input:
        inputs.append(_vi("position_ids", TensorProto.INT64, ["batch", "seq"]))
        pos = "position_ids"
    else:
        pos = _derived_positions(g, "past_key_values.0.key")
    for name in past_names(cfg.layers):
        inputs.append(_vi(name, dt, ["batch", nh, "past_seq", d]))

    h = g.op("Add", [g.op("Gather", [w["transformer.wte.weight"], "input_ids"], axis=0),
                     g.op("Gather", [w["transformer.wpe.weight"], pos], axis=0)])
    # Causal mask shared by all layers: [S, T], row i may attend keys 0 .. P + i.
    s_len = g.op("Shape", ["input_ids"], start=1, end=2)
    p_len = g.op("Shape", ["past_key_values.0.key"], start=2, end=3)
    t_len = g.op("Add", [s_len, p_len])
    ones = g.op("ConstantOfShape", [g.op("Concat", [s_len, t_len], axis=0)],
                value=numpy_helper.from_array(np.ones(1, npdt), "one"))
    tri = g.op("Trilu", [ones, g.op("Squeeze", [p_len, g.const([0])])], upper=0)
    if mask == "where":
        blocked = g.op("Equal", [tri, g.const(0.0, npdt)])
        lowest = g.const(np.finfo(npdt).min, npdt)
    else:
        big = 1e9 if npdt == np.float32 else 3e4
        additive = g.op("Mul", [g.op("Sub", [tri, g.const(1.0, npdt)]), g.const(big, npdt)])
    inv_scale = g.const(np.sqrt(d), npdt)

    outputs: List[onnx.ValueInfoProto] = []
    for i in range(cfg.layers):
        p = f"transformer.h.{i}."
        x = _layer_norm(g, h, w[p + "ln_1.weight"], w[p + "ln_1.bias"], layernorm)
        if fused_qkv:
            qkv = g.op("Add", [g.op("MatMul", [x, w[p + "attn.c_attn.weight"]]), w[p + "attn.c_attn.bias"]])
            q, k, v = g.op("Split", [qkv, g.const([ad, ad, ad])], n_out=3, axis=-1)
        else:
            q, k, v = (g.op("Add", [g.op("MatMul", [x, w[f"{p}attn.c_attn.{part}.weight"]]),
                                    w[f"{p}attn.c_attn.{part}.bias"]]) for part in ("q", "k", "v"))
        q, k, v = _heads(g, q, nh), _heads(g, k, nh), _heads(g, v, nh)
        pk = g.op("Concat", [f"past_key_values.{i}.key", k], axis=2, outputs=[f"present.{i}.key"])
        pv = g.op("Concat", [f"past_key_values.{i}.value", v], axis=2, outputs=[f"present.{i}.value"])
        scores = g.op("Div", [g.op("MatMul", [q, g.op("Transpose", [pk], perm=[0, 1, 3, 2])]), inv_scale])
        if mask == "where":
            scores = g.op("Where", [blocked, lowest, scores])
        else:
            scores = g.op("Add", [scores, additive])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), pv])
        attn = g.op("Add", [g.op("MatMul", [_merge_heads(g, ctx, nh), w[p + "attn.c_proj.weight"]]),
                            w[p + "attn.c_proj.bias"]])
        h = g.op("Add", [h, attn])
        x = _layer_norm(g, h, w[p + "ln_2.weight"], w[p + "ln_2.bias"], layernorm)
        up = _gelu(g, g.op("Add", [g.op("MatMul", [x, w[p + "mlp.c_fc.weight"]]), w[p + "mlp.c_fc.bias"]]), gelu)
        h = g.op("Add", [h, g.op("Add", [g.op("MatMul", [up, w[p + "mlp.c_proj.weight"]]), w[p + "mlp.c_proj.bias"]])])
        for kv in ("key", "value"):
            outputs.append(_vi(f"present.{i}.{kv}", dt, ["batch", nh, "total_seq", d]))
    x = _layer_norm(g, h, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], layernorm)
    g.op("MatMul", [x, w["lm_head.weight"]], outputs=["logits"])
    outputs.insert(0, _vi("logits", dt, ["batch", "seq", cfg.vocab]))
    return g.model("gpt2", "gpt2_decoder", inputs, outputs)


# --------------------------------------------------------------------------------------------
# generation


class _Runner:
    """Feeds for one model kind; hides the GQA buffer and mask bookkeeping."""

    def __init__(self, session_like: Any, cfg: DecoderConfig, kind: str, batch: int, capacity: int,
                 input_names: Optional[Sequence[str]]) -> None:
        self.sess, self.cfg, self.kind, self.batch, self.capacity = session_like, cfg, kind, batch, capacity
        self.kvh = cfg.heads_kv(kind)
        names = set(input_names) if input_names is not None else None
        self.wants_positions = kind != "llama_gqa_ort" and (names is None or "position_ids" in names)
        self.wants_mask = kind == "llama_gqa_ort" or (names is not None and "attention_mask" in names)
        self.outputs = ["logits"] + present_names(cfg.layers)

    def empty_past(self) -> Dict[str, np.ndarray]:
        length = self.capacity if self.kind == "llama_gqa_ort" else 0
        shape = (self.batch, self.kvh, length, self.cfg.head_dim)
        return {n: np.zeros(shape, self.cfg.np_dtype) for n in past_names(self.cfg.layers)}

    def run(self, ids: np.ndarray, past_len: int, past: Dict[str, np.ndarray]) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        s = ids.shape[1]
        if self.kind == "llama_gqa_ort" and past_len + s > self.capacity:
            raise ValueError(f"GQA buffer capacity {self.capacity} is smaller than {past_len + s} tokens")
        feeds: Dict[str, np.ndarray] = {"input_ids": ids.astype(np.int64)}
        if self.wants_positions:
            feeds["position_ids"] = np.broadcast_to(np.arange(past_len, past_len + s, dtype=np.int64), ids.shape).copy()
        if self.wants_mask:
            feeds["attention_mask"] = np.ones((self.batch, past_len + s), np.int64)
        feeds.update(past)
        outs = self.sess.run(self.outputs, feeds)
        presents = dict(zip(self.outputs[1:], outs[1:]))
        return np.asarray(outs[0]), presents

    def logical(self, presents: Dict[str, np.ndarray], total: int) -> Dict[str, np.ndarray]:
        if self.kind == "llama_gqa_ort":
            return {n: np.ascontiguousarray(a[:, :, :total]) for n, a in presents.items()}
        return presents


def greedy_generate(session_like: Any, model_config: Union[DecoderConfig, onnx.ModelProto],
                    prompt_ids: Any, steps: int, feed_present_back: bool = True, *,
                    kind: Optional[str] = None, capacity: Optional[int] = None,
                    input_names: Optional[Sequence[str]] = None) -> GenerationResult:
    """Greedy decoding: one prefill run on the prompt, then ``steps`` single-token runs, so
    ``steps + 1`` tokens per row (the prefill chooses the first; ``steps`` counts decode runs).

    This is the built-in models' differential-test harness: it also returns every run's logits
    and the final presents. To generate text use :func:`onnx_light_kv.generate`, whose
    ``max_new_tokens`` counts new tokens exactly and which drives any decoder export.

    ``session_like``: any object with ``run(output_names, feeds) -> list of arrays``.
    ``model_config``: the built ``ModelProto`` (config and kind read from its metadata) or a
    :class:`DecoderConfig` together with ``kind`` ("llama" when omitted).
    ``prompt_ids``: ``[S]`` or ``[B, S]`` token ids (all rows the same length, no padding).
    ``feed_present_back=True`` feeds each run's present tensors as the next run's past (the
    decode contract); ``False`` recomputes the whole sequence with an empty past every step
    (the no-cache reference). ``capacity``: GQA buffer length (default prompt + steps + 1).
    ``input_names``: the model's input names when known (for optional inputs such as
    ``attention_mask``); taken from ``session_like.get_inputs()`` when that exists.
    Returns a :class:`GenerationResult`.
    """
    if isinstance(model_config, onnx.ModelProto):
        kind = kind or kind_of(model_config)
        cfg = config_of(model_config)
    else:
        cfg, kind = model_config, kind or "llama"
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    if prompt.ndim == 1:
        prompt = prompt[None, :]
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt_ids must be [S] or [B, S] with S > 0, got shape {prompt.shape}")
    if prompt.min() < 0 or prompt.max() >= cfg.vocab:
        raise ValueError(f"prompt ids must lie in [0, {cfg.vocab})")
    if prompt.shape[1] + steps + 1 > cfg.max_positions:
        raise ValueError(f"prompt + steps exceeds max_positions={cfg.max_positions}")
    if input_names is None and hasattr(session_like, "get_inputs"):
        input_names = [i.name for i in session_like.get_inputs()]
    batch = prompt.shape[0]
    cap = capacity or (prompt.shape[1] + steps + 1)
    runner = _Runner(session_like, cfg, kind, batch, cap, input_names)

    logits, presents = runner.run(prompt, 0, runner.empty_past())
    prefill = logits
    tokens = [np.argmax(logits[:, -1, :].astype(np.float32), axis=-1)]
    step_logits = [logits[:, -1, :]]
    seq = np.concatenate([prompt, tokens[-1][:, None]], axis=1)
    for _ in range(steps):
        if feed_present_back:
            past = dict(zip(past_names(cfg.layers), (presents[n] for n in present_names(cfg.layers))))
            logits, presents = runner.run(seq[:, -1:], seq.shape[1] - 1, past)
        else:
            logits, presents = runner.run(seq, 0, runner.empty_past())
        tokens.append(np.argmax(logits[:, -1, :].astype(np.float32), axis=-1))
        step_logits.append(logits[:, -1, :])
        seq = np.concatenate([seq, tokens[-1][:, None]], axis=1)
    return GenerationResult(tokens=np.stack(tokens, axis=1), step_logits=step_logits, prefill_logits=prefill,
                            presents=runner.logical(presents, seq.shape[1] - 1))
