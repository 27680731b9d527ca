#!/usr/bin/env python3
"""A hostile battery against the public Python API, every call in a child interpreter.

Generates well over a thousand calls (hostile integers, floats, types, shapes, dtypes,
NaN/Inf data, closed objects, files that are not models) over every public entry point, runs
them in child interpreters (a child runs calls one by one and reports each; the parent kills
it when one call exceeds ``--timeout`` seconds or the child's resident memory exceeds
``--max-rss-mib``, records that call as a hang or runaway memory, and starts a new child for
the rest), and classifies every call:

  ok                      returned
  documented              raised ValueError/TypeError/IndexError/MemoryError/KeyError/
                          NotImplementedError, or OSError for a file (subclasses included)
  wrong-class             raised anything else (AttributeError, OverflowError, RuntimeError...)
  changed-on-failure      failed but changed the cache it was called on (lengths or bytes)
  wrong-result            attention returned values that differ from kernel="reference"
  abort / hang / memory   the child died, timed out or outgrew the memory limit

    python scripts/hostile_battery.py [--timeout 20] [--max-rss-mib 3072] [--show 5]

Prints the counts by class and up to ``--show`` examples of each bad class; exits 1 when a
bad class is not empty.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from typing import Dict, List, Tuple

BAD = ("wrong-class", "changed-on-failure", "wrong-result", "abort", "hang", "memory")

# -- the calls -------------------------------------------------------------------------------------

INTS = ["0", "-1", "1", "3", "2**31", "2**63", "-(2**63)", "10**30", "1.5", "float('nan')", "float('inf')",
        "'3'", "None", "True", "np.int64(2)", "np.array(2)", "np.array([2])", "[]", "object()"]
FLOATS = ["0.0", "-1.0", "0.5", "float('nan')", "float('inf')", "-float('inf')", "1e308", "3e38", "1e-45",
          "'x'", "None", "True", "np.float32(0.5)", "np.array([0.5])"]
ARRAYS = ["k", "k.astype(np.float16)", "k.astype(np.float64)", "k.astype(np.int32)", "k.astype(np.complex64)",
          "k[..., ::2]", "k[:, :, :0]", "k.reshape(-1)", "np.full_like(k, np.nan)", "np.full_like(k, np.inf)",
          "np.full_like(k, 3e38)", "k[:, :1]", "k.transpose(0, 2, 1, 3)", "None", "'k'", "[[1.0]]",
          "np.asfortranarray(k)"]
QS = ["q", "q.astype(np.float16)", "q[:, :3]", "q[..., :5]", "np.full_like(q, np.nan)", "np.full_like(q, np.inf)",
      "np.full_like(q, 3e38)", "np.full_like(q, -3e38)", "np.full_like(q, 1e-40)", "q.astype(np.int64)",
      "np.zeros((1, 4, 17, 8), np.float32)", "np.zeros((2, 4, 1, 8), np.float32)", "None", "q.reshape(-1)",
      "q[:, :, :, ::-1]"]


def cache_calls(dtype: str) -> List[str]:
    """The calls on the namespace's cache ``c`` (of dtype) and attention over it."""
    out: List[str] = []
    for a, b in itertools.product(ARRAYS, ["k", "v", "k.astype(np.int32)", "None", "k[:, :, :1]"]):
        out.append(f"c.append({a}, {b})")
    for v in ["[1]", "[0]", "[5, 5]", "[-1]", "[2**63]", "'1'", "None", "[1.5]", "np.array([1])", "[True]"]:
        out.append(f"c.append(k[:, :, :1], v[:, :, :1], counts={v})")
    out += [f"c.truncate({v})" for v in INTS + ["[1]", "[1, 2]", "[-1]", "[2**63]"]]
    out += [f"c.evict({v})" for v in INTS]
    out += [f"c.reorder({v})" for v in ["[0]", "[1]", "[-1]", "[0, 0]", "[]", "None", "[2**63]", "[0.5]", "'0'",
                                         "np.array([0])", "[True]"]]
    out += [f"c.rollback({v})" for v in ["None", "3", "'ck'", "ck_other", "ck_stale", "ck"]]
    out += [f"c.export(dtype={v})" for v in ["None", "'float32'", "'float16'", "'int8'", "'x'", "3"]]
    for qq in QS:
        out.append(f"check_attention({qq})")
    for name, vals in (("scale", FLOATS), ("softcap", FLOATS), ("window", INTS)):
        for v in vals:
            out.append(f"check_attention(q, {name}={v})")
    return out


def calls() -> List[str]:
    """Every call of the battery, as Python source run against the child's namespace."""
    out: List[str] = []
    geo = ["batch", "kv_heads", "head_dim", "capacity"]
    base = dict(batch="1", kv_heads="2", head_dim="8", capacity="16")
    for name in geo + ["head_dim_v"]:
        for v in INTS:
            kw = dict(base, **{name: v})
            out.append("olkv.KVCache(" + ", ".join(f"{a}={b}" for a, b in kw.items()) + ")")
    for v in ["'float32'", "'float16'", "'bfloat16'", "'int8'", "'float64'", "np.float32", "None", "3", "'x'",
              "olkv.bfloat16"]:
        out.append(f"olkv.KVCache(batch=1, kv_heads=2, head_dim=8, capacity=16, dtype={v})")
    for v in ["None", "'x'", "c", "olkv.Arena()", "3"]:
        out.append(f"olkv.KVCache(batch=1, kv_heads=2, head_dim=8, capacity=16, arena={v})")
    out += [f"olkv.Arena(budget={v})" for v in INTS]
    out += [f"arena.budget = {v}" for v in INTS]
    out += cache_calls("float32")
    for dt in ("float16", "bfloat16"):
        out += [f"#dtype={dt}\n{x}" for x in cache_calls(dt)]
    out += ["c.fork().lengths", "c.info()", "c.counters()", "c.reset_counters()", "repr(c)", "c.checkpoint()",
            "closed.append(k, v)", "closed.export()", "closed.reset()", "closed.fork()", "closed.info()",
            "olkv.attention(q, closed)"]
    for v in ["'auto'", "'reference'", "'x'", "''", "None", "3"]:
        out.append(f"olkv.attention(q, c, kernel={v})")
    for v in ["None", "c", "'c'", "k", "3"]:
        out.append(f"olkv.attention(q, {v})")
    for o in ["np.empty_like(q)", "q", "np.empty((1, 4, 1, 8), np.float16)", "np.empty((1, 4, 1, 9), np.float32)",
              "buf[32:32 + q.size].reshape(q.shape)", "np.empty_like(q)[..., ::2]", "'out'", "np.empty_like(q).T",
              "np.zeros((1, 4, 1, 8), np.float32, order='F')"]:
        out.append(f"olkv.attention(q2, c, out={o})")
    out += [f"olkv.set_threads({v})" for v in INTS]
    out += [f"olkv.set_kernel({v})" for v in ["'go'", "'auto'", "''", "'x'", "None", "3", "'AVX2'", "' go '"]]
    out += [f"olkv.read_bandwidth({a}, {b}, {c_})" for a, b, c_ in
            [("1", "1", "1"), ("0", "1", "1"), ("-1", "1", "1"), ("2**63", "1", "1"), ("1", "0", "1"),
             ("1", "1", "0"), ("1.5", "1", "1"), ("1", "10**6", "1")]]
    out += [f"olkv.stream_read({v})" for v in ["np.zeros(1024, np.float32)", "np.zeros(0, np.float32)", "None",
                                                "np.zeros(1024, np.float64)", "np.zeros((4, 4), np.float32)[:, ::2]"]]
    for src in ["'/dev/zero'", "'/dev/null'", "'/nonexistent.onnx'", "'/'", "b''", "b'\\x08'", "b'garbage' * 100",
                "None", "3", "model_bytes[:50]", "model_bytes", "bytearray(model_bytes)", "memoryview(model_bytes)",
                "opset99"]:
        out.append(f"olkv.InferenceSession({src})")
    for v in INTS:
        out.append(f"olkv.InferenceSession(model_bytes, threads={v})")
    feeds = ["{'input_ids': ids}", "{}", "{'input_ids': ids.astype(np.float32)}", "{'input_ids': ids[:, :0]}",
             "{'input_ids': ids, 'nope': ids}", "{'input_ids': None}", "{'input_ids': 'x'}", "None", "[ids]",
             "{'input_ids': ids.reshape(-1)}", "{'input_ids': np.full_like(ids, 10**6)}",
             "{'input_ids': np.full_like(ids, -5)}", "{'input_ids': np.full((1, 500), 1)}"]
    for f in feeds:
        for names in ["None", "['logits']", "['nope']", "'logits'", "[]"]:
            out.append(f"run_feeds({names}, {f})")
    for f in feeds[:8]:
        out.append(f"run_state({f})")
    for a in ["max_new_tokens=2", "max_new_tokens=0", "max_new_tokens=-1", "max_new_tokens=2**63",
              "max_new_tokens=1.5", "max_new_tokens=2, temperature=float('nan'), do_sample=True",
              "max_new_tokens=2, top_k=-1", "max_new_tokens=2, top_p=2.0", "max_new_tokens=2, num_beams=0",
              "max_new_tokens=2, num_beams=2, num_return_sequences=3", "max_new_tokens=2, eos_token_id=-1",
              "max_new_tokens=2, eos_token_id='x'", "max_new_tokens=2, seed=2**70", "max_new_tokens=2, prompt_lookup=-1",
              "max_new_tokens=2, stop_sequences=[[]]", "max_new_tokens=2, repetition_penalty=0.0",
              "max_new_tokens=2, min_p=float('inf')", "max_new_tokens=2, state_options='x'",
              "max_new_tokens=100"]:
        for ids_ in ["ids", "ids[0]", "ids[:, :0]", "np.full_like(ids, 99)", "ids.astype(np.float32)"]:
            out.append(f"olkv.generate(sess, {ids_}, {a})")
    for v in INTS[:8]:
        out.append(f"sess.create_state(batch={v})")
        out.append(f"sess.create_state(max_length={v})")
    return out


# -- the child ------------------------------------------------------------------------------------

CHILD = r'''
import json, sys, traceback
import numpy as np
import onnx_light_kv as olkv
from onnx_light_kv import models as M
from onnx import helper, TensorProto

DOC = (ValueError, TypeError, IndexError, MemoryError, KeyError, NotImplementedError, OSError)
rng = np.random.default_rng(0)
cfg = M.DecoderConfig(layers=1, hidden=32, q_heads=2, kv_heads=1, head_dim=16, vocab=32, max_positions=64)
model_bytes = M.model_bytes(M.llama_decoder(cfg))
sess = olkv.InferenceSession(model_bytes, threads=1)
ids = np.array([[1, 2, 3]], np.int64)
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
opset99 = helper.make_model(g, opset_imports=[helper.make_opsetid("", 99)], ir_version=10).SerializeToString()

def fresh(dtype="float32"):
    ns = dict(np=np, olkv=olkv, sess=sess, ids=ids, model_bytes=model_bytes, opset99=opset99)
    c = olkv.KVCache(batch=1, kv_heads=2, head_dim=8, capacity=16, dtype=dtype)
    k = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    c.append(k, v)
    other = olkv.KVCache(batch=1, kv_heads=2, head_dim=8, capacity=16)
    other.append(k, v)
    closed = olkv.KVCache(batch=1, kv_heads=2, head_dim=8, capacity=16)
    closed.close()
    ck_stale = c.checkpoint()
    c.reset(); c.append(k, v)
    q = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    buf = np.zeros(4096, np.float32)
    q2 = buf[:q.size].reshape(q.shape); q2[...] = q
    ns.update(c=c, k=k, v=v, q=q, q2=q2, buf=buf, closed=closed, arena=olkv.Arena(), ck=c.checkpoint(),
              ck_other=other.checkpoint(), ck_stale=ck_stale)

    def check_attention(qq, **kw):
        # every kernel path against the reference (an error must be the reference's too)
        try:
            want = olkv.attention(qq, c, kernel="reference", **kw)
        except DOC as e:
            want = e
        try:
            for path in KERNELS:
                olkv.set_kernel(path)
                try:
                    got = olkv.attention(qq, c, **kw)
                except DOC as e:
                    if not isinstance(want, BaseException) or type(e) is not type(want):
                        raise _Wrong(f"path {path} raised {e!r}, the reference {want!r}")
                    continue
                if isinstance(want, BaseException):
                    raise _Wrong(f"path {path} returned, the reference raised {want!r}")
                same = np.array_equal(np.isnan(got), np.isnan(want)) and np.allclose(
                    np.nan_to_num(got, nan=0), np.nan_to_num(want, nan=0), rtol=2e-5, atol=2e-5, equal_nan=True)
                if not same:
                    raise _Wrong(f"path {path}: {got.ravel()[:4]}, reference {want.ravel()[:4]}")
        finally:
            olkv.set_kernel("auto")
        if isinstance(want, BaseException):
            raise want
    def run_feeds(names, feeds):
        return sess.run(names, feeds)
    def run_state(feeds):
        with sess.create_state(max_length=8) as st:
            before = st.lengths.copy() if hasattr(st, "lengths") else None
            try:
                sess.run(["logits"], feeds, state=st)
            except DOC:
                if before is not None and not np.array_equal(before, st.lengths):
                    raise _Wrong("a failed state run changed the state's lengths")
                raise
    ns.update(check_attention=check_attention, run_feeds=run_feeds, run_state=run_state)
    return ns

class _Wrong(Exception):
    pass

KERNELS = []
for _p in ("go", "avx2", "avx512"):
    try:
        olkv.set_kernel(_p)
        KERNELS.append(_p)
    except ValueError:
        pass
olkv.set_kernel("auto")

def snap(c):
    try:
        kk, vv = c.export()
        return c.lengths.tobytes() + kk.tobytes() + vv.tobytes()
    except Exception:
        return None

for line in sys.stdin:
    i, src = json.loads(line)
    dtype = src.split("\n", 1)[0][len("#dtype="):] if src.startswith("#dtype=") else "float32"
    ns = fresh(dtype)
    before = snap(ns["c"])
    try:
        exec(compile(src, "<call>", "exec"), ns)
        cls, detail = "ok", ""
    except _Wrong as e:
        cls, detail = "wrong-result", str(e)
    except DOC as e:
        cls, detail = "documented", f"{type(e).__name__}: {e}"[:200]
        if snap(ns["c"]) != before:
            cls = "changed-on-failure"
    except BaseException as e:
        cls, detail = "wrong-class", f"{type(e).__name__}: {e}"[:200]
    print(json.dumps([i, cls, detail]), flush=True)
'''


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run(all_calls: List[str], timeout: float, max_rss: float) -> Dict[int, Tuple[str, str]]:
    import select
    results: Dict[int, Tuple[str, str]] = {}
    pending = list(range(len(all_calls)))
    env = dict(os.environ, OLKV_LOG="0")
    while pending:
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, env=env)
        assert child.stdin and child.stdout
        for i in pending:
            child.stdin.write(json.dumps([i, all_calls[i]]) + "\n")
        child.stdin.close()
        current = pending[0]
        started = time.monotonic()
        startup = 60.0  # the first call also pays for the import
        while True:
            r, _, _ = select.select([child.stdout], [], [], 0.2)
            if r:
                line = child.stdout.readline()
                if not line:
                    break
                i, cls, detail = json.loads(line)
                results[i] = (cls, detail)
                pending.remove(i)
                current = pending[0] if pending else -1
                started, startup = time.monotonic(), 0.0
                if current < 0:
                    break
                continue
            if child.poll() is not None:
                break
            if rss_mib(child.pid) > max_rss:
                child.kill()
                results[current] = ("memory", f"resident memory over {max_rss:.0f} MiB")
                pending.remove(current)
                break
            if time.monotonic() - started > timeout + startup:
                child.kill()
                results[current] = ("hang", f"no result within {timeout:.0f} s")
                pending.remove(current)
                break
        child.wait()
        if pending and current in pending:
            results[current] = ("abort", f"child exited with status {child.returncode}")
            pending.remove(current)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds one call may take")
    ap.add_argument("--max-rss-mib", type=float, default=3072.0, help="resident memory limit of a child")
    ap.add_argument("--show", type=int, default=5, help="examples printed per bad class")
    args = ap.parse_args()
    all_calls = calls()
    t0 = time.monotonic()
    results = run(all_calls, args.timeout, args.max_rss_mib)
    counts = Counter(cls for cls, _ in results.values())
    examples: Dict[str, List[str]] = defaultdict(list)
    for i in sorted(results):
        cls, detail = results[i]
        if cls in BAD and len(examples[cls]) < args.show:
            examples[cls].append(f"{all_calls[i]}  ->  {detail}")
    print(f"{len(all_calls)} calls in {time.monotonic() - t0:.0f} s")
    for cls in ("ok", "documented") + BAD:
        print(f"  {cls:20s} {counts.get(cls, 0)}")
    for cls in BAD:
        for e in examples[cls]:
            print(f"  [{cls}] {e}")
    return 1 if any(counts.get(c) for c in BAD) else 0


if __name__ == "__main__":
    sys.exit(main())
