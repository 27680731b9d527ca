"""The trained decoder fixture (tests/fixtures/trained-*, made by scripts/train_fixture.py) for quality tests.

Import from test files as ``import _trained as tr`` (pytest puts ``tests/`` on sys.path). Unlike the
random-weight fixtures, this model was trained on Python source (the standard library), so its
attention is peaked and its next-token distributions are meaningful: the fixture for cache
quantization, paged-cache and prefix-reuse quality checks (greedy agreement, KL divergence,
perplexity delta).

* :func:`names`: the trained fixtures' names (manifest entries with ``"trained": true``);
  :func:`training`: an entry's training figures (steps, tokens, train/held-out loss and perplexity,
  ``heldout_sample_perplexity`` of :func:`heldout_ids` computed by transformers when it was made).
* :func:`tokenizer`, :func:`heldout_text`, :func:`heldout_ids`: its byte-level BPE tokenizer (a
  ``tokenizers.Tokenizer``) and the committed held-out text sample (files the model never saw).
* :func:`state_logits`: teacher-forced logits of a token sequence on the cache path
  (``create_state``), the sequence fed in chunks, in independent windows of the training length.
* :func:`perplexity`: ``exp`` of the mean next-token negative log-likelihood from those logits.
* :func:`state_greedy`: greedy decoding on the cache path (tokens and each run's logits);
  :func:`state_decode`: the same with any decoder driver, greedy or teacher-forced.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import _fixtures as fx


def names() -> List[str]:
    """The trained fixtures' names, sorted."""
    return [n for n in fx.names() if fx.entry(n).get("trained")]


def training(name: str) -> Dict[str, Any]:
    """The fixture's training record (manifest ``training``)."""
    return fx.entry(name)["training"]


def window(name: str) -> int:
    """The sequence length the model was trained on (tokens per perplexity window)."""
    return int(training(name)["seq"])


@functools.lru_cache(maxsize=None)
def tokenizer(name: Optional[str] = None) -> Any:
    """The fixture's ``tokenizers.Tokenizer`` (byte-level BPE; id 0 is ``<|endoftext|>``)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(fx.FIXTURE_DIR, fx.entry(name or names()[0])["tokenizer"]))


@functools.lru_cache(maxsize=None)
def heldout_text(name: Optional[str] = None) -> str:
    """The committed held-out text sample (a few KB from files left out of training)."""
    with open(os.path.join(fx.FIXTURE_DIR, fx.entry(name or names()[0])["heldout_text"]), encoding="utf-8") as f:
        return f.read()


def heldout_ids(name: Optional[str] = None) -> np.ndarray:
    """:func:`heldout_text` as token ids (int64 ``[n]``)."""
    return np.asarray(tokenizer(name).encode(heldout_text(name)).ids, dtype=np.int64)


def _state_feeds(dec: Any, tokens: np.ndarray) -> Dict[str, np.ndarray]:
    pasts = {p for p, _ in dec.pairs}
    return {k: v for k, v in dec.feeds(tokens).items() if k not in pasts}


def state_logits(name: str, sess: Any, ids: np.ndarray, *, chunk: int = 64, window_len: Optional[int] = None,
                 **state_options: Any) -> np.ndarray:
    """Teacher-forced logits (float32 ``[n, vocab]``) of the 1-D token sequence ``ids`` on the cache
    path: each window of ``window_len`` tokens (default: the training length) runs on a fresh
    ``sess.create_state(**state_options)``, fed ``chunk`` tokens at a time (a prefill then chunked
    appends); row ``i`` predicts ``ids[i + 1]`` from the window's tokens up to ``i``."""
    w = window_len or window(name)
    out = []
    for s in range(0, len(ids), w):
        seg = np.asarray(ids[s:s + w], dtype=np.int64)
        dec = fx.Decoder(name, sess)
        dec.start(1)
        with sess.create_state(batch=1, **state_options) as st:
            for c in range(0, len(seg), chunk):
                tok = seg[None, c:c + chunk]
                out.append(sess.run(["logits"], _state_feeds(dec, tok), state=st)[0][0].astype(np.float32))
                dec.past_len += tok.shape[1]
    return np.concatenate(out, axis=0)


def perplexity(name: str, sess: Any, ids: np.ndarray, *, chunk: int = 64, window_len: Optional[int] = None,
               **state_options: Any) -> float:
    """Perplexity of ``ids`` from :func:`state_logits` (each window's first token is context only,
    as scripts/train_fixture.py computes ``heldout_sample_perplexity``)."""
    w = window_len or window(name)
    logits = state_logits(name, sess, ids, chunk=chunk, window_len=w, **state_options).astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll, count = 0.0, 0
    for s in range(0, len(ids), w):
        n = min(w, len(ids) - s)
        if n < 2:
            break
        nll -= float(logp[s + np.arange(n - 1), ids[s + 1:s + n]].sum())
        count += n - 1
    return float(np.exp(nll / count))


def state_decode(dec: Any, sess: Any, prompt: np.ndarray, steps: int, forced: Optional[np.ndarray] = None,
                 **state_options: Any) -> Tuple[List[int], List[np.ndarray]]:
    """Decoding of a 1-D prompt on the cache path (``sess.create_state(**state_options)``) with the
    feeds of the driver ``dec`` (a ``_fixtures.Decoder`` or any object with its ``start``,
    ``feeds``, ``pairs`` and ``past_len``): the prefill, then ``steps`` one-token steps fed the
    previous argmax (greedy) or, teacher-forced, ``forced[i]`` at step ``i + 1``. Returns the
    argmax after each run (``steps + 1``) and each run's logits (``[1, seq, vocab]``)."""
    dec.start(1)
    tokens: List[int] = []
    logits: List[np.ndarray] = []
    with sess.create_state(batch=1, **state_options) as st:
        x = np.asarray(prompt, dtype=np.int64)[None]
        for i in range(steps + 1):
            logits.append(sess.run(["logits"], _state_feeds(dec, x), state=st)[0])
            dec.past_len += x.shape[1]
            tokens.append(int(np.argmax(logits[-1][0, -1])))
            x = np.array([[tokens[-1] if forced is None else int(forced[i])]], dtype=np.int64)
    return tokens, logits


def state_greedy(name: str, sess: Any, prompt: np.ndarray, steps: int,
                 **state_options: Any) -> Tuple[List[int], List[np.ndarray]]:
    """Greedy decoding of a 1-D prompt on the cache path: the tokens chosen after the prefill and
    each of ``steps`` steps (``steps + 1``), and each run's logits (``[1, seq, vocab]``)."""
    return state_decode(fx.Decoder(name, sess), sess, prompt, steps, **state_options)
