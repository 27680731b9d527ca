"""Per-decode-step latency of the built-in Llama decoder on the tensor path: ours vs onnxruntime.

Both runtimes run the same standard ONNX model (``onnx_light_kv.models.llama_decoder``: RMSNorm,
RotaryEmbedding, Attention-23 with past/present) with the same thread count. One decode step
feeds one token plus a past of ``context`` tokens per layer and returns logits and the present
tensors; by the tensor-path contract every step copies the whole past into the present. That is
the baseline the cache-aware path must beat.

Measurement: for each context and thread count, the two runtimes are timed in alternating
rounds (ours, ort, ours, ort, ...) on identical feeds after warm-up; each sample is one
``run()`` call measured with ``perf_counter_ns``. The past is random (its values do not change
the work). ``--mode fixed`` (default) does not grow it between samples, so every sample of a
row has the same context; ``--mode growing`` runs real decode loops from that context, each
step feeding its present back as the next past (every step then works on new, larger
tensors, which exposes allocation costs), two bursts per runtime, alternating.
``--mode prefill`` times the prompt instead: ``context`` new tokens with an empty past (the
first call of a generation), in the same alternating blocks as ``fixed``.
``--profile`` adds our per-op time per step (fixed contexts, a profiled session).

Output: a printed table (median, p10, p90 per runtime, and ``speedup``: onnxruntime's median
time / ours, > 1 means we are faster), raw samples
plus environment in ``benchmarks/results/tensor-decode-<timestamp>.json`` and a PNG plot next to
it. ``--quick`` uses a small model and short contexts (seconds); the default is 4 layers,
hidden 1024, 16/8 heads, head_dim 64, vocab 32000, contexts 128..4096, threads 1 and 2.
``--runtimes ort`` measures onnxruntime alone (while our InferenceSession is not available);
``--runtimes`` takes ``ours`` and/or ``ort``, space-separated.
``--kernel avx2 avx512 go auto`` runs our session on each named kernel path (attention and
matrix kernels, as ``onnx_light_kv.set_kernel``), side by side in the same alternating rounds
(runtimes ``ours-avx2``, ``ours-avx512``; one speed-up column per path); ``auto`` alone, the
default, keeps the single runtime ``ours`` on the best path. The output and the JSON name the
CPU, its flags and the attention and matrix kernel paths that ran.

Run: ``python benchmarks/bench_tensor_decode.py --quick``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: ``--runtimes``: our InferenceSession and onnxruntime's.
RUNTIMES = ("ours", "ort")


def load_models() -> Any:
    """``onnx_light_kv.models`` (from the source file when the package cannot import)."""
    try:
        from onnx_light_kv import models
        return models
    except Exception:
        spec = importlib.util.spec_from_file_location("_olkv_models_src", os.path.join(ROOT, "python", "onnx_light_kv", "models.py"))
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod


def make_session(runtime: str, model_bytes: bytes, threads: int) -> Any:
    """A session of ``runtime`` ("ours" or "ort") with ``threads`` intra-op threads."""
    if runtime == "ort":
        from onnx_light_kv._optional import require

        onnxruntime = require("onnxruntime")  # ImportError naming the 'ort' extra when missing
        so = _common.ort_session_options(onnxruntime, threads)
        return onnxruntime.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    import onnx_light_kv
    return onnx_light_kv.InferenceSession(model_bytes, threads=threads)


class OnKernel:
    """A session whose ``run`` first selects attention kernel path ``path`` (a pointer store)."""

    def __init__(self, sess: Any, path: str):
        self.sess, self.path = sess, path

    def run(self, *args: Any, **kwargs: Any) -> Any:
        import onnx_light_kv
        onnx_light_kv.set_kernel(self.path)
        return self.sess.run(*args, **kwargs)


def expand_runtimes(runtimes: List[str], kernel: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """The runtime names with ``ours`` replaced by one ``ours-<path>`` per kernel path of
    ``kernel`` (kept as ``ours`` for the default ``auto`` alone), and the path of each."""
    if "ours" not in runtimes or kernel == ["auto"]:
        return runtimes, {}
    # exit status 2 when none of the paths is available (not a table without our runtime)
    paths = {f"ours-{run}": run for _, run in _common.kernel_runs(kernel, required=True)}
    out: List[str] = []
    for r in runtimes:
        out.extend(paths if r == "ours" else [r])
    return out, paths


def prefill_feeds(models: Any, cfg: Any, prompt: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
    """Feeds of a prefill of ``prompt`` tokens with an empty past (batch 1)."""
    feeds: Dict[str, np.ndarray] = {"input_ids": rng.integers(cfg.vocab, size=(1, prompt)).astype(np.int64),
                                    "position_ids": np.arange(prompt, dtype=np.int64)[None]}
    for name in models.past_names(cfg.layers):
        feeds[name] = np.zeros((1, cfg.kv_heads, 0, cfg.head_dim), cfg.np_dtype)
    return feeds


def decode_feeds(models: Any, cfg: Any, context: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
    """Feeds of one decode step at ``context`` past tokens (batch 1)."""
    feeds: Dict[str, np.ndarray] = {"input_ids": np.array([[int(rng.integers(cfg.vocab))]], np.int64),
                                    "position_ids": np.array([[context]], np.int64)}
    shape = (1, cfg.kv_heads, context, cfg.head_dim)
    for name in models.past_names(cfg.layers):
        feeds[name] = rng.standard_normal(shape).astype(cfg.np_dtype)
    return feeds


def growing_bursts(models: Any, cfg: Any, sessions: Dict[str, Any], feeds: Dict[str, np.ndarray], out_names: List[str],
                   samples: int, warmup: int) -> Dict[str, List[float]]:
    """Per-step ms of decode loops starting at the feeds' context, present fed back as past.

    Each runtime runs two bursts of ``samples // 2`` timed steps (after ``warmup`` untimed
    ones), alternating ours / ort, so drift hits both alike. Each burst starts after a 50 ms
    pause, so the other runtime's worker threads have stopped spinning (see
    ``_common.blocked``)."""
    out: Dict[str, List[float]] = {r: [] for r in sessions}
    pasts = models.past_names(cfg.layers)
    start = feeds[pasts[0]].shape[2]
    for _ in range(2):
        for r, sess in sessions.items():
            time.sleep(0.05)
            f = dict(feeds)
            for step in range(warmup + max(1, samples // 2)):
                f["position_ids"] = np.array([[start + step]], np.int64)
                t0 = time.perf_counter_ns()
                res = sess.run(out_names, f)
                dt = (time.perf_counter_ns() - t0) / 1e6
                if step >= warmup:
                    out[r].append(dt)
                f["input_ids"] = np.argmax(res[0][:, -1:, :], axis=-1).astype(np.int64)
                f.update(zip(pasts, res[1:]))
    return out


def op_profile(models: Any, cfg: Any, model_bytes: bytes, args: argparse.Namespace,
               out_names: List[str]) -> List[Dict[str, Any]]:
    """Median per-op milliseconds of one decode step, per context (our profiling events)."""
    import onnx_light_kv
    sess = onnx_light_kv.InferenceSession(model_bytes, threads=1, profile=True)
    rng = np.random.default_rng(1)
    meds: List[Tuple[int, Dict[str, float]]] = []
    for context in args.contexts:
        feeds = decode_feeds(models, cfg, context, rng)
        per_op: Dict[str, List[float]] = {}
        for i in range(args.warmup + 5):
            sess.run(out_names, feeds)
            if i < args.warmup:
                continue
            totals: Dict[str, float] = {}
            for ev in sess.last_run_stats.get("events", []):
                totals[ev["op"]] = totals.get(ev["op"], 0.0) + ev["dur_ns"] / 1e6
            for op, ms in totals.items():
                per_op.setdefault(op, []).append(ms)
        meds.append((context, {op: float(np.median(v)) for op, v in per_op.items()}))
    overall: Dict[str, float] = {}
    for _, med in meds:
        for op, ms in med.items():
            overall[op] = overall.get(op, 0.0) + ms
    top = [op for op, _ in sorted(overall.items(), key=lambda kv: -kv[1])[:4]]
    rows = []
    for context, med in meds:
        row: Dict[str, Any] = {"context": context, "total": sum(med.values())}
        row.update({op: med.get(op, 0.0) for op in top})
        row["other"] = sum(ms for op, ms in med.items() if op not in top)
        rows.append(row)
    return rows


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="small model, contexts 128..1024, few samples (where the other options are left at their defaults)")
    p.add_argument("--layers", type=_common.layers_arg, default=4)
    p.add_argument("--hidden", type=_common.positive_int, default=1024)
    p.add_argument("--q-heads", type=_common.positive_int, default=16, help="a multiple of --kv-heads")
    p.add_argument("--kv-heads", type=_common.positive_int, default=8)
    p.add_argument("--head-dim", type=_common.positive_int, default=64, help="even (rotary embeddings)")
    p.add_argument("--vocab", type=_common.positive_int, default=32000)
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--contexts", type=_common.positive_int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--threads", type=_common.threads_arg, nargs="+", default=[1, 2])
    p.add_argument("--samples", type=_common.positive_int, default=30, help="timed steps per (context, threads, runtime)")
    p.add_argument("--mode", choices=["fixed", "growing", "prefill"], default="fixed",
                   help="fixed: every sample at the same context; growing: a real decode loop from the context, "
                        "each step feeding its present back (new, larger tensors every step); prefill: the "
                        "contexts are prompt lengths, run with an empty past")
    p.add_argument("--warmup", type=_common.nonneg_int, default=3)
    p.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=list(RUNTIMES),
                   help="the runtimes to time side by side (default: both)")
    p.add_argument("--kernel", nargs="+", default=["auto"], choices=_common.KERNEL_CHOICES,
                   help="our kernel paths (attention and GEMM, as onnx_light_kv.set_kernel), run side by "
                        "side (default: auto, the best one)")
    p.add_argument("--name", default="tensor-decode", type=_common.name_arg, help="results file prefix")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="also record our per-op time per step (a separate profiled session, 1 thread)")
    _common.add_results_dir(p)
    a = p.parse_args(argv)
    a.runtimes = list(dict.fromkeys(a.runtimes))
    if a.quick:  # a small model, short contexts and few samples where the command line left the defaults
        _common.quick_defaults(p, a, {"layers": 2, "hidden": 256, "q_heads": 4, "kv_heads": 2, "head_dim": 64,
                                      "vocab": 4000, "contexts": [128, 256, 512, 1024], "samples": 10, "warmup": 2})
    if a.q_heads % a.kv_heads:
        p.error(f"--q-heads {a.q_heads} is not a multiple of --kv-heads {a.kv_heads}")
    if a.head_dim % 2:
        p.error(f"--head-dim must be even (rotary embeddings), got {a.head_dim}")
    return a


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    models = load_models()
    runtimes, kernel_of = expand_runtimes(args.runtimes, args.kernel)
    ours_names = [r for r in runtimes if r.startswith("ours")]
    cfg = models.DecoderConfig(layers=args.layers, hidden=args.hidden, q_heads=args.q_heads, kv_heads=args.kv_heads,
                               head_dim=args.head_dim, vocab=args.vocab, dtype=args.dtype,
                               max_positions=max(args.contexts) + 2 * (args.samples + args.warmup) + 2)
    model_bytes = models.model_bytes(models.llama_decoder(cfg))
    print(f"model: {cfg}  ({len(model_bytes) / 2 ** 20:.0f} MiB)", flush=True)
    out_names = ["logits"] + models.present_names(cfg.layers)
    rng = np.random.default_rng(0)

    kernels = None
    if ours_names:
        import onnx_light_kv
        kernels = {}
        for r in ours_names:
            onnx_light_kv.set_kernel(kernel_of.get(r, "auto"))
            info = onnx_light_kv.build_info()
            kernels[r] = {"requested": kernel_of.get(r, "auto"), "attention": info.get("attention_kernel"),
                          "gemm": info.get("gemm_kernel")}
            print(f"{r}: attention kernel {kernels[r]['attention']}, gemm {kernels[r]['gemm']}", flush=True)
        onnx_light_kv.set_kernel("auto")
        print(_common.isa_line(), flush=True)
    env_start = _common.environment(threads=None, extra={"threads_measured": args.threads, "kernels": kernels})
    rows: List[Dict[str, Any]] = []
    raw: List[Dict[str, Any]] = []
    for threads in args.threads:
        sessions = {r: make_session(r, model_bytes, threads) for r in runtimes if r not in kernel_of}
        if kernel_of:  # one session, run on each path
            ours_sess = make_session("ours", model_bytes, threads)
            sessions = {r: (OnKernel(ours_sess, kernel_of[r]) if r in kernel_of else sessions[r]) for r in runtimes}
        for context in _common.progress(args.contexts, desc=f"{threads} thread(s)"):
            feeds = (prefill_feeds if args.mode == "prefill" else decode_feeds)(models, cfg, context, rng)
            if args.mode in ("fixed", "prefill"):
                fns: Dict[str, Callable[[], Any]] = {r: (lambda s=s: s.run(out_names, feeds)) for r, s in sessions.items()}
                samples = _common.blocked(fns, repeat=args.samples, warmup=args.warmup)
            else:
                samples = growing_bursts(models, cfg, sessions, feeds, out_names, args.samples, args.warmup)
            row: Dict[str, Any] = {"mode": args.mode, "threads": threads, "context": context}
            for r in runtimes:
                st = _common.summarize(samples[r])
                row.update({f"{r}_median_ms": st["median"], f"{r}_p10_ms": st["p10"], f"{r}_p90_ms": st["p90"]})
                raw.append({"runtime": r, "mode": args.mode, "threads": threads, "context": context,
                            "samples_ms": samples[r], **st})
            for r in ours_names:
                if "ort" in samples:
                    key = "speedup" if r == "ours" else f"speedup_{kernel_of[r]}"
                    row[key] = _common.speedup(row[f"{r}_median_ms"], row["ort_median_ms"])
            rows.append(row)
            print(_common.format_table([row]).splitlines()[-1], flush=True)
        del sessions

    profile = op_profile(models, cfg, model_bytes, args, out_names) if args.profile and ours_names else None
    print()
    print(_common.format_table(rows))
    if ours_names and "ort" in runtimes:
        print(_common.isa_line())
        print(_common.SPEEDUP)
    if profile:
        print("\nour per-op time per step (ms, profiled session, 1 thread):")
        print(_common.format_table(profile))
    payload = {
        "benchmark": "tensor-path decode step latency, standard Attention-23 model with past/present",
        "config": {k: getattr(cfg, k) for k in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "vocab", "dtype")}
        | {"intermediate": cfg.ffn("llama"), "batch": 1, "samples": args.samples, "warmup": args.warmup,
           "contexts": args.contexts, "threads": args.threads, "runtimes": runtimes, "quick": args.quick,
           "mode": args.mode, "kernel_paths_run": kernel_of or None},
        "environment": env_start,
        "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "rows": rows,
        "raw": raw,
        "ours_op_profile_ms": profile,
    }
    name = args.name if args.mode == "fixed" else f"{args.name}-{args.mode}"
    path = _common.write_json(name, payload, args.results_dir)
    print(f"\nresults: {os.path.abspath(path)}")
    if not args.no_plot:
        series = {}
        ratio = {}
        for r in runtimes:
            for t in args.threads:
                sel = [x for x in raw if x["runtime"] == r and x["threads"] == t]
                series[f"{r} {t}T"] = {"x": [x["context"] for x in sel], "median": [x["median"] for x in sel],
                                       "p10": [x["p10"] for x in sel], "p90": [x["p90"] for x in sel]}
        if ours_names and "ort" in runtimes:
            for t in args.threads:
                sel = [x for x in rows if x["threads"] == t]
                for r in ours_names:
                    key = "speedup" if r == "ours" else f"speedup_{kernel_of[r]}"
                    label = f"{t}T" if r == "ours" else f"{kernel_of[r]} {t}T"
                    ratio[label] = ([x["context"] for x in sel], [x[key] for x in sel])
        xlabel, ylabel = (("prompt tokens", "ms per prefill") if args.mode == "prefill"
                          else ("context (past tokens)", "ms per decode step"))
        png = _common.plot_series(path[:-5] + ".png", series, xlabel, ylabel,
                                  title=f"tensor-path decode ({args.mode}): {cfg.layers}L h{cfg.hidden} {cfg.q_heads}/{cfg.kv_heads} heads "
                                        f"d{cfg.head_dim} V{cfg.vocab} {cfg.dtype}", ratio=ratio or None)
        print(f"plot:    {os.path.abspath(png)}")
    return 0


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
