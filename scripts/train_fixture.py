"""Train the tiny decoder fixture under tests/fixtures/: a Llama-architecture model whose attention is real.

Random-weight fixtures (scripts/make_fixtures.py) attend almost uniformly and predict nothing, which
hides cache-quantization error; this one is trained for about 20 minutes on one CPU thread on text that
every machine with Python has: the standard library's own source files. Run it with the same
environment as make_fixtures.py (torch, transformers, onnxscript, tokenizers, onnx, onnxruntime)::

    python scripts/train_fixture.py                    # 22 minutes of training (the committed fixture), then the exports
    python scripts/train_fixture.py --minutes 8        # shorter, worse model (18 minutes gave held-out perplexity 64, not 40)
    python scripts/train_fixture.py --steps 200        # a fixed step count instead of the time bound

Steps:

1. Text: ``*.py`` under ``sysconfig.get_paths()["stdlib"]`` (no site-packages, no test folders), as a
   sorted list of relative paths; every ``HELDOUT_EVERY``-th file is held out (whole files).
2. Tokenizer: a byte-level BPE (``tokenizers``, ``VOCAB`` tokens, ``<|endoftext|>`` = 0 between
   files) trained on the training split, saved as ``trained-tokenizer.json``.
3. Model: ``LlamaForCausalLM`` from ``CONFIG`` (4 layers, hidden 256, 8 query / 2 KV heads of 32,
   RoPE, tied embeddings), fixed seeds, ``torch.set_num_threads(1)``; AdamW on random windows of
   ``SEQ`` tokens, learning rate warmed up then cosine-decayed over the time (or step) budget.
4. Evaluation: train and held-out loss / perplexity on fixed windows, and the perplexity of the
   committed held-out sample (``trained-heldout.txt``, a few KB of held-out files) computed the way
   tests/test_trained_fixture.py computes it (independent windows of ``SEQ`` tokens).
5. Weights rounded per tensor to a power-of-two grid with 6, 7 or 8 bits of magnitude (exact in
   fp32 and fp16; makes the xz files several times smaller): the fewest bits whose held-out
   perplexity moves by less than ``MAX_ROUNDING_PPL_CHANGE`` are kept (every figure is recorded).
6. Exports with make_fixtures.py's torch exporters (the same flat wrapper, manifest entry, check
   against transformers' greedy run in onnxruntime, xz storage): ``trained-llama-torchscript``,
   ``trained-llama-dynamo23`` (opset 23, standard Attention; ``--exporter dynamo23-fp16`` adds a
   float16 one, not committed: another ~2.5 MB), each marked ``"trained": true`` with the training figures.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import platform
import sys
import sysconfig
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' trainer: one thread too
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (the exporters, manifest entry and storage are shared)

SEED = 1234
VOCAB = 1024
SEQ = 256
BATCH = 8
HELDOUT_EVERY = 10  # file i (sorted) is held out when i % HELDOUT_EVERY == HELDOUT_EVERY - 1
EVAL_WINDOWS = 48  # windows of SEQ tokens per split for the train / held-out figures
SAMPLE_BYTES = 6000  # the committed held-out text sample (see heldout_sample)
SAMPLE_PIECES = 6
ROUND_BITS = (6, 7, 8)  # the fewest bits whose held-out perplexity change is below the bound is kept
MAX_ROUNDING_PPL_CHANGE = 0.01  # relative
PREFIX = "trained-llama"
TOKENIZER_FILE = "trained-tokenizer.json"
HELDOUT_FILE = "trained-heldout.txt"
EOT = "<|endoftext|>"

CONFIG: Dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                              max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True,
                              bos_token_id=0, eos_token_id=0, pad_token_id=0)
EXPORTS = ["torchscript", "dynamo23", "dynamo23-fp16"]
DEFAULT_EXPORTS = ["torchscript", "dynamo23"]  # the fp16 export would add another ~2.5 MB


# -- text and tokenizer --------------------------------------------------------------------------
def source_files() -> Tuple[str, List[str]]:
    """The standard library's folder and its ``*.py`` files (relative, sorted), tests excluded."""
    root = sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        out += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames if f.endswith(".py")]
    return root, sorted(out)


def split(files: List[str]) -> Tuple[List[str], List[str]]:
    """(train, held-out): whole files, every HELDOUT_EVERY-th one held out."""
    held = [f for i, f in enumerate(files) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    train = [f for i, f in enumerate(files) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1]
    return train, held


def read_texts(root: str, files: List[str]) -> List[str]:
    out = []
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            out.append(fh.read())
    return out


def train_tokenizer(texts: List[str]) -> Any:
    """Byte-level BPE of VOCAB tokens (id 0: the end-of-text separator)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok: Any, texts: List[str]) -> Any:
    """All texts as one int64 token stream, files separated by the end-of-text token."""
    import numpy as np

    eot = tok.token_to_id(EOT)
    ids: List[int] = []
    for enc in tok.encode_batch(texts):
        ids += enc.ids
        ids.append(eot)
    return np.asarray(ids, dtype=np.int64)


def heldout_sample(texts: List[str]) -> str:
    """About SAMPLE_BYTES of held-out text: SAMPLE_PIECES pieces of whole lines, each from the
    middle of one held-out file (the first files of at least 4 KB), so that the sample is code
    like the rest of the split rather than one file's license header and docstring."""
    out: List[str] = []
    budget = SAMPLE_BYTES // SAMPLE_PIECES
    for text in [t for t in texts if len(t) >= 4096][:SAMPLE_PIECES]:
        lines = text.splitlines(keepends=True)
        piece, n = [], 0
        for line in lines[len(lines) // 2:]:
            if n + len(line) > budget:
                break
            piece.append(line)
            n += len(line)
        out.append("".join(piece))
    return "".join(out)


# -- model, training, evaluation -----------------------------------------------------------------
def build_model() -> Any:
    import torch
    import transformers

    torch.manual_seed(SEED)
    config = transformers.LlamaConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(config)


def windows(stream: Any, n: int, seed: int) -> Any:
    """``n`` fixed windows of SEQ tokens at seeded offsets ([n, SEQ])."""
    import numpy as np

    starts = np.random.default_rng(seed).integers(0, len(stream) - SEQ, n)
    return np.stack([stream[s:s + SEQ] for s in starts])


def mean_loss(model: Any, batch: Any) -> float:
    """Mean next-token cross entropy (nats) over every position of the windows."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(batch), 8):
            x = torch.from_numpy(batch[i:i + 8])
            logits = model(input_ids=x).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                     reduction="sum")
            total += float(loss)
            count += x[:, 1:].numel()
    return total / count


def sample_perplexity(model: Any, ids: List[int]) -> float:
    """Perplexity of a token list in independent windows of SEQ tokens (each window's first token
    is context only), as tests/test_trained_fixture.py computes it."""
    import numpy as np
    import torch

    model.eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, SEQ):
            w = ids[s:s + SEQ]
            if len(w) < 2:
                break
            x = torch.tensor([w])
            logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].double(), -1)
            nll -= float(logp[np.arange(len(w) - 1), x[0, 1:]].sum())
            count += len(w) - 1
    return math.exp(nll / count)


def train(model: Any, stream: Any, seconds: float, steps: Optional[int], lr: float) -> Dict[str, Any]:
    """AdamW on random SEQ-token windows until the time (or step) budget is spent."""
    import numpy as np
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(SEED)
    warmup = 20
    t0 = time.perf_counter()
    step, tokens, loss_ema = 0, 0, None
    model.train()
    while True:
        elapsed = time.perf_counter() - t0
        frac = step / steps if steps else elapsed / seconds
        if frac >= 1.0:
            break
        scale = min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        starts = rng.integers(0, len(stream) - SEQ - 1, BATCH)
        x = torch.from_numpy(np.stack([stream[s:s + SEQ] for s in starts]))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        value = loss.item()
        loss_ema = value if loss_ema is None else 0.9 * loss_ema + 0.1 * value
        if step % 10 == 0 or step == 1:
            el = time.perf_counter() - t0
            print(f"step {step:5d}  loss {value:.3f} (ema {loss_ema:.3f})  lr {lr * scale:.2e}  "
                  f"{tokens / el:7.0f} tok/s  {el:6.1f} s", flush=True)
    return {"steps": step, "tokens_seen": tokens, "seconds": round(time.perf_counter() - t0, 1),
            "batch": BATCH, "seq": SEQ, "lr": lr, "optimizer": "AdamW(betas=(0.9, 0.95), weight_decay=0.1)",
            "last_batch_loss_ema": round(loss_ema or float("nan"), 4)}


def round_weights(model: Any, bits: int) -> Any:
    """A copy with each tensor rounded to multiples of a power of two chosen so that its largest
    magnitude needs at most ``bits`` bits (values exact in fp32 and fp16)."""
    import torch

    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            m = float(p.abs().max())
            if m == 0.0:
                continue
            q = 2.0 ** math.floor(math.log2(m / (2 ** (bits - 1) - 1)))
            p.copy_(torch.round(p / q) * q)
    return out


def figures(model: Any, train_w: Any, held_w: Any, sample_ids: List[int]) -> Dict[str, float]:
    tr, he = mean_loss(model, train_w), mean_loss(model, held_w)
    return {"train_loss": round(tr, 4), "train_perplexity": round(math.exp(tr), 3),
            "heldout_loss": round(he, 4), "heldout_perplexity": round(math.exp(he), 3),
            "heldout_sample_perplexity": round(sample_perplexity(model, sample_ids), 3)}


# -- main ----------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=22.0, help="training wall time (default 22)")
    ap.add_argument("--steps", type=int, default=None, help="train this many steps instead of a time budget")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--exporter", nargs="*", default=DEFAULT_EXPORTS, choices=EXPORTS)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    t_start = time.perf_counter()
    root, files = source_files()
    train_files, held_files = split(files)
    train_texts, held_texts = read_texts(root, train_files), read_texts(root, held_files)
    tok = train_tokenizer(train_texts)
    train_stream, held_stream = encode_stream(tok, train_texts), encode_stream(tok, held_texts)
    sample = heldout_sample(held_texts)
    sample_ids = tok.encode(sample).ids
    print(f"stdlib {platform.python_version()}: {len(train_files)} train files ({len(train_stream)} tokens), "
          f"{len(held_files)} held-out ({len(held_stream)} tokens); sample {len(sample)} B = {len(sample_ids)} tokens; "
          f"{time.perf_counter() - t_start:.1f} s", flush=True)

    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters", flush=True)
    run = train(model, train_stream, args.minutes * 60.0, args.steps, args.lr)
    model.eval()
    train_w, held_w = windows(train_stream, EVAL_WINDOWS, SEED + 1), windows(held_stream, EVAL_WINDOWS, SEED + 2)
    exact = figures(model, train_w, held_w, sample_ids)
    print(f"trained: {exact}", flush=True)
    final, tried, kept = exact, {}, None
    for bits in ROUND_BITS:
        candidate = round_weights(model, bits)
        fig = figures(candidate, train_w, held_w, sample_ids)
        change = fig["heldout_perplexity"] / exact["heldout_perplexity"] - 1.0
        tried[str(bits)] = {"heldout_perplexity": fig["heldout_perplexity"], "change": round(change, 5)}
        print(f"rounded to {bits} bits: {fig} (held-out perplexity {change:+.2%})", flush=True)
        if abs(change) < MAX_ROUNDING_PPL_CHANGE:
            model, final, kept = candidate, fig, bits
            break
    print(f"weights: {'rounded to %d bits' % kept if kept else 'not rounded'}", flush=True)

    os.makedirs(mf.OUT_DIR, exist_ok=True)
    tok.save(os.path.join(mf.OUT_DIR, TOKENIZER_FILE))
    with open(os.path.join(mf.OUT_DIR, HELDOUT_FILE), "w", encoding="utf-8") as f:
        f.write(sample)
    training = {
        "corpus": "Python standard library *.py (no site-packages/test folders), sorted relative paths",
        "python": platform.python_version(), "files_train": len(train_files), "files_heldout": len(held_files),
        "heldout_rule": f"file index % {HELDOUT_EVERY} == {HELDOUT_EVERY - 1}",
        "tokens_train": int(len(train_stream)), "tokens_heldout": int(len(held_stream)),
        "tokenizer": f"byte-level BPE, vocab {VOCAB}, trained on the train split ({TOKENIZER_FILE})",
        "heldout_text": HELDOUT_FILE, "heldout_text_tokens": len(sample_ids),
        "parameters": n_params, "threads": 1, "seed": SEED, **run,
        "eval": f"{EVAL_WINDOWS} seeded windows of {SEQ} tokens per split; the sample in independent windows of {SEQ}",
        "unrounded": exact, "rounding": {"bits_kept": kept, "max_relative_change": MAX_ROUNDING_PPL_CHANGE, "tried": tried},
        **final,
    }
    manifest = mf.load_manifest()
    for name in [n for n in manifest["fixtures"] if n.startswith(PREFIX + "-")]:  # this script's, remade below
        path = os.path.join(mf.OUT_DIR, manifest["fixtures"].pop(name)["file"])
        if os.path.exists(path):
            os.remove(path)
    model.config.use_cache = True
    want = mf.hf_greedy(model)
    model16 = copy.deepcopy(model).half()
    want16 = mf.hf_greedy(model16)
    kv, hd = mf.kv_geometry(model)
    cfg = {"class": "LlamaConfig", **CONFIG}
    with tempfile.TemporaryDirectory() as work:
        for exporter in args.exporter:
            fp16 = exporter.endswith("-fp16")
            name = f"{PREFIX}-{exporter}"
            m, _ = mf.run_export("llama", exporter, model16 if fp16 else model, "", work)
            entry = mf.describe(m, "llama", exporter, cfg, None, kv, hd)
            data = m.SerializeToString()
            entry["matches_transformers"] = mf.check_export(entry, data, want16 if fp16 else want)
            entry.update({"trained": True, "tokenizer": TOKENIZER_FILE, "heldout_text": HELDOUT_FILE,
                          "training": training})
            mf.store_fixture(manifest, name, data, entry)
            chk = entry["matches_transformers"]
            print(f"{name}: {len(m.graph.node)} nodes, {len(data)} B -> {entry['xz_bytes']} B xz; vs transformers: "
                  f"tokens {'equal' if chk['tokens_equal'] else 'DIFFER'}, max logit diff "
                  f"{chk['max_abs_logit_diff']:.2g}", flush=True)
    mf.save_manifest(manifest)
    print(f"done in {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
