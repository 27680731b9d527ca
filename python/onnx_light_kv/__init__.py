"""onnx-light-kv: a CPU KV-cache runtime for autoregressive attention.

The heart is :class:`KVCache`, a persistent cache value whose append copies
only new tokens, and :func:`attention`, a streaming decode kernel that reads
the cache in place. See the README for the full tour.
"""

from __future__ import annotations

from typing import Any

from ._errors import BudgetError, CapacityError, StaleCheckpointError
from ._dtypes import bfloat16
from .cache import Arena, Checkpoint, KVCache, default_arena
from .attention import attention, get_threads, set_kernel, set_threads
from ._kernel import read_bandwidth, stream_read

__version__ = "0.1.0"

__all__ = [
    "Arena", "KVCache", "Checkpoint", "default_arena", "attention", "set_threads", "get_threads",
    "set_kernel", "read_bandwidth", "stream_read", "InferenceSession", "SessionOptions", "NodeArg", "GenerationState", "models", "BudgetError", "CapacityError", "StaleCheckpointError", "bfloat16", "build_info",
    "generate", "Generator", "GenerationOutput", "__version__",
]


def build_info() -> dict[str, Any]:
    """Version, Go version, CPU model and features, threads and the active
    attention kernel paths, as a dict."""
    import json

    from . import _lib

    return json.loads(_lib.call(_lib.fn("InfoJSON")))


def _check_kernel_env() -> None:
    """Warn when OLKV_KERNEL asked for a path this CPU or build cannot run."""
    import os
    import warnings

    if os.environ.get("OLKV_KERNEL"):
        err = build_info().get("kernel_startup_error")
        if err:
            warnings.warn(f"OLKV_KERNEL ignored: {err}", RuntimeWarning, stacklevel=2)


_check_kernel_env()


def __getattr__(name: str) -> Any:
    # heavy or optional parts load on first use
    if name == "models":
        import importlib

        return importlib.import_module(".models", __name__)
    if name in ("generate", "Generator", "GenerationOutput", "generation"):
        import importlib

        gen = importlib.import_module(".generation", __name__)
        return gen if name == "generation" else getattr(gen, name)
    if name in ("InferenceSession", "SessionOptions", "NodeArg", "GenerationState"):
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
