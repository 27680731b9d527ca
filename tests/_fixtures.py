"""The committed fixture models (tests/fixtures/, made by scripts/make_fixtures.py) and a generic driver.

Import from test files as ``import _fixtures as fx`` (pytest puts ``tests/`` on sys.path).

* :func:`manifest` / :func:`names` / :func:`entry` / :func:`entries`: the manifest and its fixtures.
* :func:`model_bytes`: a fixture's decompressed model, checked against the manifest's sha256;
  :func:`model_path`: the same written once per test session to a temporary folder (removed at exit).
* :func:`atol`: the fixture's tolerance vs onnxruntime (by its float type).
* :func:`reference_model_path`: the model onnxruntime runs as the reference (the fixture, with
  com.microsoft ``MatMulNBits`` set to ``accuracy_level`` 0: see there).
* :func:`missing_ops`: the fixture's ops (with the model's opset of their domain) that
  ``supported_ops()`` does not list.
* :class:`Decoder`: greedy generation on the tensor path with any session object that has
  onnxruntime's ``get_inputs()`` / ``run()``. Feeds are built from the session's input names and
  the manifest's ``drive`` section alone (no per-fixture code): token ids, ``attention_mask``,
  ``position_ids``, ``cache_position``, ``seqlens_k``, ``total_sequence_length``, and the past
  inputs, which start empty (``[batch, kv_heads, 0, head_dim]``) or, for exports made for a shared
  past/present buffer (onnxruntime-genai), as zeros of ``max_length`` positions (of the window,
  for the layers the genai config lists under ``sliding_window``), the presents being fed back as
  the next step's pasts either way.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import lzma
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

FIXTURE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


@functools.lru_cache(maxsize=1)
def manifest() -> Dict[str, Any]:
    """tests/fixtures/manifest.json."""
    with open(os.path.join(FIXTURE_DIR, "manifest.json")) as f:
        return json.load(f)


def names() -> List[str]:
    """Every fixture's name (``<architecture>-<exporter>``), sorted."""
    return sorted(manifest()["fixtures"])


def entry(name: str) -> Dict[str, Any]:
    """The manifest entry of one fixture."""
    return manifest()["fixtures"][name]


def entries() -> List[Dict[str, Any]]:
    """Every fixture's manifest entry with its ``name`` added, in name order."""
    return [dict(entry(n), name=n) for n in names()]


def model_bytes(name: str) -> bytes:
    """The fixture's decompressed ONNX model, checked against the manifest's sha256."""
    e = entry(name)
    with open(os.path.join(FIXTURE_DIR, e["file"]), "rb") as f:
        data = lzma.decompress(f.read())
    digest = hashlib.sha256(data).hexdigest()
    if digest != e["sha256"]:
        raise ValueError(f"fixture {name}: sha256 {digest} does not match the manifest's {e['sha256']}")
    return data


@functools.lru_cache(maxsize=1)
def _tmpdir() -> str:
    d = tempfile.mkdtemp(prefix="olkv-fixtures-")
    atexit.register(shutil.rmtree, d, True)
    return d


@functools.lru_cache(maxsize=None)
def model_path(name: str) -> str:
    """Path of the fixture's decompressed .onnx file (decompressed once per session)."""
    path = os.path.join(_tmpdir(), entry(name)["file"][: -len(".xz")])
    with open(path, "wb") as f:
        f.write(model_bytes(name))
    return path


# absolute tolerance of logits and presents vs onnxruntime, by the model's float type (see
# test_fixture_models.py for the observed differences)
ATOL = {"float32": 1e-4, "float16": 2e-2}


def atol(name: str) -> float:
    """The fixture's tolerance vs onnxruntime: ``ATOL`` of its logits' dtype."""
    return ATOL[next(o["dtype"] for o in entry(name)["outputs"] if o["name"] == "logits")]


def _exact_matmulnbits(data: bytes) -> Optional[bytes]:
    """``data`` with every com.microsoft MatMulNBits node's accuracy_level set to 0, or None when
    none has another level."""
    import onnx

    m = onnx.load_from_string(data)
    changed = False
    for node in m.graph.node:
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            for a in node.attribute:
                if a.name == "accuracy_level" and a.i != 0:
                    a.i, changed = 0, True
    return m.SerializeToString() if changed else None


@functools.lru_cache(maxsize=None)
def reference_model_path(name: str) -> str:
    """Path of the model onnxruntime runs as the reference for fixture ``name``: ``model_path(name)``,
    except that com.microsoft ``MatMulNBits`` nodes (the ``genai-int4`` exports) get
    ``accuracy_level`` 0. The onnxruntime-genai builder sets 4 for CPU int4 models, with which
    onnxruntime's CPU kernel quantizes the activations A to int8 per block before the product; at 0 it
    computes the float product, as onnx-light-kv does at every level. Against the builder's level 4,
    the genai-int4 fixtures' logits differ from ours by up to 0.06 (llama, batch 1) and the greedy
    tokens of qwen3 (batch 1) and llama (padded batch) change after a few steps, onnxruntime's own
    level-4 tokens differing from its level-0 ones; against level 0 they are within 3e-6, tokens equal
    (so the float32 ``ATOL`` applies unchanged)."""
    data = _exact_matmulnbits(model_bytes(name))
    if data is None:
        return model_path(name)
    path = os.path.join(_tmpdir(), entry(name)["file"][: -len(".onnx.xz")] + "-accuracy0.onnx")
    with open(path, "wb") as f:
        f.write(data)
    return path


_SUPPORTED = re.compile(r"^(.*?)/(\S+) \[(\d+), (\d+)\]$")


def missing_ops(name: str, supported: Sequence[str]) -> List[str]:
    """The fixture's ops (``domain/op``) that no entry of ``supported`` (``"domain/op [since, until]"``,
    until 0 = open) covers at the model's opset for that domain."""
    ranges: Dict[str, List[Tuple[int, int]]] = {}
    for s in supported:
        m = _SUPPORTED.match(s)
        if m is None:
            raise ValueError(f"unparsable supported_ops() entry {s!r}")
        ranges.setdefault(f"{m.group(1)}/{m.group(2)}", []).append((int(m.group(3)), int(m.group(4))))
    e = entry(name)
    opsets = {("" if d == "ai.onnx" else d): v for d, v in e["opset_imports"].items()}
    out = []
    for op in e["ops"]:
        v = opsets.get(op.split("/")[0], 1)
        if not any(lo <= v and (hi == 0 or v <= hi) for lo, hi in ranges.get(op, [])):
            out.append(op)
    return out


_NP = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
       "tensor(float16)": np.float16, "tensor(bool)": np.bool_}


def _np_dtype(type_str: str) -> Any:
    if type_str not in _NP:
        raise TypeError(f"no feed rule for element type {type_str}")
    return _NP[type_str]


@dataclass
class Step:
    """One run: the feeds' token ids, every output by name, the past length before it, and per
    batch row the index (along the run's tokens) of its last real token (-1: the last one)."""

    past_len: int
    tokens: np.ndarray
    outputs: Dict[str, np.ndarray] = field(default_factory=dict)
    last: Optional[np.ndarray] = None

    def next_tokens(self) -> np.ndarray:
        """The greedy choice of each row: argmax of the logits at its last real token ([batch])."""
        logits = self.outputs["logits"]
        last = np.full(logits.shape[0], -1) if self.last is None else self.last
        return np.argmax(logits[np.arange(logits.shape[0]), last], axis=-1).astype(np.int64)


class Decoder:
    """Greedy generation of one fixture with one session, step by step.

    ``fixture`` is a fixture's name or its manifest entry; ``session`` is any object with
    onnxruntime's ``get_inputs()`` / ``get_outputs()`` (NodeArg ``.name``/``.type``) and
    ``run(None, feeds)``.
    """

    def __init__(self, fixture: Union[str, Mapping[str, Any]], session: Any) -> None:
        e = entry(fixture) if isinstance(fixture, str) else fixture
        self.session = session
        self.drive = e["drive"]
        self.pairs = [(p["past"], p["present"]) for p in e["past_present"]]
        self.inputs = [(i.name, i.type) for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        self.past_dtype = {i["name"]: i["dtype"] for i in e["inputs"]}
        self.state: Dict[str, np.ndarray] = {}
        self.mask = np.zeros((0, 0), dtype=np.int64)
        self.past_len = 0

    def start(self, batch: int) -> None:
        """Empty pasts (or zeroed shared buffers of their capacity)."""
        d = self.drive
        self.past_len = 0
        self.mask = np.zeros((batch, 0), dtype=np.int64)
        self.state = {p: np.zeros((batch, d["kv_heads"], self.capacity(p), d["head_dim"]),
                                  dtype=np.dtype(self.past_dtype[p])) for p, _ in self.pairs}

    def capacity(self, past: str) -> int:
        """Positions of a past buffer: 0 (it grows), or for shared buffers ``max_length`` (the
        window for a windowed layer: GroupQueryAttention with ``sliding_window_cache=1``)."""
        d = self.drive
        return int(d.get("past_capacity", {}).get(past, d["max_length"])) if d.get("shared_buffer") else 0

    def feeds(self, tokens: np.ndarray, mask: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
        """The run's feeds for ``tokens`` ([batch, seq]) after ``past_len`` positions, ``mask`` being
        the attention mask over all of them ([batch, past_len + seq], 0 = padding; default: no
        padding). Position ids count the unmasked positions before each one (padding gets 1, as
        transformers does)."""
        b, s = tokens.shape
        total = self.past_len + s
        if mask is None:
            mask = np.ones((b, total), dtype=np.int64)
        if self.drive.get("shared_buffer") and total > self.drive["max_length"]:
            raise ValueError(f"{total} positions exceed the shared buffer's max_length {self.drive['max_length']}")
        pos = np.arange(self.past_len, total, dtype=np.int64)
        ids = np.where(mask == 0, 1, np.cumsum(mask, axis=1) - 1)[:, self.past_len:]
        out: Dict[str, np.ndarray] = {}
        for name, typ in self.inputs:
            dt = _np_dtype(typ)
            if name in self.state:
                out[name] = self.state[name]
            elif name == self.drive["token_input"]:
                out[name] = tokens.astype(dt)
            elif name == "attention_mask":
                out[name] = mask.astype(dt)
            elif name == "position_ids":
                out[name] = ids.astype(dt)
            elif name == "cache_position":
                out[name] = pos.astype(dt)
            elif name == "seqlens_k":
                out[name] = (mask.sum(axis=1) - 1).astype(dt)
            elif name == "total_sequence_length":
                out[name] = np.array(total, dtype=dt)
            else:
                raise ValueError(f"no feed rule for input {name!r} ({typ})")
        return out

    def run(self, tokens: np.ndarray, new_mask: Optional[np.ndarray] = None) -> Step:
        """One step: run, feed the presents back as pasts, advance the past length.
        ``new_mask`` ([batch, seq]) marks padding among ``tokens`` (default: none), on the left
        (exports fed attention_mask + position_ids) or on the right (GroupQueryAttention's
        shared buffer: seqlens_k counts the real tokens)."""
        if new_mask is None:
            new_mask = np.ones(tokens.shape, dtype=np.int64)
        mask = np.concatenate([self.mask, new_mask.astype(np.int64)], axis=1)
        res = self.session.run(None, self.feeds(tokens, mask))
        last = tokens.shape[1] - 1 - np.argmax(new_mask[:, ::-1] != 0, axis=1)
        step = Step(self.past_len, tokens, dict(zip(self.output_names, res)), last)
        for past, present in self.pairs:
            self.state[past] = step.outputs[present]
        self.past_len += tokens.shape[1]
        self.mask = mask
        return step

    def generate(self, prompt: np.ndarray, steps: int, prompt_mask: Optional[np.ndarray] = None) -> List[Step]:
        """Prefill ``prompt`` ([batch, seq], ``prompt_mask`` 0 at padding) then ``steps`` greedy
        steps (argmax of the logits at each row's last real token)."""
        self.start(prompt.shape[0])
        out = [self.run(prompt, prompt_mask)]
        for _ in range(steps):
            out.append(self.run(out[-1].next_tokens()[:, None]))
        return out

    def written(self, past: str, present: np.ndarray) -> List[np.ndarray]:
        """Per batch row, the positions of ``past``'s present that hold a real token's K/V
        ([kv_heads, n, head_dim]). Growing pasts: the unpadded ones. Shared buffers: rows
        ``[0, min(T, capacity))``, T the row's real tokens (GroupQueryAttention stores them from
        row 0; a windowed buffer whose capacity is the window keeps the most recent ones there;
        the rest of a buffer is never written)."""
        if self.drive.get("shared_buffer"):
            cap = self.capacity(past)
            return [present[b][:, :min(int(self.mask[b].sum()), cap)] for b in range(present.shape[0])]
        return [present[b][:, np.flatnonzero(self.mask[b])] for b in range(present.shape[0])]


def greedy_tokens(steps: Sequence[Step]) -> np.ndarray:
    """The tokens chosen after each run ([batch, len(steps)])."""
    return np.stack([s.next_tokens() for s in steps], axis=1)

