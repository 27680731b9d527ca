"""onnx-light-kv: a CPU KV-cache runtime for autoregressive attention.

The heart is :class:`KVCache`, a persistent cache value whose append copies
only new tokens, and :func:`attention`, a streaming decode kernel that reads
the cache in place. See the README for the full tour.

Diagnostics (the kernel path chosen, options without effect, provider
fallbacks) go to the standard :mod:`logging` logger ``"onnx_light_kv"``,
silent unless the application configures logging, e.g.
``logging.basicConfig(level=logging.INFO)``.
"""

from __future__ import annotations

import logging as _logging
from typing import TYPE_CHECKING, Any

_log = _logging.getLogger("onnx_light_kv")
_log.addHandler(_logging.NullHandler())

from ._errors import BudgetError, CapacityError, StaleCheckpointError
from ._dtypes import bfloat16
from .cache import Arena, Checkpoint, KVCache, default_arena
from .attention import attention, get_quant_int_loops, get_threads, set_kernel, set_quant_int_loops, set_threads
from ._kernel import read_bandwidth, stream_read

if TYPE_CHECKING:  # the names __getattr__ loads on first use, typed for checkers (py.typed)
    from . import generation, models, serve, session, state
    from .generation.generate import generate
    from .generation.generator import Generator
    from .generation.output import GenerationOutput
    from .serve.engine import Engine
    from .session import (ExecutionMode, GenerationState, GraphOptimizationLevel, InferenceSession, ModelMetadata,
                          NodeArg, SessionOptions)

__all__ = [
    "Arena", "KVCache", "Checkpoint", "default_arena", "attention", "set_threads", "get_threads",
    "set_kernel", "set_quant_int_loops", "get_quant_int_loops", "read_bandwidth", "stream_read", "InferenceSession", "SessionOptions", "NodeArg", "ModelMetadata",
    "GraphOptimizationLevel", "ExecutionMode", "GenerationState", "models", "BudgetError", "CapacityError",
    "StaleCheckpointError", "bfloat16", "build_info", "generate", "Generator", "GenerationOutput", "__version__",
    "Engine",
]


def build_info() -> dict[str, Any]:
    """Version, Go version, CPU model and features, threads, the active
    attention kernel paths and the CPU tuning their SIMD loops use
    (``"kernel_tuning"``: ``"intel"`` or ``"zen"``, picked once by CPU vendor;
    ``""`` without a SIMD path), as a dict."""
    import json

    from . import _lib

    return json.loads(_lib.call(_lib.fn("InfoJSON")))


def _check_kernel_env() -> str:
    """Log the kernel path in use; warn when OLKV_KERNEL asked for a path
    this CPU or build cannot run. Returns the package version."""
    import os
    import warnings

    info = build_info()
    if os.environ.get("OLKV_KERNEL"):
        err = info.get("kernel_startup_error")
        if err:  # (the message names the variable and says it is ignored)
            _log.warning("%s", err)
            warnings.warn(str(err), RuntimeWarning, stacklevel=2)
    gemm = os.environ.get("OLKV_GEMM", "").strip().lower()
    paths = ["auto", *info.get("attention_kernels", [])]  # (the matrix kernels have the same paths)
    if gemm and gemm not in paths:
        msg = (f'OLKV_GEMM="{os.environ["OLKV_GEMM"]}" ignored: not a kernel path of this CPU/build '
               f'(available: {", ".join(paths)}); the matrix kernels use {info.get("gemm_kernel")}')
        _log.warning("%s", msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
    _log.info("attention kernel path %s (available: %s), %d threads", info.get("attention_kernel"),
              ", ".join(info.get("attention_kernels", [])), info.get("threads", 0))
    return str(info["version"])


__version__: str = _check_kernel_env()
"""The package version (one source: the extension embeds golib/kvgo/VERSION,
which the package metadata reads too)."""


def __dir__() -> list[str]:
    """The module's names, the lazily loaded ones (``__all__``) included."""
    return sorted(set(globals()) | set(__all__))


if not TYPE_CHECKING:  # (hidden from checkers: to them, a module __getattr__ makes every name Any)
    def __getattr__(name: str) -> Any:
        # heavy or optional parts load on first use (type checkers see the TYPE_CHECKING imports
        # above instead, so a misspelt name is an error there too)
        if name == "models":
            import importlib

            return importlib.import_module(".models", __name__)
        if name in ("session", "state", "serve"):
            import importlib

            # submodules the README names as olkv.session... (an import of them works too)
            return importlib.import_module(f".{name}", __name__)
        if name in ("generate", "Generator", "GenerationOutput", "generation"):
            import importlib

            gen = importlib.import_module(".generation", __name__)
            return gen if name == "generation" else getattr(gen, name)
        if name == "Engine":
            from .serve.engine import Engine

            return Engine
        if name in ("InferenceSession", "SessionOptions", "NodeArg", "ModelMetadata", "GraphOptimizationLevel",
                    "ExecutionMode", "GenerationState"):
            from . import session

            return getattr(session, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
