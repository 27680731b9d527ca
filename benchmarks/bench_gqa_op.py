"""One com.microsoft GroupQueryAttention node on the tensor path: our InferenceSession vs onnxruntime.

Both sides run the same one-node model with ``session.run`` as a graph with past/present would be
run without IOBinding: ``past_key``/``past_value`` fed as inputs of ``max_length`` positions,
``present_*`` returned as new arrays of the same length (so each step copies the written part of
the past on both sides). The decode step is one new token with the past filled to ``context - 1``;
the prompt case writes ``context`` tokens into an empty buffer. Sides alternate in blocks after a
pause (``_common.blocked``), with the same thread count.

Outputs: a printed table (median ms, ``speedup`` = onnxruntime time / ours: > 1 means we are
faster) and raw samples plus the environment in ``benchmarks/results/gqa-op-<UTC>.json``
(``--results-dir`` elsewhere).

Usage::

    python benchmarks/bench_gqa_op.py           # GQA 32/8, head 128, contexts 256..4096, fp32/fp16, 1 and 2 threads
    python benchmarks/bench_gqa_op.py --quick   # a smaller subset
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import blocked, environment, format_table, summarize, write_json  # noqa: E402


def gqa_model(heads: int, kv_heads: int, dtype: Any, rotary: bool) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total"] + (["cos", "sin"] if rotary else [])
    node = helper.make_node("GroupQueryAttention", names, ["y", "present_k", "present_v"], domain="com.microsoft",
                            num_heads=heads, kv_num_heads=kv_heads, do_rotary=int(rotary))
    ints = {"seqlens_k": TensorProto.INT32, "total": TensorProto.INT32}
    inputs = [helper.make_tensor_value_info(n, ints.get(n, elem), None) for n in names]
    outputs = [helper.make_tensor_value_info(n, elem, None) for n in ("y", "present_k", "present_v")]
    return helper.make_model(helper.make_graph([node], "gqa", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)], ir_version=10)


def feeds_for(phase: str, ctx: int, max_len: int, heads: int, kv_heads: int, head: int, dtype: Any,
              rotary: bool) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    s = ctx if phase == "prompt" else 1
    f = {"q": rng.standard_normal((1, s, heads * head)).astype(dtype),
         "k": rng.standard_normal((1, s, kv_heads * head)).astype(dtype),
         "v": rng.standard_normal((1, s, kv_heads * head)).astype(dtype),
         "past_k": rng.standard_normal((1, kv_heads, max_len, head)).astype(dtype),
         "past_v": rng.standard_normal((1, kv_heads, max_len, head)).astype(dtype),
         "seqlens_k": np.array([ctx - 1], np.int32),
         # a prompt is the first run (total = S); a decode step after a shared buffer has total <= max_len
         "total": np.array(ctx, np.int32)}
    if rotary:
        ang = rng.uniform(0, 6, (max_len, head // 2))
        f["cos"], f["sin"] = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
    return f


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=_common.positive_int, default=40, help="timed calls per side")
    _common.add_results_dir(ap)
    args = ap.parse_args(argv)
    import onnxruntime

    import onnx_light_kv as olkv

    heads, kv_heads, head = 32, 8, 128
    contexts = [256, 1024] if args.quick else [256, 1024, 4096]
    dtypes = [np.float32] if args.quick else [np.float32, np.float16]
    rows: List[Dict[str, Any]] = []
    raw: List[Dict[str, Any]] = []
    for threads in (1, 2):
        olkv.set_threads(threads)
        for dtype in dtypes:
            model = gqa_model(heads, kv_heads, dtype, rotary=True).SerializeToString()
            so = _common.ort_session_options(onnxruntime, threads, sequential=False)
            ref = onnxruntime.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            ours = olkv.InferenceSession(model, threads=threads)
            for phase in ("decode", "prompt"):
                for ctx in contexts:
                    if phase == "prompt" and ctx > 1024:
                        continue
                    f = feeds_for(phase, ctx, max(ctx, 256) if phase == "prompt" else ctx + 64, heads, kv_heads, head, dtype, True)
                    a = ours.run(None, f)[0].astype(np.float32)
                    b = ref.run(None, f)[0].astype(np.float32)
                    err = float(np.max(np.abs(a - b)))
                    s = blocked({"ours": lambda: ours.run(None, f), "ort": lambda: ref.run(None, f)}, repeat=args.repeat)
                    so_, sr = summarize(s["ours"]), summarize(s["ort"])
                    rows.append({"threads": threads, "dtype": np.dtype(dtype).name, "phase": phase, "context": ctx,
                                 "ours_ms": so_["median"], "ort_ms": sr["median"], "speedup": _common.speedup(so_["median"], sr["median"]),
                                 "max_abs_diff": err})
                    raw.append({**rows[-1], "samples": s})
                    # progress: the header once, then a line per case (the full table follows)
                    lines = format_table(rows[-1:], min_width=9).splitlines()
                    print("\n".join(lines if len(rows) == 1 else lines[2:]), flush=True)
    print()
    print(format_table(rows))
    print("wrote", write_json("gqa-op", {"environment": environment(), "rows": rows, "raw": raw}, args.results_dir))


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
