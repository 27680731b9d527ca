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
- **executor share**: two more sessions of ours, one profiled, run the same decode loop step
  for step; per pair of steps ``1 - sum(kernel times) / sum(run_ns)``, the kernel times from
  the profiled session's events and ``run_ns`` (the run's wall time inside the Go executor)
  from the plain one, so the profiler's clock reads are not counted (``executor_share_profiled``
  is the share within the profiled runs). The two sessions take turns running first in a step:
  the run right after the Python driver's work is the slower one (its kernels' caches are colder;
  measured 20-40 us a step on the fp16 exports), which a fixed order would count as executor
  time of the plain session (``executor_share_plain_first``: the share of the steps where the
  plain session ran first, the definition before the turns). ``binding`` is the share of the plain session's ``run`` call spent
  outside the executor (feed and output conversion); ``step_outside`` is the same against the
  whole step of the Python driver (feeds built, outputs mapped: what ``binding`` measured
  before). ``allocs``: Go heap allocations per step of the plain session, binding included
  (``go_allocs_per_step``).

Speed-up is onnxruntime's median time / ours (above 1: we are faster). Output: a table, and
raw samples plus the environment in ``benchmarks/results/models-<timestamp>.json`` (``--results-dir``
elsewhere).
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

# --------------------------------------------------------------------------------------------
# models


#: The built-in decoders: (name, kind, build options).
BUILTINS: Tuple[Tuple[str, str, Dict[str, Any]], ...] = (
    ("builtin-llama", "llama", {}),
    ("builtin-llama-derived-pos", "llama", {"position_ids_input": False}),
    ("builtin-gpt2", "gpt2", {}))


def builtin_models(names: Optional[Sequence[str]] = None) -> List[Tuple[str, bytes, Dict[str, Any]]]:
    """(name, model bytes, info) of the built-in decoders (a small configuration); only those
    of ``names`` when given."""
    from onnx_light_kv import models
    cfg = models.DecoderConfig(layers=2, hidden=128, q_heads=4, kv_heads=2, head_dim=32, vocab=512,
                               max_positions=1024)
    out = []
    for name, kind, kw in BUILTINS:
        if names is not None and name not in names:
            continue
        out.append((name, models.model_bytes(models.build(kind, cfg, **kw)),
                    {"source": "onnx_light_kv.models", "kind": kind, "config": cfg, **kw}))
    return out


def _fixtures_module() -> Any:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import _fixtures  # type: ignore
    except ImportError:
        return None
    return _fixtures


def fixture_names() -> List[str]:
    """The fixture exports' names, when they are present."""
    fx = _fixtures_module()
    if fx is None or not os.path.exists(os.path.join(FIXTURES, "manifest.json")):
        return []
    return list(fx.names())


def fixture_models(names: Optional[Sequence[str]] = None) -> List[Tuple[str, bytes, Dict[str, Any]]]:
    """(name, model bytes, manifest entry) of the fixture exports, when they are present; only
    those of ``names`` when given."""
    fx = _fixtures_module()
    out = []
    for name in fixture_names():
        if names is not None and name not in names:
            continue
        with open(fx.model_path(name), "rb") as f:
            out.append((name, f.read(), {"fixture": name, **fx.entry(name)}))
    return out


# --------------------------------------------------------------------------------------------
# driving a decoder generically (tensor path)


class BuiltinDecoder:
    """The built-in decoders' feeds (``input_ids``, optional ``attention_mask`` and
    ``position_ids``, pasts ``[B, kv_heads, P, D]``), with the interface of the fixtures'
    ``_fixtures.Decoder`` that :class:`Stepper` uses: ``start``, ``feeds``, ``run``, ``state``,
    ``past_len``."""

    def __init__(self, session: Any, info: Dict[str, Any]) -> None:
        from onnx_light_kv import models
        self.session = session
        self.cfg = info["config"]
        self.names = {i.name for i in session.get_inputs()}
        self.pairs = list(zip(models.past_names(self.cfg.layers), models.present_names(self.cfg.layers)))
        self.output_names = [o.name for o in session.get_outputs()]
        self.kv = self.cfg.kv_heads if info["kind"] != "gpt2" else self.cfg.q_heads
        self.state: Dict[str, np.ndarray] = {}
        self.past_len = 0
        self.mask = np.zeros((1, 0), np.int64)

    def start(self, batch: int) -> None:
        self.past_len = 0
        self.mask = np.zeros((batch, 0), np.int64)
        self.state = {p: np.zeros((batch, self.kv, 0, self.cfg.head_dim), np.float32) for p, _ in self.pairs}

    def feeds(self, tokens: np.ndarray, mask: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
        s = tokens.shape[1]
        f: Dict[str, np.ndarray] = {"input_ids": tokens.astype(np.int64), **self.state}
        if "position_ids" in self.names:
            f["position_ids"] = np.arange(self.past_len, self.past_len + s, dtype=np.int64)[None]
        if "attention_mask" in self.names:
            f["attention_mask"] = np.ones((1, self.past_len + s), np.int64)
        return f

    def run(self, tokens: np.ndarray) -> Dict[str, np.ndarray]:
        res = dict(zip(self.output_names, self.session.run(None, self.feeds(tokens))))
        for past, present in self.pairs:
            self.state[past] = res[present]
        self.past_len += tokens.shape[1]
        self.mask = np.ones((tokens.shape[0], self.past_len), np.int64)
        return res


def make_decoder(name: str, session: Any, info: Dict[str, Any]) -> Any:
    """The fixture's generic driver, or the built-in decoders' one."""
    if "fixture" in info:
        return _fixtures_module().Decoder(name, session)
    return BuiltinDecoder(session, info)


def snapshot(dec: Any) -> Tuple[Dict[str, np.ndarray], int, np.ndarray]:
    """The decoder's generation state: pasts, past length, attention mask so far."""
    return dict(dec.state), dec.past_len, dec.mask.copy()


def restore(dec: Any, snap: Tuple[Dict[str, np.ndarray], int, np.ndarray]) -> None:
    dec.state, dec.past_len, dec.mask = dict(snap[0]), snap[1], snap[2].copy()


def prompt_feeds(dec: Any, prompt: np.ndarray) -> Dict[str, np.ndarray]:
    """The feeds of a first run on ``prompt`` (no padding)."""
    dec.start(prompt.shape[0])
    return dec.feeds(prompt, np.ones(prompt.shape, np.int64))


def logits_of(res: Any) -> np.ndarray:
    return np.asarray(res.outputs["logits"] if hasattr(res, "outputs") else res["logits"])


class Stepper:
    """One greedy decode step per call, restarting from a fixed past state every ``period``
    calls (``_common.blocked`` calls it ``period`` times per block), so each burst sees pasts
    of ``start_len``, ``start_len + 1``, ... tokens on both runtimes."""

    def __init__(self, dec: Any, snap: Tuple[Dict[str, np.ndarray], int, np.ndarray], token: np.ndarray,
                 period: int) -> None:
        self.dec, self.snap, self.tok0, self.period = dec, snap, token, period
        self.i, self.tok = 0, token

    def __call__(self) -> Any:
        if self.i % self.period == 0:
            restore(self.dec, self.snap)
            self.tok = self.tok0
        self.i += 1
        res = self.dec.run(self.tok)
        self.tok = np.argmax(logits_of(res)[:, -1, :], axis=-1).astype(np.int64)[:, None]
        return res


def start_state(name: str, ort: Any, info: Dict[str, Any], past: int,
                vocab: int) -> Tuple[Tuple[Dict[str, np.ndarray], int, np.ndarray], np.ndarray]:
    """The generation state after an onnxruntime prefill of ``past`` random tokens, and the
    next token."""
    dec = make_decoder(name, ort, info)
    dec.start(1)
    rng = np.random.default_rng(7)
    res = dec.run(rng.integers(vocab, size=(1, past)).astype(np.int64))
    tok = np.argmax(logits_of(res)[:, -1, :], axis=-1).astype(np.int64)[:, None]
    return snapshot(dec), tok


def vocab_of(ort_session: Any) -> int:
    shape = ort_session.get_outputs()[0].shape
    return int(shape[-1]) if isinstance(shape[-1], int) else 256


# --------------------------------------------------------------------------------------------
# measurement


def make_sessions(data: bytes, threads: int) -> Tuple[Any, Any]:
    """Our session and onnxruntime's (sequential, ``threads`` intra-op threads) of one model."""
    import onnx_light_kv
    from onnx_light_kv._optional import require

    onnxruntime = require("onnxruntime")  # ImportError naming the 'ort' extra when missing
    so = _common.ort_session_options(onnxruntime, threads)
    ort = onnxruntime.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    ours = onnx_light_kv.InferenceSession(data, threads=threads)
    return ours, ort


#: Steps of the executor-share loop between restarts from the start state (even: whole pairs):
#: the pasts then grow by at most this many tokens (the onnxruntime-genai fixtures' shared
#: buffers hold 64 positions).
SHARE_PERIOD = 24


def executor_share(name: str, data: bytes, info: Dict[str, Any], threads: int,
                   snap: Tuple[Dict[str, np.ndarray], int, np.ndarray], tok: np.ndarray, steps: int) -> Dict[str, Any]:
    """Median shares of a decode loop run by two sessions of ours side by side, step for step
    (same pasts, same tokens): a profiled one gives the kernels' time, a plain one the run's
    time inside the executor (``run_ns``), so the executor share (``1 - kernels / run_ns``) does
    not count the profiler's own clock reads (two per node, measured 0.1-0.2 us a pair here);
    ``executor_share_profiled`` is the same share within the profiled runs. The sessions take
    turns running first (see the module docstring), and the share is taken over pairs of steps,
    one of each order; ``executor_share_plain_first`` is the share of the plain-first steps
    alone. Every ``SHARE_PERIOD`` steps both restart from the start state. ``binding_share``:
    the part of the plain session's ``run`` call spent outside the executor (``1 - run_ns /
    call``); ``step_outside_share``: the same against the whole decode step of the driver
    (feeds built in Python, outputs mapped back), the definition ``binding_share`` had before.
    ``go_allocs_per_step``: Go heap objects allocated per plain-session step, binding
    included (the process-wide counter around each call, summed over the steps)."""
    import onnx_light_kv
    prof = onnx_light_kv.InferenceSession(data, threads=threads, profile=True)
    plain = TimedRun(onnx_light_kv.InferenceSession(data, threads=threads))
    decs = {"prof": make_decoder(name, prof, info), "plain": make_decoder(name, plain, info)}
    for d in decs.values():
        restore(d, snap)
    from onnx_light_kv import _lib
    heap = _lib.fn("HeapAllocs")
    ex_first, ex_prof, bind, outside, ran, run_ms = [], [], [], [], [], []
    pairs: List[Tuple[float, float]] = []  # (kernels, plain run_ns) per step, in order
    allocs = 0
    steps += steps % 2  # whole pairs
    tok0 = tok
    for i in range(steps + 2):
        if i > 2 and (i - 2) % SHARE_PERIOD == 0:  # back to the start: the pasts stay short
            for d in decs.values():
                restore(d, snap)
            tok = tok0
        plain_first = i % 2 == 0
        if not plain_first:
            decs["prof"].run(tok)
        a0 = heap()
        t0 = time.perf_counter_ns()
        res = decs["plain"].run(tok)
        wall = time.perf_counter_ns() - t0
        if i >= 2:
            allocs += heap() - a0
        plain_ns = plain.last_run_stats.get("run_ns", 0) or plain.last_ns
        if plain_first:
            decs["prof"].run(tok)
        st = prof.last_run_stats
        tok = np.argmax(logits_of(res)[:, -1, :], axis=-1).astype(np.int64)[:, None]
        if i < 2:
            continue
        kernels = sum(e["dur_ns"] for e in st.get("events", []))
        pairs.append((kernels, plain_ns))
        if plain_first:
            ex_first.append(1.0 - kernels / plain_ns)
        ex_prof.append(1.0 - kernels / (st.get("run_ns", 0) or wall))
        bind.append(1.0 - plain_ns / plain.last_ns)
        outside.append(1.0 - plain_ns / wall)
        ran.append(len(st.get("events", [])))
        run_ms.append(plain_ns / 1e6)
    ex = [1.0 - (k0 + k1) / (r0 + r1) for (k0, r0), (k1, r1) in zip(pairs[0::2], pairs[1::2])]
    return {"executor_share": float(np.median(ex)), "executor_share_profiled": float(np.median(ex_prof)),
            "executor_share_plain_first": float(np.median(ex_first)),
            "binding_share": float(np.median(bind)), "step_outside_share": float(np.median(outside)),
            "nodes_run": int(np.median(ran)),
            "run_ms": float(np.median(run_ms)), "go_allocs_per_step": allocs / steps}


class TimedRun:
    """A session whose ``run`` calls are timed (``last_ns``: the latest call's wall time); every
    other attribute is the session's."""

    def __init__(self, session: Any) -> None:
        self._s = session
        self.last_ns = 0

    def run(self, *args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = self._s.run(*args, **kw)
        self.last_ns = time.perf_counter_ns() - t0
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def node_counts(data: bytes) -> int:
    import onnx
    return len(onnx.load_from_string(data).graph.node)


def measure(name: str, data: bytes, info: Dict[str, Any], args: argparse.Namespace) -> List[Dict[str, Any]]:
    rows: List[Dict[str, Any]] = []
    for threads in args.threads:
        try:
            ours, ort = make_sessions(data, threads)
            vocab = vocab_of(ort)
            snap, tok = start_state(name, ort, info, args.past, vocab)
        except Exception as e:  # unsupported op, bad model: reported in the table
            rows.append({"model": name, "threads": threads, "error": f"{type(e).__name__}: {str(e)[:160]}"})
            print(fmt_row(rows[-1]), flush=True)
            continue
        sides = {"ours": ours, "ort": ort}
        decs = {k: make_decoder(name, s, info) for k, s in sides.items()}
        dec = _common.blocked({k: Stepper(d, snap, tok, args.block) for k, d in decs.items()},
                              repeat=args.samples, warmup=args.block, block=args.block)
        prompt = np.random.default_rng(8).integers(vocab, size=(1, args.prompt)).astype(np.int64)
        pre_fns = {}
        for k, d in decs.items():
            pre_fns[k] = (lambda s, f: lambda: s.run(None, f))(sides[k], prompt_feeds(d, prompt))
        pre = _common.blocked(pre_fns, repeat=max(10, args.samples // 2), warmup=2, block=args.block)
        share = executor_share(name, data, info, threads, snap, tok, args.share_steps)
        row = {"model": name, "threads": threads, "nodes": node_counts(data), **share,
               "decode": {k: _common.summarize(v) for k, v in dec.items()},
               "prefill": {k: _common.summarize(v) for k, v in pre.items()},
               "samples": {"decode": dec, "prefill": pre},
               "info": {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool))}}
        for phase in ("decode", "prefill"):
            row[f"{phase}_speedup"] = row[phase]["ort"]["median"] / row[phase]["ours"]["median"]
        rows.append(row)
        print(fmt_row(row), flush=True)
    return rows


HEADER = (f"{'model':<34} {'thr':>3} {'nodes':>5} {'ran':>4} | {'decode ours':>11} {'ort':>7} {'x':>5} | "
          f"{'prefill ours':>12} {'ort':>7} {'x':>5} | {'exec':>5} {'bind':>5} {'step':>5} {'allocs':>6}")


def fmt_row(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['model']:<34} {r['threads']:>3} {r['error']}"
    d, p = r["decode"], r["prefill"]
    return (f"{r['model']:<34} {r['threads']:>3} {r['nodes']:>5} {r['nodes_run']:>4} | "
            f"{d['ours']['median']:>9.3f}ms {d['ort']['median']:>7.3f} {r['decode_speedup']:>5.2f} | "
            f"{p['ours']['median']:>10.3f}ms {p['ort']['median']:>7.3f} {r['prefill_speedup']:>5.2f} | "
            f"{100 * r['executor_share']:>4.0f}% {100 * r['binding_share']:>4.0f}% "
            f"{100 * r.get('step_outside_share', 0):>4.0f}% {r['go_allocs_per_step']:>6.0f}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples, one thread")
    ap.add_argument("--threads", type=_common.threads_arg, nargs="+", default=None,
                    help="thread counts (default 1 and 2; --quick 1)")
    ap.add_argument("--past", type=_common.positive_int, default=32, help="past tokens at the start of each decode burst")
    ap.add_argument("--prompt", type=_common.positive_int, default=16, help="prefill prompt tokens")
    ap.add_argument("--samples", type=_common.positive_int, default=None,
                    help="timed decode steps per runtime (default 96, quick 24)")
    ap.add_argument("--block", type=_common.int_range(2), default=9, help="calls per block, >= 2 (first one untimed)")
    ap.add_argument("--share-steps", type=_common.positive_int, default=96,
                    help="profiled steps for the executor share (whole pairs: one of each order)")
    ap.add_argument("--models", type=_common.regex, nargs="*", default=None,
                    help="regular expressions selecting models (re.search on the names)")
    ap.add_argument("--no-builtin", action="store_true")
    _common.add_results_dir(ap)
    args = ap.parse_args(argv)
    args.threads = args.threads or ([1] if args.quick else [1, 2])
    args.samples = args.samples or (24 if args.quick else 96)
    known = fixture_names() + ([] if args.no_builtin else [b[0] for b in BUILTINS])
    names = [n for n in known if any(re.search(p, n) for p in args.models)] if args.models else known
    if not names:
        ap.error(f"argument --models: no model matched {' '.join(map(repr, args.models))}; models: {', '.join(known)}"
                 if args.models else "no models to run (--no-builtin and no fixture exports)")
    import onnx_light_kv  # noqa: F401  (fail early without the extension)

    todo = fixture_models(names) + builtin_models(names)
    env = _common.environment(threads=None, extra={"threads_measured": args.threads})
    print(HEADER)
    rows: List[Dict[str, Any]] = []
    for name, data, info in todo:
        rows.extend(measure(name, data, info, args))
    payload = {"benchmark": "models", "args": vars(args), "environment": env, "rows": rows}
    path = _common.write_json("models", payload, args.results_dir)
    print(f"\nx: onnxruntime median / ours (above 1: ours faster). exec: executor share of a step "
          f"(outside kernels); bind: binding share of the run call; step: share of the whole Python "
          f"step outside the executor; allocs: Go heap allocations per step (binding included)."
          f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
