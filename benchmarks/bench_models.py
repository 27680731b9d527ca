"""Decode-step and prefill latency of whole decoder models: ours vs onnxruntime.

Models: the committed fixture exports (``tests/fixtures/manifest.json``: torch.onnx, optimum,
onnxruntime-genai builder; tiny random-weight Hugging Face decoders) and the built-in
decoders (``onnx_light_kv.models``: Llama with position ids, Llama with positions derived
from the past by Shape/Range arithmetic, GPT-2 with decomposed attention).

Per model and thread count (1 and 2 by default), on the tensor path (past in, present out):

- **decode**: a real decode loop: ``--past`` tokens of random past, then each step feeds one
  token and the previous step's presents as the next past, so every step sees a past one
  token longer (nothing about its geometry repeats, as in generation). Each runtime runs
  bursts of ``--block`` steps restarting from the same feeds, alternating ours / onnxruntime
  with a pause before each burst (``_common.blocked``: its first call per burst is a settling
  call, not recorded).
- **prefill**: a ``--prompt``-token prompt with an empty past, fixed feeds, same blocks.
- **executor share**: a second, profiled session of ours runs the same decode loop; per step,
  ``1 - sum(kernel times) / run_ns`` from ``last_run_stats`` (``run_ns``: the run's wall time
  inside the Go executor; profiling adds two clock reads per node). ``binding`` is the share
  of the Python call spent outside the executor (feed and output conversion).

Speed-up is onnxruntime's median time / ours (above 1: we are faster). Output: a table, and
raw samples plus the environment in ``benchmarks/results/models-<timestamp>.json``.
``--quick`` takes fewer samples and only thread count 1.

Run: ``python benchmarks/bench_models.py [--quick] [--models NAME ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


# --------------------------------------------------------------------------------------------
# models


def builtin_models() -> List[Tuple[str, bytes, Dict[str, Any]]]:
    """(name, model bytes, info) of the built-in decoders (a small configuration)."""
    from onnx_light_kv import models
    cfg = models.DecoderConfig(layers=2, hidden=128, q_heads=4, kv_heads=2, head_dim=32, vocab=512,
                               max_positions=1024)
    out = []
    for name, kind, kw in (("builtin-llama", "llama", {}),
                           ("builtin-llama-derived-pos", "llama", {"position_ids_input": False}),
                           ("builtin-gpt2", "gpt2", {})):
        out.append((name, models.model_bytes(models.build(kind, cfg, **kw)), {"source": "onnx_light_kv.models",
                                                                             "kind": kind, **kw}))
    return out


def fixture_models() -> List[Tuple[str, bytes, Dict[str, Any]]]:
    """(name, model bytes, manifest entry) of the fixture exports, when they are present."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import _fixtures  # type: ignore
    except ImportError:
        return []
    out = []
    for entry in _fixtures.entries():
        name = entry["name"]
        try:
            data = _fixtures.model_bytes(name)
        except Exception as e:  # a fixture that cannot be read is reported, not fatal
            print(f"skip {name}: {e}", file=sys.stderr)
            continue
        out.append((name, data, entry))
    return out


# --------------------------------------------------------------------------------------------
# driving a decoder generically (tensor path)


class Driver:
    """Feeds for a decoder from its declared inputs: ``input_ids``, optional ``attention_mask``
    and ``position_ids``, and float rank-4 pasts ``[B, heads, P, D]`` paired in order with the
    outputs whose names contain ``present``."""

    def __init__(self, ort_session: Any, vocab: int) -> None:
        self.inputs = {i.name: i for i in ort_session.get_inputs()}
        self.vocab = vocab
        self.pasts = [i.name for i in ort_session.get_inputs() if len(i.shape) == 4 and i.type in
                      ("tensor(float)", "tensor(float16)")]
        outs = [o.name for o in ort_session.get_outputs()]
        self.presents = [o for o in outs if "present" in o]
        self.logits = outs[0]
        if len(self.pasts) != len(self.presents):
            raise ValueError(f"{len(self.pasts)} pasts but {len(self.presents)} presents")
        known = {"input_ids", "attention_mask", "position_ids", *self.pasts}
        extra = sorted(set(self.inputs) - known)
        if extra:
            raise NotImplementedError(f"inputs this driver does not feed: {extra}")
        self.out_names = [self.logits] + self.presents

    def past_shape(self, name: str, length: int) -> Tuple[int, ...]:
        dims = self.inputs[name].shape
        return (1, int(dims[1]), length, int(dims[3]))

    def feeds(self, rng: np.random.Generator, past_len: int, seq: int) -> Dict[str, np.ndarray]:
        f: Dict[str, np.ndarray] = {"input_ids": rng.integers(self.vocab, size=(1, seq)).astype(np.int64)}
        if "attention_mask" in self.inputs:
            f["attention_mask"] = np.ones((1, past_len + seq), np.int64)
        if "position_ids" in self.inputs:
            f["position_ids"] = np.arange(past_len, past_len + seq, dtype=np.int64)[None]
        for name in self.pasts:
            dt = _ORT_TYPES[self.inputs[name].type]
            f[name] = (0.5 * rng.standard_normal(self.past_shape(name, past_len))).astype(dt)
        return f

    def advance(self, f: Dict[str, np.ndarray], outs: Sequence[np.ndarray]) -> None:
        """Turn feeds into the next step's: the argmax token, presents as pasts."""
        f["input_ids"] = np.argmax(np.asarray(outs[0])[:, -1:, :], axis=-1).astype(np.int64)
        total = np.asarray(outs[1]).shape[2] + 1 if outs[1:] else 0
        if "attention_mask" in f:
            f["attention_mask"] = np.ones((1, total), np.int64)
        if "position_ids" in f:
            f["position_ids"] = np.array([[total - 1]], np.int64)
        f.update(zip(self.pasts, outs[1:]))


def stepper(sess: Any, driver: Driver, start: Dict[str, np.ndarray], period: int) -> Callable[[], Any]:
    """A callable doing one decode step per call, restarting from ``start`` every ``period``
    calls (``_common.blocked`` calls it ``period`` times per block)."""
    state = {"i": 0, "f": dict(start)}

    def step() -> Any:
        if state["i"] % period == 0:
            state["f"] = dict(start)
        state["i"] += 1
        f = state["f"]
        outs = sess.run(driver.out_names, f)
        driver.advance(f, outs)
        return outs
    return step


def vocab_of(ort_session: Any) -> int:
    shape = ort_session.get_outputs()[0].shape
    return int(shape[-1]) if isinstance(shape[-1], int) else 256


# --------------------------------------------------------------------------------------------
# measurement


def make_sessions(data: bytes, threads: int) -> Tuple[Any, Any]:
    import onnxruntime
    import onnx_light_kv
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    ort = onnxruntime.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    ours = onnx_light_kv.InferenceSession(data, threads=threads)
    return ours, ort


def executor_share(data: bytes, threads: int, driver: Driver, start: Dict[str, np.ndarray],
                   steps: int) -> Dict[str, Any]:
    """Median shares of a profiled decode loop: executor (outside kernels, of run_ns) and
    binding (outside the executor, of the Python call); nodes run per step."""
    import onnx_light_kv
    sess = onnx_light_kv.InferenceSession(data, threads=threads, profile=True)
    f = dict(start)
    ex, bind, ran, run_ms = [], [], [], []
    for i in range(steps + 2):
        t0 = time.perf_counter_ns()
        outs = sess.run(driver.out_names, f)
        wall = time.perf_counter_ns() - t0
        st = sess.last_run_stats
        driver.advance(f, outs)
        if i < 2:
            continue
        kernels = sum(e["dur_ns"] for e in st.get("events", []))
        run_ns = st.get("run_ns", 0) or wall
        ex.append(1.0 - kernels / run_ns)
        bind.append(1.0 - run_ns / wall)
        ran.append(len(st.get("events", [])))
        run_ms.append(run_ns / 1e6)
    return {"executor_share": float(np.median(ex)), "binding_share": float(np.median(bind)),
            "nodes_run": int(np.median(ran)), "profiled_run_ms": float(np.median(run_ms))}


def node_counts(data: bytes) -> int:
    import onnx
    return len(onnx.load_from_string(data).graph.node)


def measure(name: str, data: bytes, info: Dict[str, Any], args: argparse.Namespace) -> List[Dict[str, Any]]:
    rows: List[Dict[str, Any]] = []
    for threads in args.threads:
        try:
            ours, ort = make_sessions(data, threads)
        except Exception as e:  # unsupported op, bad model: reported in the table
            rows.append({"model": name, "threads": threads, "error": f"{type(e).__name__}: {str(e)[:160]}"})
            continue
        try:
            driver = Driver(ort, vocab_of(ort))
        except (ValueError, NotImplementedError) as e:
            rows.append({"model": name, "threads": threads, "error": f"driver: {e}"})
            continue
        rng = np.random.default_rng(7)
        start = driver.feeds(rng, args.past, 1)
        dec = _common.blocked({"ours": stepper(ours, driver, start, args.block),
                               "ort": stepper(ort, driver, start, args.block)},
                              repeat=args.samples, warmup=args.block, block=args.block)
        pre_feeds = driver.feeds(rng, 0, args.prompt)
        pre = _common.blocked({"ours": lambda: ours.run(driver.out_names, pre_feeds),
                               "ort": lambda: ort.run(driver.out_names, pre_feeds)},
                              repeat=max(10, args.samples // 2), warmup=2, block=args.block)
        share = executor_share(data, threads, driver, start, args.share_steps)
        row = {"model": name, "threads": threads, "nodes": node_counts(data), **share,
               "decode": {k: _common.summarize(v) for k, v in dec.items()},
               "prefill": {k: _common.summarize(v) for k, v in pre.items()},
               "samples": {"decode": dec, "prefill": pre}, "info": {k: v for k, v in info.items()
                                                                    if isinstance(v, (str, int, float, bool))}}
        for phase in ("decode", "prefill"):
            row[f"{phase}_speedup"] = row[phase]["ort"]["median"] / row[phase]["ours"]["median"]
        rows.append(row)
        print(fmt_row(row), flush=True)
    return rows


HEADER = (f"{'model':<34} {'thr':>3} {'nodes':>5} {'ran':>4} | {'decode ours':>11} {'ort':>7} {'x':>5} | "
          f"{'prefill ours':>12} {'ort':>7} {'x':>5} | {'exec':>5} {'bind':>5}")


def fmt_row(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['model']:<34} {r['threads']:>3} {r['error']}"
    d, p = r["decode"], r["prefill"]
    return (f"{r['model']:<34} {r['threads']:>3} {r['nodes']:>5} {r['nodes_run']:>4} | "
            f"{d['ours']['median']:>9.3f}ms {d['ort']['median']:>7.3f} {r['decode_speedup']:>5.2f} | "
            f"{p['ours']['median']:>10.3f}ms {p['ort']['median']:>7.3f} {r['prefill_speedup']:>5.2f} | "
            f"{100 * r['executor_share']:>4.0f}% {100 * r['binding_share']:>4.0f}%")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples, one thread")
    ap.add_argument("--threads", type=int, nargs="+", default=None)
    ap.add_argument("--past", type=int, default=32, help="past tokens at the start of each decode burst")
    ap.add_argument("--prompt", type=int, default=16, help="prefill prompt tokens")
    ap.add_argument("--samples", type=int, default=None, help="timed decode steps per runtime")
    ap.add_argument("--block", type=int, default=9, help="calls per block (first one untimed)")
    ap.add_argument("--share-steps", type=int, default=24, help="profiled steps for the executor share")
    ap.add_argument("--models", nargs="*", default=None, help="regular expressions selecting models")
    ap.add_argument("--no-builtin", action="store_true")
    args = ap.parse_args(argv)
    args.threads = args.threads or ([1] if args.quick else [1, 2])
    args.samples = args.samples or (24 if args.quick else 96)
    import onnx_light_kv  # noqa: F401  (fail early without the extension)

    todo = fixture_models() + ([] if args.no_builtin else builtin_models())
    if args.models:
        todo = [m for m in todo if any(re.search(p, m[0]) for p in args.models)]
    env = _common.environment(threads=None, extra={"threads_measured": args.threads})
    print(HEADER)
    rows: List[Dict[str, Any]] = []
    for name, data, info in todo:
        rows.extend(measure(name, data, info, args))
    payload = {"benchmark": "models", "args": vars(args), "environment": env, "rows": rows}
    path = _common.write_json("models", payload)
    print(f"\nx: onnxruntime median / ours (above 1: ours faster). exec: executor share of a step "
          f"(outside kernels); bind: binding share of the Python call.\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
