"""com.microsoft GroupQueryAttention on the tensor path: our InferenceSession vs onnxruntime.

Each case is a one-node model run in both runtimes on the same feeds, as onnxruntime-genai drives
it: a past/present buffer of ``max_length`` positions (present is as long as past), ``seqlens_k``
= total length - 1 per sequence, ``total_sequence_length`` the batch maximum. We compare ``output``
over every valid row (right-padded prompt rows are unspecified) and both presents entirely (the
past's rows before the new tokens, the new tokens, zeros after them).

The grid covers the prompt (first run: ``sequence_length == total_sequence_length``, with and
without a past buffer, right-padded batches), the token phase (one new token, batches with
different ``seqlens_k``, a full buffer), a multi-token step after a past, rotary on/off
(interleaved or not, partial rotary, position_ids), a local window smaller than the context,
softcap, smooth softmax, head_sink, attention_bias, scale, packed QKV, GQA ratios 1/2/4/8 and MQA,
float32 and float16, NaN/Inf in the inputs, one and two threads. Tolerances: float32 rtol 1e-4 /
atol 1e-5 (summation order of the dot products and the softmax), float16 5e-3 / 5e-3 (one float16
rounding of values that are computed in float32 in both runtimes).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import _ort_compare as oc

TOL = {"float32": (1e-4, 1e-5), "float16": (5e-3, 5e-3)}


@dataclass(frozen=True)
class G:
    """One GroupQueryAttention call."""

    batch: int = 1
    seq: int = 1                 # new tokens S
    heads: int = 8
    kv_heads: int = 2
    head: int = 32
    max_len: int = 32            # past/present buffer length (0: no past inputs)
    lens: Tuple[int, ...] = (9,)  # T_b = seqlens_k[b] + 1
    total: Optional[int] = None  # total_sequence_length (default max(lens), or S for a prompt)
    prompt: bool = False
    dtype: str = "float32"
    packed: bool = False
    rotary: int = 0              # 0 off, 1 half split, 2 interleaved
    rotary_dim: Optional[int] = None
    position_ids: bool = False
    window: int = -1
    softcap: float = 0.0
    smooth: bool = False
    sink: bool = False
    bias: bool = False
    scale: Optional[float] = None
    window_cache: bool = False   # sliding_window_cache=1: buffers of max_len >= window positions
    special: str = ""            # "nan" / "inf": poison one query / key element
    threads: int = 1
    attrs: Dict[str, int] = field(default_factory=dict)

    def tot(self) -> int:
        if self.total is not None:
            return self.total
        return self.seq if self.prompt else max(self.lens)


def build(c: G, seed: int = 0) -> Tuple[onnx.ModelProto, Dict[str, np.ndarray], List[int]]:
    """The model, its feeds and the number of valid output rows per sequence."""
    rng = np.random.default_rng(seed)
    dt = np.float16 if c.dtype == "float16" else np.float32
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    B, S, D = c.batch, c.seq, c.head
    tot = c.tot()
    feeds: Dict[str, np.ndarray] = {}
    names = []
    if c.packed:
        feeds["q"] = rng.standard_normal((B, S, (c.heads + 2 * c.kv_heads) * D)).astype(dt)
        names += ["q", "", ""]
    else:
        feeds["q"] = rng.standard_normal((B, S, c.heads * D)).astype(dt)
        feeds["k"] = rng.standard_normal((B, S, c.kv_heads * D)).astype(dt)
        feeds["v"] = rng.standard_normal((B, S, c.kv_heads * D)).astype(dt)
        names += ["q", "k", "v"]
    if c.max_len:
        feeds["past_k"] = rng.standard_normal((B, c.kv_heads, c.max_len, D)).astype(dt)
        feeds["past_v"] = rng.standard_normal((B, c.kv_heads, c.max_len, D)).astype(dt)
        names += ["past_k", "past_v"]
    else:
        names += ["", ""]
    feeds["seqlens_k"] = np.array([t - 1 for t in c.lens], np.int32)
    feeds["total"] = np.array(tot, np.int32)
    names += ["seqlens_k", "total"]
    optional: List[str] = []
    if c.rotary:
        half = (c.rotary_dim or D) // 2
        ang = rng.uniform(0, 2 * np.pi, (max(c.max_len, tot) + 32, half))
        feeds["cos"], feeds["sin"] = np.cos(ang).astype(dt), np.sin(ang).astype(dt)
        optional += ["cos", "sin"]
    else:
        optional += ["", ""]
    if c.position_ids:
        first = [0 if c.prompt else t - S for t in c.lens]
        feeds["pos"] = np.array([[f + s for s in range(S)] for f in first], np.int64)
        optional.append("pos")
    else:
        optional.append("")
    if c.bias:
        feeds["bias"] = rng.standard_normal((B, 1, S, tot)).astype(dt)
        optional.append("bias")
    else:
        optional.append("")
    if c.sink:
        feeds["sink"] = rng.standard_normal((c.heads,)).astype(dt)
        optional.append("sink")
    else:
        optional.append("")
    while optional and optional[-1] == "":
        optional.pop()
    names += optional
    if c.special:
        bad = np.nan if c.special == "nan" else np.inf
        # the last token: onnxruntime turns a one-key softmax row into 1 even for a NaN score
        feeds["q"][0, -1, 3] = bad
        if "k" in feeds:
            feeds["k"][-1, -1, 5] = bad
    attrs = dict(num_heads=c.heads, kv_num_heads=c.kv_heads, local_window_size=c.window,
                 do_rotary=int(c.rotary > 0), rotary_interleaved=int(c.rotary == 2), softcap=c.softcap,
                 smooth_softmax=int(c.smooth), **c.attrs)
    if c.window_cache:
        attrs["sliding_window_cache"] = 1
    if c.scale is not None:
        attrs["scale"] = c.scale
    node = helper.make_node("GroupQueryAttention", names, ["y", "present_k", "present_v"], domain="com.microsoft", **attrs)
    dims = {"q": ["batch", "seq", None], "k": ["batch", "seq", None], "v": ["batch", "seq", None],
            "past_k": ["batch", None, "past", None], "past_v": ["batch", None, "past", None],
            "seqlens_k": ["batch"], "pos": ["batch", "seq"], "bias": ["batch", 1, "seq", "total"]}
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32 if n in ("seqlens_k", "total") else
                                            TensorProto.INT64 if n == "pos" else elem,
                                            [d if d is not None else s for d, s in zip(dims[n], feeds[n].shape)]
                                            if n in dims else list(feeds[n].shape))
              for n in names if n]
    outputs = [helper.make_tensor_value_info(n, elem, None) for n in ("y", "present_k", "present_v")]
    model = helper.make_model(helper.make_graph([node], "gqa", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    valid = [min(S, t) if c.prompt else S for t in c.lens]
    return model, feeds, valid


def resident(t: int, capacity: int, window: int) -> int:
    """Positions a window cache keeps after t tokens (onnxruntime's L(T))."""
    g = capacity - window + 1
    return t if t <= capacity else t - g * -(-(t - capacity) // g)


def compare(c: G, seed: int = 0) -> None:
    model, feeds, valid = build(c, seed)
    want = oc.ort(model, c.threads).run(None, feeds)
    got = oc.ours(model, threads=c.threads).run(None, feeds)
    rtol, atol = TOL[c.dtype]
    for b, n in enumerate(valid):
        oc.assert_close(f"output[{b}, :{n}]", got[0][b, :n], want[0][b, :n], rtol, atol)
    assert got[0].shape == want[0].shape and got[0].dtype == want[0].dtype
    if c.window_cache:  # rows past the resident positions are unspecified
        for b, t in enumerate(c.lens):
            keep = resident(t, c.max_len, c.window)
            oc.assert_close(f"present_key[{b}]", got[1][b, :, :keep], want[1][b, :, :keep], rtol, atol)
            oc.assert_close(f"present_value[{b}]", got[2][b, :, :keep], want[2][b, :, :keep], 0, 0)
        assert got[1].shape == want[1].shape
        return
    oc.assert_close("present_key", got[1], want[1], rtol, atol)
    oc.assert_close("present_value", got[2], want[2], 0, 0)  # V rows are copied, never computed


B2 = dict(batch=2, lens=(7, 19))
CASES: Dict[str, G] = {
    # prompt phase
    "prompt-empty-past": G(seq=6, prompt=True, max_len=0, lens=(6,)),
    "prompt-buffer": G(seq=6, prompt=True, max_len=16, lens=(6,)),
    "prompt-padded-batch": G(batch=3, seq=7, prompt=True, max_len=12, lens=(7, 3, 5)),
    "prompt-rotary": G(seq=9, prompt=True, max_len=16, lens=(9,), rotary=1),
    "prompt-rotary-interleaved-padded": G(batch=2, seq=5, prompt=True, max_len=8, lens=(5, 2), rotary=2),
    "prompt-rotary-position-ids": G(seq=5, prompt=True, max_len=8, lens=(5,), rotary=1, position_ids=True),
    "prompt-window": G(seq=12, prompt=True, max_len=16, lens=(12,), window=4),
    "prompt-softcap-smooth": G(seq=5, prompt=True, max_len=8, lens=(5,), softcap=3.0, smooth=True),
    "prompt-packed-rotary": G(seq=4, prompt=True, max_len=8, lens=(4,), packed=True, rotary=1),
    "prompt-long-two-threads": G(batch=2, seq=70, prompt=True, max_len=80, lens=(70, 41), threads=2, rotary=1),
    # token phase
    "decode": G(**B2),
    "decode-full-buffer": G(batch=2, lens=(32, 5)),
    "decode-first-token": G(batch=2, lens=(1, 1), max_len=4),
    "decode-rotary": G(**B2, rotary=1),
    "decode-rotary-interleaved": G(**B2, rotary=2),
    "decode-partial-rotary": G(**B2, rotary=1, rotary_dim=16),
    "decode-rotary-position-ids": G(**B2, rotary=1, position_ids=True),
    "decode-window-smaller-than-context": G(**B2, window=5),
    "decode-window-larger-than-context": G(**B2, window=25),
    "decode-softcap": G(**B2, softcap=2.5),
    "decode-smooth-softmax": G(**B2, smooth=True),
    "decode-head-sink": G(**B2, sink=True),
    # both: onnxruntime's smooth softmax takes the head's sink as its extra logit
    "decode-head-sink-and-smooth": G(**B2, sink=True, smooth=True),
    "prompt-head-sink-and-smooth": G(seq=5, prompt=True, max_len=8, lens=(5,), sink=True, smooth=True),
    "decode-attention-bias": G(**B2, bias=True),
    "decode-scale": G(**B2, scale=0.3),
    "decode-packed": G(**B2, packed=True),
    "decode-packed-rotary-window": G(**B2, packed=True, rotary=2, window=6),
    "decode-head128-long": G(batch=2, heads=8, kv_heads=2, head=128, max_len=600, lens=(600, 333), rotary=1),
    "decode-two-threads": G(batch=3, lens=(9, 31, 2), threads=2, window=7),
    "decode-growing-cache": G(batch=2, lens=(13, 6), max_len=12, total=13),
    "decode-total-above-lengths": G(batch=2, lens=(7, 9), total=30),
    # several new tokens after a past (speculative verification, chunked prompts)
    "multi-token-step": G(seq=4, lens=(13,)),
    "decode-negative-softcap": G(**B2, softcap=-2.0),  # onnxruntime applies a softcap only when > 0
    "multi-token-step-rotary-window": G(seq=3, lens=(20,), rotary=1, window=6),
    "multi-token-step-long": G(seq=24, lens=(30,), max_len=32, rotary=2),
    "multi-token-step-smooth-bias": G(seq=3, lens=(10,), smooth=True, bias=True),
    # window-sized buffers (sliding_window_cache=1, as the genai builder emits for Gemma 2 local layers)
    "window-cache-prompt": G(seq=5, prompt=True, max_len=6, lens=(5,), window=4, window_cache=True),
    "window-cache-prompt-longer-than-buffer": G(seq=13, prompt=True, max_len=6, lens=(13,), window=4, window_cache=True, rotary=1),
    "window-cache-prompt-batch": G(batch=2, seq=9, prompt=True, max_len=8, lens=(9, 9), window=5, window_cache=True),
    "window-cache-decode-evicting": G(batch=3, lens=(7, 12, 3), max_len=6, window=4, window_cache=True, rotary=1, total=12),
    "window-cache-decode-window-equals-buffer": G(batch=2, lens=(30, 9), max_len=8, window=8, window_cache=True),
    "window-cache-softcap-bias": G(batch=2, lens=(17, 10), max_len=10, window=6, window_cache=True, softcap=20.0, bias=True),
    "window-cache-multi-token-step": G(seq=3, lens=(15,), max_len=7, window=4, window_cache=True, rotary=2),
    "window-cache-smooth": G(batch=2, lens=(11, 4), max_len=6, window=3, window_cache=True, smooth=True),
    # special values
    "decode-nan": G(**B2, special="nan"),
    "decode-inf": G(**B2, special="inf"),
    "prompt-nan": G(seq=4, prompt=True, max_len=8, lens=(4,), special="nan"),
}
for _kvh in (8, 4, 2, 1):  # GQA ratios 1, 2, 4, 8 (8/1 is MQA)
    CASES[f"ratio-{8 // _kvh}-decode"] = G(**B2, kv_heads=_kvh, rotary=1)
    CASES[f"ratio-{8 // _kvh}-prompt"] = G(seq=5, prompt=True, max_len=8, lens=(5,), kv_heads=_kvh)
CASES["ratio-16-mqa-decode"] = G(**B2, heads=16, kv_heads=1)
for _name in ("prompt-buffer", "prompt-padded-batch", "prompt-rotary", "decode", "decode-rotary-interleaved",
              "decode-window-smaller-than-context", "decode-softcap", "decode-smooth-softmax", "decode-packed",
              "multi-token-step", "decode-head128-long", "ratio-4-decode", "window-cache-decode-evicting"):
    CASES[f"{_name}-float16"] = replace(CASES[_name], dtype="float16")


@pytest.mark.parametrize("name", sorted(CASES))
def test_group_query_attention_matches_onnxruntime(name: str) -> None:
    compare(CASES[name])


@pytest.mark.parametrize("window_cache", [False, True], ids=["max-length-buffer", "window-cache"])
def test_decode_loop_feeds_present_back_as_past(window_cache: bool) -> None:
    """Twelve steps as onnxruntime-genai runs them: a prompt into the buffer, then one token a step,
    each step's present fed back as the next past; both runtimes keep their own buffers. With a
    window cache (Gemma 2's local layers) the 6-position buffers evict as the context passes them."""
    extra = dict(max_len=6, window=4, window_cache=True) if window_cache else dict(max_len=20)
    c = G(batch=2, seq=5, prompt=True, lens=(5, 5) if window_cache else (5, 3), rotary=1, **extra)
    model, feeds, _ = build(c)
    ours, ref = oc.ours(model), oc.ort(model)
    mine, theirs = dict(feeds), dict(feeds)
    rng = np.random.default_rng(1)
    lens = np.array(c.lens)
    for step in range(12):
        got, want = ours.run(None, mine), ref.run(None, theirs)
        for b in range(2):
            n = min(5, lens[b]) if step == 0 else 1
            oc.assert_close(f"step {step} output[{b}]", got[0][b, :n], want[0][b, :n], *TOL["float32"])
        for i in (1, 2):
            for b in range(2):
                keep = resident(lens[b], c.max_len, c.window) if window_cache else lens[b]
                oc.assert_close(f"step {step} present {i}[{b}]", got[i][b, :, :keep], want[i][b, :, :keep], *TOL["float32"])
        lens = lens + 1
        tok = {"q": rng.standard_normal((2, 1, 8 * 32)).astype(np.float32),
               "k": rng.standard_normal((2, 1, 2 * 32)).astype(np.float32),
               "v": rng.standard_normal((2, 1, 2 * 32)).astype(np.float32),
               "seqlens_k": (lens - 1).astype(np.int32), "total": np.array(lens.max(), np.int32)}
        for fd, out in ((mine, got), (theirs, want)):
            fd.update(tok)
            fd["past_k"], fd["past_v"] = out[1], out[2]


BAD = {
    "seqlens-above-total": (G(**B2, total=10), ValueError),
    "seqlens-negative": (G(batch=2, lens=(0, 5)), ValueError),
    "seqlens-needs-more-past": (G(batch=1, lens=(20,), max_len=8, total=9), ValueError),
    "total-beyond-buffer": (G(batch=1, lens=(20,), max_len=8, total=20), ValueError),
    "multi-token-batch": (G(batch=2, seq=2, lens=(5, 6)), ValueError),
    "rotary-position-outside-cache": (G(seq=1, lens=(9,), rotary=1, position_ids=True), None),
}


def _bad_model(name: str) -> Tuple[onnx.ModelProto, Dict[str, np.ndarray]]:
    c, _ = BAD[name]
    model, feeds, _ = build(c)
    if name == "rotary-position-outside-cache":
        feeds["pos"] = np.array([[10_000]], np.int64)
    return model, feeds


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_feeds_raise_value_error(name: str) -> None:
    model, feeds = _bad_model(name)
    with pytest.raises(ValueError):
        oc.ours(model).run(None, feeds)


def test_window_cache_needs_a_window() -> None:
    model, _, _ = build(G(**B2, attrs={"sliding_window_cache": 1}))
    with pytest.raises(ValueError, match="local_window_size"):
        oc.ours(model)


def test_wrong_ranks_and_types_raise() -> None:
    model, feeds, _ = build(G(**B2))
    sess = oc.ours(model)
    bad = dict(feeds, q=feeds["q"][0])  # 2D query
    with pytest.raises(ValueError):
        sess.run(None, bad)
    with pytest.raises((TypeError, ValueError)):
        sess.run(None, dict(feeds, seqlens_k=feeds["seqlens_k"].astype(np.int64)))
    with pytest.raises(ValueError):
        sess.run(None, dict(feeds, past_k=feeds["past_k"][:, :1]))  # wrong kv heads


@pytest.mark.parametrize("attr,value", [("causal", 0), ("qk_output", 1), ("kv_cache_bit_width", 8)])
def test_unimplemented_attributes_raise_not_implemented(attr: str, value: int) -> None:
    model, _, _ = build(G(**B2, attrs={attr: value}))
    with pytest.raises(NotImplementedError, match="GroupQueryAttention"):
        oc.ours(model)
