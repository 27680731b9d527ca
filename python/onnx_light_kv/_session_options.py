"""onnxruntime-compatible session configuration: SessionOptions, the
execution providers check and ModelMetadata.

Names and defaults are onnxruntime's, so code written for
``onnxruntime.InferenceSession`` runs unchanged; what does not apply to this
runtime is accepted, has no effect, and is listed in the docstrings (and
logged at INFO level on the ``onnx_light_kv`` logger when set to a value
other than its default).
"""

from __future__ import annotations

import enum
import logging
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ._format import summary
from ._validate import integer

__all__ = ["SessionOptions", "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "ModelMetadata",
           "CPU_PROVIDER", "check_providers"]

log = logging.getLogger("onnx_light_kv")

#: The only execution provider: this runtime runs on the CPU.
CPU_PROVIDER = "CPUExecutionProvider"


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's graph optimization levels (accepted, no effect here)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """onnxruntime's execution modes (accepted, no effect: nodes run in order,
    each on all kernel threads)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    """onnxruntime's node execution orders (accepted, no effect)."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


# name -> (default, kind); kind is the type the value is converted to
_APPLIED: Dict[str, Tuple[Any, type]] = {
    "intra_op_num_threads": (0, int),
    "enable_profiling": (False, bool),
}
_ACCEPTED: Dict[str, Tuple[Any, Any]] = {
    "inter_op_num_threads": (0, int),
    "graph_optimization_level": (GraphOptimizationLevel.ORT_ENABLE_ALL, GraphOptimizationLevel),
    "execution_mode": (ExecutionMode.ORT_SEQUENTIAL, ExecutionMode),
    "execution_order": (ExecutionOrder.DEFAULT, ExecutionOrder),
    "enable_cpu_mem_arena": (True, bool),
    "enable_mem_pattern": (True, bool),
    "enable_mem_reuse": (True, bool),
    "use_deterministic_compute": (False, bool),
    "use_per_session_threads": (True, bool),
    "log_severity_level": (-1, int),
    "log_verbosity_level": (0, int),
    "logid": ("", str),
    "optimized_model_filepath": ("", str),
    "profile_file_prefix": ("onnxruntime_profile_", str),
}
_OPTIONS = {**_APPLIED, **_ACCEPTED}

#: this project's own session config entries and their allowed values
_OWN_CONFIG: Dict[str, Set[str]] = {"olkv.map_model_files": {"0", "1"}}


def _convert(name: str, value: Any, kind: Any) -> Any:
    if kind is bool:
        if not isinstance(value, (bool, int)) or (isinstance(value, int) and value not in (0, 1)):
            raise TypeError(f"SessionOptions.{name} must be a bool, got {value!r}")
        return bool(value)
    if kind is str:
        if not isinstance(value, str):
            raise TypeError(f"SessionOptions.{name} must be a str, got {type(value).__name__}")
        return value
    # ints and enums, including onnxruntime's own enum values
    iv = integer(getattr(value, "value", value), f"SessionOptions.{name}")
    if kind is int:
        if name.endswith("num_threads"):
            return integer(iv, f"SessionOptions.{name}", lo=0, hi=1024)
        return iv
    try:
        return kind(iv)
    except ValueError:
        allowed = ", ".join(f"{m.name}={m.value}" for m in kind)
        raise ValueError(f"SessionOptions.{name}: {iv} is not one of {allowed}") from None


class SessionOptions:
    """Session configuration with onnxruntime's attribute names and defaults.

    Applied here:

    - ``intra_op_num_threads`` (default 0: all CPUs): kernel threads.
    - ``enable_profiling`` (default False): record per-node events, read
      from ``InferenceSession.last_run_stats``.

    Accepted for compatibility, without effect (the runtime plans the graph
    itself, allocates from its own pools and runs nodes in order):
    ``inter_op_num_threads``, ``graph_optimization_level``,
    ``execution_mode``, ``execution_order``, ``enable_cpu_mem_arena``,
    ``enable_mem_pattern``, ``enable_mem_reuse``,
    ``use_deterministic_compute`` (runs are deterministic for a given thread
    count anyway), ``use_per_session_threads``, ``log_severity_level``, ``log_verbosity_level``,
    ``logid``, ``optimized_model_filepath`` (nothing is written),
    ``profile_file_prefix``, and ``add_session_config_entry`` entries other
    than this project's own:

    - ``"olkv.map_model_files"``: ``"1"`` (default) memory-maps model and
      external data files of 16 MiB or more, ``"0"`` reads them into memory
      (then the files may be rewritten while a session is alive).

    Any other attribute raises ``AttributeError``, so a misspelt option is
    never silently ignored. ``register_custom_ops_library``,
    ``add_initializer``, ``add_external_initializers`` and the free-dimension
    overrides raise ``NotImplementedError``.
    """

    __slots__ = tuple(_OPTIONS) + ("_config",)

    # the options as type checkers see them (py.typed; the slots above hold them): each reads
    # back as the type an assignment is converted to
    intra_op_num_threads: int
    enable_profiling: bool
    inter_op_num_threads: int
    graph_optimization_level: GraphOptimizationLevel
    execution_mode: ExecutionMode
    execution_order: ExecutionOrder
    enable_cpu_mem_arena: bool
    enable_mem_pattern: bool
    enable_mem_reuse: bool
    use_deterministic_compute: bool
    use_per_session_threads: bool
    log_severity_level: int
    log_verbosity_level: int
    logid: str
    optimized_model_filepath: str
    profile_file_prefix: str
    _config: Dict[str, str]

    def __init__(self) -> None:
        for name, (default, _) in _OPTIONS.items():
            object.__setattr__(self, name, default)
        object.__setattr__(self, "_config", {})

    def __setattr__(self, name: str, value: Any) -> None:
        spec = _OPTIONS.get(name)
        if spec is None:
            raise AttributeError(f"SessionOptions has no option {name!r} (onnxruntime's options: "
                                 f"{', '.join(sorted(_OPTIONS))})")
        object.__setattr__(self, name, _convert(name, value, spec[1]))

    def __getstate__(self) -> dict[str, Any]:
        """The options and config entries, for pickling and copies (each copy gets its own
        config entries)."""
        state = {name: getattr(self, name) for name in _OPTIONS}
        state["_config"] = dict(self._config)
        return state

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`__getstate__`'s options (validated as on assignment)."""
        object.__setattr__(self, "_config", dict(state.get("_config", {})))
        for name, (default, _) in _OPTIONS.items():
            setattr(self, name, state.get(name, default))

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Store a session config entry (as onnxruntime does). Only this
        project's own keys have an effect (see the class docstring); their
        values are checked here (ValueError)."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError("session config entries are str -> str")
        allowed = _OWN_CONFIG.get(key)
        if allowed is not None and value not in allowed:
            raise ValueError(f"session config entry {key!r} takes one of {sorted(allowed)}, got {value!r}")
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        """The value stored by :meth:`add_session_config_entry` (KeyError if none)."""
        try:
            return self._config[key]
        except KeyError:
            raise KeyError(f"no session config entry {key!r}") from None

    def _map_model_files(self) -> bool:
        """Whether model and external data files may be memory-mapped."""
        return self._config.get("olkv.map_model_files", "1") == "1"

    def _unsupported(self, what: str) -> None:
        raise NotImplementedError(f"SessionOptions.{what} is not supported by onnx-light-kv")

    def register_custom_ops_library(self, library_path: str) -> None:
        """Not supported: raises NotImplementedError."""
        self._unsupported("register_custom_ops_library")

    def add_initializer(self, name: str, value: Any) -> None:
        """Not supported: raises NotImplementedError (put initializers in the model)."""
        self._unsupported("add_initializer")

    def add_external_initializers(self, names: Sequence[str], values: Sequence[Any]) -> None:
        """Not supported: raises NotImplementedError."""
        self._unsupported("add_external_initializers")

    def add_free_dimension_override_by_name(self, name: str, value: int) -> None:
        """Not supported: raises NotImplementedError (shapes come from the feeds)."""
        self._unsupported("add_free_dimension_override_by_name")

    def add_free_dimension_override_by_denotation(self, denotation: str, value: int) -> None:
        """Not supported: raises NotImplementedError (shapes come from the feeds)."""
        self._unsupported("add_free_dimension_override_by_denotation")

    def non_default(self) -> Dict[str, Any]:
        """The options set to a value other than their default."""
        return {n: getattr(self, n) for n, (d, _) in _OPTIONS.items() if getattr(self, n) != d}

    def _log_ignored(self) -> None:
        for name, value in self.non_default().items():
            if name not in _APPLIED:
                log.info("SessionOptions.%s=%r has no effect in onnx-light-kv", name, value)
        ignored = sorted(k for k in self._config if k not in _OWN_CONFIG)
        if ignored:
            log.info("session config entries have no effect in onnx-light-kv: %s", ignored)

    def __repr__(self) -> str:
        nd = {n: (v.name if isinstance(v, enum.Enum) else v) for n, v in self.non_default().items()}
        return summary("SessionOptions", **nd)


_warned: Set[str] = set()

ProviderSpec = Union[str, Tuple[str, Mapping[str, Any]]]


def check_providers(providers: Optional[Sequence[ProviderSpec]],
                    provider_options: Optional[Sequence[Mapping[str, Any]]] = None) -> List[str]:
    """Validate onnxruntime-style ``providers`` (names or ``(name, options)``
    pairs) and return the ones used: always ``["CPUExecutionProvider"]``.

    A provider other than the CPU one is not available here: like
    onnxruntime with a provider it was not built with, the session falls
    back to the CPU, with a ``RuntimeWarning`` issued once per provider name
    (and a WARNING on the ``onnx_light_kv`` logger).

    Raises:
        TypeError: a provider that is neither a str nor a (str, dict) pair.
        ValueError: ``provider_options`` of a different length than ``providers``.
    """
    if providers is None:
        return [CPU_PROVIDER]
    if isinstance(providers, str):
        raise TypeError("providers must be a list of provider names, e.g. ['CPUExecutionProvider']")
    names = []
    for p in providers:
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], Mapping):
            names.append(p[0])
        elif isinstance(p, str):
            names.append(p)
        else:
            raise TypeError(f"a provider is a name or a (name, options dict) pair, got {p!r}")
    if provider_options is not None and len(provider_options) != len(names):
        raise ValueError(f"provider_options has {len(provider_options)} entries for {len(names)} providers")
    for n in names:
        if n != CPU_PROVIDER and n not in _warned:
            _warned.add(n)
            msg = (f"{n!r} is not available in onnx-light-kv, which runs on the CPU only: "
                   f"using {CPU_PROVIDER!r}")
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return [CPU_PROVIDER]


class ModelMetadata:
    """The model's self-description, as onnxruntime's ``ModelMetadata``.

    Attributes:
        producer_name: the tool that wrote the model (``ModelProto.producer_name``).
        graph_name: the graph's name.
        graph_description: the graph's doc string.
        domain: the model's domain (reverse-DNS namespace).
        description: the model's doc string.
        version: the model's version (``model_version``, an int; 0 when the
            model sets none, where onnxruntime reports ``2**63 - 1``).
        custom_metadata_map: the model's ``metadata_props`` as a dict.
        producer_version, ir_version, opsets: also available here (not in
            onnxruntime's class); ``opsets`` maps each imported domain to its
            opset version.
    """

    __slots__ = ("producer_name", "producer_version", "graph_name", "graph_description", "domain",
                 "description", "version", "ir_version", "custom_metadata_map", "opsets")

    def __init__(self, meta: Mapping[str, Any], opsets: Mapping[str, int]) -> None:
        self.producer_name: str = meta.get("producer_name", "")
        self.producer_version: str = meta.get("producer_version", "")
        self.graph_name: str = meta.get("graph_name", "")
        self.graph_description: str = meta.get("graph_description", "")
        self.domain: str = meta.get("domain", "")
        self.description: str = meta.get("description", "")
        self.version: int = int(meta.get("version", 0))
        self.ir_version: int = int(meta.get("ir_version", 0))
        self.custom_metadata_map: Dict[str, str] = dict(meta.get("custom_metadata_map") or {})
        self.opsets: Dict[str, int] = dict(opsets)

    def __repr__(self) -> str:
        keys = list(self.custom_metadata_map)
        return summary("ModelMetadata", producer_name=repr(self.producer_name), graph_name=repr(self.graph_name),
                       domain=repr(self.domain) if self.domain else None, version=self.version,
                       custom_metadata_map=f"<{len(keys)} keys>" if keys else None)
