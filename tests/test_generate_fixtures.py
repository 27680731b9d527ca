"""generate() on the committed exporter fixtures (torch.onnx dynamo/TorchScript, optimum,
onnxruntime-genai builder): greedy tokens equal the fixture driver's onnxruntime loop, batch 1
and a left-padded batch of 3 against per-sequence runs.

Fixtures our runtime loads run in our session; the others (ops still pending on another branch)
run generate() on onnxruntime's session, which still checks the feeds built from their names.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
import pytest

import _fixtures as fx
import _ort_compare as oc
from _gen_common import padded

olkv = pytest.importorskip("onnx_light_kv")

STEPS = 12
PROMPTS = [np.array([5, 17, 42, 99, 7, 130]), np.array([1, 2, 3]), np.array([200, 9, 9, 4, 8])]


def _session(name: str) -> Any:
    try:
        return oc.ours(fx.model_path(name))
    except NotImplementedError:
        return oc.ort(fx.model_path(name))


def _reference(name: str, prompt: np.ndarray) -> np.ndarray:
    steps = fx.Decoder(name, oc.ort(fx.reference_model_path(name))).generate(prompt[None, :], STEPS - 1)
    return fx.greedy_tokens(steps)[0]


def _generic(name: str) -> bool:
    """Fixtures these generic tests drive: all but the genai builder's exports with a sliding
    window (window-sized shared buffers, whose tensor path cannot truncate: test_generate_window.py
    covers them; the genai builder names head_dim symbolically, which generation reads from the
    model's GroupQueryAttention nodes)."""
    return not (fx.entry(name)["drive"].get("shared_buffer") and _gqa_window(name))


def _gqa_window(name: str) -> int:
    m = onnx.load_from_string(fx.model_bytes(name))
    return max([a.i for n in m.graph.node if n.op_type == "GroupQueryAttention" for a in n.attribute
                if a.name == "local_window_size"] + [0])


def _params() -> list:
    return [pytest.param(name, runner, id=f"{name}-{runner}")
            for name in fx.names() if _generic(name) for runner in ("tensor", "default")]


def _options(runner: str) -> object:
    return False if runner == "tensor" else None


@pytest.mark.parametrize("name,runner", _params())
def test_fixture_greedy_batch1_and_padded_batch(name: str, runner: str) -> None:
    sess = _session(name)
    got = olkv.generate(sess, PROMPTS[0], max_new_tokens=STEPS, state_options=_options(runner))
    np.testing.assert_array_equal(got.new_tokens[0], _reference(name, PROMPTS[0]))
    ids, mask = padded(PROMPTS)
    batch = olkv.generate(sess, ids, attention_mask=mask, max_new_tokens=STEPS, state_options=_options(runner))
    for r, p in enumerate(PROMPTS):
        np.testing.assert_array_equal(batch.new_tokens[r], _reference(name, p), err_msg=f"{name} row {r}")


@pytest.mark.parametrize("name,runner", _params())
def test_fixture_speculative_and_beam_run(name: str, runner: str) -> None:
    sess = _session(name)
    want = _reference(name, PROMPTS[0])
    spec = olkv.generate(sess, PROMPTS[0], max_new_tokens=STEPS, draft_session=sess, num_draft_tokens=3,
                         state_options=_options(runner))
    np.testing.assert_array_equal(spec.new_tokens[0], want)
    assert spec.stats.accepted_draft_tokens > 0
    beams = olkv.generate(sess, PROMPTS[0], max_new_tokens=4, num_beams=2, num_return_sequences=2,
                          state_options=_options(runner))
    assert beams.sequences.shape == (2, PROMPTS[0].size + 4)


def test_symbolic_head_dim_from_genai_config_or_graph(tmp_path: Any) -> None:
    """A symbolic head_dim comes from genai_config.json beside the model when there is one,
    else from the GroupQueryAttention geometry; a session made from bytes cannot tell."""
    from onnx_light_kv.generation.decoder_io import DecoderIO

    name = next(n for n in fx.names() if fx.entry(n)["exporter"] == "genai" and _generic(n))
    want = fx.entry(name)["drive"]["head_dim"]
    path = tmp_path / "model.onnx"
    path.write_bytes(fx.model_bytes(name))
    assert {kv.head_dim for kv in DecoderIO.from_session(olkv.InferenceSession(str(path))).kv} == {want}
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"head_size": 2 * want}}}))
    assert {kv.head_dim for kv in DecoderIO.from_session(oc.ort(str(path))).kv} == {2 * want}
    with pytest.raises(ValueError, match="head_dim"):
        DecoderIO.from_session(olkv.InferenceSession(fx.model_bytes(name)))
