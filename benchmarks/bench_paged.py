"""Paged KV cache: the generation operations the paged layout makes cheap, against the
contiguous layout, on one attention layer (fp32, GQA 32/8 query/KV heads, head dim 128).

Cases (the paged-cache issue's):

* ``beam4@4k``: a beam step of 4 beams at 4096 tokens: ``reorder`` with repeated beams (the
  indices cycle through [0, 0, 1, 1], [3, 3, 3, 3], [1, 0, 3, 2], [2, 2, 0, 1]) then the append of
  the step's token. Reports bytes copied per step (the cache's ``copy_bytes`` counter: the
  contiguous layout copies every duplicated beam, the paged layout at most the shared partial
  block of each beam) and the milliseconds per step, both layouts timed in alternation.
* ``fork16@4k``: 16 forks of one 4096-token sequence, before and after each fork appends one
  token: committed bytes (the blocks referenced, and the arena's committed slabs) against one
  sequence's.
* ``ttft2k``: time to first token of a request whose 2049-token prompt (2048 + 1) a previous
  request already ran, on a built-in Llama-style decoder (4 layers, hidden 256, 8/4 heads of 32):
  a cold prefill on a new state against ``create_state(layout="paged", prefix_cache=True)`` +
  ``reuse_prefix`` + running the one remaining token, timed in alternation.

Outputs: a printed table and ``benchmarks/results/paged-<UTC>.json``.

Usage::

    python benchmarks/bench_paged.py [--block-size 64] [--repeat 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import (add_results_dir, block_size, environment, format_table, positive_int,  # noqa: E402
                     summarize, threads_arg, write_json)

KVH, D, L = 8, 128, 4096
BEAMS = [[0, 0, 1, 1], [3, 3, 3, 3], [1, 0, 3, 2], [2, 2, 0, 1]]


def _cache(olkv: Any, layout: str, batch: int, cap: int, bs: Optional[int], arena: Any = None) -> Any:
    kw = {"layout": "paged", "block_size": bs} if layout == "paged" else {}
    return olkv.KVCache(batch, KVH, D, dtype="float32", capacity=cap, arena=arena, **kw)


def beam_case(olkv: Any, bs: Optional[int], repeat: int, rng: np.random.Generator) -> List[Dict[str, Any]]:
    past = rng.standard_normal((4, KVH, L, D)).astype(np.float32)
    tok = rng.standard_normal((4, KVH, 1, D)).astype(np.float32)
    caches = {lay: _cache(olkv, lay, 4, L + repeat + 8, bs) for lay in ("contiguous", "paged")}
    for c in caches.values():
        c.append(past, past)
    samples: Dict[str, List[float]] = {lay: [] for lay in caches}
    copied: Dict[str, List[int]] = {lay: [] for lay in caches}
    for i in range(repeat):
        for lay in (("contiguous", "paged") if i % 2 else ("paged", "contiguous")):
            c = caches[lay]
            c.reset_counters()
            t0 = time.perf_counter()
            c.reorder(BEAMS[i % len(BEAMS)])
            c.append(tok, tok)
            samples[lay].append((time.perf_counter() - t0) * 1e3)
            copied[lay].append(c.counters["copy_bytes"])
    block = (bs or olkv.cache.DEFAULT_BLOCK_SIZE) * KVH * 2 * D * 4
    rows = []
    for lay, c in caches.items():
        s = summarize(samples[lay])
        rows.append({"case": f"beam4@4k {lay}", "ms_per_step": s["median"], "p10": s["p10"], "p90": s["p90"],
                     "copy_MB_per_step": float(np.mean(copied[lay])) / 1e6,
                     "max_copy_blocks": max(copied[lay]) / block if lay == "paged" else None,
                     "samples_ms": samples[lay], "copy_bytes": copied[lay]})
        c.close()
    rows[1]["speedup"] = rows[0]["ms_per_step"] / rows[1]["ms_per_step"]
    return rows


def fork_case(olkv: Any, bs: Optional[int], rng: np.random.Generator) -> List[Dict[str, Any]]:
    past = rng.standard_normal((1, KVH, L, D)).astype(np.float32)
    tok = rng.standard_normal((1, KVH, 1, D)).astype(np.float32)
    one = L * KVH * 2 * D * 4
    rows = []
    for lay in ("contiguous", "paged"):
        arena = olkv.Arena()
        root = _cache(olkv, lay, 1, L + 16, bs, arena)
        root.append(past, past)
        forks = [root.fork() for _ in range(16)]

        def figures(when: str) -> Dict[str, Any]:
            if lay == "paged":
                blocks = root.info()["blocks_total"] - root.info()["blocks_free"]  # blocks in use, pool-wide
                committed = blocks * root.info()["committed_bytes"] // max(root.info()["blocks_used"], 1)
            else:
                committed = sum(c.info()["committed_bytes"] for c in [root] + forks)
            arena_b = arena.stats()["allocated_bytes"]
            return {"case": f"fork16@4k {lay} {when}", "committed_MB": committed / 1e6,
                    "vs_one_seq": committed / one, "arena_MB": arena_b / 1e6, "arena_vs_one_seq": arena_b / one}

        rows.append(figures("at fork"))
        for f in forks:
            f.append(tok, tok)
        rows.append(figures("+1 token each"))
        for c in forks + [root]:
            c.close()
    return rows


def ttft_case(olkv: Any, bs: Optional[int], repeat: int, rng: np.random.Generator) -> List[Dict[str, Any]]:
    from onnx_light_kv import models as M

    cfg = M.DecoderConfig(layers=4, hidden=256, q_heads=8, kv_heads=4, head_dim=32, vocab=1024, max_positions=2304)
    sess = olkv.InferenceSession(M.model_bytes(M.llama_decoder(cfg)))
    prompt = rng.integers(1, cfg.vocab, size=(1, 2049), dtype=np.int64)
    pos = np.arange(prompt.shape[1], dtype=np.int64)[None]
    kw = {"layout": "paged", "block_size": bs, "prefix_cache": True}
    with sess.create_state(**kw) as st:  # the first request registers the prompt's blocks
        sess.run(["logits"], {"input_ids": prompt, "position_ids": pos}, state=st)
    logits: Dict[str, Any] = {}

    def cold() -> None:
        with sess.create_state(layout="paged", block_size=bs) as st:
            logits["cold"] = sess.run(["logits"], {"input_ids": prompt, "position_ids": pos}, state=st)[0][:, -1]

    def reuse() -> None:
        with sess.create_state(**kw) as st:
            n = st.reuse_prefix(prompt[0])
            logits["reuse"] = sess.run(["logits"], {"input_ids": prompt[:, n:], "position_ids": pos[:, n:]},
                                       state=st)[0][:, -1]
            logits["n"] = n

    samples: Dict[str, List[float]] = {"cold": [], "reuse": []}
    for i in range(repeat):
        for name, fn in ((("cold", cold), ("reuse", reuse)) if i % 2 else (("reuse", reuse), ("cold", cold))):
            t0 = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t0) * 1e3)
    diff = float(np.abs(logits["cold"] - logits["reuse"]).max())
    c, r = summarize(samples["cold"]), summarize(samples["reuse"])
    sess.close()
    return [{"case": "ttft2k cold prefill", "ms": c["median"], "p10": c["p10"], "p90": c["p90"],
             "samples_ms": samples["cold"]},
            {"case": f"ttft2k prefix reuse ({logits['n']} tokens)", "ms": r["median"], "p10": r["p10"],
             "p90": r["p90"], "speedup": c["median"] / r["median"], "max_abs_logit_diff": diff,
             "samples_ms": samples["reuse"]}]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--block-size", type=block_size, default=None,
                    help="paged block size (one of onnx_light_kv.cache.BLOCK_SIZES; default: the library's)")
    ap.add_argument("--repeat", type=positive_int, default=20, help="beam steps timed per layout")
    ap.add_argument("--threads", type=threads_arg, default=1)
    add_results_dir(ap)
    args = ap.parse_args(argv)

    import onnx_light_kv as olkv

    olkv.set_threads(args.threads)
    rng = np.random.default_rng(0)
    beam = beam_case(olkv, args.block_size, args.repeat, rng)
    fork = fork_case(olkv, args.block_size, rng)
    ttft = ttft_case(olkv, args.block_size, max(3, args.repeat // 4), rng)
    print(format_table(beam, ["case", "ms_per_step", "p10", "p90", "copy_MB_per_step", "max_copy_blocks", "speedup"]))
    print()
    print(format_table(fork, ["case", "committed_MB", "vs_one_seq", "arena_MB", "arena_vs_one_seq"]))
    print()
    print(format_table(ttft, ["case", "ms", "p10", "p90", "speedup", "max_abs_logit_diff"]))
    worst = beam[1]["max_copy_blocks"]
    print(f"\nbeam reorder at 4k, 4 beams: at most {worst:.2f} blocks copied per step (target <= 4) -> "
          f"{'met' if worst <= 4 else 'NOT met'}")
    for r in (r for r in fork if r["case"].startswith("fork16@4k paged")):
        print(f"16 forks sharing a 4k prefix, {r['case'].split('paged ')[1]}: committed {r['vs_one_seq']:.3f}x of one "
              f"sequence (target <= 1.1) -> {'met' if r['vs_one_seq'] <= 1.1 else 'NOT met'}")
    print(f"time to first token of a 2k prompt with prefix reuse: {ttft[1]['speedup']:.1f}x faster than a cold "
          f"prefill (target >= 10) -> {'met' if ttft[1]['speedup'] >= 10 else 'NOT met'}")
    path = write_json("paged", {"benchmark": "paged", "environment": environment(threads=args.threads), "args": vars(args),
                                "beam": beam, "fork": fork, "ttft": ttft}, args.results_dir)
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
