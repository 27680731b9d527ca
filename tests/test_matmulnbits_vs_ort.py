"""com.microsoft MatMulNBits: our InferenceSession vs onnxruntime on single-node models.

Each case builds one MatMulNBits node with onnx.helper: random quantized values packed as the
contrib schema says (``B`` [N, k_blocks, block_size * bits / 8], each block's values low bits
first), random per-block scales, optional zero points (uint8, packed the same way per weight row,
or of A's type), optional bias, and runs it in both runtimes. onnxruntime runs at
``accuracy_level`` 0, where its CPU kernel computes the float product of A and the dequantized
weight; the comparison then only has to allow for the summation order (float32: ``1e-5`` of
``|A| @ |W|^T + |bias|`` per element; float16 output: plus one float16 ulp of the value; the largest
difference observed is 1.5% of that bound, while a wrong bit order, block or zero point changes
many weights by whole quantization steps and the outputs by far more). Each case
is also checked against a numpy reference of the dequantization, written here (alone for 8-bit
weights with float zero points, which the schema allows and onnxruntime's CPU kernel refuses).

``accuracy_level`` 4 (what the onnxruntime-genai builder sets for CPU int4 models) makes
onnxruntime quantize A to int8 per block before the product. We compute the exact float product
whatever accuracy_level says, so at level 4 our outputs equal our level-0 outputs bit for bit and
differ from onnxruntime's by its quantization of A (``test_accuracy_level_is_ignored``).

Weights are initializers (dequantized and packed when our session is built) or, in the
"dynamic" cases, graph inputs (dequantized by every run). Malformed nodes raise ValueError,
features not implemented (g_idx, bits 3/5/6/7) NotImplementedError, at session creation.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import _ort_compare as oc

NP_TYPE = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def _pack(vals: np.ndarray, bits: int, nbytes: int) -> np.ndarray:
    """Little-endian bit stream of ``vals`` (each < 2**bits) in ``nbytes`` bytes: value i in bits
    i*bits .. i*bits + bits - 1."""
    out = np.zeros(nbytes, np.uint8)
    for i, v in enumerate(vals.tolist()):
        for b in range(bits):
            if (v >> b) & 1:
                pos = i * bits + b
                out[pos // 8] |= np.uint8(1 << (pos % 8))
    return out


@dataclass
class Case:
    k: int
    n: int
    bits: int = 4
    block: int = 32
    dtype: int = TensorProto.FLOAT
    zp: str = "none"  # "none", "uint8" or "float"
    bias: bool = False
    a_shape: Tuple[int, ...] = (3,)  # leading dimensions of A
    dynamic: bool = False  # B, scales, zero_points as graph inputs
    accuracy_level: int = 0

    @property
    def id(self) -> str:
        t = "f16" if self.dtype == TensorProto.FLOAT16 else "f32"
        return (f"{t}-b{self.bits}-bs{self.block}-k{self.k}-n{self.n}-zp{self.zp}-a{'x'.join(map(str, self.a_shape))}"
                f"{'-bias' if self.bias else ''}{'-dynamic' if self.dynamic else ''}")

    def build(self, seed: int) -> Tuple[bytes, Dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """The model, its feeds, the numpy reference output and its magnitude bound."""
        rng = np.random.default_rng(seed)
        ft = NP_TYPE[self.dtype]
        kb = -(-self.k // self.block)
        blob = self.block * self.bits // 8
        levels = 1 << self.bits
        q = rng.integers(0, levels, (self.n, kb * self.block))  # the padding past K is random too
        b = np.stack([np.stack([_pack(q[r, j * self.block:(j + 1) * self.block], self.bits, blob) for j in range(kb)])
                      for r in range(self.n)])
        scales = (rng.uniform(0.01, 0.06, (self.n, kb)) * rng.choice([-1, 1], (self.n, kb))).astype(ft)
        zpv = np.full((self.n, kb), levels // 2, np.float64)
        zp_t: Optional[np.ndarray] = None
        if self.zp == "uint8":
            z = rng.integers(0, levels, (self.n, kb))
            per = -(-kb * self.bits // 8)
            zp_t = np.concatenate([_pack(z[r], self.bits, per) for r in range(self.n)])  # 1D form [N * per]
            zpv = z.astype(np.float64)
        elif self.zp == "float":
            zp_t = rng.uniform(0, levels - 1, (self.n, kb)).astype(ft)
            zpv = zp_t.astype(np.float64)
        a = rng.standard_normal(self.a_shape + (self.k,)).astype(ft)
        bias = rng.standard_normal(self.n).astype(ft) if self.bias else None

        blocks = np.arange(self.k) // self.block
        w = (q[:, :self.k] - zpv[:, blocks]) * scales.astype(np.float64)[:, blocks]  # [N, K]
        a64 = a.astype(np.float64)
        want = a64 @ w.T + (bias.astype(np.float64) if bias is not None else 0)
        mag = np.abs(a64) @ np.abs(w).T + (np.abs(bias.astype(np.float64)) if bias is not None else 0)

        names = ["A", "B", "scales", "zero_points" if zp_t is not None else "", "", "bias" if bias is not None else ""]
        while names[-1] == "":
            names.pop()
        node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=self.k, N=self.n,
                                bits=self.bits, block_size=self.block, accuracy_level=self.accuracy_level)
        values = {"B": b.astype(np.uint8), "scales": scales.reshape(-1) if self.n % 2 else scales}
        if zp_t is not None:
            values["zero_points"] = zp_t
        consts = dict(values)
        if bias is not None:
            consts["bias"] = bias
        feeds = {"A": a}
        inputs = [helper.make_tensor_value_info("A", self.dtype, list(a.shape))]
        inits = []
        for name, v in consts.items():
            if self.dynamic and name in values:
                feeds[name] = v
                inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
            else:
                inits.append(numpy_helper.from_array(v, name))
        graph = helper.make_graph([node], "mmnb", inputs,
                                  [helper.make_tensor_value_info("Y", self.dtype, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 10
        return model.SerializeToString(), feeds, want, mag


def _tolerance(case: Case, want: np.ndarray, mag: np.ndarray) -> np.ndarray:
    tol = 1e-5 * mag + 1e-6
    if case.dtype == TensorProto.FLOAT16:
        tol = tol + 2.0 ** -10 * np.abs(want)
    return tol


def _cases() -> List[Case]:
    out = []
    i = 0
    for bits in (2, 4, 8):
        for block in (16, 32, 64, 128):
            for k in (2 * block, 2 * block + block // 2 + 3):  # the second: a partial last block
                for zp in ("none", "uint8", "float"):
                    i += 1
                    out.append(Case(k=k, n=40 + 3 * (i % 3), bits=bits, block=block, zp=zp, bias=i % 2 == 0,
                                    a_shape=[(3,), (2, 5), (1,)][i % 3]))
    for bits in (4, 8):  # float16 A (onnxruntime's CPU kernel dequantizes 4 and 8 bits for it)
        for zp in ("none", "uint8", "float"):
            out.append(Case(k=100, n=48, bits=bits, block=32, dtype=TensorProto.FLOAT16, zp=zp, bias=True,
                            a_shape=(2, 3)))
    for zp in ("none", "uint8", "float"):  # weights fed at run time
        out.append(Case(k=72, n=33, bits=4, block=16, zp=zp, bias=True, dynamic=True))
    out.append(Case(k=96, n=70, bits=8, block=32, zp="uint8", dynamic=True, a_shape=(2, 9)))
    # longer products (prefill-sized): the blocked products read the pack
    out.append(Case(k=256, n=200, bits=4, block=32, zp="uint8", bias=True, a_shape=(1, 37)))
    return out


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matmulnbits_matches_onnxruntime(case: Case) -> None:
    data, feeds, want, mag = case.build(seed=zlib.crc32(case.id.encode()))
    # onnxruntime's CPU kernel refuses 8-bit weights with float zero points (the schema allows
    # them): those cases are checked against the numpy reference alone
    ref = None if case.bits == 8 and case.zp == "float" else oc.ort(data).run(None, feeds)[0]
    tol = _tolerance(case, want, mag)
    for threads in (1, 2):
        got = oc.ours(data, threads).run(None, feeds)[0]
        assert got.dtype == NP_TYPE[case.dtype] and got.shape == want.shape
        g = got.astype(np.float64)
        if ref is not None:
            assert ref.dtype == got.dtype and ref.shape == got.shape
            r = ref.astype(np.float64)
            assert np.all(np.abs(g - r) <= tol), (
                f"{case.id} threads={threads}: max |ours - onnxruntime| = {np.abs(g - r).max():.3g}")
        assert np.all(np.abs(g - want) <= tol), f"{case.id}: max |ours - numpy| = {np.abs(g - want).max():.3g}"


def test_accuracy_level_is_ignored() -> None:
    """accuracy_level 4 (int8 activations in onnxruntime) changes nothing in ours: the outputs at
    levels 0 and 4 are identical and equal onnxruntime's level-0 product within the float32
    bound; onnxruntime's level-4 output is further off (its quantization of A)."""
    c0 = Case(k=256, n=64, bits=4, block=32, a_shape=(4,))
    c4 = Case(k=256, n=64, bits=4, block=32, a_shape=(4,), accuracy_level=4)
    d0, feeds, want, mag = c0.build(seed=5)
    d4, feeds4, _, _ = c4.build(seed=5)
    assert all(np.array_equal(feeds[k], feeds4[k]) for k in feeds)
    ours0, ours4 = oc.ours(d0).run(None, feeds)[0], oc.ours(d4).run(None, feeds)[0]
    np.testing.assert_array_equal(ours0, ours4)
    ort0, ort4 = oc.ort(d0).run(None, feeds)[0], oc.ort(d4).run(None, feeds)[0]
    tol = _tolerance(c0, want, mag)
    assert np.all(np.abs(ours0 - ort0) <= tol)
    # int8 activations: about 1% of |A| per element, far above the float32 bound
    assert np.abs(ort4.astype(np.float64) - want).max() > 10 * tol.max()


def _model(attrs: Dict[str, Any], b_shape: Tuple[int, ...] = (8, 2, 16), scales_shape: Tuple[int, ...] = (8, 2),
           b_dtype: Any = np.uint8, extra: Optional[Dict[str, np.ndarray]] = None, k: int = 64) -> bytes:
    inits = [numpy_helper.from_array(np.zeros(b_shape, b_dtype), "B"),
             numpy_helper.from_array(np.ones(scales_shape, np.float32), "scales")]
    names = ["A", "B", "scales"]
    for name, v in (extra or {}).items():
        inits.append(numpy_helper.from_array(v, name))
    if extra:
        names += ["zero_points" if "zero_points" in extra else "", "g_idx" if "g_idx" in extra else ""]
        while names[-1] == "":
            names.pop()
    kw = dict(K=64, N=8, bits=4, block_size=32)
    kw.update(attrs)
    kw = {a: v for a, v in kw.items() if v is not None}
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", **kw)
    graph = helper.make_graph([node], "bad", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()


@pytest.mark.parametrize("exc,data", [
    (ValueError, _model({"block_size": 24})),
    (ValueError, _model({"block_size": 8}, b_shape=(8, 8, 4), scales_shape=(8, 8))),
    (ValueError, _model({"bits": 9})),
    (ValueError, _model({"K": None})),
    (ValueError, _model({"N": 9})),
    (ValueError, _model({}, b_shape=(8, 2, 17))),
    (ValueError, _model({}, b_dtype=np.int8)),
    (ValueError, _model({}, scales_shape=(8, 3))),
    (ValueError, _model({}, extra={"zero_points": np.zeros((8, 2), np.uint8)})),  # uint8: [8, 1] bytes
    (NotImplementedError, _model({"bits": 3}, b_shape=(8, 2, 12))),
    (NotImplementedError, _model({}, extra={"g_idx": np.zeros(64, np.int32)})),
], ids=["block24", "block8", "bits9", "noK", "N", "blob", "Bint8", "scales", "zp", "bits3", "g_idx"])
def test_malformed_nodes_are_refused(exc: type, data: bytes) -> None:
    with pytest.raises(exc):
        oc.ours(data)


def test_malformed_model_base_runs() -> None:
    """The refused models above differ from this one in one respect each."""
    y = oc.ours(_model({})).run(None, {"A": np.ones((2, 64), np.float32)})[0]
    assert y.shape == (2, 8)
    np.testing.assert_array_equal(y, np.full((2, 8), -8 * 64, np.float32))  # q = 0, zero point 8, scale 1
