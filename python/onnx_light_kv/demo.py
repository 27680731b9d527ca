"""The demo job, in two parts.

1. Generation: greedy decoding with the built-in Llama-style ONNX decoder
   (``onnx_light_kv.models``) through :class:`InferenceSession` on the
   standard tensor past/present path, side by side with onnxruntime when it
   is installed: identical tokens are checked, per-step latencies printed.
2. KV cache: a synthetic decode loop over a :class:`KVCache` as a
   cache-aware generation loop drives it (prefill, then one token per
   step), with decode attention each step checked against numpy on a sample
   of steps; prints the cache's info table, the append/attention counters
   and timing figures (median and p90 per step, effective K+V bandwidth).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ._format import human_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the demo's command-line options."""
    p.add_argument("--batch", type=int, default=1, help="sequences in the KV-cache part")
    p.add_argument("--q-heads", type=int, default=32, help="query heads in the KV-cache part")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads in the KV-cache part")
    p.add_argument("--head-dim", type=int, default=128, help="elements per head in the KV-cache part")
    p.add_argument("--prompt", type=int, default=512, help="prefill tokens in the KV-cache part")
    p.add_argument("--steps", type=int, default=256, help="decode steps in the KV-cache part")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="cache storage type in the KV-cache part")
    p.add_argument("--threads", type=int, default=0, help="kernel threads (0: all CPUs)")
    p.add_argument("--check-every", type=int, default=32, help="compare with numpy every N steps (0: never)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random model weights and data")
    p.add_argument("--gen-steps", type=int, default=32, help="greedy tokens in the generation part (0: skip it)")
    p.add_argument("--gen-prompt", type=int, default=64, help="prompt tokens in the generation part")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                   help="progress bars on stderr (needs the 'progress' extra, tqdm; default: when stderr is a terminal)")


def _steps(n: int, desc: str, args: Any) -> Any:
    """range(n), with a progress bar when asked for (or stderr is a terminal) and tqdm is installed."""
    import sys

    from ._optional import progress

    show = getattr(args, "progress", None)
    if show is None:
        show = sys.stderr.isatty()
    return progress(range(n), total=n, desc=desc, enable=bool(show))


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """numpy decode attention for one new token: q [B,Hq,1,D], k/v [B,Hkv,L,D]."""
    group = q.shape[1] // k.shape[1]
    kk = np.repeat(k.astype(np.float64), group, axis=1)
    vv = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk) * scale
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, vv).astype(np.float32)


class _Timed:
    """Wraps a session and records the wall time of every run call."""

    def __init__(self, session: Any) -> None:
        self.session, self.times = session, []

    def get_inputs(self) -> Any:
        return self.session.get_inputs()

    def run(self, names: Any, feeds: Any) -> Any:
        t = time.perf_counter()
        out = self.session.run(names, feeds)
        self.times.append(time.perf_counter() - t)
        return out


def run_generation(args: Any) -> bool:
    """Part 1: greedy generation on the built-in decoder, ours vs onnxruntime."""
    import onnx_light_kv as olkv
    from onnx_light_kv import models

    cfg = models.DecoderConfig(layers=4, hidden=512, q_heads=8, kv_heads=4, head_dim=64, vocab=8192,
                               max_positions=args.gen_prompt + args.gen_steps + 8, seed=args.seed)
    model = models.build("llama", cfg)
    data = models.model_bytes(model)
    print(f"\n[1] greedy generation: built-in Llama-style decoder ({cfg.layers} layers, hidden {cfg.hidden}, "
          f"{cfg.q_heads}/{cfg.kv_heads} heads x {cfg.head_dim}, vocab {cfg.vocab}, "
          f"{len(data) / 2**20:.1f} MiB), prompt {args.gen_prompt}, {args.gen_steps} new tokens, tensor past/present")
    prompt = np.random.default_rng(args.seed).integers(0, cfg.vocab, size=(1, args.gen_prompt))
    runs = {}
    try:
        ours = _Timed(olkv.InferenceSession(data, threads=args.threads or None))
    except NotImplementedError as e:  # the runtime does not run this model yet
        print(f"  skipped: {e}")
        return True
    runs["onnx-light-kv"] = (ours, models.greedy_generate(ours, model, prompt, args.gen_steps))
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = olkv.get_threads()
        so.inter_op_num_threads = 1
        theirs = _Timed(ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]))
        runs["onnxruntime"] = (theirs, models.greedy_generate(theirs, model, prompt, args.gen_steps))
    print(f"  {'runtime':<14} {'prefill ms':>10} {'step ms median':>15} {'p90':>7} {'tokens/s':>9}")
    for name, (timed, _) in runs.items():
        steps = np.array(timed.times[1:]) * 1e3
        print(f"  {name:<14} {timed.times[0] * 1e3:10.2f} {np.median(steps):15.2f} {np.percentile(steps, 90):7.2f} "
              f"{1e3 / np.median(steps):9.1f}")
    tokens = runs["onnx-light-kv"][1].tokens[0]
    print(f"  tokens: {' '.join(map(str, tokens[:16]))}{' ...' if len(tokens) > 16 else ''}")
    if "onnxruntime" not in runs:
        print("  (onnxruntime not installed: no comparison; pip install 'onnx-light-kv[ort]' adds it)")
        return True
    same = np.array_equal(tokens, runs["onnxruntime"][1].tokens[0])
    diff = float(np.max(np.abs(runs["onnx-light-kv"][1].logits - runs["onnxruntime"][1].logits)))
    print(f"  check vs onnxruntime: identical greedy tokens: {same}; max |logit diff| = {diff:.2e} -> "
          f"{'OK' if same else 'FAILED'}")
    return same


def run(args: Any) -> int:
    """Run the demo; returns the process exit code (1 if a check failed)."""
    import onnx_light_kv as olkv

    olkv.set_threads(args.threads or None)
    info = olkv.build_info()
    print(f"onnx-light-kv {info['version']} | {info['cpu']} | kernel {info['attention_kernel']} | "
          f"threads {olkv.get_threads()}")
    gen_ok = run_generation(args) if args.gen_steps > 0 else True
    print(f"\n[2] KV cache decode loop: batch {args.batch}, {args.q_heads}/{args.kv_heads} heads x {args.head_dim}, "
          f"{args.dtype}, prompt {args.prompt}, {args.steps} steps")
    rng = np.random.default_rng(args.seed)
    B, Hq, Hkv, D = args.batch, args.q_heads, args.kv_heads, args.head_dim
    cap = args.prompt + args.steps
    cache = olkv.KVCache(B, Hkv, D, dtype=args.dtype, capacity=cap)
    k0 = rng.standard_normal((B, Hkv, args.prompt, D), dtype=np.float32)
    v0 = rng.standard_normal((B, Hkv, args.prompt, D), dtype=np.float32)
    t0 = time.perf_counter()
    cache.append(k0, v0)
    prefill = time.perf_counter() - t0
    print(f"prefill: appended {args.prompt} tokens in {prefill * 1e3:.2f} ms")

    tol = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}[args.dtype]
    scale = 1.0 / np.sqrt(D)
    t_append, t_attn = [], []
    worst = 0.0
    out = np.empty((B, Hq, 1, D), dtype=np.float32)
    cache.reset_counters()
    for step in _steps(args.steps, "decode", args):
        k = rng.standard_normal((B, Hkv, 1, D), dtype=np.float32)
        v = rng.standard_normal((B, Hkv, 1, D), dtype=np.float32)
        q = rng.standard_normal((B, Hq, 1, D), dtype=np.float32)
        a = time.perf_counter()
        cache.append(k, v)
        b = time.perf_counter()
        olkv.attention(q, cache, out=out)
        c = time.perf_counter()
        t_append.append(b - a)
        t_attn.append(c - b)
        if args.check_every and (step % args.check_every == 0 or step == args.steps - 1):
            kk, vv = cache.export(dtype="float32")
            ref = reference_attention(q, kk, vv, scale)
            worst = max(worst, float(np.max(np.abs(out - ref))))
    counters = cache.counters
    i = cache.info()
    print("\ncache info")
    for key in ("dtype", "layout", "batch", "kv_heads", "head_dim_k", "capacity", "committed_bytes",
                "live_bytes", "page_table_bytes"):
        val = i[key]
        print(f"  {key:<17} {human_bytes(val) if key.endswith('bytes') else val}")
    print(f"  {'lengths':<17} {i['lengths']}")
    row = B * Hkv * 2 * D * cache.dtype.itemsize
    print("\ncounters over the decode loop")
    print(f"  append bytes     {human_bytes(counters['append_bytes'])} "
          f"(= {counters['append_bytes'] // row} tokens x {human_bytes(row)}: only new tokens copied)")
    print(f"  attention bytes  {human_bytes(counters['attention_bytes'])} read in {counters['attention_calls']} calls")
    ta, tt = np.array(t_append) * 1e6, np.array(t_attn) * 1e6
    last_bytes = cap * row
    print("\nper decode step (microseconds)      median      p90")
    print(f"  append 1 token                 {np.median(ta):9.1f} {np.percentile(ta, 90):8.1f}")
    print(f"  attention (len {args.prompt}..{cap}) {np.median(tt):9.1f} {np.percentile(tt, 90):8.1f}")
    print(f"  effective K+V read at the last step: {last_bytes / (tt[-16:].mean() * 1e-6) / 1e9:.1f} GB/s")
    ok = worst <= tol
    print(f"\ncheck vs numpy reference: max |diff| = {worst:.2e} (tolerance {tol:g} for {args.dtype}) -> "
          f"{'OK' if ok else 'FAILED'}")
    cache.close()
    return 0 if ok and gen_ok else 1
