"""What a decoder model takes and returns, discovered from its inputs and outputs.

:class:`DecoderIO` is built once per session from ``get_inputs()`` / ``get_outputs()`` (our
:class:`~onnx_light_kv.InferenceSession` and ``onnxruntime.InferenceSession`` both have them).
Recognized inputs (anything else raises ``ValueError`` naming it):

* ``input_ids`` int64 ``[batch, seq]`` (required);
* ``attention_mask`` int ``[batch, past + seq]``: 1 for tokens, 0 for (left) padding;
* ``position_ids`` int64 ``[batch, seq]``: counted over the attention mask, as transformers does;
* ``cache_position`` int64 ``[seq]``: ``past .. past + seq - 1``;
* ``use_cache_branch`` bool ``[1]`` (optimum's merged decoders): true once there is a past;
* past inputs per layer, named ``past_key_values.N.key/value`` (torch.onnx, optimum,
  onnxruntime-genai), ``past.N.key/value``, ``past_key_N`` / ``past_value_N`` or
  ``past_key_values_N_key/value``, ``[batch, kv_heads, past, head_dim]``.

Recognized outputs: ``logits`` ``[batch, seq, vocab]`` (or the only output that is not a
present) and one present per past, named ``present.N.key/value``, ``present_key_values.N.key/
value``, ``present_key_N`` / ``present_value_N`` or ``present_N_key/value``.

A past whose ``head_dim`` is symbolic (the onnxruntime-genai builder names it ``kv_cache_dim``)
takes its size from the model's files when the session was created from a path (ours and
onnxruntime's keep it): ``head_size`` of a ``genai_config.json`` beside the model, else the
model's GroupQueryAttention geometry (its ``kv_num_heads`` and the key projection's width
from ONNX shape inference). Otherwise it raises ``ValueError``.

A past read by a GroupQueryAttention node with ``sliding_window_cache=1`` (the onnxruntime-genai
Gemma 2 export's local layers; the nodes are read from the model file together with the symbolic
``head_dim`` above) is a window-sized shared buffer: :attr:`KVInput.window` is the
node's ``local_window_size``, the buffer's size whatever the generation's length (onnxruntime
keeps the most recent positions in it and evicts the oldest), as onnxruntime-genai allocates it;
the other layers' pasts of such a model are shared buffers of the generation's capacity.

:attr:`DecoderIO.max_positions` is the number of positions the model can address when its graph
fixes one (read from the model file, when the session was created from a path): the rows of a
constant table that ``position_ids`` index through shape-only ops (a learned position embedding,
as GPT-2's; a precomputed sin/cos table, as GPT-J's dynamo export), of the ``cos_cache`` of a
com.microsoft ``RotaryEmbedding`` fed ``position_ids`` or of a ``GroupQueryAttention`` with
``do_rotary=1`` (onnxruntime-genai exports). Generation refuses up front to go beyond it (the run
would fail at that position). Model files over 256 MiB (single-file models with their weights
inline) are not read for it. Rotary embeddings computed in the graph have no such limit (None);
tables reached otherwise (positions computed from the attention mask with an offset, as OPT's)
are not found, and such a model fails only at the position it cannot run.

A past whose sequence dimension has the same symbolic name (or the same fixed size) as its
present's is a pre-allocated buffer shared between steps (onnxruntime's GroupQueryAttention
exports): the runner allocates it with the generation's capacity once and the attention mask
says how much of it is valid.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._dtypes import bfloat16

__all__ = ["DecoderIO", "KVInput"]

Dim = Union[int, str, None]

_PAST = [re.compile(p) for p in (
    r"^past_key_values\.(\d+)\.(key|value)$",
    r"^past\.(\d+)\.(key|value)$",
    r"^past_key_values_(\d+)_(key|value)$",
    r"^past_(key|value)_(\d+)$",
    r"^past_(key|value)s?\.(\d+)$",
)]
_PRESENT = [re.compile(p) for p in (
    r"^present\.(\d+)\.(key|value)$",
    r"^present_key_values\.(\d+)\.(key|value)$",
    r"^present_(\d+)_(key|value)$",
    r"^present_(key|value)_(\d+)$",
    r"^present_(key|value)s?\.(\d+)$",
)]
_DTYPES = {"tensor(float)": np.dtype(np.float32), "tensor(float16)": np.dtype(np.float16),
           "tensor(bfloat16)": np.dtype(bfloat16), "tensor(double)": np.dtype(np.float64)}
_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
_KNOWN = ("input_ids", "attention_mask", "position_ids", "cache_position", "use_cache_branch")


def _layer_kind(name: str, patterns: Sequence["re.Pattern[str]"]) -> Optional[Tuple[int, str]]:
    for p in patterns:
        m = p.match(name)
        if m:
            a, b = m.groups()
            return (int(a), b) if a.isdigit() else (int(b), a)
    return None


@dataclass(frozen=True)
class KVInput:
    """One past input and the present output that feeds it on the next step.

    ``shape`` is the past's declared shape ``[batch, kv_heads, past, head_dim]`` (ints or
    symbolic names); ``kv_heads`` / ``head_dim`` are its fixed sizes; ``shared_buffer`` is true
    when past and present are one pre-allocated buffer of fixed capacity; ``window`` > 0 is the
    size of a window-sized shared buffer (GroupQueryAttention ``sliding_window_cache=1``: it
    holds the last positions only), 0 for a buffer of the generation's capacity or a growing
    past."""

    layer: int
    kind: str
    past: str
    present: str
    shape: Tuple[Dim, ...]
    kv_heads: int
    head_dim: int
    dtype: np.dtype
    shared_buffer: bool
    window: int = 0


@dataclass(frozen=True)
class DecoderIO:
    """The feeds and fetches of one decoder model (see the module docstring for the names)."""

    input_ids: str
    attention_mask: Optional[str]
    position_ids: Optional[str]
    cache_position: Optional[str]
    use_cache_branch: Optional[str]
    logits: str
    kv: Tuple[KVInput, ...]
    int_types: Dict[str, Any]
    group_query_attention: bool = False
    vocab: Optional[int] = None  # the logits' last dimension where the model fixes it
    max_positions: Optional[int] = None  # positions the graph can address (module docstring)
    #: the graph branches (If) on the attention mask's width: its result for a row depends on
    #: the batch's longest row (the genai LongRoPE export picks its rope factors so), so rows run
    #: together differ from each run alone (False where the session has no model file to read)
    mask_width_branch: bool = False

    def check_positions(self, needed: int, what: str) -> None:
        """Raise ``ValueError`` when a row would need more than :attr:`max_positions`
        positions; ``what`` says where the count comes from (it starts the message)."""
        if self.max_positions is not None and needed > self.max_positions:
            raise ValueError(f"{what} needs {needed} positions; the model addresses at most "
                             f"{self.max_positions} (the rows of its position table)")

    def check_generation(self, prompt_tokens: int, max_new_tokens: int, what: str) -> None:
        """:meth:`check_positions` for a row of ``prompt_tokens`` (padding excluded) followed by
        ``max_new_tokens`` generated ones. The model runs every position but the last generated
        token's, which is chosen from the logits of the position before it: the check counts
        ``prompt_tokens + max_new_tokens - 1`` positions, as :class:`.Generator` runs them."""
        self.check_positions(prompt_tokens + max_new_tokens - 1,
                             f"{what}, which runs all but the last new token,")

    @property
    def left_padding(self) -> bool:
        """True when rows of different lengths can share a run as left padding: the model takes
        an attention mask, its pasts grow with the sequence, and its attention is not
        com.microsoft GroupQueryAttention (which reads the mask as a per-row length, i.e. right
        padding)."""
        return self.attention_mask is not None and not self.shared_buffer and not self.group_query_attention

    @property
    def output_names(self) -> List[str]:
        """The fetch list of every step: logits, then the presents in :attr:`kv` order."""
        return [self.logits] + [kv.present for kv in self.kv]

    @property
    def layers(self) -> int:
        """Number of decoder layers (distinct layer indices among the pasts)."""
        return len({kv.layer for kv in self.kv})

    @property
    def shared_buffer(self) -> bool:
        """True when the pasts are fixed-capacity buffers shared with the presents."""
        return bool(self.kv) and self.kv[0].shared_buffer

    @property
    def window_buffers(self) -> bool:
        """True when some pasts are window-sized shared buffers (:attr:`KVInput.window`)."""
        return any(kv.window for kv in self.kv)

    @property
    def dtype(self) -> np.dtype:
        """The past/present element type."""
        return self.kv[0].dtype

    @classmethod
    def from_session(cls, session: Any) -> "DecoderIO":
        """Describe ``session`` (anything with ``get_inputs()`` and ``get_outputs()``).

        Raises ``ValueError`` naming every input that is not recognized, a past without its
        present, or a K/V dimension that is not fixed."""
        if not (hasattr(session, "get_inputs") and hasattr(session, "get_outputs")):
            raise TypeError(f"session must have get_inputs() and get_outputs(), got {type(session).__name__}")
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = {o.name: o for o in session.get_outputs()}
        if "input_ids" not in inputs:
            raise ValueError(f"the model has no input_ids input (inputs: {sorted(inputs)}); "
                             "generation needs a decoder taking token ids")
        presents: Dict[Tuple[int, str], Any] = {}
        for name, o in outputs.items():
            lk = _layer_kind(name, _PRESENT)
            if lk is not None:
                presents[lk] = o
        kv: List[KVInput] = []
        unknown: List[str] = []
        sizes: Optional[Dict[str, Any]] = None
        for name, i in inputs.items():
            if name in _KNOWN:
                continue
            lk = _layer_kind(name, _PAST)
            if lk is None:
                unknown.append(name)
                continue
            if lk not in presents:
                raise ValueError(f"past input {name!r} has no matching present output "
                                 f"(outputs: {sorted(outputs)})")
            if sizes is None and i.shape is not None and len(i.shape) == 4 and isinstance(i.shape[3], str):
                sizes = _model_sizes(session)
            kv.append(_kv_input(lk, i, presents[lk], sizes or {}))
        if unknown:
            raise ValueError(
                f"the model needs inputs generation does not know how to feed: {unknown}; recognized are "
                f"{list(_KNOWN)} and per-layer pasts named past_key_values.N.key/value (or past.N.key/value, "
                "past_key_N/past_value_N)")
        if not kv:
            raise ValueError("the model has no past key/value inputs (past_key_values.N.key/value): "
                             "generation needs a decoder exported with its KV cache")
        kv.sort(key=lambda k: (k.layer, k.kind != "key"))
        if len({k.shared_buffer for k in kv}) > 1:
            raise ValueError("some pasts are shared fixed-capacity buffers and some are not; "
                             "generation needs one convention for all layers")
        logits = "logits" if "logits" in outputs else None
        if logits is None:
            rest = [n for n in outputs if _layer_kind(n, _PRESENT) is None]
            if len(rest) != 1:
                raise ValueError(f"cannot tell which output is the logits (no output named logits; candidates {rest})")
            logits = rest[0]
        ints = {n: _INT_TYPES.get(inputs[n].type, np.int64) for n in _KNOWN if n in inputs}
        return cls(input_ids="input_ids",
                   attention_mask="attention_mask" if "attention_mask" in inputs else None,
                   position_ids="position_ids" if "position_ids" in inputs else None,
                   cache_position="cache_position" if "cache_position" in inputs else None,
                   use_cache_branch="use_cache_branch" if "use_cache_branch" in inputs else None,
                   logits=logits, kv=tuple(kv), int_types=ints,
                   group_query_attention=_uses_group_query_attention(session, sizes),
                   vocab=_fixed_last_dim(outputs[logits]), max_positions=_max_positions(session),
                   mask_width_branch=_mask_width_branch(session))


#: Model files larger than this are not read for :attr:`DecoderIO.max_positions`: a single-file
#: model keeps its weights inline, and parsing them would hold a second copy of the model in
#: memory for a moment (exports with external data have a small graph file and are read).
POSITION_SCAN_MAX_BYTES = 256 << 20


def _scanned_file(session: Any) -> Optional[Tuple[str, int, int]]:
    """The session's model file as the scans' cache key (absolute path, mtime_ns, size); None
    without a file, or for one larger than :data:`POSITION_SCAN_MAX_BYTES`."""
    path = getattr(session, "_model_path", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    st = os.stat(path)
    if st.st_size > POSITION_SCAN_MAX_BYTES:
        return None
    return os.path.abspath(path), st.st_mtime_ns, st.st_size


def _max_positions(session: Any) -> Optional[int]:
    """:attr:`DecoderIO.max_positions` of the session's model file (None where
    :func:`_scanned_file` gives none)."""
    key = _scanned_file(session)
    return None if key is None else _position_table_rows(*key)


def _mask_width_branch(session: Any) -> bool:
    """:attr:`DecoderIO.mask_width_branch` of the session's model file (False where
    :func:`_scanned_file` gives none)."""
    key = _scanned_file(session)
    return False if key is None else _branches_on_mask_width(*key)


@functools.lru_cache(maxsize=16)
def _branches_on_mask_width(path: str, mtime_ns: int = 0, size: int = 0) -> bool:
    """Whether an If node's condition of the main graph is computed from Shape or Size of the
    ``attention_mask`` input. Cached per (path, mtime_ns, size)."""
    import onnx

    try:
        graph = onnx.load(path, load_external_data=False).graph
    except Exception:  # not readable by onnx: nothing known
        return False
    producer = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        seen, todo = set(), [node.input[0]]
        while todo and len(seen) < 256:
            name = todo.pop()
            n = producer.get(name)
            if name in seen or n is None:
                continue
            seen.add(name)
            if n.op_type in ("Shape", "Size") and n.input and n.input[0] == "attention_mask":
                return True
            todo.extend(n.input)
    return False


# ops that move or re-type position ids without changing their values
_SHAPE_ONLY = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Tile", "Identity"})


@functools.lru_cache(maxsize=16)
def _position_table_rows(path: str, mtime_ns: int = 0, size: int = 0) -> Optional[int]:
    """The fewest rows of a table the model's positions index (see :attr:`DecoderIO.max_positions`;
    None when none is found or the file cannot be read). Cached per (path, mtime_ns, size)."""
    import onnx

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:  # not readable by onnx: no limit known (the session itself loaded it)
        return None
    graph = model.graph
    dims: Dict[str, List[Optional[int]]] = {t.name: list(t.dims) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value":
                    dims[n.output[0]] = list(a.t.dims)
    inferred: List[Optional[Dict[str, List[Optional[int]]]]] = [None]

    def rows(name: str, axis: int = 0) -> Optional[int]:
        d = dims.get(name)
        if d is None:
            if inferred[0] is None:  # shape inference only for a table that is computed
                try:
                    g = onnx.shape_inference.infer_shapes(model).graph
                    inferred[0] = {vi.name: [x.dim_value if x.HasField("dim_value") else None
                                             for x in vi.type.tensor_type.shape.dim] for vi in g.value_info}
                except Exception:
                    inferred[0] = {}
            d = inferred[0].get(name)
        if not d or not -len(d) <= axis < len(d):
            return None
        r = d[axis]
        return int(r) if r else None

    found: List[int] = []
    consumers: Dict[str, List[Tuple[Any, int]]] = {}
    for n in graph.node:
        for i, x in enumerate(n.input):
            consumers.setdefault(x, []).append((n, i))
        if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft" and len(n.input) > 7 and n.input[7]:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            if int(attrs.get("do_rotary", 0)):
                found.append(rows(n.input[7]) or 0)
    frontier = ["position_ids"] if any(i.name == "position_ids" for i in graph.input) else []
    seen = set(frontier)
    while frontier:
        for n, i in consumers.get(frontier.pop(), []):
            if n.op_type in ("Gather", "GatherElements") and n.domain in ("", "ai.onnx") and i == 1:
                axis = next((int(onnx.helper.get_attribute_value(a)) for a in n.attribute if a.name == "axis"), 0)
                found.append(rows(n.input[0], axis) or 0)
            elif n.op_type == "RotaryEmbedding" and n.domain == "com.microsoft" and i == 1 and len(n.input) > 2:
                found.append(rows(n.input[2]) or 0)
            elif n.op_type == "RotaryEmbedding" and n.domain in ("", "ai.onnx") and i == 3:
                # opset 23: (X, cos_cache, sin_cache, position_ids), the caches indexed by position
                found.append(rows(n.input[1]) or 0)
            elif n.op_type in _SHAPE_ONLY and n.domain in ("", "ai.onnx") and i == 0:
                for o in n.output:
                    if o not in seen:
                        seen.add(o)
                        frontier.append(o)
    found = [r for r in found if r > 0]
    return min(found) if found else None


def _fixed_last_dim(arg: Any) -> Optional[int]:
    """The last dimension of an input/output description when it is a fixed positive size."""
    shape = getattr(arg, "shape", None)
    if not shape:
        return None
    d = shape[-1]
    return int(d) if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 else None


def _uses_group_query_attention(session: Any, sizes: Optional[Dict[str, Any]]) -> bool:
    """Whether the model's attention is com.microsoft GroupQueryAttention, as far as the session
    tells: its model file was read (``sizes``), or our session's cache plan names the rule."""
    if sizes and sizes.get("group_query_attention"):
        return True
    plan = getattr(session, "cache_plan", None)
    if callable(plan):
        try:
            return any("group-query-attention" in str(d.get("rule", "")) for d in plan())
        except Exception:  # a session without a plan: nothing to tell
            return False
    return False


def _model_sizes(session: Any) -> Dict[str, Any]:
    """What the model's files fix that its inputs leave symbolic: ``head_dim`` (from
    ``genai_config.json`` beside the model, else from its GroupQueryAttention nodes),
    ``local_window`` (the largest GroupQueryAttention ``local_window_size``; 0 for none) and
    ``window_buffers`` (past input name -> ``local_window_size`` for the pasts of
    GroupQueryAttention nodes with ``sliding_window_cache=1``, 0 for the other nodes' pasts of
    such a model; empty when no node has it). ``{}`` when the session has no model file."""
    path = getattr(session, "_model_path", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return {}
    st = os.stat(path)
    head, window, gqa, buffers = _gqa_geometry(os.path.abspath(path), st.st_mtime_ns, st.st_size)
    sizes: Dict[str, Any] = {"local_window": window, "group_query_attention": int(gqa),
                             "window_buffers": dict(buffers)}
    if head:
        sizes["head_dim"] = head
    config = os.path.join(os.path.dirname(os.path.abspath(path)), "genai_config.json")
    if os.path.isfile(config):
        try:
            with open(config) as f:
                size = json.load(f)["model"]["decoder"]["head_size"]
            if isinstance(size, int) and size > 0:
                sizes["head_dim"] = size
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return sizes


@functools.lru_cache(maxsize=16)
def _gqa_geometry(path: str, mtime_ns: int = 0,
                  size: int = 0) -> Tuple[Optional[int], int, bool, Tuple[Tuple[str, int], ...]]:
    """The K/V head size of the first com.microsoft GroupQueryAttention node of the model at
    ``path`` (weights not loaded: the key input's width over ``kv_num_heads``, or for a packed
    QKV input its width over ``num_heads + 2 * kv_num_heads``; None when not determinable),
    the largest ``local_window_size`` of those nodes (0 when none has a window), whether there
    is such a node, and, when some node has ``sliding_window_cache=1``, ``(past input, window)``
    for the past_key/past_value inputs of every node: all are shared buffers then (as
    onnxruntime-genai feeds them), ``window`` being the node's ``local_window_size`` for a
    window-sized buffer, 0 for one of the generation's capacity. Cached per (path,
    mtime_ns, size): every ``generate`` call describes its session again, and reading and
    inferring the graph costs more than a decode step."""
    import onnx

    try:
        model = onnx.load(path, load_external_data=False)
        nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
        if not nodes:
            return None, 0, False, ()
        attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nodes]
        window = max(max(int(a.get("local_window_size", -1)), 0) for a in attrs)
        windowed = [bool(int(a.get("sliding_window_cache", 0))) and int(a.get("local_window_size", -1)) > 0
                    for a in attrs]
        buffers = tuple((name, int(a["local_window_size"]) if w else 0) for n, a, w in zip(nodes, attrs, windowed)
                        for name in n.input[3:5] if name) if any(windowed) else ()
        heads, kv_heads = int(attrs[0].get("num_heads", 0)), int(attrs[0].get("kv_num_heads", 0))
        if heads <= 0 or kv_heads <= 0:
            return None, window, True, buffers
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a model onnx cannot read or infer: the caller reports the symbolic size
        return None, 0, False, ()
    widths = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[-1].HasField("dim_value"):
            widths[vi.name] = dims[-1].dim_value
    node = nodes[0]
    key = node.input[1] if len(node.input) > 1 else ""
    if key:
        width, parts = widths.get(key), kv_heads
    else:
        width, parts = widths.get(node.input[0]), heads + 2 * kv_heads
    if not width or width % parts:
        return None, window, True, buffers
    return width // parts, window, True, buffers


def _kv_input(lk: Tuple[int, str], past: Any, present: Any, sizes: Dict[str, Any]) -> KVInput:
    shape = tuple(past.shape) if past.shape is not None else ()
    if len(shape) != 4:
        raise ValueError(f"past input {past.name!r} has shape {list(shape) if shape else None}; "
                         "generation needs [batch, kv_heads, past_sequence, head_dim]")
    heads, dim = shape[1], shape[3]
    if isinstance(dim, str) and "head_dim" in sizes:
        dim = sizes["head_dim"]
    if not isinstance(heads, (int, np.integer)) or not isinstance(dim, (int, np.integer)):
        raise ValueError(f"past input {past.name!r} has shape {list(shape)}: kv_heads and head_dim "
                         "must be fixed sizes for generation to build the empty past (a symbolic head_dim "
                         "is read from genai_config.json beside the model or from its GroupQueryAttention "
                         "nodes when the session was created from a file path)")
    if past.type not in _DTYPES:
        raise ValueError(f"past input {past.name!r} has type {past.type}; expected a float tensor")
    pshape = tuple(present.shape) if present.shape is not None else ()
    buffers = sizes.get("window_buffers", {})
    window = int(buffers.get(past.name, 0))
    shared = past.name in buffers or (len(pshape) == 4 and pshape[2] is not None and pshape[2] == shape[2])
    return KVInput(layer=lk[0], kind=lk[1], past=past.name, present=present.name, shape=shape,
                   kv_heads=int(heads), head_dim=int(dim), dtype=_DTYPES[past.type], shared_buffer=shared,
                   window=window)
