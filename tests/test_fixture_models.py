"""The fixture models (tests/fixtures: tiny decoders as torch.onnx dynamo, TorchScript, optimum and the
onnxruntime-genai builder export them) run in our session exactly as in onnxruntime.

Per fixture: every op it uses is in ``supported_ops()`` (at the model's opset); then a prefill of a
6-token prompt and 16 greedy steps on the tensor path (presents fed back as pasts; genai exports
with a shared ``max_length`` past/present buffer, as onnxruntime-genai drives them), once in
onnxruntime and once in our session with 1 and 2 threads, all feeds built by the generic driver in
``_fixtures.py``. Required: identical greedy tokens at every step, logits of every run and the
final presents (over the positions written) within the tolerance below of onnxruntime's. The
reference is onnxruntime on one thread, computed once per fixture; run on the fixture as stored it
must choose the tokens the manifest recorded when the fixture was made. The comparisons run
onnxruntime on ``_fixtures.reference_model_path``: the int4 exports (``genai-int4``: com.microsoft
MatMulNBits) with ``accuracy_level`` 0, the exact float product we compute, since at the builder's
level 4 onnxruntime quantizes the activations to int8 and its own greedy tokens change. The same checks run on a batch of two prompts, the
second padded by 2 (attention_mask 0): on the left, or on the right for the genai exports.

Tolerances (``_fixtures.ATOL``; absolute; logits of magnitude ~1-10, present values ~0.1-5), by the
model's float type:
* float32: 1e-4 for logits and presents. Observed differences between the two runtimes' summation
  orders are below 2e-6; a wrong mask, position, window or softcap moves values by 1e-2 or more.
* float16 (the ``-fp16`` exports): 2e-2, about 5 fp16 ulps at magnitude 4. Observed: 4.5e-3
  (one ulp; onnxruntime widens some fp16 kernels to fp32 internally, we may round elsewhere).

Fixtures that use an op another branch is adding (``PENDING_OPS``) are expected to fail at session
creation (``NotImplementedError``) and are marked ``xfail(strict=True)``: once the op lands they
pass, strict xfail turns that into a failure, and the op must be removed from ``PENDING_OPS``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Set

import numpy as np
import pytest

import _fixtures as fx
import _ort_compare as oc

STEPS = 16
PROMPT = np.array([[5, 17, 42, 99, 7, 130]], dtype=np.int64)
# ops the fixtures use that the runtime does not have yet (being added on another branch)
PENDING_OPS: Set[str] = set()


def _params(raises: type) -> List[Any]:
    out = []
    for name in fx.names():
        pending = sorted(set(fx.entry(name)["ops"]) & PENDING_OPS)
        marks = ([pytest.mark.xfail(strict=True, raises=raises, reason="needs " + ", ".join(pending))]
                 if pending else [])
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def test_manifest_lists_every_file() -> None:
    import os

    files = {f for f in os.listdir(fx.FIXTURE_DIR) if f.endswith(".onnx.xz")}
    assert files == {fx.entry(n)["file"] for n in fx.names()}
    assert len(files) > 0


@pytest.mark.parametrize("name", _params(AssertionError))
def test_fixture_ops_supported(name: str) -> None:
    from onnx_light_kv.session import supported_ops

    missing = fx.missing_ops(name, supported_ops())
    assert not missing, f"{name}: ops not in supported_ops(): {missing}"


@pytest.mark.parametrize("name", fx.names())
def test_fixture_op_gaps_are_pending(name: str) -> None:
    """The only unsupported ops are the pending ones (the xfails above hide no other gap)."""
    from onnx_light_kv.session import supported_ops

    other = sorted(set(fx.missing_ops(name, supported_ops())) - PENDING_OPS)
    assert not other, f"{name}: unsupported ops besides the pending ones: {other}"


_REFERENCE: Dict[str, List[fx.Step]] = {}


def _reference(name: str, exact: bool = False) -> List[fx.Step]:
    """onnxruntime's run of the fixture as stored, or (exact) of ``fx.reference_model_path``."""
    path = fx.reference_model_path(name) if exact else fx.model_path(name)
    if path not in _REFERENCE:
        _REFERENCE[path] = fx.Decoder(name, oc.ort(path, 1)).generate(PROMPT, STEPS)
    return _REFERENCE[path]


@pytest.mark.parametrize("name", fx.names())
def test_fixture_onnxruntime_reproduces_export_check(name: str) -> None:
    """onnxruntime driven here chooses the tokens recorded when the fixture was made (manifest
    ``matches_transformers``: the same driver and prompt; equal to transformers' own greedy run
    where ``tokens_equal``), so the files, the driver and the comparator still agree."""
    chk = fx.entry(name)["matches_transformers"]
    assert chk["prompt"] == PROMPT[0].tolist() and chk["steps"] == STEPS
    got = fx.greedy_tokens(_reference(name))[0].tolist()
    assert got == chk["tokens"], f"{name}: onnxruntime tokens {got} != the manifest's {chk['tokens']}"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", _params(NotImplementedError))
def test_fixture_greedy_matches_onnxruntime(name: str, threads: int) -> None:
    want, tol = _reference(name, exact=True), fx.atol(name)
    dec = fx.Decoder(name, oc.ours(fx.model_path(name), threads))
    got = dec.generate(PROMPT, STEPS)
    want_tokens, got_tokens = fx.greedy_tokens(want), fx.greedy_tokens(got)
    for i, (g, w) in enumerate(zip(got, want)):
        where = f"{name} threads={threads} run {i} (past {w.past_len})"
        oc.assert_close(f"{where} logits", g.outputs["logits"], w.outputs["logits"], rtol=0, atol=tol)
        assert np.array_equal(got_tokens[:, i], want_tokens[:, i]), (
            f"{where}: greedy token {got_tokens[:, i]} != onnxruntime's {want_tokens[:, i]}")
    for past, present in dec.pairs:
        for b, (g, w) in enumerate(zip(dec.written(past, got[-1].outputs[present]),
                                       dec.written(past, want[-1].outputs[present]))):
            oc.assert_close(f"{name} threads={threads} {present} row {b}", g, w, rtol=0, atol=tol)


LEFT_PADDED = (np.array([[5, 17, 42, 99, 7, 130], [0, 0, 61, 8, 200, 33]], dtype=np.int64),
               np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=np.int64))
RIGHT_PADDED = (np.array([[5, 17, 42, 99, 7, 130], [61, 8, 200, 33, 0, 0]], dtype=np.int64),
                np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=np.int64))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", _params(NotImplementedError))
def test_fixture_padded_batch_matches_onnxruntime(name: str, threads: int) -> None:
    """Batch of 2, the second row padded by 2 (attention_mask 0): on the left for the exports fed
    attention_mask + position_ids, on the right for the shared-buffer (genai) exports, whose
    GroupQueryAttention counts each row's tokens from the mask (seqlens_k) and stores them from
    row 0. Same checks as above over the real tokens (padded query rows are not compared)."""
    drive = fx.entry(name)["drive"]
    if any(c < drive["max_length"] for c in drive.get("past_capacity", {}).values()):
        pytest.skip("a window-sized GroupQueryAttention buffer (sliding_window_cache=1) takes a padded "
                    "prompt only with query_seqlens, which the export does not have (onnxruntime: "
                    "'seqlens_k[1] = 3 is too small for sequence_length')")
    prompt, mask = RIGHT_PADDED if drive.get("shared_buffer") else LEFT_PADDED
    tol = fx.atol(name)
    want = fx.Decoder(name, oc.ort(fx.reference_model_path(name), threads)).generate(prompt, STEPS, mask)
    dec = fx.Decoder(name, oc.ours(fx.model_path(name), threads))
    got = dec.generate(prompt, STEPS, mask)
    want_tokens, got_tokens = fx.greedy_tokens(want), fx.greedy_tokens(got)
    for i, (g, w) in enumerate(zip(got, want)):
        where = f"{name} threads={threads} run {i} (past {w.past_len})"
        valid = mask.astype(bool) if i == 0 else np.ones((2, 1), dtype=bool)
        oc.assert_close(f"{where} logits", g.outputs["logits"][valid], w.outputs["logits"][valid],
                        rtol=0, atol=tol)
        assert np.array_equal(got_tokens[:, i], want_tokens[:, i]), (
            f"{where}: greedy tokens {got_tokens[:, i]} != onnxruntime's {want_tokens[:, i]}")
    for past, present in dec.pairs:
        for b, (g, w) in enumerate(zip(dec.written(past, got[-1].outputs[present]),
                                       dec.written(past, want[-1].outputs[present]))):
            oc.assert_close(f"{name} threads={threads} {present} row {b}", g, w, rtol=0, atol=tol)
