"""Quality of the quantized KV cache: greedy agreement, KL divergence and perplexity vs the fp32 cache.

Models: the trained decoder fixture (``tests/fixtures/trained-*``, scripts/train_fixture.py: a
Llama trained on Python source, whose attention is peaked) and the built-in decoders
(``onnx_light_kv.models``: Llama-style and GPT-2-style, seeded random weights), all on the cache
path (``sess.create_state(...)``). Caches: the fp32 cache (the reference) and each one of
``--configs``: ``int8 r0``, ``int8 r128``, ``int4 r128``, ``int4 r0`` (format and residual
window; ``--quant-group``, ``--k-axis``; the residual window in the model's type, fp32), and
the bf16 and fp16 caches for scale.

Per model, cache and prompt (``--prompts`` prompts of ``--prompt-len`` tokens: consecutive
held-out text for the trained fixture, seeded random ids for the built-ins):

* the fp32 cache decodes ``--tokens`` tokens greedily (the prefill's pick and ``tokens - 1``
  steps);
* the quantized cache runs the same prompt teacher-forced on those tokens, so every position
  is compared with the same past: ``agreement`` is the fraction of positions where its argmax is
  the fp32 cache's token, ``kl`` the mean (and ``kl_max`` the largest) KL(fp32 || quantized) of
  the next-token distributions, in nats;
* it also decodes freely: ``free_match`` is the fraction of positions where its own greedy tokens
  equal the fp32 ones, ``first_divergence`` the first position where they differ (``tokens`` when
  never);
* trained fixture only: the perplexity of the committed held-out sample (``tests/_trained.py``'s
  ``perplexity``: windows of the training length, fed ``--chunk`` tokens at a time), and its
  relative change ``ppl_delta`` = quantized / fp32 - 1.

The targets (issue 13): agreement >= 99.5% (int8) and >= 97% (int4 with residual 128),
perplexity delta <= 0.5% (int8) and <= 3% (int4 + residual 128).

Outputs: a printed table and ``benchmarks/results/quant-quality-<UTC>.json`` (per prompt: the
tokens, per-position KL, the figures; the environment).

Usage::

    python benchmarks/bench_quant_quality.py             # trained fixtures + built-ins, 4 prompts
    python benchmarks/bench_quant_quality.py --quick     # one prompt, trained dynamo export + Llama
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import _common  # noqa: E402
import _trained as tr  # noqa: E402  (tests/_trained.py: the trained fixture's helpers)
from _common import environment, format_table, write_json  # noqa: E402
from bench_models import BuiltinDecoder  # noqa: E402

#: The caches compared with the fp32 cache, by label: ``create_state`` options (the 16-bit caches
#: show what rounding the K/V rows alone costs).
CONFIGS: Dict[str, Dict[str, Any]] = {
    "bf16": {"dtype": "bfloat16"},
    "fp16": {"dtype": "float16"},
    "int8 r0": {"quant": "int8", "residual": 0},
    "int8 r128": {"quant": "int8", "residual": 128},
    "int4 r128": {"quant": "int4", "residual": 128},
    "int4 r0": {"quant": "int4", "residual": 0},
}
#: The issue's targets: (minimum agreement, maximum perplexity delta) per label.
TARGETS = {"int8 r0": (0.995, 0.005), "int8 r128": (0.995, 0.005), "int4 r128": (0.97, 0.03)}
#: The built-in decoders measured: a geometry with several KV heads per query group.
BUILTIN_CONFIG = dict(layers=2, hidden=256, q_heads=8, kv_heads=4, head_dim=32, vocab=512, max_positions=1024)
TRAINED = "trained-llama-dynamo23"
#: The built-in decoders ``--models`` accepts (``builtin-<kind>`` of ``onnx_light_kv.models.build``).
BUILTINS = ("builtin-llama", "builtin-gpt2")


def model_names() -> List[str]:
    """Every name ``--models`` accepts: the trained fixtures present, then the built-ins."""
    try:
        trained = list(tr.names())
    except Exception:  # no fixtures manifest: the built-ins only
        trained = []
    return trained + list(BUILTINS)


def max_positions(name: str) -> int:
    """Positions the model ``name`` covers (prompt + generated tokens must fit)."""
    if name.startswith("trained-"):
        import _fixtures as fx

        cfg = fx.entry(name).get("config", {})
        return int(cfg.get("max_position_embeddings") or BUILTIN_CONFIG["max_positions"])
    return int(BUILTIN_CONFIG["max_positions"])


def state_options(label: str, group: int = 32, k_axis: str = "channel") -> Dict[str, Any]:
    """``create_state`` options of a :data:`CONFIGS` label ("fp32" is the reference cache)."""
    if label == "fp32":
        return {"dtype": "float32"}
    if "quant" not in CONFIGS[label]:
        return dict(CONFIGS[label])
    return {**CONFIGS[label], "quant_group": group, "k_axis": k_axis}


def unavailable(sess: Any, options: Dict[str, Any]) -> Optional[str]:
    """Why a state with ``options`` cannot be made on ``sess`` (None when it can): this build's
    ``create_state`` refusing the quantization options."""
    try:
        sess.create_state(batch=1, max_length=64, **options).close()
    except (TypeError, ValueError, NotImplementedError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


class Model:
    """A decoder under test: its session, the feed driver, prompts and (trained) held-out ids."""

    def __init__(self, name: str, threads: int):
        import onnx_light_kv as olkv
        from onnx_light_kv import models

        self.name = name
        if name.startswith("trained-"):
            import _fixtures as fx

            self.sess = olkv.InferenceSession(fx.model_path(name), threads=threads)
            self.decoder = lambda: fx.Decoder(name, self.sess)
            self.vocab = int(fx.entry(name)["config"]["vocab_size"])
            self.heldout: Optional[np.ndarray] = tr.heldout_ids(name)
        else:
            kind = name.split("-", 1)[1]
            cfg = models.DecoderConfig(**BUILTIN_CONFIG)
            self.sess = olkv.InferenceSession(models.model_bytes(models.build(kind, cfg)), threads=threads)
            info = {"config": cfg, "kind": kind}
            self.decoder = lambda: BuiltinDecoder(self.sess, info)
            self.vocab = cfg.vocab
            self.heldout = None

    def prompts(self, n: int, length: int, seed: int = 0) -> List[np.ndarray]:
        """``n`` prompts of ``length`` tokens: consecutive slices of the held-out sample (trained
        fixture), else seeded random ids."""
        if self.heldout is not None:
            if n * length > len(self.heldout):
                raise ValueError(f"{n} prompts of {length} tokens exceed the {len(self.heldout)} held-out tokens")
            return [self.heldout[i * length:(i + 1) * length] for i in range(n)]
        rng = np.random.default_rng(seed)
        return [rng.integers(1, self.vocab, length, dtype=np.int64) for _ in range(n)]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _last_logits(logits: Sequence[np.ndarray]) -> np.ndarray:
    """``[runs, vocab]``: each run's last-position logits."""
    return np.stack([lg[0, -1] for lg in logits])


def compare(model: Model, label: str, prompt: np.ndarray, tokens: int, ref_tokens: List[int],
            ref_logits: np.ndarray, group: int, k_axis: str) -> Dict[str, Any]:
    """One quantized cache on one prompt against the fp32 cache's greedy tokens and logits."""
    opts = state_options(label, group, k_axis)
    steps = tokens - 1
    forced_choice, forced_logits = tr.state_decode(model.decoder(), model.sess, prompt, steps,
                                                   forced=np.asarray(ref_tokens), **opts)
    lp, lq = _log_softmax(ref_logits), _log_softmax(_last_logits(forced_logits))
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    free, _ = tr.state_decode(model.decoder(), model.sess, prompt, steps, **opts)
    diff = [i for i, (a, b) in enumerate(zip(free, ref_tokens)) if a != b]
    return {"agreement": float(np.mean(np.asarray(forced_choice) == np.asarray(ref_tokens))),
            "kl": float(kl.mean()), "kl_max": float(kl.max()), "kl_per_position": kl.tolist(),
            "free_match": float(np.mean(np.asarray(free) == np.asarray(ref_tokens))),
            "first_divergence": diff[0] if diff else tokens, "free_tokens": free}


def measure(model: Model, labels: Sequence[str], prompts: Sequence[np.ndarray], tokens: int, *,
            group: int = 32, k_axis: str = "channel", chunk: int = 16,
            perplexity: bool = True) -> Dict[str, Any]:
    """Every quantized cache of ``labels`` on ``model`` over ``prompts``: per label the pooled
    figures (agreement and free match over all positions, mean KL, worst KL, first divergence
    per prompt) and, for a model with held-out text and ``perplexity``, the perplexities. Labels
    whose options ``create_state`` refuses get ``{"unavailable": reason}``."""
    refs = []
    for p in prompts:
        t, lg = tr.state_decode(model.decoder(), model.sess, p, tokens - 1, **state_options("fp32"))
        refs.append((t, _last_logits(lg)))
    out: Dict[str, Any] = {"model": model.name, "tokens": tokens, "prompts": len(prompts),
                           "prompt_len": int(len(prompts[0])), "ref_tokens": [t for t, _ in refs], "caches": {}}
    ppl_ref = None
    if perplexity and model.heldout is not None:
        ppl_ref = tr.perplexity(model.name, model.sess, model.heldout, chunk=chunk, **state_options("fp32"))
        out["ppl_fp32"] = ppl_ref
    for label in labels:
        why = unavailable(model.sess, state_options(label, group, k_axis))
        if why:
            out["caches"][label] = {"unavailable": why}
            continue
        t0 = time.perf_counter()
        per = [compare(model, label, p, tokens, t, lg, group, k_axis) for p, (t, lg) in zip(prompts, refs)]
        res: Dict[str, Any] = {
            "agreement": float(np.mean([r["agreement"] for r in per])),
            "free_match": float(np.mean([r["free_match"] for r in per])),
            "first_divergence": [r["first_divergence"] for r in per],
            "kl": float(np.mean([r["kl"] for r in per])), "kl_max": float(max(r["kl_max"] for r in per)),
            "per_prompt": per}
        if ppl_ref is not None:
            ppl = tr.perplexity(model.name, model.sess, model.heldout, chunk=chunk,
                                **state_options(label, group, k_axis))
            res.update({"ppl": ppl, "ppl_delta": ppl / ppl_ref - 1.0})
        res["seconds"] = time.perf_counter() - t0
        out["caches"][label] = res
    return out


def table_rows(results: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One printable row per model and cache."""
    rows = []
    for m in results:
        for label, r in m["caches"].items():
            row: Dict[str, Any] = {"model": m["model"], "cache": label, "positions": m["prompts"] * m["tokens"]}
            if "unavailable" in r:
                row["note"] = "unavailable: " + r["unavailable"]
            else:
                row.update({"agreement_%": 100 * r["agreement"], "free_match_%": 100 * r["free_match"],
                            "first_div": min(r["first_divergence"]), "mean_KL": r["kl"], "max_KL": r["kl_max"]})
                if "ppl" in r:
                    row.update({"ppl_fp32": m["ppl_fp32"], "ppl": r["ppl"], "ppl_delta_%": 100 * r["ppl_delta"]})
            rows.append(row)
    return rows


def target_lines(results: Sequence[Dict[str, Any]]) -> List[str]:
    """The issue's quality targets against the measured figures."""
    lines = []
    for m in results:
        for label, r in m["caches"].items():
            if label not in TARGETS or "agreement" not in r:
                continue
            agree, ppl = TARGETS[label]
            line = (f"{m['model']} {label}: agreement {100 * r['agreement']:.2f}% (target >= {100 * agree:.1f}%: "
                    f"{'met' if r['agreement'] >= agree else 'NOT met'})")
            if "ppl_delta" in r:
                line += (f", perplexity delta {100 * r['ppl_delta']:+.2f}% (target <= {100 * ppl:.1f}%: "
                         f"{'met' if r['ppl_delta'] <= ppl else 'NOT met'})")
            lines.append(line)
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one prompt; the trained dynamo export and the built-in Llama")
    ap.add_argument("--models", nargs="+", default=None,
                    help="trained fixtures (trained-llama-dynamo23, trained-llama-torchscript) and/or builtin-llama, "
                         "builtin-gpt2 (default: all four)")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--prompts", type=_common.positive_int, default=None, help="prompts per model (default 4, quick 1)")
    ap.add_argument("--prompt-len", type=_common.positive_int, default=64)
    ap.add_argument("--tokens", type=_common.positive_int, default=256, help="tokens generated per prompt")
    ap.add_argument("--quant-group", type=int, choices=[32, 64], default=32, help="tokens per sealed chunk")
    ap.add_argument("--k-axis", choices=["channel", "token"], default="channel")
    ap.add_argument("--chunk", type=_common.positive_int, default=16, help="tokens per run of the perplexity pass")
    ap.add_argument("--threads", type=_common.threads_arg, default=2)
    _common.add_results_dir(ap)
    args = ap.parse_args(argv)
    names = args.models or ([TRAINED, "builtin-llama"] if args.quick else
                            [TRAINED, "trained-llama-torchscript", "builtin-llama", "builtin-gpt2"])
    known = model_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"argument --models: unknown model(s) {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    n_prompts = args.prompts if args.prompts is not None else (1 if args.quick else 4)
    for name in names:
        if args.prompt_len + args.tokens - 1 > max_positions(name):  # the last token generated is not fed
            ap.error(f"--prompt-len {args.prompt_len} + --tokens {args.tokens} exceed the {max_positions(name)} "
                     f"positions of {name}")
        if name.startswith("trained-") and n_prompts * args.prompt_len > len(tr.heldout_ids(name)):
            ap.error(f"{n_prompts} prompt(s) of {args.prompt_len} tokens exceed the {len(tr.heldout_ids(name))} "
                     f"held-out tokens of {name} (--prompts x --prompt-len)")
    results = []
    for name in _common.progress(names, desc="models"):
        model = Model(name, args.threads)
        t0 = time.perf_counter()
        res = measure(model, args.configs, model.prompts(n_prompts, args.prompt_len), args.tokens,
                      group=args.quant_group, k_axis=args.k_axis, chunk=args.chunk)
        res["seconds"] = time.perf_counter() - t0
        results.append(res)
        print(format_table(table_rows([res])), flush=True)
    rows = table_rows(results)
    print()
    print(_common.isa_line())
    print(f"{args.tokens} tokens x {n_prompts} prompt(s) of {args.prompt_len} per model; agreement: teacher-forced "
          "top-1 vs the fp32 cache's greedy token; KL(fp32 || quantized) in nats; ppl on the held-out sample")
    cols = ["model", "cache", "positions", "agreement_%", "free_match_%", "first_div", "mean_KL", "max_KL",
            "ppl_fp32", "ppl", "ppl_delta_%", "note"]
    print(format_table(rows, [c for c in cols if any(c in r for r in rows)], floatfmt="{:.4g}"))
    for line in target_lines(results):
        print(line)
    path = write_json("quant-quality", {"benchmark": "quant-quality", "environment": environment(threads=args.threads),
                                        "args": vars(args), "targets": TARGETS, "rows": rows, "results": results},
                      args.results_dir)
    print(f"\nraw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
