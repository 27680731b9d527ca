"""Small shared helpers for the benchmark programs.

Every benchmark writes raw samples + environment to JSON, prints a table and can draw a PNG.
This module keeps that uniform:

* :func:`environment` -- CPU model and flags, logical cores, threads, package versions, Go
  version, git revision (no host names, no paths).
* :func:`time_calls` -- wall-clock samples of a callable, in milliseconds, after warm-up.
* :func:`summarize` -- median, p10, p90, mean, min, max, n of a list of samples.
* :func:`interleaved` -- time several callables in alternating rounds (A B A B ...), so
  drift (thermal, other processes) hits all of them alike.
* :func:`blocked` -- alternating blocks (pause, settling call, A A A A; pause, settling call,
  B B B B; ...): use it for side-by-side ratios of multi-threaded runtimes, whose worker
  threads keep spinning after a call and would take the cores of whoever runs next.
* :func:`write_json` -- ``benchmarks/results/<name>-<UTC timestamp>.json`` (or ``--results-dir``);
  returns the path. Strict JSON: NaN and infinities are written as ``null`` (:func:`json_safe`).
* :func:`format_table` -- a fixed-width text table from a list of row dicts (NaN shows as ``n/a``).
* argparse ``type=`` checks, so a bad value is argparse's usage error (exit status 2), never a
  traceback or a table of NaN: :func:`positive_int` (>= 1), :func:`nonneg_int` (>= 0),
  :func:`int_range` (any bounds, e.g. ``int_range(2)`` for blocks), :func:`threads_arg`
  (1..1024), :func:`positive_float` (finite, > 0), :func:`heads` (``Q/KV`` -> ``(q, kv)``,
  Q a multiple of KV), :func:`block_size` (one the paged cache takes), :func:`regex` (a valid regular expression); :func:`add_results_dir`
  adds the ``--results-dir`` option every benchmark has.
* :func:`plot_series` -- latency-style line plot with a p10..p90 band, PNG (matplotlib, Agg).
* :func:`speedup` -- the one ratio every benchmark reports (:data:`SPEEDUP`).
* :func:`progress` -- a tqdm progress bar over the cases when tqdm is installed.

Usage::

    from _common import environment, interleaved, summarize, write_json, format_table
    samples = interleaved({"ours": f, "ort": g}, repeat=20, warmup=3)
    row = {"case": "x", **{k: summarize(v)["median"] for k, v in samples.items()}}
    print(format_table([row]))
    write_json("my-bench", {"environment": environment(threads=1), "rows": [row], "samples": samples})

Only the standard library and numpy are needed at import; matplotlib loads inside plot_series.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: CPU flags that matter for the kernels; the full list is recorded as well.
KEY_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


# ---------------------------------------------------------------- argument checks
#
# argparse ``type=`` functions: a bad value raises ``argparse.ArgumentTypeError``, which argparse
# reports as ``error: argument --x: <message>`` after the usage line, with exit status 2.

#: Largest thread count the library accepts (``set_threads``, ``read_bandwidth``, sessions).
MAX_THREADS = 1024


def _integer(text: str) -> int:
    try:
        return int(str(text).strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def int_range(lo: Optional[int] = None, hi: Optional[int] = None, what: str = "an integer") -> Callable[[str], int]:
    """An argparse ``type=``: an integer in ``lo..hi`` (either bound may be None: open)."""
    if lo is not None and hi is not None:
        want = f"{what} in {lo}..{hi}"
    elif lo is not None:
        want = f"{what} >= {lo}"
    elif hi is not None:
        want = f"{what} <= {hi}"
    else:
        want = what

    def parse(text: str) -> int:
        v = _integer(text)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {want}, got {v}")
        return v

    parse.__name__ = f"int_range({lo}, {hi})"
    return parse


#: An argparse ``type=``: an integer >= 1 (counts, sizes, repetitions).
positive_int = int_range(1)
#: An argparse ``type=``: an integer >= 0 (warm-up calls, residual windows).
nonneg_int = int_range(0)
#: An argparse ``type=``: a thread count, 1..:data:`MAX_THREADS`.
threads_arg = int_range(1, MAX_THREADS, "a thread count")


#: An argparse ``type=``: a decoder's layer count, 1..256.
layers_arg = int_range(1, 256, "a layer count")


def run_main(main: Callable[[], Optional[int]]) -> int:
    """Run a benchmark's ``main`` and return its exit status: a size the machine or the library
    refuses (a ``MemoryError``, or a ``ValueError``/``OverflowError`` from numpy or the runtime,
    such as a context or batch far too large) is one ``error:`` line and status 2, as argparse
    reports a bad value; Ctrl-C is status 130 without a traceback."""
    try:
        return int(main() or 0)
    except KeyboardInterrupt:
        return 130
    except (MemoryError, ValueError, OverflowError) as e:
        print(f"{os.path.basename(sys.argv[0])}: error: {e} ({type(e).__name__})", file=sys.stderr)
        return 2


def positive_float(text: str) -> float:
    """An argparse ``type=``: a finite number > 0 (sizes in GiB or MiB)."""
    try:
        v = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return v


def heads(text: str) -> Tuple[int, int]:
    """An argparse ``type=``: ``"Q/KV"`` query and key/value heads -> ``(q, kv)``; both >= 1 and
    Q a multiple of KV (each KV head serves a whole group of query heads)."""
    q_s, sep, kv_s = str(text).partition("/")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected Q/KV heads such as 32/8, got {text!r}")
    try:
        q, kv = int(q_s.strip(), 10), int(kv_s.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected Q/KV heads such as 32/8 (two integers), got {text!r}") from None
    if kv < 1 or q < 1:
        raise argparse.ArgumentTypeError(f"Q and KV heads must be >= 1, got {text!r}")
    if q % kv:
        raise argparse.ArgumentTypeError(f"query heads must be a multiple of the KV heads, got {text!r}")
    return q, kv


def block_size(text: str) -> int:
    """An argparse ``type=``: a paged-cache block size the library takes
    (``onnx_light_kv.cache.BLOCK_SIZES``; any positive integer where the package is not
    importable, whose own check then reports it)."""
    v = positive_int(text)
    try:
        from onnx_light_kv.cache import BLOCK_SIZES
    except Exception:
        return v
    if v not in BLOCK_SIZES:
        raise argparse.ArgumentTypeError(f"must be one of {' '.join(map(str, BLOCK_SIZES))}, got {v}")
    return v


def regex(text: str) -> str:
    """An argparse ``type=``: a valid regular expression (returned as given)."""
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"invalid regular expression {text!r}: {e}") from None
    return text


def add_results_dir(parser: argparse.ArgumentParser) -> None:
    """The ``--results-dir`` option (default :data:`RESULTS_DIR`): where the JSON (and, for the
    programs that draw one, the PNG plot) go; pass ``args.results_dir`` to :func:`write_json`."""
    parser.add_argument("--results-dir", default=RESULTS_DIR, type=results_dir_arg,
                        help="where the JSON (and a plot, where the program draws one) go (default: benchmarks/results)")


def results_dir_arg(text: str) -> str:
    """An argparse ``type=``: a folder results can be written to, created if missing (checked
    before the run, so a bad one does not lose a finished run's results)."""
    try:
        os.makedirs(text, exist_ok=True)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot use {text!r} as the results folder: {e.strerror or e}") from None
    if not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write to the results folder {text!r}")
    return text


def quick_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace, values: Mapping[str, Any]) -> None:
    """``--quick``'s sizes: each option of ``values`` takes its quick value where the command line
    left it at its default (a value the user gave is kept, and checked as given)."""
    for name, v in values.items():
        if getattr(args, name) == parser.get_default(name):
            setattr(args, name, v)


def name_arg(text: str) -> str:
    """An argparse ``type=``: a results file prefix (a plain file name: no folder, checked before
    the run, so a bad one does not lose a finished run's results)."""
    if not text or text in (".", "..") or os.sep in text or (os.altsep and os.altsep in text) or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a plain file name (the folder is --results-dir)")
    return text


def _run(cmd: Sequence[str]) -> str:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=20,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpuinfo() -> Tuple[str, List[str]]:
    model, flags = platform.processor() or "unknown", []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("unknown", "", platform.processor()):
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = value.split()
    except OSError:
        pass
    return model, flags


def _version(module: str) -> Optional[str]:
    try:
        mod = __import__(module)
        return str(getattr(mod, "__version__", "unknown"))
    except Exception:  # a broken optional package must not stop a benchmark
        return None


#: The attention kernel paths a benchmark's ``--kernel`` option accepts ("auto": the best one).
KERNEL_CHOICES = ("auto", "go", "avx2", "avx512")


def kernel_paths() -> Dict[str, Any]:
    """The installed package's attention kernel paths: ``{"active": name, "available": [names],
    "gemm": the matrix kernels' path, "tuning": the SIMD loops' CPU tuning}`` (portable Go twin
    first, best last), or ``{}`` when the package cannot be imported."""
    try:
        import onnx_light_kv

        info = onnx_light_kv.build_info()
    except Exception:  # the benchmark may run without our package (onnxruntime alone)
        return {}
    return {"active": info.get("attention_kernel"), "available": list(info.get("attention_kernels", [])),
            "gemm": info.get("gemm_kernel"), "tuning": info.get("kernel_tuning")}


def kernel_runs(requested: Sequence[str], required: bool = False) -> List[Tuple[str, str]]:
    """``(requested name, path that runs)`` for each name of ``--kernel`` the CPU and build have
    ("auto" resolves to the best available path); unavailable ones are reported and left out.

    ``required``: when none of them is available, say so on stderr and exit with status 2
    (a benchmark asked for kernel paths must not pass with none of them measured)."""
    paths = kernel_paths()
    avail = paths.get("available", [])
    out: List[Tuple[str, str]] = []
    for name in requested:
        run = avail[-1] if name == "auto" and avail else name
        if run not in avail:
            print(f"kernel path {name!r} is not available on this CPU/build (available: {', '.join(avail)}): skipped")
            continue
        if all(r != run for _, r in out):
            out.append((name, run))
    if required and not out:
        print(f"error: none of the requested kernel paths ({', '.join(requested)}) is available on this "
              f"CPU/build (available: {', '.join(avail) or 'none'})", file=sys.stderr)
        raise SystemExit(2)
    return out


def on_kernel(path: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run on attention kernel path ``path`` (selected before each call; a pointer store)."""
    import onnx_light_kv

    def call() -> Any:
        onnx_light_kv.set_kernel(path)
        return fn()
    return call


def isa_line() -> str:
    """One line naming the CPU, its kernel-relevant flags and the kernel paths, for tables."""
    model, flags = _cpuinfo()
    paths = kernel_paths()
    return (f"CPU: {model}; flags: {' '.join(f for f in KEY_FLAGS if f in flags)}; kernel paths: "
            f"{', '.join(paths.get('available', [])) or 'n/a'} (default {paths.get('active', 'n/a')}, "
            f"gemm {paths.get('gemm', 'n/a')})")


ORT_SPIN_ENV = "OLKV_BENCH_ORT_SPIN"


def ort_spinning() -> bool:
    """Whether onnxruntime's intra-op workers may spin between calls (``OLKV_BENCH_ORT_SPIN=1``).

    Off by default: the benchmarks alternate onnxruntime with our runtime in one process, and
    onnxruntime's spinning workers keep a core busy after each of its calls, so with two threads
    on a 2-core machine the next runtime in the alternation ran on about one core (measured:
    our 128 x 1024 x 1024 MatMul on two threads took 1.9 ms after an onnxruntime call without
    spinning and 3.6 ms with it, while onnxruntime's own time stayed within noise)."""
    return os.environ.get(ORT_SPIN_ENV, "0") == "1"


def ort_session_options(ort: Any, threads: int, sequential: bool = True) -> Any:
    """onnxruntime ``SessionOptions`` for a side-by-side run: ``threads`` intra-op threads, one
    inter-op thread, sequential execution (when ``sequential``), and intra-op spinning as
    :func:`ort_spinning` says (recorded by :func:`environment`)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if sequential:
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if ort_spinning() else "0")
    return so


def environment(threads: Optional[int] = None, extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Machine and software description to store next to the samples.

    ``threads``: the thread count the benchmark uses (recorded as given). ``extra``: merged in.
    Keys: timestamp_utc, cpu_model, cpu_key_flags, cpu_flags, kernel_paths (see
    :func:`kernel_paths`), logical_cpus, affinity_cpus,
    memory_gib, load_average_1_5_15 (other work on the machine skews samples), ort_intra_op_spinning
    (see :func:`ort_spinning`), os, python, versions {numpy, onnx, onnxruntime, onnx_light_kv, matplotlib},
    onnx_light_kv_build (``build_info()`` when the package provides it), go, git {rev, dirty},
    env (thread-related variables).
    """
    model, flags = _cpuinfo()
    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    info: Dict[str, Any] = {
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": model,
        "cpu_key_flags": [f for f in KEY_FLAGS if f in flags],
        "cpu_flags": flags,
        "kernel_paths": kernel_paths(),
        "logical_cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": mem,
        "load_average_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "threads": threads,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "versions": {m: _version(m) for m in ("numpy", "onnx", "onnxruntime", "onnx_light_kv", "matplotlib")},
        "go": _run(["go", "version"]) or None,
        "git": {"rev": _run(["git", "rev-parse", "HEAD"]) or None,
                "dirty": bool(_run(["git", "status", "--porcelain", "--untracked-files=no"]))},
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "GOMAXPROCS", "GOEXPERIMENT", "MKL_NUM_THREADS")
                if k in os.environ},
        "ort_intra_op_spinning": ort_spinning(),
    }
    try:
        import onnx_light_kv
        info["onnx_light_kv_build"] = onnx_light_kv.build_info()
    except Exception:
        info["onnx_light_kv_build"] = None
    if extra:
        info.update(extra)
    return info


def time_calls(fn: Callable[[], Any], repeat: int, warmup: int = 2) -> List[float]:
    """Call ``fn`` ``warmup`` times untimed, then ``repeat`` times; per-call milliseconds."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def interleaved(fns: Mapping[str, Callable[[], Any]], repeat: int, warmup: int = 2) -> Dict[str, List[float]]:
    """Per-call milliseconds of several callables measured in alternating rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for key, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn()
            out[key].append((time.perf_counter_ns() - t0) / 1e6)
    return out


def blocked(fns: Mapping[str, Callable[[], Any]], repeat: int, warmup: int = 2, block: int = 5,
            pause: float = 0.05) -> Dict[str, List[float]]:
    """Per-call milliseconds, sides alternating in blocks of ``block`` calls; the first call of
    each block is a settling call and is not recorded (``repeat`` samples per side in all).

    Before each block the script sleeps ``pause`` seconds, so the other side's worker threads
    have stopped spinning: onnxruntime's intra-op workers keep spinning for longer than many
    of our calls take, and on a 2-core machine a spinning worker takes the core our second
    thread needs (measured: our 2-thread attention step at 16k tokens 6.5-6.9 ms right after
    onnxruntime's block, 5.1 ms with its spinning off). Both sides get the same pause and
    settling call.
    """
    if block < 2:
        raise ValueError(f"block must be >= 2 (one settling call plus timed calls), got {block}")
    if not fns:
        raise ValueError("nothing to time (every side was left out)")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: Dict[str, List[float]] = {k: [] for k in fns}
    while min(len(v) for v in out.values()) < repeat:
        for key, fn in fns.items():
            time.sleep(pause)
            fn()
            for _ in range(block - 1):
                t0 = time.perf_counter_ns()
                fn()
                out[key].append((time.perf_counter_ns() - t0) / 1e6)
    return {k: v[:repeat] for k, v in out.items()}


def summarize(samples: Iterable[float]) -> Dict[str, float]:
    """``{"median", "p10", "p90", "mean", "min", "max", "n"}`` of the samples (NaN when empty)."""
    a = np.asarray(list(samples), dtype=np.float64)
    if a.size == 0:
        return {k: float("nan") for k in ("median", "p10", "p90", "mean", "min", "max")} | {"n": 0}
    p10, med, p90 = np.percentile(a, [10, 50, 90])
    return {"median": float(med), "p10": float(p10), "p90": float(p90), "mean": float(a.mean()),
            "min": float(a.min()), "max": float(a.max()), "n": int(a.size)}


def write_json(name: str, payload: Mapping[str, Any], results_dir: str = RESULTS_DIR) -> str:
    """Write ``payload`` to ``<results_dir>/<name>-<YYYYmmddTHHMMSSZ>.json`` and return the path.

    Every result records where it was measured: the payload must have an ``"environment"`` key
    (:func:`environment`'s dict; ValueError otherwise), the one name all benchmarks use. Where the
    file goes is not part of the measurement: a ``results_dir`` among the payload's ``args`` is
    left out (it would record a path of this machine)."""
    if "environment" not in payload:
        raise ValueError(f"benchmark result {name!r} has no 'environment' (CPU, flags, kernel path)")
    args = payload.get("args")
    if isinstance(args, Mapping) and "results_dir" in args:
        payload = {**payload, "args": {k: v for k, v in args.items() if k != "results_dir"}}
    text = json.dumps(json_safe(payload), indent=1, default=_jsonable, allow_nan=False)
    os.makedirs(results_dir, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(results_dir, f"{name}-{stamp}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(tmp, path)
    return path


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN or infinity (Python or numpy float, at any depth of dicts, lists,
    tuples and arrays) replaced by None, numpy scalars and arrays as Python values: strict JSON
    has no NaN (``json.dump`` would write a bare ``NaN`` that strict parsers reject)."""
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, Mapping):
        return {(k.item() if isinstance(k, np.generic) else k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _jsonable(obj: Any) -> Any:
    return str(obj)  # what json_safe leaves that JSON has no type for (paths, sets, ...)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Optional[Sequence[str]] = None, floatfmt: str = "{:.3f}",
                 labels: Optional[Mapping[str, str]] = None, min_width: int = 0) -> str:
    """Fixed-width table; floats through ``floatfmt`` (NaN, a figure not measured: ``n/a``);
    columns default to the first row's keys; ``labels`` gives a column a heading other than its
    key (a unit, say, without changing the rows' keys in the JSON); every column is at least
    ``min_width`` wide (so rows printed one at a time line up under one header)."""
    if not rows:
        return "(no rows)"
    cols = list(columns or rows[0].keys())

    def cell(v: Any) -> str:
        if isinstance(v, (float, np.floating)):
            return floatfmt.format(v) if not math.isnan(v) else "n/a"
        return str(v)

    cells = [[cell(r.get(c, "")) for c in cols] for r in rows]
    titles = [(labels or {}).get(c, c) for c in cols]
    widths = [max(len(t), min_width, *(len(row[i]) for row in cells)) for i, t in enumerate(titles)]
    line = "  ".join(t.rjust(w) for t, w in zip(titles, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join([line, sep, *body])


#: The one ratio convention of the benchmarks and the README.
SPEEDUP = "speed-up = their time / our time, > 1 means we are faster"


def speedup(ours: float, theirs: float) -> float:
    """``theirs / ours`` (see :data:`SPEEDUP`): 2.0 means we take half their time."""
    return theirs / ours if ours > 0 else float("nan")


def progress(items: Iterable[Any], desc: str = "", total: Optional[int] = None) -> Iterable[Any]:
    """``items`` with a tqdm progress bar on stderr when tqdm is installed
    (``pip install 'onnx-light-kv[progress]'``) and stderr is a terminal."""
    if not sys.stderr.isatty():
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, total=total, leave=False)


def plot_series(path: str, series: Mapping[str, Mapping[str, Sequence[float]]], xlabel: str, ylabel: str,
                title: str = "", logx: bool = True, logy: bool = False,
                ratio: Optional[Mapping[str, Tuple[Sequence[float], Sequence[float]]]] = None) -> str:
    """Line plot, one line per series with a shaded p10..p90 band, saved as PNG at ``path``.

    ``series[label]`` holds lists ``x``, ``median`` and optionally ``p10``/``p90``.
    ``ratio[label] = (x, values)`` adds a lower panel of speed-ups (:data:`SPEEDUP`) with a 1.0 line.
    Returns ``path``.
    """
    from onnx_light_kv._optional import require

    matplotlib = require("matplotlib")  # ImportError naming the 'plot' extra when missing
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if ratio:
        fig, (ax, axr) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    else:
        fig, ax = plt.subplots(figsize=(8, 5))
        axr = None
    for label, s in series.items():
        (line,) = ax.plot(s["x"], s["median"], marker="o", ms=3, label=label)
        if "p10" in s and "p90" in s:
            ax.fill_between(s["x"], s["p10"], s["p90"], color=line.get_color(), alpha=0.2, lw=0)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if logy:
        ax.set_yscale("log")
    bottom = axr if axr is not None else ax
    if axr is not None and ratio:
        for label, (x, values) in ratio.items():
            axr.plot(x, values, marker="o", ms=3, label=label)
        axr.axhline(1.0, color="gray", lw=1, ls="--")
        axr.set_ylabel("speed-up (their / our time)")
        axr.grid(True, which="both", alpha=0.3)
        axr.legend(fontsize=8)
    if logx:
        bottom.set_xscale("log", base=2)
    bottom.set_xlabel(xlabel)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":  # print the environment record
    json.dump(environment(), sys.stdout, indent=1)
    print()
