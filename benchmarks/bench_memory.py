"""Resident memory of a session: ours vs onnxruntime, for whole decoder models.

Models: the built-in Llama decoder (``onnx_light_kv.models``) at a benchmark size (``--layers``,
``--hidden``, ``--vocab``; 4 x 1024 and a 32000-token vocabulary by default: 439 MB of float32
weights), in float32, float16, and int4: the float32 model with every constant-weight MatMul
turned into a com.microsoft ``MatMulNBits`` (4 bits, groups of 32 along K, symmetric: the
onnxruntime-genai ``-p int4`` layout). Each model is saved to a file and loaded from it;
``--external-data`` stores the weights in a data file next to it, as models over 2 GB must be.

Each runtime runs in a fresh child process per model, so neither the other runtime nor earlier
models count. The child imports the runtime, reads its resident set (Linux ``/proc/self/status``
``VmRSS``), creates the session from the file, runs one decode step (one token on a past of
``--past`` tokens) and reports, against the resident set before the session:

- ``session_mb``: resident growth after the session was created;
- ``peak_mb``: the largest resident set while it was created (``VmHWM``);
- ``step_mb``: resident growth after the decode step (the session plus the step's buffers).

Peak and steady memory decide which models fit a machine: a packed weight held beside its
initializer doubles a model's weights. Output: a table, and the figures plus the environment in
``benchmarks/results/memory-<timestamp>.json`` (``memory-ext-`` with ``--external-data``;
``--results-dir`` elsewhere).

Run: ``python benchmarks/bench_memory.py [--dtypes float32 float16 int4] [--layers 4] [--hidden 1024]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

#: The child program: argv runtime, model path, past length; prints one JSON line.
_CHILD = r"""
import json, sys
import numpy as np

def status():
    with open("/proc/self/status") as f:
        d = dict(line.split(":", 1) for line in f if ":" in line)
    return int(d["VmRSS"].split()[0]) / 1e3, int(d["VmHWM"].split()[0]) / 1e3

runtime, path, past = sys.argv[1], sys.argv[2], int(sys.argv[3])
if runtime == "ours":
    import onnx_light_kv as rt
    before = status()[0]
    s = rt.InferenceSession(path, threads=1)
else:
    import onnxruntime as rt
    before = status()[0]
    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    s = rt.InferenceSession(path, so, providers=["CPUExecutionProvider"])
after, peak = status()
feeds = {}
for i in s.get_inputs():
    dims = [d if isinstance(d, int) else None for d in i.shape]
    if "float16" in i.type:
        dt = np.float16
    elif "float" in i.type:
        dt = np.float32
    else:
        dt = np.int64
    name = i.name
    if name.startswith("past"):
        shape = [1, dims[1], past, dims[3]]
        feeds[name] = np.zeros(shape, dt)
    elif name == "attention_mask":
        feeds[name] = np.ones((1, past + 1), dt)
    elif name == "position_ids":
        feeds[name] = np.array([[past]], dt)
    else:
        feeds[name] = np.ones((1, 1), dt)
s.run(None, feeds)
print(json.dumps({"session_mb": after - before, "peak_mb": peak - before, "step_mb": status()[0] - before}))
"""


def int4_model(model: Any) -> Any:
    """``model`` (float32) with every MatMul whose B is a 2D float32 initializer replaced by
    ``MatMulNBits`` (4 bits, groups of 32 along K, the last one zero-padded, scale max|w|/7 per
    group, zero point 8)."""
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    block = 32
    nodes = []
    for node in g.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        arr = numpy_helper.to_array(w) if w is not None else None
        if arr is None or arr.ndim != 2 or arr.dtype != np.float32:
            nodes.append(node)
            continue
        k, n = arr.shape
        kb = -(-k // block)  # the last group zero-padded (MatMulNBits ignores the padding)
        wt = np.zeros((n, kb * block), np.float32)
        wt[:, :k] = arr.T
        wt = wt.reshape(n, kb, block)
        scale = np.maximum(np.abs(wt).max(axis=2, keepdims=True) / 7, np.float32(1e-8)).astype(np.float32)
        q = (np.clip(np.rint(wt / scale), -8, 7) + 8).astype(np.uint8)
        packed = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)
        name = node.input[1]
        g.initializer.remove(w)
        g.initializer.extend([numpy_helper.from_array(packed, name + "_q4"),
                              numpy_helper.from_array(scale.reshape(-1), name + "_scales")])
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], name + "_q4", name + "_scales"], list(node.output),
                                      name=node.name + "_q4", domain="com.microsoft", K=k, N=n, bits=4,
                                      block_size=block, accuracy_level=0))
    del g.node[:]
    g.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def build(dtype: str, args: argparse.Namespace, folder: str) -> str:
    """Saves the built-in Llama decoder of ``dtype`` (float32, float16 or int4) and returns its path."""
    from onnx_light_kv import models

    heads = max(1, args.hidden // 64)
    cfg = models.DecoderConfig(layers=args.layers, hidden=args.hidden, q_heads=heads, kv_heads=max(1, heads // 4),
                               head_dim=64, vocab=args.vocab, dtype="float16" if dtype == "float16" else "float32")
    m = models.build("llama", cfg)
    if dtype == "int4":
        m = int4_model(m)
    path = os.path.join(folder, f"llama-{dtype}{'-ext' if args.external_data else ''}.onnx")
    models.save_model(m, path, external_data=args.external_data)
    return path


def measure(runtime: str, path: str, past: int) -> Optional[Dict[str, float]]:
    """One child process's figures (see the module docstring); None where it fails."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, runtime, path, str(past)], capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        print(f"  {runtime} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", nargs="+", default=["float32", "float16", "int4"], choices=["float32", "float16", "int4"])
    p.add_argument("--layers", type=_common.layers_arg, default=4)
    p.add_argument("--hidden", type=_common.int_range(64, 16384), default=1024,
                   help="hidden size (a multiple of 64: heads of 64, a quarter of them K/V heads)")
    p.add_argument("--vocab", type=_common.int_range(2, 1 << 20), default=32000)
    p.add_argument("--past", type=_common.int_range(0, 1 << 16), default=128)
    p.add_argument("--external-data", action="store_true",
                   help="save the weights in a data file next to the model (as models over 2 GB must be)")
    p.add_argument("--no-ort", action="store_true", help="measure ours only")
    _common.add_results_dir(p)
    args = p.parse_args(argv)
    if args.hidden % 64:
        p.error(f"--hidden must be a multiple of 64, got {args.hidden}")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    runtimes = ["ours"] if args.no_ort else ["ours", "ort"]
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for dtype in args.dtypes:
            path = build(dtype, args, folder)
            files = [path] + [os.path.join(folder, f) for f in os.listdir(folder)
                              if f.startswith(os.path.basename(path)) and f != os.path.basename(path)]
            row: Dict[str, Any] = {"model": f"llama {args.layers}x{args.hidden} {dtype}"
                                            + (" external" if args.external_data else ""),
                                   "file_mb": round(sum(os.path.getsize(f) for f in files) / 1e6, 1)}
            for rt in runtimes:
                print(f"{row['model']}: {rt} ...", file=sys.stderr, flush=True)
                r = measure(rt, path, args.past)
                for key, v in (r or {}).items():
                    row[f"{rt}_{key}"] = round(v, 1)
            if not args.no_ort and "ours_session_mb" in row and "ort_session_mb" in row:
                row["ours/ort_session"] = round(row["ours_session_mb"] / max(row["ort_session_mb"], 1e-9), 2)
                row["ours/ort_peak"] = round(row["ours_peak_mb"] / max(row["ort_peak_mb"], 1e-9), 2)
            rows.append(row)
    print(_common.format_table(rows))
    payload = {"benchmark": "memory", "args": vars(args), "environment": _common.environment(1), "rows": rows}
    out = _common.write_json("memory-ext" if args.external_data else "memory", payload, args.results_dir)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
