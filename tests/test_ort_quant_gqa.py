"""onnxruntime's quantized-cache GroupQueryAttention, the comparator of the quantized KV cache
(``benchmarks/bench_decode.py --quant``): the one-node model, its int8 / int4 storage format and
its attention against a numpy reference.

onnxruntime 1.32's CPU kernel takes an ``int8`` cache (``kv_cache_bit_width=8``) and a packed
``uint8`` int4 cache (``kv_cache_bit_width=4``) with static ``PER_TENSOR`` or ``PER_CHANNEL``
scales. Checked here, per bit width, scale kind and a grid of shapes (GQA, MQA, MHA, batch 1-3,
contexts 1-257):

* the row the step writes into the shared past/present buffer (bound through IOBinding, as the
  benchmark does) is :func:`bench_decode.ort_quantize` of the new key/value: the storage format
  (int8 symmetric; int4 signed nibbles with offset 8, low nibble first) is the one the helpers
  write and read;
* the output equals float64 attention over :func:`bench_decode.ort_dequantize` of the present
  rows (the new token included, read back quantized) within 2e-5;
* against fp32 attention over the unquantized rows the error stays within a bound per format,
  1.5x the largest measured over the grid (int8 / int4 per channel: 0.03 / 0.55; per tensor, where
  one outlier channel 10x the others sets the one scale: 0.16 / 2.7, i.e. a per-tensor int4 cache
  is unusable on such keys), so the comparator computes quantized attention, not something else.

A build of onnxruntime without the quantized CPU kernel skips with its error message.
"""

from __future__ import annotations

import os
import sys
from typing import Tuple

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_decode as bd  # noqa: E402

pytest.importorskip("onnxruntime")

SHAPES = [  # batch, q_heads, kv_heads, head_dim, context (after the step)
    (1, 8, 2, 64, 100),
    (2, 8, 2, 128, 257),
    (3, 4, 1, 32, 33),
    (1, 4, 4, 64, 1),
]
# max |error| vs fp32 attention over the grid (seed 0): 0.020 / 0.37 / 0.105 / 1.79; bounds 1.5x that.
BOUND = {(8, "PER_CHANNEL"): 0.03, (4, "PER_CHANNEL"): 0.55, (8, "PER_TENSOR"): 0.16, (4, "PER_TENSOR"): 2.7}


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float64 decode attention: q [B, Hq, d], k/v [B, Hkv, L, d] -> [B, Hq, d]."""
    g = q.shape[1] // k.shape[1]
    kk = np.repeat(k.astype(np.float64), g, axis=1)
    vv = np.repeat(v.astype(np.float64), g, axis=1)
    s = np.einsum("bhd,bhld->bhl", q.astype(np.float64), kk) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhl,bhld->bhd", p, vv)


def _step(shape: Tuple[int, ...], quant: bd.OrtQuant, seed: int = 0):
    b, hq, hkv, d, L = shape
    rng = np.random.default_rng(seed)
    kf = rng.standard_normal((b, hkv, L, d)).astype(np.float32)
    vf = rng.standard_normal((b, hkv, L, d)).astype(np.float32)
    kf[..., 3] *= 10.0  # an outlier channel, as real keys have
    q = rng.standard_normal((b, hq, d)).astype(np.float32)
    ks, vs = bd.ort_scales(kf, quant), bd.ort_scales(vf, quant)
    cap = L + 7  # a shared buffer longer than the context, as the benchmark's
    c = bd.Case(1, "float32", b, hq, hkv, d, L)
    past_k = np.zeros((b, hkv, cap, quant.row_bytes(d)), quant.np_dtype)
    past_v = np.zeros_like(past_k)
    past_k[:, :, :L - 1] = bd.ort_quantize(kf[:, :, :L - 1], ks, quant)
    past_v[:, :, :L - 1] = bd.ort_quantize(vf[:, :, :L - 1], vs, quant)
    new_k = np.ascontiguousarray(kf[:, :, L - 1].reshape(b, 1, hkv * d))
    new_v = np.ascontiguousarray(vf[:, :, L - 1].reshape(b, 1, hkv * d))
    try:
        step = bd.OrtStep(c, past_k, past_v, q.reshape(b, 1, hq * d), new_k, new_v, quant, (ks, vs))
        step()
    except Exception as e:  # noqa: BLE001 - an onnxruntime without the kernel is a skip, with its reason
        pytest.skip(f"this onnxruntime cannot run a {quant.bits}-bit {quant.kind} GroupQueryAttention cache: "
                    f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return c, step, (kf, vf, q, ks, vs, new_k)


@pytest.mark.parametrize("kind", ["PER_CHANNEL", "PER_TENSOR"])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-h{}/{}-d{}-L{}".format(*s))
def test_quantized_gqa_matches_reference(shape: Tuple[int, ...], bits: int, kind: str) -> None:
    quant = bd.OrtQuant(bits, kind)
    c, step, (kf, vf, q, ks, vs, new_k) = _step(shape, quant)
    b, hq, hkv, d, L = shape
    assert step.shares_buffer(c, new_k), "the new key is not where the shared buffer should hold it"
    assert np.array_equal(step.np_v[:, :, L - 1], bd.ort_quantize(vf[:, :, L - 1:L], vs, quant)[:, :, 0])
    kd = bd.ort_dequantize(step.np_k[:, :, :L], ks, quant)
    vd = bd.ort_dequantize(step.np_v[:, :, :L], vs, quant)
    got = step.out.numpy().reshape(b, hq, d)
    ref = _attention(q, kd, vd)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5)
    err = float(np.abs(got - _attention(q, kf, vf)).max())
    assert err < BOUND[(bits, kind)], f"error vs fp32 attention {err:.3g} >= {BOUND[(bits, kind)]}"


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_round_trip(bits: int) -> None:
    """The helpers' format: dequantize(quantize(x)) is within half a step of x inside the range,
    int4 packs element 2i in the low nibble with offset 8."""
    quant = bd.OrtQuant(bits, "PER_CHANNEL")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 40, 16)).astype(np.float32)
    s = bd.ort_scales(x, quant)
    assert s.shape == (1, 3, 1, 16)
    back = bd.ort_dequantize(bd.ort_quantize(x, s, quant), s, quant)
    assert np.all(np.abs(back - x) <= s / 2 + 1e-6)
    if bits == 4:
        one = np.array([[1.0, -1.0]], np.float32)
        assert bd.ort_quantize(one, np.float32(1.0), quant).tolist() == [[(1 + 8) | ((-1 + 8) << 4)]]
    zero = bd.ort_scales(np.zeros((1, 1, 4, 4), np.float32), quant)
    assert np.all(zero == 1.0)
