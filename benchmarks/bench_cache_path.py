"""Decode-step and prefill latency of a whole decoder: our cache path vs our tensor path vs onnxruntime.

Configurations, all on the same model, batch and thread count, timed side by side in one run
(``_common.blocked``: alternating blocks after a pause, first call of a block not recorded):

* ``ours-cache`` (and ``ours-cache-float16`` ... for each further ``--cache-dtype``):
  ``InferenceSession.run(["logits"], feeds, state=state)`` on a GenerationState holding
  ``context`` positions per sequence (loaded with ``state.load`` from random present tensors:
  decode-step work does not depend on the values); one new token per sequence is appended per
  step and the state is truncated back to ``context`` after each call, outside the timing (an
  O(1) length change). A float16 cache serves the float32 model;
* ``ours-tensor``: the standard export on our tensor path (pasts of ``context`` positions fed,
  presents returned: the whole past copied every step);
* ``ort-tensor``: onnxruntime on the same standard export;
* ``ort-gqa-iobinding``: onnxruntime on the GroupQueryAttention export of the same weights
  (``models.llama_decoder_gqa_ort``) with past and present bound to one shared buffer per layer
  (IOBinding), the equivalent-contract comparator. Its past/present take the query's type: a
  float16 cache needs a float16 model there, so it always runs with a float32 cache;
* ``genai``: onnxruntime-genai's own ``Generator`` on that GroupQueryAttention export (a model
  folder with a ``genai_config.json`` built like ``bench_generate.py``'s), after
  ``append_tokens`` of a random ``[batch, context]`` prompt (its prefill, not timed); the timed
  call is one ``generate_next_token()``: one model run over one new token per sequence, plus
  genai's greedy choice and bookkeeping, nothing subtracted. Its context grows by one per call
  (from ``context`` to ``context`` + a few dozen). Skipped when ``onnxruntime_genai`` is not
  importable, or when ``batch x context`` exceeds ``--genai-max-tokens`` (its prefill of
  ``batch x context`` tokens takes minutes on 2 cores at 16k).

Configurations whose buffers would exceed ``--max-gib`` (tensor paths: pasts fed + presents
returned; cache states; onnxruntime's shared buffers; genai's) are skipped and listed in the
JSON. Per configuration the JSON records medians/percentiles and, for the decode step: bytes a
step must read (weights + K/V of the context once for the cache paths; weights + 3x K/V for a
tensor path, which reads the past, writes the present and reads it again in attention), the
effective bandwidth, and the streaming-read bandwidth measured in the same case right after
the timing (``onnx_light_kv.read_bandwidth``); for our cache path also the append bytes,
attention bytes read, committed cache bytes (state counters) and the peak temporary bytes of
the step (``last_run_stats``), for our tensor path its peak and allocated bytes. ``tensor
bound`` is the speed-up over our tensor path that the bytes alone allow ((weights + 3 K/V) /
(weights + K/V of the cache)). ``--mode prefill`` times a prompt of ``context`` tokens instead
(batch 1; ours-cache: a fresh state each call).

The default model is the issue's (8 layers, hidden 1024, 32/8 heads of 128, vocab 32000: 64 KiB of
fp32 K/V per token against ~880 MB of weights); ``--quick`` uses a small one (well under a
minute). Speed-ups follow ``_common.SPEEDUP``.

Run: ``python benchmarks/bench_cache_path.py --quick`` (or ``--contexts 1024 4096 16384 --threads 1 2
--batches 1 4 --cache-dtype float32 float16``). onnxruntime-genai runs where it is installed.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

#: the issue's targets: speed-up of the cache path over onnxruntime's GQA export and genai, by context
TARGETS = {1024: 1.05, 4096: 1.3, 16384: 2.0}
#: the bandwidth target (fraction of the streaming-read probe) at 4k and beyond
BANDWIDTH_TARGET = 0.85
GIB = 1 << 30


def build(args: argparse.Namespace) -> Any:
    from onnx_light_kv import models as M

    slack = 128  # positions past the longest context (decode steps, genai's growing context)
    if args.quick:
        cfg = M.DecoderConfig(layers=args.layers or 2, hidden=256, q_heads=8, kv_heads=2, head_dim=32, vocab=512,
                              max_positions=max(args.contexts) + slack, dtype=args.dtype)
    else:
        cfg = M.DecoderConfig(layers=args.layers or 8, hidden=1024, q_heads=32, kv_heads=8, head_dim=128, vocab=32000,
                              intermediate=2816, max_positions=max(args.contexts) + slack, dtype=args.dtype)
    return M, cfg


def ort_session(model_bytes: bytes, threads: int) -> Any:
    import onnxruntime as ort

    so = _common.ort_session_options(ort, threads)
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def weight_bytes(model: Any) -> int:
    return sum(int(np.prod(t.dims)) * (2 if t.data_type == 10 else 4) for t in model.graph.initializer)


class GQABound:
    """onnxruntime on the GQA export, past and present bound to one buffer per layer (IOBinding)."""

    def __init__(self, sess: Any, M: Any, cfg: Any, batch: int, context: int, capacity: int) -> None:
        import onnxruntime as ort

        self.sess = sess
        ov = ort.OrtValue.ortvalue_from_numpy
        shape = (batch, cfg.kv_heads, capacity, cfg.head_dim)
        # one buffer per layer (separate memory, as a real cache); the values do not change the work
        self.bufs = {n: ov(np.full(shape, 0.01, cfg.np_dtype)) for n in M.past_names(cfg.layers)}
        self.ids = ov(np.full((batch, 1), 7, np.int64))
        self.mask = ov(np.ones((batch, context + 1), np.int64))
        self.logits = ov(np.zeros((batch, 1, cfg.vocab), cfg.np_dtype))
        b = sess.io_binding()
        b.bind_ortvalue_input("input_ids", self.ids)
        b.bind_ortvalue_input("attention_mask", self.mask)
        for past, present in zip(M.past_names(cfg.layers), M.present_names(cfg.layers)):
            b.bind_ortvalue_input(past, self.bufs[past])
            b.bind_ortvalue_output(present, self.bufs[past])
        b.bind_ortvalue_output("logits", self.logits)
        self.binding = b

    def __call__(self) -> None:
        self.sess.run_with_iobinding(self.binding)


class GenaiStep:
    """onnxruntime-genai's Generator after a prefill of ``context`` tokens: each call is one
    ``generate_next_token()`` (one model run over one new token per sequence + the choice)."""

    def __init__(self, og: Any, model: Any, vocab: int, batch: int, context: int, calls: int,
                 rng: np.random.Generator) -> None:
        params = og.GeneratorParams(model)
        total = context + calls + 8
        params.set_search_options(max_length=total, min_length=total, batch_size=batch)
        self.gen = og.Generator(model, params)
        prompt = rng.integers(1, vocab, size=(batch, context)).astype(np.int32)
        t = time.perf_counter()
        self.gen.append_tokens(prompt)
        self.prefill_s = time.perf_counter() - t
        self.gen.generate_next_token()  # picks the first token from the prefill's logits (no model run)

    def __call__(self) -> None:
        self.gen.generate_next_token()


def genai_model_dir(M: Any, cfg: Any, threads: int, root: str) -> str:
    """bench_generate.py's genai folder (the GQA export of the same weights + genai_config.json)."""
    import bench_generate

    return bench_generate._genai_dir(M, cfg, threads, root)


def _calls(args: argparse.Namespace) -> int:
    """Calls _common.blocked makes of each side (warm-up + blocks)."""
    blocks = -(-args.repeat // (args.block - 1))
    return 2 + blocks * args.block


def decode_case(M: Any, cfg: Any, model: Any, sessions: Dict[str, Any], threads: int, batch: int, context: int,
                args: argparse.Namespace, rng: np.random.Generator) -> Dict[str, Any]:
    ours = sessions["ours"]
    itemsize = np.dtype(cfg.np_dtype).itemsize
    row_all = cfg.layers * 2 * cfg.kv_heads * cfg.head_dim  # K/V elements per position, all layers
    kv32 = batch * context * row_all * itemsize
    wbytes = weight_bytes(model)
    budget = args.max_gib * GIB
    skipped: Dict[str, str] = {}
    tok = np.full((batch, 1), 7, np.int64)
    pos = np.full((batch, 1), context, np.int64)
    # one random past per layer side is enough for timing: every layer reads the same array
    past_arr = (rng.standard_normal((batch, cfg.kv_heads, context, cfg.head_dim), dtype=np.float32) * 0.5
                ).astype(cfg.np_dtype)
    fns: Dict[str, Callable[[], Any]] = {}
    states: Dict[str, Any] = {}
    used = 0

    def add_state(cd: str) -> None:
        nonlocal used
        name = "ours-cache" if cd == args.cache_dtype[0] else f"ours-cache-{cd}"
        need = batch * (context + 8) * row_all * (4 if cd == "float32" else 2)
        if used + need > budget:
            skipped[name] = f"{need / GIB:.1f} GiB of cache over --max-gib {args.max_gib}"
            return
        used += need
        # an arena of its own (budget): its memory goes back to the system when the state
        # closes, instead of staying pooled in the session's arena for the next cases
        st = ours.create_state(batch=batch, max_length=context + 8, dtype=cd, budget=2 * need + GIB)
        st.load({n: past_arr for n in M.present_names(cfg.layers)})
        states[name] = st

        def cache_step() -> None:
            ours.run(["logits"], {"input_ids": tok, "position_ids": pos}, state=st)
            st.truncate(context)

        fns[name] = cache_step

    # by priority when memory is short: our first cache type, the two comparators of the targets,
    # our other cache types, the tensor paths
    add_state(args.cache_dtype[0])
    comparators: List[str] = []
    if not args.no_ort:
        need = batch * (context + 8) * row_all * itemsize
        if used + need <= budget:
            used += need
            fns["ort-gqa-iobinding"] = GQABound(sessions["ort-gqa"], M, cfg, batch, context, context + 8)
            comparators.append("ort-gqa-iobinding")
        else:
            skipped["ort-gqa-iobinding"] = f"{need / GIB:.1f} GiB of shared buffers over --max-gib"
    genai = None
    if sessions.get("genai") is not None:
        need = batch * (context + _calls(args) + 8) * row_all * itemsize
        if batch * context > args.genai_max_tokens:
            skipped["genai"] = f"prefill of {batch} x {context} tokens over --genai-max-tokens {args.genai_max_tokens}"
        elif used + need > budget:
            skipped["genai"] = f"{need / GIB:.1f} GiB of buffers over --max-gib"
        else:
            used += need
            genai = GenaiStep(sessions["og"], sessions["genai"], cfg.vocab, batch, context, _calls(args), rng)
            fns["genai"] = genai
            comparators.append("genai")
    elif "genai_reason" in sessions:
        skipped["genai"] = sessions["genai_reason"]
    for cd in args.cache_dtype[1:]:
        add_state(cd)
    # tensor paths: a past per layer side (separate memory, as a real run has), presents returned
    tensor_need = 2 * kv32
    feeds: Optional[Dict[str, np.ndarray]] = None
    for name in ("ours-tensor", "ort-tensor"):
        if name == "ort-tensor" and args.no_ort:
            continue
        if used + tensor_need + (kv32 if feeds is None else 0) > budget:
            skipped[name] = f"{tensor_need / GIB:.1f} GiB of pasts and presents per call over --max-gib"
            continue
        if feeds is None:
            used += kv32
            feeds = {"input_ids": tok, "position_ids": pos, **{n: past_arr.copy() for n in M.past_names(cfg.layers)}}
        used += tensor_need
        fns[name] = ((lambda f=feeds: ours.run(["logits"], f)) if name == "ours-tensor"
                     else (lambda f=feeds: sessions["ort-tensor"].run(["logits"], f)))
    if not fns:  # every side over the limits: the caller reports the case as skipped
        return {"row": None, "skipped": skipped}
    memory = process_memory()  # every buffer of the case is allocated and touched by now
    samples = _common.blocked(fns, repeat=args.repeat, warmup=2, block=args.block)
    probe = olkv_read_bandwidth(threads, args)
    row = _median_row(threads, batch, context, samples, comparators)
    row["read GB/s"] = probe
    figures: Dict[str, Any] = {"weight_bytes": wbytes, "kv_bytes_float32": kv32, "read_gbs": probe,
                               "process_memory": memory}
    for name, st in states.items():
        cd = st.dtype
        kv = batch * context * row_all * np.dtype(cd).itemsize
        st.reset_counters()
        fns[name]()
        stats = ours.last_run_stats
        info = st.info()["totals"]
        step_bytes = wbytes + kv
        gbs = step_bytes / (row[name] / 1e3) / 1e9
        figures[name] = {"cache_dtype": str(cd), "kv_bytes": kv, "step_bytes": step_bytes, "gbs": gbs,
                         "fraction_of_read": gbs / probe, "append_bytes": info["append_bytes"],
                         "attention_bytes": info["attention_bytes"], "committed_cache_bytes": info["committed_bytes"],
                         "peak_temp_bytes": stats.get("peak_bytes"), "allocated_bytes": stats.get("allocated_bytes"),
                         "tensor_bound": (wbytes + 3 * kv32) / step_bytes}
        row[f"{name} GB/s"] = gbs
        row[f"{name} frac"] = gbs / probe
        if "ours-tensor" in row:
            row[f"{name} tensor bound"] = figures[name]["tensor_bound"]
        st.close()
    if "ours-tensor" in fns:
        fns["ours-tensor"]()
        stats = ours.last_run_stats
        figures["ours-tensor"] = {"step_bytes": wbytes + 3 * kv32, "gbs": (wbytes + 3 * kv32) / (row["ours-tensor"] / 1e3) / 1e9,
                                  "peak_temp_bytes": stats.get("peak_bytes"), "allocated_bytes": stats.get("allocated_bytes")}
    if genai is not None:
        figures["genai"] = {"prefill_s": genai.prefill_s,
                            "context_range": [context, context + _calls(args)]}
        del genai
    return {"row": row, "samples": samples, "figures": figures, "skipped": skipped,
            "summary": {k: _common.summarize(v) for k, v in samples.items()}}


def process_memory() -> Dict[str, int]:
    """The process's resident bytes and how many of them sit in transparent huge pages
    (``/proc/self/smaps_rollup``: Rss, AnonHugePages, FilePmdMapped; empty off Linux). The caches'
    arenas ask for huge pages (MADV_HUGEPAGE) and get 4 KiB pages when the kernel cannot compact
    memory, which slows the streaming reads: a case whose ``AnonHugePages`` falls short of its
    caches' bytes ran (partly) on small pages."""
    out: Dict[str, int] = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "AnonHugePages", "FilePmdMapped"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def olkv_read_bandwidth(threads: int, args: argparse.Namespace) -> float:
    """Streaming-read GB/s on a fresh buffer beyond the L3 (the probe of the same case)."""
    import onnx_light_kv as olkv

    return float(olkv.read_bandwidth(256 if args.quick else 1024, threads, 3))


def _median_row(threads: int, batch: int, context: int, samples: Dict[str, List[float]],
                comparators: List[str]) -> Dict[str, Any]:
    """The table row of one case: each side's median ms and each cache-path side's speed-up over
    the comparators and our tensor path, with the issue's target at this context."""
    row: Dict[str, Any] = {"threads": threads, "batch": batch, "context": context}
    for k, v in samples.items():
        row[k] = _common.summarize(v)["median"]
    ours = [k for k in samples if k.startswith("ours-cache")]
    for o in ours:
        for k in [*comparators, "ours-tensor", "ort-tensor"]:
            if k in samples:
                row[f"{o} vs {k}"] = _common.speedup(row[o], row[k])
    if context in TARGETS:
        row["target"] = TARGETS[context]
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
    row = _median_row(threads, 1, context, samples, [])
    return {"row": row, "samples": samples, "summary": {k: _common.summarize(v) for k, v in samples.items()}}


def _printed(row: Dict[str, Any]) -> List[str]:
    """The columns printed (the JSON has every one): times, the cache paths' speed-ups over the
    comparators and our tensor path, the tensor-path bound and the bandwidth fractions."""
    keep = (" vs ort-gqa-iobinding", " vs genai", " vs ours-tensor", " frac", "ours-cache tensor bound")
    return [k for k in row if " " not in k or k.endswith(keep) or k in ("read GB/s", "target")]


#: Printed under the tables: what the columns are (the JSON's rows carry the same keys).
LEGEND = ("times: median ms per call (decode: one step, one new token per sequence; prefill: the whole prompt). "
          "'A vs B': speed-up of A over B (B's time / A's time, > 1: A is faster).\n"
          "read GB/s: the streaming-read probe of the case. '<cache> frac': the cache path's bytes per step "
          "(weights + K/V of the context) / step time, as a fraction of that probe (target "
          f"{BANDWIDTH_TARGET:g} from 4k on).\n"
          "'<cache> tensor bound': the speed-up over our tensor path the bytes alone allow ((weights + 3 K/V) / "
          "(weights + K/V)). target: the issue's speed-up target over onnxruntime's GQA and genai at this context.")
#: Columns of a row that are not times (the others are sides' median ms).
NOT_TIMES = ("threads", "batch", "context", "target")


def _table(rows: List[Dict[str, Any]], columns: List[str]) -> str:
    """The printed table: ``columns`` of ``rows``, each side's time headed ``<side> ms``."""
    return _common.format_table(rows, columns=columns,
                                labels={c: f"{c} ms" for c in columns if " " not in c and c not in NOT_TIMES})


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small model, short contexts (under a minute)")
    ap.add_argument("--mode", choices=["decode", "prefill"], default="decode")
    ap.add_argument("--contexts", type=_common.positive_int, nargs="+", default=None)
    ap.add_argument("--threads", type=_common.threads_arg, nargs="+", default=[1, 2])
    ap.add_argument("--batches", type=_common.positive_int, nargs="+", default=[1], help="sequences per step (decode mode)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="the model's type")
    ap.add_argument("--cache-dtype", nargs="+", default=None, choices=["float32", "float16", "bfloat16"],
                    help="our cache path's storage types, timed side by side (default: the model's)")
    ap.add_argument("--repeat", type=_common.positive_int, default=None, help="timed calls per side (default 20, quick 8)")
    ap.add_argument("--block", type=_common.int_range(2), default=5,
                    help="calls per block, >= 2 (the first one settles and is not timed)")
    ap.add_argument("--no-ort", action="store_true", help="our paths only")
    ap.add_argument("--no-genai", action="store_true", help="skip onnxruntime-genai")
    ap.add_argument("--genai-max-tokens", type=_common.nonneg_int, default=4096,
                    help="largest batch x context genai is run at (its prefill is not cheap)")
    ap.add_argument("--max-gib", type=_common.positive_float, default=8.0, help="buffers a case may hold (GiB)")
    ap.add_argument("--layers", type=_common.layers_arg, default=None, help="layers of the model (default 8, quick 2)")
    _common.add_results_dir(ap)
    args = ap.parse_args(argv)
    if args.contexts is None:
        args.contexts = [128, 512] if args.quick else [256, 1024, 4096, 16384]
    if args.repeat is None:
        args.repeat = 8 if args.quick else 20
    if args.cache_dtype is None:
        args.cache_dtype = [args.dtype]
    M, cfg = build(args)
    t0 = time.time()
    model = M.llama_decoder(cfg)
    print(f"model: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.q_heads}/{cfg.kv_heads} heads of {cfg.head_dim}, "
          f"vocab {cfg.vocab}, {cfg.dtype}; {weight_bytes(model) / 1e6:.0f} MB of weights (built in {time.time() - t0:.1f} s)")
    import onnx_light_kv as olkv

    og: Optional[Any] = None
    genai = "skipped: --no-genai"
    if args.mode == "decode" and not args.no_genai and not args.no_ort:
        try:
            import onnxruntime_genai as og
            genai = f"onnxruntime-genai {og.__version__}: its Generator on the GroupQueryAttention export"
        except ImportError:
            genai = "skipped: onnxruntime-genai is not installed"
    print(f"genai: {genai}")
    rng = np.random.default_rng(0)
    bandwidth = {t: olkv.read_bandwidth(256 if args.quick else 1024, t, 3) for t in args.threads}
    results: List[Dict[str, Any]] = []
    mb = M.model_bytes(model)
    genai_root = tempfile.mkdtemp(prefix="olkv-bench-cache-genai-")
    try:
        for threads in args.threads:
            if args.mode == "prefill":
                for context in args.contexts:
                    r = prefill_case(M, cfg, model, threads, context, args, rng)
                    r["row"]["read GB/s"] = bandwidth[threads]
                    results.append(r)
                    print(_table([r["row"]], list(r["row"])), flush=True)
                continue
            sessions: Dict[str, Any] = {"ours": olkv.InferenceSession(mb, threads=threads)}
            if not args.no_ort:
                sessions["ort-tensor"] = ort_session(mb, threads)
                sessions["ort-gqa"] = ort_session(M.model_bytes(M.llama_decoder_gqa_ort(cfg)), threads)
            if og is not None:
                sessions["og"] = og
                sessions["genai"] = og.Model(genai_model_dir(M, cfg, threads, genai_root))
            else:
                sessions["genai_reason"] = genai
            # largest cases first: memory the allocators keep (ours, onnxruntime's arena) is reused
            # by the smaller ones instead of adding to it
            for batch in sorted(args.batches, reverse=True):
                for context in sorted(args.contexts, reverse=True):
                    r = decode_case(M, cfg, model, sessions, threads, batch, context, args, rng)
                    if r["row"] is None:
                        print(f"threads {threads} batch {batch} context {context}: nothing measured, skipped: "
                              f"{r['skipped']}", flush=True)
                        continue
                    results.append(r)
                    print(_table([r["row"]], _printed(r["row"])), flush=True)
                    if r["skipped"]:
                        print(f"  skipped: {r['skipped']}", flush=True)
                    gc.collect()
            sessions["ours"].close()
            sessions.clear()
            gc.collect()
    finally:
        shutil.rmtree(genai_root, ignore_errors=True)
    if not results:
        raise ValueError(f"every case is larger than --max-gib={args.max_gib} GiB (or the other limits): nothing "
                         "was measured")
    results.sort(key=lambda r: (r["row"]["threads"], r["row"].get("batch", 1), r["row"]["context"]))
    rows = [r["row"] for r in results]
    print()
    cols: List[str] = []
    for r in rows:
        cols += [c for c in _printed(r) if c not in cols]
    print(_table(rows, cols))
    print(LEGEND)
    print(_common.SPEEDUP)
    path = _common.write_json(f"cache-path-{args.mode}", {
        "environment": _common.environment(threads=args.threads, extra={"mode": args.mode, "genai": genai}),
        "args": {k: v for k, v in vars(args).items()},
        "model": {"layers": cfg.layers, "hidden": cfg.hidden, "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads,
                  "head_dim": cfg.head_dim, "vocab": cfg.vocab, "dtype": cfg.dtype, "weight_bytes": weight_bytes(model)},
        "targets": {"speedup_by_context": TARGETS, "bandwidth_fraction": BANDWIDTH_TARGET},
        "read_bandwidth_gbs": bandwidth, "rows": rows, "cases": results}, args.results_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
