"""Decode-step and prefill latency of a whole decoder: our cache path vs our tensor path vs onnxruntime.

Configurations, all on the same model and thread count, timed side by side in one run
(``_common.blocked``: alternating blocks after a pause, first call of a block not recorded):

* ``ours-cache``: ``InferenceSession.run(["logits"], feeds, state=state)`` on a GenerationState
  holding ``context`` tokens (one new token appended per step; the state is truncated back to
  ``context`` after each call, outside the timing: an O(1) length change);
* ``ours-tensor``: the standard export on our tensor path (past of ``context`` tokens fed, presents
  returned: the whole past copied every step);
* ``ort-tensor``: onnxruntime on the same standard export;
* ``ort-gqa-iobinding``: onnxruntime on the GroupQueryAttention export of the same weights
  (``models.llama_decoder_gqa_ort``) with past and present bound to one shared buffer
  (IOBinding), the equivalent-contract comparator;
* onnxruntime-genai's generator is measured when the package is installed (it is not here:
  reported as skipped).

Per configuration the JSON records medians/percentiles and, for the decode step: bytes a step must
read (weights + K/V of the context once), the resulting effective bandwidth, and the streaming-read
bandwidth measured in the same run (``onnx_light_kv.read_bandwidth``); for the cache path also the
append bytes, attention bytes read, committed cache bytes (state counters) and the peak temporary
bytes of the step (``last_run_stats``). ``--mode prefill`` times a prompt of ``context`` tokens
instead (ours-cache: a fresh state each call).

The default model is the issue's (8 layers, hidden 1024, 32/8 heads of 128, vocab 32000: 64 KiB of
fp32 K/V per token against ~730 MB of weights); ``--quick`` uses a small one (seconds).
Speed-ups follow ``_common.SPEEDUP``.

Run: ``python benchmarks/bench_cache_path.py --quick`` (or ``--contexts 256 1024 4096 --threads 1 2``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def build(args: argparse.Namespace) -> Any:
    from onnx_light_kv import models as M

    if args.quick:
        cfg = M.DecoderConfig(layers=2, hidden=256, q_heads=8, kv_heads=2, head_dim=32, vocab=512,
                              max_positions=max(args.contexts) + 64, dtype=args.dtype)
    else:
        cfg = M.DecoderConfig(layers=args.layers or 8, hidden=1024, q_heads=32, kv_heads=8, head_dim=128, vocab=32000,
                              intermediate=2816, max_positions=max(args.contexts) + 64, dtype=args.dtype)
    return M, cfg


def ort_session(model_bytes: bytes, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def weight_bytes(model: Any) -> int:
    return sum(int(np.prod(t.dims)) * (2 if t.data_type == 10 else 4) for t in model.graph.initializer)


class GQABound:
    """onnxruntime on the GQA export, past and present bound to one buffer per layer (IOBinding)."""

    def __init__(self, M: Any, cfg: Any, threads: int, context: int, capacity: int, rng: np.random.Generator) -> None:
        import onnxruntime as ort

        self.sess = ort_session(M.model_bytes(M.llama_decoder_gqa_ort(cfg)), threads)
        ov = ort.OrtValue.ortvalue_from_numpy
        shape = (1, cfg.kv_heads, capacity, cfg.head_dim)
        self.bufs = {n: ov((rng.standard_normal(shape) * 0.5).astype(cfg.np_dtype)) for n in M.past_names(cfg.layers)}
        self.ids = ov(np.array([[1]], np.int64))
        self.mask = ov(np.ones((1, context + 1), np.int64))
        self.logits = ov(np.zeros((1, 1, cfg.vocab), cfg.np_dtype))
        b = self.sess.io_binding()
        b.bind_ortvalue_input("input_ids", self.ids)
        b.bind_ortvalue_input("attention_mask", self.mask)
        for past, present in zip(M.past_names(cfg.layers), M.present_names(cfg.layers)):
            b.bind_ortvalue_input(past, self.bufs[past])
            b.bind_ortvalue_output(present, self.bufs[past])
        b.bind_ortvalue_output("logits", self.logits)
        self.binding = b

    def __call__(self) -> None:
        self.sess.run_with_iobinding(self.binding)


def decode_case(M: Any, cfg: Any, model: Any, threads: int, context: int, args: argparse.Namespace,
                rng: np.random.Generator) -> Dict[str, Any]:
    import onnx_light_kv as olkv

    mb = M.model_bytes(model)
    ours = olkv.InferenceSession(mb, threads=threads)
    tok = np.array([[7]], np.int64)
    pos = np.array([[context]], np.int64)
    # cache path: a state filled by a real prefill of `context` tokens
    state = ours.create_state(max_length=context + 8)
    prompt = rng.integers(cfg.vocab, size=(1, context)).astype(np.int64)
    ours.run(["logits"], {"input_ids": prompt, "position_ids": np.arange(context, dtype=np.int64)[None]}, state=state)

    def cache_step() -> None:
        ours.run(["logits"], {"input_ids": tok, "position_ids": pos}, state=state)
        state.truncate(context)

    past = {n: (rng.standard_normal((1, cfg.kv_heads, context, cfg.head_dim)) * 0.5).astype(cfg.np_dtype)
            for n in M.past_names(cfg.layers)}
    feeds = {"input_ids": tok, "position_ids": pos, **past}
    fns: Dict[str, Callable[[], Any]] = {
        "ours-cache": cache_step,
        "ours-tensor": lambda: ours.run(["logits"], feeds),
    }
    if not args.no_ort:
        ort_std = ort_session(mb, threads)
        fns["ort-tensor"] = lambda: ort_std.run(["logits"], feeds)
        fns["ort-gqa-iobinding"] = GQABound(M, cfg, threads, context, context + 8, rng)
    samples = _common.blocked(fns, repeat=args.repeat, warmup=2, block=args.block)
    # figures of one cache-path step
    state.reset_counters()
    cache_step()
    stats = ours.last_run_stats
    info = state.info()["totals"]
    kv_bytes = cfg.layers * 2 * cfg.kv_heads * cfg.head_dim * context * np.dtype(cfg.np_dtype).itemsize
    wbytes = weight_bytes(model)
    row = _median_row(threads, context, samples)
    step_bytes = wbytes + kv_bytes
    row["cache GB/s"] = step_bytes / (row["ours-cache"] / 1e3) / 1e9
    extra = {"weight_bytes": wbytes, "kv_bytes": kv_bytes, "step_bytes": step_bytes,
             "append_bytes": info["append_bytes"], "attention_bytes": info["attention_bytes"],
             "committed_cache_bytes": info["committed_bytes"], "peak_temp_bytes": stats.get("peak_bytes")}
    state.close()
    return {"row": row, "samples": samples, "figures": extra,
            "summary": {k: _common.summarize(v) for k, v in samples.items()}}


def _median_row(threads: int, context: int, samples: Dict[str, List[float]]) -> Dict[str, Any]:
    """The table row of one case: each side's median ms and the cache path's speed-up over each other side."""
    row: Dict[str, Any] = {"threads": threads, "context": context}
    for k, v in samples.items():
        row[k] = _common.summarize(v)["median"]
    for k in samples:
        if k != "ours-cache":
            row[f"speedup vs {k}"] = _common.speedup(row["ours-cache"], row[k])
    return row


def prefill_case(M: Any, cfg: Any, model: Any, threads: int, context: int, args: argparse.Namespace,
                 rng: np.random.Generator) -> Dict[str, Any]:
    import onnx_light_kv as olkv

    mb = M.model_bytes(model)
    ours = olkv.InferenceSession(mb, threads=threads)
    prompt = rng.integers(cfg.vocab, size=(1, context)).astype(np.int64)
    posn = np.arange(context, dtype=np.int64)[None]
    empty = {n: np.zeros((1, cfg.kv_heads, 0, cfg.head_dim), cfg.np_dtype) for n in M.past_names(cfg.layers)}
    feeds = {"input_ids": prompt, "position_ids": posn, **empty}

    def cache_prefill() -> None:
        with ours.create_state(max_length=context) as st:
            ours.run(["logits"], {"input_ids": prompt, "position_ids": posn}, state=st)

    fns: Dict[str, Callable[[], Any]] = {"ours-cache": cache_prefill,
                                         "ours-tensor": lambda: ours.run(["logits"], feeds)}
    if not args.no_ort:
        ort_std = ort_session(mb, threads)
        fns["ort-tensor"] = lambda: ort_std.run(["logits"], feeds)
    samples = _common.blocked(fns, repeat=args.repeat, warmup=1, block=args.block)
    row = _median_row(threads, context, samples)
    return {"row": row, "samples": samples, "summary": {k: _common.summarize(v) for k, v in samples.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small model, short contexts")
    ap.add_argument("--mode", choices=["decode", "prefill"], default="decode")
    ap.add_argument("--contexts", type=int, nargs="+", default=None)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--no-ort", action="store_true", help="our two paths only")
    ap.add_argument("--layers", type=int, default=None, help="layers of the default model (8)")
    args = ap.parse_args()
    if args.contexts is None:
        args.contexts = [128, 512] if args.quick else [256, 1024, 4096, 16384]
    if args.repeat is None:
        args.repeat = 12 if args.quick else 20
    M, cfg = build(args)
    t0 = time.time()
    model = M.llama_decoder(cfg)
    print(f"model: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.q_heads}/{cfg.kv_heads} heads of {cfg.head_dim}, "
          f"vocab {cfg.vocab}, {cfg.dtype}; {weight_bytes(model) / 1e6:.0f} MB of weights (built in {time.time() - t0:.1f} s)")
    import onnx_light_kv as olkv

    rng = np.random.default_rng(0)
    bandwidth = {t: olkv.read_bandwidth(256 if args.quick else 1024, t, 3) for t in args.threads}
    results: List[Dict[str, Any]] = []
    case = decode_case if args.mode == "decode" else prefill_case
    for threads in args.threads:
        for context in args.contexts:
            r = case(M, cfg, model, threads, context, args, rng)
            r["row"]["read GB/s"] = bandwidth[threads]
            results.append(r)
            print(_common.format_table([r["row"]]), flush=True)
    rows = [r["row"] for r in results]
    print()
    print(_common.format_table(rows))
    print(_common.SPEEDUP)
    try:
        import onnxruntime_genai  # noqa: F401
        genai = "installed but not driven by this program yet"
    except ImportError:
        genai = "skipped: onnxruntime-genai is not installed"
    path = _common.write_json(f"cache-path-{args.mode}", {
        "env": _common.environment(threads=args.threads, extra={"mode": args.mode, "genai": genai}),
        "model": {"layers": cfg.layers, "hidden": cfg.hidden, "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads,
                  "head_dim": cfg.head_dim, "vocab": cfg.vocab, "dtype": cfg.dtype, "weight_bytes": weight_bytes(model)},
        "read_bandwidth_gbs": bandwidth, "rows": rows, "cases": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
