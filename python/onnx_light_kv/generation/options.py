"""Validated generation options and the per-row stop conditions they define."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .._validate import integer, real

__all__ = ["SamplingOptions", "StopCondition"]


@dataclass(frozen=True)
class SamplingOptions:
    """How the next token is chosen (transformers' names and meanings).

    The fields are checked and normalized by the project's one rule per argument kind
    (:mod:`onnx_light_kv._validate`): ``do_sample`` must be a ``bool`` (``TypeError``
    otherwise), ``top_k`` an integer (``1.5`` or ``"2"`` raise ``TypeError``), the others real
    numbers (strings raise ``TypeError``) that are finite and in range (``ValueError``)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, (bool, np.bool_)):
            raise TypeError(f"do_sample must be a bool, got {type(self.do_sample).__name__}")
        temperature = real(self.temperature, "temperature")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        top_p = real(self.top_p, "top_p")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        repetition_penalty = real(self.repetition_penalty, "repetition_penalty")
        if not repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
        fields = {"do_sample": bool(self.do_sample), "temperature": temperature,
                  "top_k": integer(self.top_k, "top_k", lo=0), "top_p": top_p,
                  "min_p": real(self.min_p, "min_p", lo=0.0, hi=1.0), "repetition_penalty": repetition_penalty}
        for name, value in fields.items():
            object.__setattr__(self, name, value)  # frozen: normalized once, here


def _ids(value: Any, what: str) -> Tuple[int, ...]:
    """Token ids (an int or an iterable of ints, each >= 0 and within int64)."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must be an int or a list of ints, got {type(value).__name__}")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (integer(value, what, lo=0),)
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{what} must be an int or a list of ints, got {type(value).__name__}") from None
    return tuple(integer(v, what, lo=0) for v in items)


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
