"""What :func:`~onnx_light_kv.generate` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from .._format import human_bytes

__all__ = ["GenerationOutput", "GenerationStats"]


@dataclass
class GenerationStats:
    """Figures of one ``generate`` call.

    ``prefill_ms``: the prompt runs; ``decode_ms`` and ``decode_tokens`` (new tokens after
    the first of each row, summed over rows) give ``decode_tokens_per_s``; ``model_runs``:
    target-model calls; ``draft_tokens`` / ``accepted_draft_tokens``: speculative decoding's
    proposals and how many the target kept; ``cache_bytes``: the largest K/V footprint held
    (target and draft together); ``runner``: "tensor" (past/present fed back) or "state"."""

    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    decode_tokens: int = 0
    model_runs: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    cache_bytes: int = 0
    runner: str = "tensor"

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens per second after the first (0 when nothing was decoded)."""
        return self.decode_tokens / (self.decode_ms / 1e3) if self.decode_ms > 0 else 0.0

    def summary(self) -> str:
        """One line: prefill ms, decode tokens/s, accepted drafts, cache bytes."""
        s = (f"prefill {self.prefill_ms:.1f} ms | decode {self.decode_tokens} tokens in {self.decode_ms:.1f} ms "
             f"({self.decode_tokens_per_s:.1f} tokens/s) | cache {human_bytes(self.cache_bytes)}")
        if self.draft_tokens:
            s += f" | drafts accepted {self.accepted_draft_tokens}/{self.draft_tokens}"
        return s


@dataclass
class GenerationOutput:
    """Result of :func:`~onnx_light_kv.generate`.

    ``sequences``: int64 ``[batch * num_return_sequences, prompt + new]``, the (left-padded)
    prompt followed by the new tokens, rows that stopped early padded with ``pad_token_id``.
    ``scores``: with ``return_scores=True``, one ``[rows, vocab]`` float32 array per step of
    log-probabilities after the logits processors (beam search: ``[batch * num_beams, vocab]``
    per step, as transformers); else None. ``sequences_scores``: beam search's final score per
    returned sequence. ``text``: the decoded new tokens per row when a tokenizer was given.
    ``stats``: :class:`GenerationStats`."""

    sequences: np.ndarray
    scores: Optional[List[np.ndarray]] = None
    sequences_scores: Optional[np.ndarray] = None
    text: Optional[List[str]] = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    prompt_length: int = 0

    @property
    def new_tokens(self) -> np.ndarray:
        """``[rows, new]``: the generated part of :attr:`sequences`."""
        return self.sequences[:, self.prompt_length:]
