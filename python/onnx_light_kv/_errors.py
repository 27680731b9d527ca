"""Exception classes of onnx_light_kv and the mapping from Go errors.

Go functions report errors as ``"Class: message"`` strings (see
``golib/kvgo/errors.go``); gopy raises them as ``RuntimeError``. ``convert``
turns them into the built-in class the prefix names, so users catch
``ValueError``, ``IndexError``, ``MemoryError``... as with any numpy API.
"""

from __future__ import annotations

__all__ = ["BudgetError", "CapacityError", "StaleCheckpointError", "convert"]


class BudgetError(MemoryError):
    """The session's memory budget cannot hold the requested cache memory.

    The message carries the numbers (requested, committed, budget). The
    operation that raised it changed nothing.
    """


class CapacityError(ValueError):
    """Appending would exceed a cache's reserved capacity (nothing was written)."""


class StaleCheckpointError(ValueError):
    """A checkpoint can no longer be restored: released, dropped because a
    cache keeps only its 64 newest checkpoints live, invalidated by
    ``reset``/``reorder``, or its rows were overwritten by a later append.
    The message names the reason."""


_CLASSES: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "IndexError": IndexError,
    "KeyError": KeyError,
    "MemoryError": MemoryError,
    "NotImplementedError": NotImplementedError,
    "FileNotFoundError": FileNotFoundError,
    "PermissionError": PermissionError,
    "IsADirectoryError": IsADirectoryError,
    "OSError": OSError,
    "RuntimeError": RuntimeError,
    "BudgetError": BudgetError,
    "CapacityError": CapacityError,
}


def convert(exc: BaseException) -> BaseException:
    """Map a ``RuntimeError("Class: message")`` raised by the extension to the
    exception class it names; anything else is returned unchanged."""
    msg = str(exc)
    cls_name, sep, rest = msg.partition(": ")
    if not sep:
        return exc
    cls = _CLASSES.get(cls_name)
    if cls is None:
        return exc
    if cls is ValueError and rest.startswith("stale checkpoint"):
        cls = StaleCheckpointError
    return cls(rest)
