"""``python -m onnx_light_kv generate MODEL.onnx ...``: stream a generation, then a summary line."""

from __future__ import annotations

import argparse
import sys
from typing import Any, List, Optional

import numpy as np

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the generate subcommand's options."""
    p.add_argument("model", help="decoder .onnx file with past/present inputs")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-ids", type=int, nargs="+", metavar="ID", help="prompt token ids")
    src.add_argument("--prompt", help="prompt text (needs --tokenizer)")
    p.add_argument("--tokenizer", help="tokenizer.json (Hugging Face tokenizers; optional dependency)")
    p.add_argument("--max-new-tokens", type=int, required=True, default=argparse.SUPPRESS,
                   help="number of tokens to generate")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy choice")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --sample)")
    p.add_argument("--top-k", type=int, default=50,
                   help="sample among the k most likely tokens (as transformers; 0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: smallest set of tokens with this probability")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide (multiply) the logits of tokens already present (1: off)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=0, metavar="N",
                   help="never repeat an n-gram of this size (0: off)")
    p.add_argument("--min-new-tokens", type=int, default=0, metavar="N",
                   help="ban the --eos ids until this many new tokens")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling (None: fresh entropy)")
    p.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams (1: no beam search)")
    p.add_argument("--eos", type=int, nargs="+", default=None, metavar="ID", help="end-of-sequence id(s)")
    p.add_argument("--draft", help="draft decoder .onnx for speculative decoding")
    p.add_argument("--num-draft-tokens", type=int, default=4, help="tokens the draft model proposes per step")
    p.add_argument("--prompt-lookup", type=int, default=0, metavar="N", help="prompt-lookup drafts per step")
    p.add_argument("--threads", type=int, default=None, help="threads of the session (omitted or 0: all CPUs)")


def run(args: Any, out: Any = None) -> int:
    """Run the subcommand; returns the exit code."""
    from .. import InferenceSession
    from .generate import generate

    out = out or sys.stdout
    if args.prompt is not None and not args.tokenizer:
        raise ValueError("--prompt needs --tokenizer (or give --prompt-ids)")
    if args.prompt_ids is not None:
        bad = [i for i in args.prompt_ids if not 0 <= i < 2**63]
        if bad:
            raise ValueError(f"--prompt-ids must be token ids in [0, 2**63), got {bad[0]}")
    if not args.sample:
        unused = [flag for flag, value, default in (("--temperature", args.temperature, 1.0), ("--top-k", args.top_k, 50),
                                                    ("--top-p", args.top_p, 1.0), ("--seed", args.seed, None))
                  if value != default]
        if unused:
            one = len(unused) == 1
            raise ValueError(f"{', '.join(unused)} only take{'s' if one else ''} effect with --sample (greedy choice "
                             f"ignores {'it' if one else 'them'})")
    if args.num_draft_tokens != 4 and not args.draft:
        raise ValueError("--num-draft-tokens only takes effect with --draft (prompt lookup proposes --prompt-lookup "
                         "tokens)")
    sess = InferenceSession(args.model, threads=args.threads)
    draft = InferenceSession(args.draft, threads=args.threads) if args.draft else None
    tok = None
    if args.tokenizer:
        from .text import load_tokenizer

        tok = load_tokenizer(args.tokenizer)
    prompt: Any = args.prompt if args.prompt is not None else np.array(args.prompt_ids, np.int64)
    first = [True]

    def stream(tokens: np.ndarray, text: Optional[List[str]]) -> None:
        piece = text[0] if text is not None else ("" if first[0] else " ") + str(int(tokens[0]))
        first[0] = False
        out.write(piece)
        out.flush()

    res = generate(sess, prompt, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                   repetition_penalty=args.repetition_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
                   min_new_tokens=args.min_new_tokens,
                   num_beams=args.num_beams, eos_token_id=args.eos, draft_session=draft,
                   num_draft_tokens=args.num_draft_tokens, prompt_lookup=args.prompt_lookup,
                   streamer=stream if args.num_beams == 1 else None, tokenizer=tok)
    if args.num_beams > 1:  # beams are known only at the end
        out.write(res.text[0] if res.text else " ".join(map(str, res.new_tokens[0])))
    out.write("\n")
    print(res.stats.summary(), file=out)
    return 0
