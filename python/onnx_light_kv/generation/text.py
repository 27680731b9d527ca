"""Text in and out (Hugging Face ``tokenizers``), streaming and the progress bar.

``tokenizers`` and ``tqdm`` are optional dependencies (``pip install 'onnx-light-kv[generate]'``),
imported only when a tokenizer path or ``progress=True`` is used (:mod:`onnx_light_kv._optional`).
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._optional import require

__all__ = ["load_tokenizer", "encode", "check_text", "Streamer", "Progress"]

_PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>", "<|endoftext|>", "</s>", "<eos>")


def load_tokenizer(tokenizer: Any) -> Any:
    """A ``tokenizers.Tokenizer``: given one, or loaded from a ``tokenizer.json`` path."""
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer_cls = require("tokenizers").Tokenizer
        path = os.fspath(tokenizer)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            return tokenizer_cls.from_file(path)
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
            raise ValueError(f"cannot read the tokenizer {path}: {e}") from None
    if not (hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "decode")):
        raise TypeError("tokenizer must be a tokenizers.Tokenizer or a tokenizer.json path, "
                        f"got {type(tokenizer).__name__}")
    return tokenizer


def default_pad_id(tokenizer: Any) -> Optional[int]:
    """The id of the tokenizer's padding (or end-of-text) token, if it has one of the usual names."""
    for name in _PAD_NAMES:
        i = tokenizer.token_to_id(name)
        if i is not None:
            return int(i)
    return None


def encode(tokenizer: Any, text: Union[str, Sequence[str]], pad_token_id: int) -> Tuple[np.ndarray, np.ndarray]:
    """Token ids ``[batch, s]`` (left-padded with ``pad_token_id``) and their attention mask."""
    texts = [text] if isinstance(text, str) else list(text)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise TypeError("text input must be a str or a non-empty list of str")
    for i, t in enumerate(texts):
        check_text(t, "the prompt" if isinstance(text, str) else f"prompt {i}")
    rows = [enc.ids for enc in tokenizer.encode_batch(texts)]
    if any(len(r) == 0 for r in rows):
        raise ValueError("a prompt encodes to no tokens")
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_token_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    return ids, mask


def check_text(text: str, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` when ``text`` is not valid Unicode (a lone
    surrogate, as ``surrogateescape`` leaves for undecodable bytes): tokenizers cannot encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} is not valid Unicode text ({e.reason} at position {e.start})") from None


class Streamer:
    """Hands new tokens (and text pieces) to the user's ``streamer`` as they are produced.

    ``streamer`` is either an object with ``put(tokens)`` / ``end()`` (transformers'
    streamer protocol: ``put`` first gets the prompt ``[rows, s]``, then each step's new tokens
    ``[rows]``) or a callable ``streamer(tokens, text)`` called per step with the ``[rows]``
    new token ids and, with a tokenizer, the list of new text pieces per row (else None). A
    row that has stopped gets its padding id and an empty piece, so the pieces of a row add up
    to its ``text`` in the output. With a tokenizer the callable is called one step late: a
    piece that ends inside a multi-byte character waits for the next token, and the last step's
    call, made by :meth:`end`, carries whatever is left (a character the generation cut short
    included). A byte-fallback tokenizer that rewrites text it already decoded (a later byte
    making an earlier byte group invalid) is the one case where the pieces cannot add up."""

    def __init__(self, streamer: Any, tokenizer: Any, rows: int) -> None:
        self.streamer, self.tokenizer = streamer, tokenizer
        self._protocol = hasattr(streamer, "put") and hasattr(streamer, "end")
        if not self._protocol and not callable(streamer):
            raise TypeError("streamer must have put()/end() or be callable(tokens, text)")
        self._tokens: List[List[int]] = [[] for _ in range(rows)]
        self._text = [""] * rows
        self._pending: Optional[Tuple[np.ndarray, Optional[np.ndarray]]] = None

    def prompt(self, ids: np.ndarray) -> None:
        """Announce the prompt (transformers' protocol only)."""
        if self._protocol:
            self.streamer.put(ids.copy())

    def put(self, tokens: np.ndarray, finished: Optional[np.ndarray] = None) -> None:
        """One new token per row; ``finished`` marks rows that had stopped before it (their
        token is padding: no text)."""
        if self._protocol:
            self.streamer.put(tokens.copy())
            return
        if self.tokenizer is None:
            self.streamer(tokens.copy(), None)
            return
        if self._pending is not None:
            # rows stopped since the pending step: that step was their last
            ended = None
            if finished is not None:
                before = self._pending[1]
                ended = finished if before is None else finished & ~before
            self._deliver(*self._pending, last=False, ended=ended)
        self._pending = (tokens.copy(), None if finished is None else finished.copy())

    def _deliver(self, tokens: np.ndarray, finished: Optional[np.ndarray], last: bool,
                 ended: Optional[np.ndarray] = None) -> None:
        pieces = []
        for r, t in enumerate(tokens):
            if finished is not None and finished[r]:
                pieces.append("")
                continue
            self._tokens[r].append(int(t))
            full = self.tokenizer.decode(self._tokens[r], skip_special_tokens=True)
            row_last = last or (ended is not None and bool(ended[r]))
            if full.endswith("\ufffd") and not row_last:  # an incomplete multi-byte character: wait for the rest
                pieces.append("")
                continue
            if not full.startswith(self._text[r]):  # rewritten by a later byte: what was sent stays
                pieces.append("")
                self._text[r] = full
                continue
            pieces.append(full[len(self._text[r]):])
            self._text[r] = full
        self.streamer(tokens, pieces)

    def end(self) -> None:
        """Generation finished: the last step's call (with a tokenizer), or ``end()``."""
        if self._protocol:
            self.streamer.end()
        elif self._pending is not None:
            pending, self._pending = self._pending, None
            self._deliver(*pending, last=True)


class Progress:
    """A tqdm bar over the new tokens, showing tokens/s (no-op when disabled)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.bar = None
        if enabled:  # asked for explicitly: a missing tqdm is an error naming its extra
            self.bar = require("tqdm.auto").tqdm(total=total, unit="tok", desc="generate")

    def update(self, n: int = 1) -> None:
        """``n`` more tokens."""
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()
