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
* Time to first token with prefix reuse is not measured: prefix sharing across states is not
  implemented yet (``create_state(prefix_cache=True)`` raises NotImplementedError).

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
from _common import environment, format_table, summarize, write_json  # noqa: E402

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
                     "max_copy_blocks": max(copied[lay]) / block if lay == "paged" else None})
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


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=20, help="beam steps timed per layout")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import onnx_light_kv as olkv

    olkv.set_threads(args.threads)
    rng = np.random.default_rng(0)
    beam = beam_case(olkv, args.block_size, args.repeat, rng)
    fork = fork_case(olkv, args.block_size, rng)
    print(format_table(beam, ["case", "ms_per_step", "p10", "p90", "copy_MB_per_step", "max_copy_blocks", "speedup"]))
    print()
    print(format_table(fork, ["case", "committed_MB", "vs_one_seq", "arena_MB", "arena_vs_one_seq"]))
    worst = beam[1]["max_copy_blocks"]
    print(f"\nbeam reorder at 4k, 4 beams: at most {worst:.2f} blocks copied per step (target <= 4) -> "
          f"{'met' if worst <= 4 else 'NOT met'}")
    f1 = [r for r in fork if r["case"].startswith("fork16@4k paged")]
    print("16 forks sharing a 4k prefix: committed " + ", ".join(
        f"{r['vs_one_seq']:.3f}x ({r['case'].split('paged ')[1]})" for r in f1)
          + " of one sequence (target <= 1.1)")
    print("time to first token with prefix reuse: not measured (prefix sharing is not implemented yet)")
    path = write_json("paged", {"benchmark": "paged", "env": environment(threads=args.threads), "args": vars(args),
                                "beam": beam, "fork": fork})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
