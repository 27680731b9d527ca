"""One MatMul with a constant weight, ours vs onnxruntime (MLAS), per kernel path.

The model is ``Y = MatMul(X, W)`` with ``W`` (k x n) an initializer, as every projection of an
exported decoder: both runtimes pack it once when the session is built. Shapes are a decode
step (1 and 4 rows: the GEMV, bound by reading the weights) and prefills (128 and 512 rows:
the blocked GEMM, bound by the FMA units), float32 and float16 (onnxruntime's CPU provider
computes float16 MatMul by inserting casts to float32).

Each (shape, dtype, threads) is timed with ``_common.blocked`` (sides alternating in blocks of
calls after a pause). Output: a table with medians, p10, GFLOP/s (2*m*n*k per call, at the
median) and ``speedup`` (onnxruntime's median / ours, > 1: we are faster), and raw samples
plus the environment in ``benchmarks/results/matmul-<paths>-<timestamp>.json``. ``--kernel
avx2|avx512|go|auto`` forces our path (``onnx_light_kv.set_kernel``: attention and matrix
kernels), so the AVX2 kernels can be measured on an AVX-512 machine; several paths
(``--kernel avx2 avx512``) run side by side on one session, alternating with onnxruntime in
the same blocks (columns ``ours-<path>_*`` and ``speedup_<path>``).

``--weights int4`` (or ``int8``) times com.microsoft ``MatMulNBits`` instead, as the
onnxruntime-genai builder emits it for ``-p int4`` (groups of ``--block-size`` 32 along k,
uint8 zero points): our packs keep the integers and dequantize a sliver at a time, onnxruntime
runs at ``--accuracy-level`` (default 0: the exact float product we compute; the builder sets
4, where onnxruntime quantizes A to int8). The table adds the float32 size of the weight and,
for the first thread count, the resident memory a fresh process gains by importing each runtime,
creating its session and running it once (``*_rss_mb``, Linux, measured in a child process).

``--preset small`` times the one-row products of a small export (weights of 256 x 64 to
1024 x 256, in the caches), where a call's fixed cost shows.

Run: ``python benchmarks/bench_matmul.py [--quick] [--preset small] [--kernel avx2 avx512]
[--weights int4]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


SHAPES: List[Tuple[int, int, int]] = [(1, 1024, 4096), (1, 4096, 1024), (4, 1024, 4096), (1, 1024, 32000),
                                      (16, 1024, 1024), (16, 512, 2048), (128, 1024, 1024), (512, 1024, 4096)]
QUICK_SHAPES: List[Tuple[int, int, int]] = [(1, 1024, 4096), (4, 1024, 4096), (128, 1024, 1024)]
# ``--preset small``: the decode-step products of a small Llama-style export (hidden 256, one
# KV head of 64, MLP 512, a tied 1024-word head: tests/fixtures trained-llama-*), whose weights
# sit in the L2/L3, so a call's fixed cost and the in-cache rate decide, not DRAM bandwidth.
SMALL_SHAPES: List[Tuple[int, int, int]] = [(1, 256, 64), (1, 256, 256), (1, 256, 512), (1, 512, 256),
                                            (1, 256, 1024)]


def matmul_model(k: int, n: int, dtype: str, seed: int = 0) -> bytes:
    """Serialized ``Y = MatMul(X, W)``, X [m, k] with a symbolic m, W [k, n] a constant."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    w = (np.random.default_rng(seed).standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "matmul",
        [helper.make_tensor_value_info("X", elem, ["m", k])],
        [helper.make_tensor_value_info("Y", elem, ["m", n])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def nbits_model(k: int, n: int, dtype: str, bits: int, block: int, accuracy_level: int, seed: int = 0) -> bytes:
    """Serialized ``Y = MatMulNBits(X, B, scales, zero_points)`` (com.microsoft) of a random
    weight ``n x k`` quantized to ``bits`` in groups of ``block`` along k, as the onnxruntime-genai
    builder lays it out: B ``[n, k_blocks, block*bits/8]``, scales of X's type, uint8 zero points."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    rng = np.random.default_rng(seed)
    kb = (k + block - 1) // block
    b = rng.integers(0, 256, size=(n, kb, block * bits // 8), dtype=np.uint8)
    scales = (rng.standard_normal(n * kb) * (2.0 / (np.sqrt(k) * (1 << bits)))).astype(dtype)
    zp = rng.integers(0, 256, size=(n, (kb * bits + 7) // 8), dtype=np.uint8)
    node = helper.make_node("MatMulNBits", ["X", "B", "scales", "zero_points"], ["Y"], domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=block, accuracy_level=accuracy_level)
    graph = helper.make_graph(
        [node], "matmulnbits", [helper.make_tensor_value_info("X", elem, ["m", k])],
        [helper.make_tensor_value_info("Y", elem, ["m", n])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales"),
         numpy_helper.from_array(zp, "zero_points")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model.SerializeToString()


def sessions(model: bytes, threads: int) -> Dict[str, Any]:
    """Our session and onnxruntime's, ``threads`` intra-op threads each."""
    import onnx_light_kv
    import onnxruntime

    so = _common.ort_session_options(onnxruntime, threads)
    return {"ours": onnx_light_kv.InferenceSession(model, threads=threads),
            "ort": onnxruntime.InferenceSession(model, so, providers=["CPUExecutionProvider"])}


#: session_memory's child program: argv runtime, model path, k, dtype; prints {"rss_mb": ...}.
_MEMORY_CHILD = """
import json, os, sys
import numpy as np
x = np.ones((1, int(sys.argv[3])), sys.argv[4])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
before = rss()
if sys.argv[1] == "ours":
    import onnx_light_kv
    s = onnx_light_kv.InferenceSession(sys.argv[2], threads=1)
else:
    import onnxruntime
    s = onnxruntime.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
s.run(None, {s.get_inputs()[0].name: x})
print(json.dumps({"rss_mb": rss() - before}))
"""


def session_memory(runtime: str, model: bytes, k: int, dtype: str) -> Optional[float]:
    """Resident memory (MB, Linux ``/proc/self/statm``) a fresh process holds more after it
    imported ``runtime``, created its session for ``model`` (inner dimension ``k``, input
    ``dtype``) from a file and ran it on one row than before, measured in a child process so that
    neither the other runtime nor earlier shapes count; None where that fails."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        with open(path, "wb") as f:
            f.write(model)
        proc = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, runtime, path, str(k), dtype], capture_output=True,
                              text=True, timeout=600)
    if proc.returncode != 0:
        return None
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["rss_mb"])


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="three shapes, float32, one thread, few samples")
    p.add_argument("--preset", choices=["default", "small"], default="default",
                   help="shape set: default (1-512 rows, hidden 1024-4096) or small (one row, the small "
                        "fixture export's projections, 256 x 64 to 1024 x 256)")
    p.add_argument("--kernel", choices=["auto", "avx2", "avx512", "go"], nargs="+", default=["auto"],
                   help="our kernel paths (attention and GEMM, as onnx_light_kv.set_kernel), run side by side")
    p.add_argument("--threads", type=_common.threads_arg, nargs="+", default=[1, 2])
    p.add_argument("--dtypes", nargs="+", choices=["float32", "float16"], default=["float32", "float16"])
    p.add_argument("--samples", type=_common.positive_int, default=40, help="timed calls per side")
    p.add_argument("--warmup", type=_common.nonneg_int, default=3)
    p.add_argument("--weights", choices=["float", "int4", "int8"], default="float",
                   help="float: MatMul with a constant weight of the input's type; int4/int8: MatMulNBits")
    p.add_argument("--block-size", type=_common.int_range(16, 1 << 16, "a block size"), default=32,
                   help="MatMulNBits values per quantization group (a power of 2, >= 16)")
    p.add_argument("--accuracy-level", type=_common.int_range(0, 4, "an accuracy level"), default=0,
                   help="MatMulNBits accuracy_level for onnxruntime (ours computes the float product at every level)")
    p.add_argument("--name", default=None, type=_common.name_arg, help="results file prefix (default matmul, or matmulnbits-int4/int8)")
    _common.add_results_dir(p)
    a = p.parse_args(argv)
    if a.block_size & (a.block_size - 1):
        p.error(f"--block-size must be a power of 2, got {a.block_size}")
    if a.name is None:
        a.name = "matmul" if a.weights == "float" else f"matmulnbits-{a.weights}"
    a.shapes = QUICK_SHAPES if a.quick else SMALL_SHAPES if a.preset == "small" else SHAPES
    if a.quick:  # (where the command line left the defaults)
        _common.quick_defaults(p, a, {"threads": [1], "dtypes": ["float32"], "samples": 15})
    return a


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import onnx_light_kv

    runs = _common.kernel_runs(args.kernel, required=True)  # exit status 2 when none is available
    # One column set per path ("ours" alone for a single --kernel auto).
    ours = {("ours" if args.kernel == ["auto"] else f"ours-{run}"): run for _, run in runs}
    kernels: Dict[str, Any] = {}
    for r, run in ours.items():
        onnx_light_kv.set_kernel(run)  # ValueError when this CPU or build lacks the path
        info = onnx_light_kv.build_info()
        kernels[r] = {"requested": run, "attention": info.get("attention_kernel"), "gemm": info.get("gemm_kernel")}
        print(f"{r}: gemm kernel path {kernels[r]['gemm']}; cpu: {info.get('cpu')}", flush=True)
    print(_common.isa_line(), flush=True)
    env = _common.environment(threads=None, extra={"threads_measured": args.threads, "kernels": kernels})
    rng = np.random.default_rng(1)
    rows: List[Dict[str, Any]] = []
    raw: List[Dict[str, Any]] = []
    for dtype in args.dtypes:
        for m, k, n in args.shapes:
            if args.weights == "float":
                model = matmul_model(k, n, dtype)
            else:
                model = nbits_model(k, n, dtype, 4 if args.weights == "int4" else 8, args.block_size,
                                    args.accuracy_level)
            x = rng.standard_normal((m, k)).astype(dtype)
            for threads in args.threads:
                sess = sessions(model, threads)
                fns = {r: _common.on_kernel(run, (lambda s=sess["ours"]: s.run(["Y"], {"X": x})))
                       for r, run in ours.items()}
                fns["ort"] = lambda s=sess["ort"]: s.run(["Y"], {"X": x})
                want = np.asarray(fns["ort"]()[0], np.float32)
                err = max(float(np.max(np.abs(np.asarray(fns[r]()[0], np.float32) - want)) /
                                (np.max(np.abs(want)) + 1e-30)) for r in ours)
                samples = _common.blocked(fns, repeat=args.samples, warmup=args.warmup)
                row: Dict[str, Any] = {"dtype": dtype, "m": m, "k": k, "n": n, "threads": threads}
                if args.weights != "float":
                    row.update({"weights": args.weights, "f32_weight_mb": 4 * k * n / 1e6})
                    if threads == args.threads[0]:
                        row.update({f"{r}_rss_mb": session_memory(r, model, k, dtype) for r in ("ours", "ort")})
                for r in fns:
                    st = _common.summarize(samples[r])
                    row.update({f"{r}_median_ms": st["median"], f"{r}_p10_ms": st["p10"],
                                f"{r}_gflops": 2 * m * n * k / (st["median"] * 1e6)})
                    raw.append({"runtime": r, "dtype": dtype, "m": m, "k": k, "n": n, "threads": threads,
                                "samples_ms": samples[r], **st})
                for r, run in ours.items():
                    key = "speedup" if r == "ours" else f"speedup_{run}"
                    row[key] = _common.speedup(row[f"{r}_median_ms"], row["ort_median_ms"])
                row["max_rel_diff"] = err
                rows.append(row)
                print(_common.format_table([row]).splitlines()[-1], flush=True)
                del sess
        onnx_light_kv.set_kernel("auto")
    print()
    print(_common.format_table(rows))
    print(_common.SPEEDUP)
    what = "MatMul with a constant weight" if args.weights == "float" else f"MatMulNBits ({args.weights})"
    payload = {"benchmark": f"{what}, ours vs onnxruntime", "kernels": kernels,
               "config": {"shapes": args.shapes, "dtypes": args.dtypes, "threads": args.threads,
                          "samples": args.samples, "warmup": args.warmup, "quick": args.quick,
                          "preset": args.preset, "weights": args.weights, "block_size": args.block_size,
                          "accuracy_level": args.accuracy_level},
               "environment": env,
               "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
               "rows": rows, "raw": raw}
    path = _common.write_json(f"{args.name}-{'-'.join(ours.values())}", payload, args.results_dir)
    print(f"\nresults: {os.path.abspath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
