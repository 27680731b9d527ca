"""generate() and Generator on the onnxruntime-genai Gemma 2 export, whose local layer's
GroupQueryAttention keeps window-sized shared past/present buffers (``sliding_window_cache=1``,
``local_window_size`` 8), run far past the window.

The reference is the fixture driver (``_fixtures.Decoder``) on onnxruntime's session: the pasts
fed as onnxruntime-genai allocates them (zeros of the window for the local layer, of max_length
for the global one), each run's presents fed back as the next run's pasts, greedy argmax. Both of
our paths must give its tokens: the cache path (the default: ``cache_plan()`` rewrites every
layer) and the tensor path (``state_options=False``, window-sized buffers built by the runner),
on our session and on onnxruntime's; so must rows of different lengths, Generator, Engine
(staggered requests in one state) and speculative decoding on the cache path. Beam search gives
the same hypotheses on every path, seeded sampling the same tokens on both of ours. On the
tensor path, which cannot truncate window-sized buffers, speculative decoding and rewinding
raise NotImplementedError.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest

import _fixtures as fx
import _ort_compare as oc

olkv = pytest.importorskip("onnx_light_kv")

NAME = "gemma2-genai"
WINDOW = 8
PROMPT = np.array([5, 17, 42, 99, 7, 130, 3, 8, 21, 64, 33, 2])  # longer than the window
NEW = 41  # 12 + 41 = 53 positions: more than six windows
SHORT = np.array([200, 9, 9, 4, 8])

pytestmark = pytest.mark.skipif(NAME not in fx.names(), reason=f"no {NAME} fixture")


_SESSIONS: Dict[str, Any] = {}


def _ours() -> Any:
    if "ours" not in _SESSIONS:
        _SESSIONS["ours"] = oc.ours(fx.model_path(NAME))
    return _SESSIONS["ours"]


def _ort() -> Any:
    if "ort" not in _SESSIONS:
        _SESSIONS["ort"] = oc.ort(fx.model_path(NAME))
    return _SESSIONS["ort"]


def _reference(prompt: np.ndarray, new: int) -> np.ndarray:
    """onnxruntime-genai's loop on onnxruntime: ``new`` greedy tokens after ``prompt``."""
    steps = fx.Decoder(NAME, _ort()).generate(prompt[None, :], new - 1)
    return fx.greedy_tokens(steps)[0]


def _options(runner: str) -> Any:
    return False if runner == "tensor" else None


def test_decoder_io_sees_the_window_sized_buffers() -> None:
    from onnx_light_kv.generation.decoder_io import DecoderIO

    drive = fx.entry(NAME)["drive"]
    for sess in (_ours(), _ort()):
        io = DecoderIO.from_session(sess)
        assert io.shared_buffer and io.window_buffers and io.group_query_attention
        for kv in io.kv:
            want = drive["past_capacity"][kv.past]
            assert kv.window == (want if want == WINDOW else 0), kv.past
            assert (kv.kv_heads, kv.head_dim) == (drive["kv_heads"], drive["head_dim"])
    assert olkv.generation.runner.cache_path_available(_ours())


@pytest.mark.parametrize("runner", ["default", "tensor"])
def test_greedy_past_the_window_equals_the_onnxruntime_genai_loop(runner: str) -> None:
    want = _reference(PROMPT, NEW)
    out = olkv.generate(_ours(), PROMPT, max_new_tokens=NEW, state_options=_options(runner))
    assert out.stats.runner == ("tensor" if runner == "tensor" else "state")
    np.testing.assert_array_equal(out.new_tokens[0], want)
    np.testing.assert_array_equal(out.sequences[0], np.concatenate([PROMPT, want]))


def test_greedy_on_onnxruntime_session_equals_the_loop() -> None:
    """generate() driving onnxruntime itself (the tensor path) builds the same feeds."""
    out = olkv.generate(_ort(), PROMPT, max_new_tokens=NEW)
    np.testing.assert_array_equal(out.new_tokens[0], _reference(PROMPT, NEW))


@pytest.mark.parametrize("runner", ["default", "tensor"])
def test_batch_of_two_prompt_lengths(runner: str) -> None:
    """Rows of different lengths (left-padded input): GroupQueryAttention reads the mask as a
    per-row length, so generate() runs the rows one after another; each equals its own loop."""
    S = PROMPT.size
    ids = np.zeros((2, S), np.int64)
    mask = np.zeros((2, S), np.int64)
    ids[0], mask[0] = PROMPT, 1
    ids[1, S - SHORT.size:], mask[1, S - SHORT.size:] = SHORT, 1
    out = olkv.generate(_ours(), ids, attention_mask=mask, max_new_tokens=NEW, state_options=_options(runner))
    np.testing.assert_array_equal(out.new_tokens[0], _reference(PROMPT, NEW))
    np.testing.assert_array_equal(out.new_tokens[1], _reference(SHORT, NEW))


def test_sampling_is_seeded_and_the_same_on_both_paths() -> None:
    kw: Dict[str, Any] = dict(max_new_tokens=NEW, do_sample=True, temperature=1.5, top_k=50)
    a = olkv.generate(_ours(), PROMPT, seed=3, **kw)
    b = olkv.generate(_ours(), PROMPT, seed=3, **kw)
    np.testing.assert_array_equal(a.new_tokens, b.new_tokens)
    tensor = olkv.generate(_ours(), PROMPT, seed=3, state_options=False, **kw)
    np.testing.assert_array_equal(tensor.new_tokens, a.new_tokens)
    others = [olkv.generate(_ours(), PROMPT, seed=s, **kw).new_tokens[0] for s in (4, 5)]
    assert any(not np.array_equal(o, a.new_tokens[0]) for o in others), "the seed changes nothing"
    greedy = _reference(PROMPT, NEW)
    assert not np.array_equal(a.new_tokens[0], greedy), "sampling at temperature 1.5 gave the greedy tokens"


def test_generator_steps_and_rewind_on_the_cache_path() -> None:
    want = _reference(PROMPT, NEW)
    g = olkv.Generator(_ours(), max_length=PROMPT.size + NEW)
    assert g.runner_kind == ""
    g.append_tokens(PROMPT[None])
    while not g.is_done():
        g.generate_next_token()
    assert g.runner_kind == "state"
    np.testing.assert_array_equal(g.sequences[0, PROMPT.size:], want)
    keep = PROMPT.size + 20  # rewind to a point the window buffer has long evicted
    g.rewind_to(keep)
    g.generate_next_token()
    assert int(g.get_next_tokens()[0]) == int(want[20])
    g.close()


def test_tensor_path_truncate_is_refused_clearly() -> None:
    """The tensor path's window-sized buffers have dropped the older positions: rewinding or
    speculative decoding there raises NotImplementedError naming the cache path."""
    g = olkv.Generator(_ours(), max_length=PROMPT.size + 4, state_options=False)
    g.append_tokens(PROMPT[None])
    g.generate_next_token()
    g.generate_next_token()
    before = g.sequences
    with pytest.raises(NotImplementedError, match="cache path"):
        g.rewind_to(PROMPT.size)
    np.testing.assert_array_equal(g.sequences, before)  # a failed call changes nothing
    g.generate_next_token()
    g.close()
    for draft in ({"draft_session": _ours(), "num_draft_tokens": 3}, {"prompt_lookup": 3}):
        with pytest.raises(NotImplementedError, match="window-sized"):
            olkv.generate(_ours(), PROMPT, max_new_tokens=6, state_options=False, **draft)
        with pytest.raises(NotImplementedError, match="window-sized"):  # onnxruntime's session: the tensor path
            olkv.generate(_ort(), PROMPT, max_new_tokens=6, **draft)


def test_speculative_and_beam_search() -> None:
    want = _reference(PROMPT, NEW)
    spec = olkv.generate(_ours(), PROMPT, max_new_tokens=NEW, draft_session=_ours(), num_draft_tokens=3)
    np.testing.assert_array_equal(spec.new_tokens[0], want)
    assert spec.stats.accepted_draft_tokens > 0
    beams = olkv.generate(_ours(), PROMPT, max_new_tokens=20, num_beams=3, num_return_sequences=2)
    assert beams.sequences.shape == (2, PROMPT.size + 20) and beams.stats.runner == "state"
    # beam search reorders the rows: on the tensor path (window-sized buffers taken along the
    # batch axis) and on onnxruntime's session it gives the same hypotheses
    for sess, options in ((_ours(), False), (_ort(), None)):
        other = olkv.generate(sess, PROMPT, max_new_tokens=20, num_beams=3, num_return_sequences=2,
                              state_options=options)
        assert other.stats.runner == "tensor"
        np.testing.assert_array_equal(other.sequences, beams.sequences)


def test_engine_batches_rows_of_different_lengths_past_the_window() -> None:
    """Engine (one state, one run per step over rows of different lengths) on the export: each
    request's tokens equal onnxruntime-genai's loop (greedy) or generate() alone (sampled), the
    second request joining while the first runs."""
    reqs: List[Dict[str, Any]] = [dict(input_ids=PROMPT, max_new_tokens=30),
                                  dict(input_ids=SHORT, max_new_tokens=25),
                                  dict(input_ids=SHORT[:3], max_new_tokens=20, do_sample=True, temperature=1.5, seed=9)]
    want = [list(_reference(PROMPT, 30)), list(_reference(SHORT, 25)),
            list(olkv.generate(_ours(), SHORT[:3], max_new_tokens=20, do_sample=True, temperature=1.5,
                               seed=9).new_tokens[0])]
    add_at = {0: 0, 1: 3, 2: 7}
    with olkv.Engine(_ours(), max_batch=3, max_length=64) as eng:
        ids: Dict[int, int] = {}
        step = 0
        while len(ids) < len(reqs) or eng.has_work():
            for i, at in add_at.items():
                if at == step:
                    kw = dict(reqs[i])
                    ids[i] = eng.add_request(np.asarray(kw.pop("input_ids")), **kw)
            eng.step()
            step += 1
            assert step < 200
        for i, rid in ids.items():
            assert eng.request(rid).tokens == [int(t) for t in want[i]], f"request {i}"


def test_tensor_runner_allocates_window_sized_buffers() -> None:
    """The tensor path's pasts: the local layer's K and V buffers hold the window, the global
    layer's the generation's capacity, whatever the length run so far."""
    from onnx_light_kv.generation.decoder_io import DecoderIO
    from onnx_light_kv.generation.runner import make_runner

    io = DecoderIO.from_session(_ours())
    capacity = PROMPT.size + NEW
    runner = make_runner(_ours(), io, 1, capacity, False)
    assert runner.kind == "tensor" and not runner.can_truncate
    d = fx.entry(NAME)["drive"]
    row = d["kv_heads"] * d["head_dim"] * 4  # float32 bytes of one position of one K or V
    want = 2 * row * (WINDOW + capacity)  # K and V of one local and one global layer
    assert runner.cache_bytes() == want
    logits = runner.run(PROMPT[None])
    for t in range(20):
        logits = runner.run(np.argmax(logits[:, -1], -1)[:, None])
    assert runner.length == PROMPT.size + 20 and runner.cache_bytes() == want
    runner.close()
