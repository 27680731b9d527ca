"""The demo job, in two parts.

1. Generation: greedy decoding with :func:`onnx_light_kv.generate` and the
   :class:`onnx_light_kv.Generator` on the built-in Llama-style ONNX decoder
   (``onnx_light_kv.models``): our cache path (GenerationState) and tensor
   path side by side with onnxruntime when it is installed: identical tokens
   are checked, per-step latencies printed and plotted against the context.
2. KV cache: a synthetic decode loop over a :class:`KVCache` as a
   cache-aware generation loop drives it (prefill, then one token per
   step), with decode attention each step checked against numpy on a sample
   of steps; prints the cache's info table, the append/attention counters
   and timing figures (median and p90 per step, effective K+V bandwidth).
"""

from __future__ import annotations

import argparse
import os
import tempfile
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
    p.add_argument("--plot", default=os.path.join(tempfile.gettempdir(), "onnx_light_kv_demo_generation.png"),
                   help="PNG of the generation part's step latency vs context ('' for none)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                   help="progress bars on stderr (needs the 'progress' extra, tqdm; default: when stderr is a terminal)")


def _steps(n: int, desc: str, args: Any) -> Any:
    """range(n), with a progress bar when asked for (or stderr is a terminal) and tqdm is installed."""
    import sys

    from ._optional import available, progress

    show = getattr(args, "progress", None)
    if show is None:
        show = sys.stderr.isatty()
    elif show and not available("tqdm"):  # asked for: say why there is no bar
        print("  (tqdm not installed: no progress bars; pip install 'onnx-light-kv[progress]' adds it)")
        args.progress = False  # (said once)
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


def _timed_generation(session: Any, prompt: np.ndarray, n: int, state_options: Any) -> Any:
    """Greedy generation step by step with the :class:`~onnx_light_kv.Generator`: returns the
    tokens, the prefill time and the time of each later step (model run + the Python loop)."""
    import onnx_light_kv as olkv

    g = olkv.Generator(session, max_length=prompt.shape[1] + n, state_options=state_options)
    t = time.perf_counter()
    g.append_tokens(prompt)
    prefill = time.perf_counter() - t
    g.generate_next_token()  # from the prefill's logits
    steps = []
    while not g.is_done():
        t = time.perf_counter()
        g.generate_next_token()
        steps.append(time.perf_counter() - t)
    kind = g.runner_kind
    tokens = g.sequences[0, prompt.shape[1]:]
    g.close()
    return tokens, prefill, np.array(steps), kind


#: the image formats matplotlib's Agg backend writes (by file extension)
_PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "ps", "eps", "jpg", "jpeg", "tif", "tiff", "webp", "pgf", "raw", "rgba")


def _plot_path(path: str) -> str:
    """Where ``--plot`` writes: a folder gets the default file name, a name without an extension
    ``.png`` (what savefig would write)."""
    if os.path.isdir(path):
        return os.path.join(path, "onnx_light_kv_demo_generation.png")
    if not os.path.splitext(path)[1]:
        return path + ".png"
    return path


def _check_plot(path: str) -> None:
    """``ValueError`` unless the plot can be written at ``path`` (checked before anything runs)."""
    out = _plot_path(path)
    ext = os.path.splitext(out)[1][1:].lower()
    if ext not in _PLOT_FORMATS:
        raise ValueError(f"--plot {path!r}: format {ext!r} is not one matplotlib writes (.png, .pdf, .svg, ...)")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise ValueError(f"--plot {path!r}: no folder {folder!r}")
    if not os.access(folder, os.W_OK) or (os.path.exists(out) and not os.access(out, os.W_OK)):
        raise ValueError(f"--plot {path!r}: cannot write there")


def _plot(path: str, prompt_len: int, series: Any) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib not installed: no plot; pip install 'onnx-light-kv[plot]' adds it)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, steps in series.items():
        ax.plot(np.arange(prompt_len + 2, prompt_len + 2 + steps.size), steps * 1e3, label=name, lw=1)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode step (ms)")
    ax.set_title("greedy decode step latency vs context")
    ax.legend()
    fig.tight_layout()
    path = _plot_path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"  plot: {path}")


def run_generation(args: Any) -> bool:
    """Part 1: greedy generation on the built-in decoder with ``generate`` / ``Generator``:
    our cache path and tensor path vs onnxruntime (tensor path), tokens checked identical."""
    import onnx_light_kv as olkv
    from onnx_light_kv import models

    cfg = models.DecoderConfig(layers=4, hidden=512, q_heads=8, kv_heads=4, head_dim=64, vocab=8192,
                               max_positions=args.gen_prompt + args.gen_steps + 8, seed=args.seed)
    model = models.build("llama", cfg)
    data = models.model_bytes(model)
    print(f"\n[1] greedy generation: built-in Llama-style decoder ({cfg.layers} layers, hidden {cfg.hidden}, "
          f"{cfg.q_heads}/{cfg.kv_heads} heads x {cfg.head_dim}, vocab {cfg.vocab}, "
          f"{len(data) / 2**20:.1f} MiB), prompt {args.gen_prompt}, {args.gen_steps} new tokens")
    prompt = np.random.default_rng(args.seed).integers(0, cfg.vocab, size=(1, args.gen_prompt))
    try:
        ours = olkv.InferenceSession(data, threads=args.threads or None)
    except NotImplementedError as e:  # the runtime does not run this model yet
        print(f"  skipped: {e}")
        return True
    out = olkv.generate(ours, prompt, max_new_tokens=args.gen_steps)
    print(f"  generate(): {out.stats.summary()} [{out.stats.runner} path]")
    runs = {}
    if hasattr(ours, "create_state"):
        runs["onnx-light-kv cache path"] = _timed_generation(ours, prompt, args.gen_steps, None)
    runs["onnx-light-kv tensor path"] = _timed_generation(ours, prompt, args.gen_steps, False)
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = olkv.get_threads()
        so.inter_op_num_threads = 1
        theirs = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        runs["onnxruntime"] = _timed_generation(theirs, prompt, args.gen_steps, False)
    print(f"  {'runtime / path':<26} {'prefill ms':>10} {'step ms median':>15} {'p90':>7} {'tokens/s':>9}")
    for name, (_, prefill, steps, _) in runs.items():
        ms = steps * 1e3
        print(f"  {name:<26} {prefill * 1e3:10.2f} {np.median(ms):15.2f} {np.percentile(ms, 90):7.2f} "
              f"{1e3 / np.median(ms):9.1f}")
    tokens = out.new_tokens[0]
    print(f"  tokens: {' '.join(map(str, tokens[:16]))}{' ...' if len(tokens) > 16 else ''}")
    if args.plot:
        _plot(args.plot, args.gen_prompt, {k: v[2] for k, v in runs.items()})
    same = all(np.array_equal(tokens, r[0]) for r in runs.values())
    names = ", ".join(runs)
    print(f"  check: identical greedy tokens from generate() and {names}: {same} -> {'OK' if same else 'FAILED'}")
    if "onnxruntime" not in runs:
        print("  (onnxruntime not installed: no comparison; pip install 'onnx-light-kv[ort]' adds it)")
    return same


def check_arguments(args: Any) -> None:
    """Check every numeric option before anything runs, so a mistake in the second part's options
    does not surface after the first part (``ValueError`` naming the option)."""
    from ._validate import INT64_MAX, integer

    for name, lo in (("batch", 1), ("q_heads", 1), ("kv_heads", 1), ("head_dim", 1), ("prompt", 0),
                     ("steps", 1), ("threads", 0), ("check_every", 0), ("gen_steps", 0), ("gen_prompt", 1),
                     ("seed", 0)):
        integer(getattr(args, name), "--" + name.replace("_", "-"), lo=lo, hi=1024 if name == "threads" else INT64_MAX)
    if args.q_heads % args.kv_heads:
        raise ValueError(f"--q-heads ({args.q_heads}) must be a multiple of --kv-heads ({args.kv_heads})")
    if args.plot and args.gen_steps > 0:
        _check_plot(args.plot)


def run(args: Any) -> int:
    """Run the demo; returns the process exit code (1 if a check failed)."""
    import onnx_light_kv as olkv

    check_arguments(args)
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
    print(f"\n{'per decode step (microseconds)':<31}{'median':>9} {'p90':>8}")
    print(f"  {'append 1 token':<29}{np.median(ta):9.1f} {np.percentile(ta, 90):8.1f}")
    print(f"  {f'attention (len {args.prompt}..{cap})':<29}{np.median(tt):9.1f} {np.percentile(tt, 90):8.1f}")
    print(f"  effective K+V read at the last step: {last_bytes / (tt[-16:].mean() * 1e-6) / 1e9:.1f} GB/s")
    ok = worst <= tol
    print(f"\ncheck vs numpy reference: max |diff| = {worst:.2e} (tolerance {tol:g} for {args.dtype}) -> "
          f"{'OK' if ok else 'FAILED'}")
    cache.close()
    return 0 if ok and gen_ok else 1
