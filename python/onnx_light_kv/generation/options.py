"""Validated generation options and the per-row stop conditions they define."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["SamplingOptions", "StopCondition"]


@dataclass(frozen=True)
class SamplingOptions:
    """How the next token is chosen (transformers' names and meanings)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, (bool, np.bool_)):
            raise TypeError(f"do_sample must be a bool, got {type(self.do_sample).__name__}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


def _ids(value: Any, what: str) -> Tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),)
    try:
        out = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{what} must be an int or a list of ints, got {type(value).__name__}") from None
    return out


@dataclass(frozen=True)
class StopCondition:
    """When a row is finished: it produced one of ``eos`` or ended with one of ``stop_sequences``
    (the stopping tokens are kept in the output, as transformers does)."""

    eos: Tuple[int, ...] = ()
    stop_sequences: Tuple[Tuple[int, ...], ...] = ()

    @classmethod
    def of(cls, eos_token_id: Union[int, Sequence[int], None],
           stop_sequences: Optional[Sequence[Sequence[int]]]) -> "StopCondition":
        """Validate ``eos_token_id`` (int or list) and ``stop_sequences`` (lists of ids)."""
        seqs = tuple(_ids(s, "each stop sequence") for s in (stop_sequences or ()))
        if any(len(s) == 0 for s in seqs):
            raise ValueError("stop sequences must not be empty")
        return cls(eos=_ids(eos_token_id, "eos_token_id"), stop_sequences=seqs)

    def hit(self, sequence: np.ndarray) -> bool:
        """Whether the 1-D ``sequence`` (ids so far, the newest last) is finished."""
        if sequence.size == 0:
            return False
        if int(sequence[-1]) in self.eos:
            return True
        for s in self.stop_sequences:
            n = len(s)
            if sequence.size >= n and tuple(int(t) for t in sequence[-n:]) == s:
                return True
        return False

    def hits(self, sequences: np.ndarray) -> np.ndarray:
        """:meth:`hit` for each row of ``sequences [rows, length]``."""
        if not self.eos and not self.stop_sequences:
            return np.zeros(sequences.shape[0], dtype=bool)
        return np.array([self.hit(row) for row in sequences], dtype=bool)
