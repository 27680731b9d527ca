"""Optional dependencies: import them on use, naming the extra that installs them.

``pip install onnx-light-kv`` brings what every documented feature needs
(numpy, ml_dtypes, onnx). The rest is optional:

=============  ==================  ==============================================
extra          package             used for
=============  ==================  ==============================================
``ort``        onnxruntime         side-by-side comparison (demo, benchmarks)
``plot``       matplotlib          benchmark plots (PNG)
``progress``   tqdm                progress bars (demo, long benchmark runs)
``generate``   tokenizers, tqdm    text in/out and progress bars of ``generate()``
``serve``      starlette, uvicorn, the OpenAI-compatible HTTP server (``serve``)
               jinja2, tokenizers
``ray``        ray[serve]          scale-out on Ray Serve (``serve.ray``)
=============  ==================  ==============================================
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Iterable, Iterator, Optional, TypeVar

__all__ = ["EXTRAS", "require", "available", "progress"]

#: module name -> (extra, feature) for the optional dependencies
EXTRAS = {
    "onnxruntime": ("ort", "comparison with onnxruntime"),
    "matplotlib": ("plot", "plots"),
    "tqdm": ("progress", "progress bars"),
    "tokenizers": ("generate", "text in/out with a tokenizer"),
    "starlette": ("serve", "the HTTP server"),
    "uvicorn": ("serve", "the HTTP server"),
    "jinja2": ("serve", "chat templates of the HTTP server"),
    "ray": ("ray", "scale-out on Ray Serve"),
}

T = TypeVar("T")


def require(module: str) -> ModuleType:
    """Import the optional ``module`` or raise ImportError saying which
    extra installs it (``pip install 'onnx-light-kv[ort]'``)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        extra, feature = EXTRAS.get(module.split(".")[0], (None, module))
        hint = f"pip install 'onnx-light-kv[{extra}]'" if extra else f"pip install {module}"
        raise ImportError(f"{feature} needs the optional package {module!r}: {hint}") from e


def available(module: str) -> bool:
    """True when the optional ``module`` can be imported."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def progress(items: Iterable[T], *, total: Optional[int] = None, desc: str = "",
             enable: bool = True, **kwargs: Any) -> Iterator[T]:
    """``items`` wrapped in a tqdm progress bar (on stderr) when tqdm is
    installed (extra ``progress``) and ``enable`` is true; else ``items``
    unchanged."""
    if enable:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            return iter(tqdm(items, total=total, desc=desc, leave=False, **kwargs))
    return iter(items)
