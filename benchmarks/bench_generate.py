"""Tokens/s of ``onnx_light_kv.generate`` on the built-in Llama decoder: our cache path, our tensor
path and onnxruntime, plus the Python loop's share of a decode step.

Our sides and onnxruntime run through the same ``generate()`` loop (same feeds, same token
choice), so the comparison is between the runtimes; onnxruntime runs the standard model on its
tensor path (presents fed back as pasts). onnxruntime-genai (when installed) runs its own
``og.Generator`` loop on the GroupQueryAttention export of the same weights (past and present
sharing one buffer; beam search copies the chosen beams), greedy and beam cases only; "genai
same" says whether its tokens equal ours (``pip install onnxruntime-genai``; optional). Cases: greedy at several prompt lengths, beam search (4 beams), speculative decoding
with a 1-layer draft (same vocabulary, other weights: a low acceptance rate, reported), each at
1 and 2 threads. Sides alternate (ours-state, ours-tensor, ort, ...) with a pause before each,
``--repeat`` times; the table reports the median decode tokens/s (new tokens after the first,
over the decode time) and the speed-ups (their time / our time: our tokens/s over theirs, > 1
means we are faster).

The Python overhead is measured on the cache path: a proxy session times every ``run`` call;
overhead = 1 - (time inside run) / (decode time).

Output: a table, and raw figures + environment in ``benchmarks/results/generate-<stamp>.json``
(``--results-dir`` elsewhere). The genai columns are ``n/a`` in the table and ``null`` in the JSON
when onnxruntime-genai is not installed.
Run: ``python benchmarks/bench_generate.py --quick`` (seconds) or without ``--quick`` (the issue's
grid: prompts 128 / 1024 / 4096, 128 new tokens, 4 layers hidden 1024; minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def _genai_dir(models: Any, cfg: Any, threads: int, root: str) -> str:
    """A folder onnxruntime-genai loads: the GroupQueryAttention export of the same weights
    (written once) and a genai_config.json with ``threads`` intra-op threads."""
    model = os.path.join(root, "model.onnx")
    if not os.path.exists(model):
        models.save_model(models.build("llama_gqa_ort", cfg), model, external_data=True)
    d = os.path.join(root, f"t{threads}")
    os.makedirs(d, exist_ok=True)
    for f in ("model.onnx", "model.onnx.data"):
        if not os.path.exists(os.path.join(d, f)):
            os.symlink(os.path.join(root, f), os.path.join(d, f))
    conf = {"model": {"bos_token_id": 1, "context_length": cfg.max_positions, "eos_token_id": cfg.vocab - 1,
                      "pad_token_id": 0, "type": "llama", "vocab_size": cfg.vocab,
                      "decoder": {"session_options": {"log_id": "bench", "provider_options": [],
                                                      "intra_op_num_threads": threads, "inter_op_num_threads": 1},
                                  "filename": "model.onnx", "head_size": cfg.head_dim, "hidden_size": cfg.hidden,
                                  "num_attention_heads": cfg.q_heads, "num_hidden_layers": cfg.layers,
                                  "num_key_value_heads": cfg.kv_heads,
                                  "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                             "past_key_names": "past_key_values.%d.key",
                                             "past_value_names": "past_key_values.%d.value"},
                                  "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                              "present_value_names": "present.%d.value"}}},
            "search": {"do_sample": False, "max_length": cfg.max_positions, "num_beams": 1, "top_k": 1,
                       "past_present_share_buffer": True, "early_stopping": False, "length_penalty": 1.0}}
    with open(os.path.join(d, "genai_config.json"), "w") as f:
        json.dump(conf, f)
    return d


def _genai_generate(og: Any, model: Any, prompt: np.ndarray, new: int, num_beams: int) -> Any:
    """onnxruntime-genai's own loop: decode tokens/s (after the first token) and the tokens."""
    params = og.GeneratorParams(model)
    total = prompt.shape[1] + new
    opts: Dict[str, Any] = {"max_length": total, "min_length": total}  # eos never ends it early
    if num_beams > 1:  # past_present_share_buffer does not apply to beams (og copies the chosen beams)
        opts.update(num_beams=num_beams, num_return_sequences=1, early_stopping=False)
    params.set_search_options(**opts)
    g = og.Generator(model, params)
    g.append_tokens(prompt.astype(np.int32))
    g.generate_next_token()
    t = time.perf_counter()
    steps = 0
    while not g.is_done():
        g.generate_next_token()
        steps += 1
    dt = time.perf_counter() - t
    return steps / dt if dt > 0 else 0.0, np.asarray(g.get_sequence(0), np.int64)


class _TimedSession:
    """Forwards to a session and sums the wall time of its ``run`` calls."""

    def __init__(self, session: Any) -> None:
        self.session, self.run_s, self.calls = session, 0.0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def run(self, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        out = self.session.run(*args, **kw)
        self.run_s += time.perf_counter() - t
        self.calls += 1
        return out


#: (max_positions, new tokens) of the model of ``--quick`` and of the full grid.
QUICK_POSITIONS, QUICK_NEW = 1024, 32
FULL_POSITIONS, FULL_NEW = 4096 + 160, 128


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=_common.threads_arg, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=_common.positive_int, default=2, help="generations per side and case")
    ap.add_argument("--cases", nargs="+", choices=["greedy", "beams", "draft"], default=["greedy", "beams", "draft"],
                    help="which kinds of case to run")
    ap.add_argument("--beam-prompts", type=_common.positive_int, nargs="+", default=None,
                    help=f"prompt lengths of the 4-beam cases (default 1024; --quick 256; at most "
                         f"{FULL_POSITIONS - FULL_NEW}, --quick {QUICK_POSITIONS - QUICK_NEW})")
    _common.add_results_dir(ap)
    args = ap.parse_args(argv)
    positions, new = (QUICK_POSITIONS, QUICK_NEW) if args.quick else (FULL_POSITIONS, FULL_NEW)
    if args.beam_prompts and max(args.beam_prompts) + new > positions:
        ap.error(f"argument --beam-prompts: {max(args.beam_prompts)} tokens + {new} new ones exceed the model's "
                 f"{positions} positions{' (--quick)' if args.quick else ''}")

    import onnxruntime as ort

    import onnx_light_kv as olkv
    from onnx_light_kv import models

    if args.quick:
        cfg = models.DecoderConfig(layers=2, hidden=256, q_heads=8, kv_heads=4, head_dim=32, vocab=4096,
                                   max_positions=QUICK_POSITIONS)
        prompts, new, beam_prompt = [64, 512], QUICK_NEW, 256
    else:
        cfg = models.DecoderConfig(layers=4, hidden=1024, q_heads=16, kv_heads=8, head_dim=64, vocab=32000,
                                   max_positions=FULL_POSITIONS)
        prompts, new, beam_prompt = [128, 1024, 4096], FULL_NEW, 1024
    data = models.model_bytes(models.build("llama", cfg))
    draft = models.model_bytes(models.build("llama", cfg.replace(layers=1, seed=1)))
    try:
        import onnxruntime_genai as og
        genai = f"{og.__version__} (its own loop on the GroupQueryAttention export of the same weights)"
    except ImportError:
        og = None
        genai = "not installed: not measured"
    genai_root = tempfile.mkdtemp(prefix="olkv-bench-genai-")
    print(f"model: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.q_heads}/{cfg.kv_heads} heads x {cfg.head_dim}, "
          f"vocab {cfg.vocab}; {new} new tokens; onnxruntime-genai {genai}")
    rng = np.random.default_rng(0)
    cases: List[Dict[str, Any]] = []
    if "greedy" in args.cases:
        cases += [{"case": f"greedy p{p}", "prompt": p, "kw": {}} for p in prompts]
    if "beams" in args.cases:
        cases += [{"case": f"beams4 p{p}", "prompt": p, "kw": {"num_beams": 4}}
                  for p in (args.beam_prompts or [beam_prompt])]
    if "draft" in args.cases:
        cases.append({"case": f"draft(1 layer) k4 p{prompts[0]}", "prompt": prompts[0], "kw": {"draft": True}})
    rows: List[Dict[str, Any]] = []
    raw: List[Dict[str, Any]] = []
    for threads in args.threads:
        so = _common.ort_session_options(ort, threads, sequential=False)
        sides = {
            "state": (olkv.InferenceSession(data, threads=threads), None),
            "tensor": (olkv.InferenceSession(data, threads=threads), False),
            "ort": (ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]), False),
        }
        drafts = {"state": olkv.InferenceSession(draft, threads=threads),
                  "tensor": olkv.InferenceSession(draft, threads=threads),
                  "ort": ort.InferenceSession(draft, so, providers=["CPUExecutionProvider"])}
        og_model = og.Model(_genai_dir(models, cfg, threads, genai_root)) if og is not None else None
        for case in cases:
            prompt = rng.integers(0, cfg.vocab, size=(1, case["prompt"]))
            kw = dict(case["kw"])
            genai_tps: List[float] = []
            genai_same = None
            tps: Dict[str, List[float]] = {k: [] for k in sides}
            tokens: Dict[str, Any] = {}
            overhead: List[float] = []
            accepted = ""
            for _ in range(args.repeat):
                for name, (sess, opt) in sides.items():
                    time.sleep(0.05)
                    timed = _TimedSession(sess)
                    extra = {"draft_session": drafts[name]} if kw.get("draft") else {}
                    out = olkv.generate(timed, prompt, max_new_tokens=new, state_options=opt,
                                        num_beams=kw.get("num_beams", 1), **extra)
                    s = out.stats
                    tps[name].append(s.decode_tokens_per_s)
                    tokens[name] = out.sequences
                    if name == "state" and not kw:
                        prefill_s = s.prefill_ms / 1e3
                        overhead.append(1.0 - (timed.run_s - prefill_s) / (s.decode_ms / 1e3))
                    if s.draft_tokens:
                        accepted = f"{s.accepted_draft_tokens}/{s.draft_tokens}"
                    raw.append({"threads": threads, "case": case["case"], "side": name, "stats": vars(s).copy(),
                                "runner": s.runner})
                if og_model is not None and not kw.get("draft"):
                    time.sleep(0.05)
                    rate, seq = _genai_generate(og, og_model, prompt, new, kw.get("num_beams", 1))
                    genai_tps.append(rate)
                    genai_same = bool(np.array_equal(seq, tokens["state"][0]))
            same = all(np.array_equal(tokens["ort"], t) for t in tokens.values())
            med = {k: float(np.median(v)) for k, v in tps.items()}
            rows.append({"threads": threads, "case": case["case"], "state tok/s": med["state"],
                         "tensor tok/s": med["tensor"], "ort tok/s": med["ort"],
                         "genai tok/s": float(np.median(genai_tps)) if genai_tps else float("nan"),
                         # tokens/s ratios: ours / theirs = their time / our time, the one speed-up
                         "speedup state": med["state"] / med["ort"], "speedup tensor": med["tensor"] / med["ort"],
                         "speedup vs genai": med["state"] / float(np.median(genai_tps)) if genai_tps else float("nan"),
                         "genai same": "" if genai_same is None else genai_same,
                         "py overhead": f"{100 * float(np.median(overhead)):.1f}%" if overhead else "",
                         "drafts kept": accepted, "same tokens": same})
            print(_common.format_table(rows[-1:], floatfmt="{:.2f}"), flush=True)
    print()
    print(_common.format_table(rows, floatfmt="{:.2f}"))
    print(f"speedup state/tensor: vs onnxruntime; {_common.SPEEDUP}")
    path = _common.write_json("generate", {"environment": _common.environment(extra={"genai": genai}),
                                           "config": vars(cfg) if hasattr(cfg, "__dict__") else str(cfg),
                                           "new_tokens": new, "rows": rows, "raw": raw}, args.results_dir)
    print(f"\nraw: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
