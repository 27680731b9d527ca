"""generate(): greedy tokens equal a hand-written onnxruntime loop; feeds from the model's names;
stop conditions; errors."""

from __future__ import annotations

from typing import Any, List

import dataclasses

import numpy as np
import onnx
import pytest

import _gen_common as gc
import _ort_compare as oc

olkv = pytest.importorskip("onnx_light_kv")
from onnx_light_kv.generation import DecoderIO, StopCondition  # noqa: E402

N = 12


@pytest.mark.parametrize("variant,dtype", [
    ("llama", "float32"), ("llama-mask", "float32"), ("llama-derived-positions", "float32"),
    ("llama-opset24", "float32"), ("gpt2", "float32"), ("gpt2-derived-positions", "float32"),
    ("llama", "float16"), ("gpt2", "float16"),
])
def test_greedy_batch1_equals_onnxruntime_loop(variant: str, dtype: str) -> None:
    want = gc.ort_greedy(gc.model(variant, dtype), gc.PROMPT, N)
    got = olkv.generate(gc.ours(variant, dtype), gc.PROMPT, max_new_tokens=N)
    assert got.sequences.shape == (1, gc.PROMPT.size + N)
    assert got.sequences.dtype == np.int64
    np.testing.assert_array_equal(got.sequences[0, :gc.PROMPT.size], gc.PROMPT)
    np.testing.assert_array_equal(got.new_tokens[0], want)
    # the same generate() drives an onnxruntime session too
    on_ort = olkv.generate(gc.ort(variant, dtype), gc.PROMPT, max_new_tokens=N)
    np.testing.assert_array_equal(on_ort.new_tokens[0], want)


def test_greedy_gqa_shared_buffer_export_on_onnxruntime() -> None:
    """The GroupQueryAttention export (fixed-capacity past buffers) run by onnxruntime gives the
    Llama model's greedy tokens (same weights)."""
    want = gc.ort_greedy(gc.model("llama"), gc.PROMPT, N)
    io = DecoderIO.from_session(gc.ort("llama-gqa-ort"))
    assert io.shared_buffer and io.attention_mask == "attention_mask" and io.position_ids is None
    got = olkv.generate(gc.ort("llama-gqa-ort"), gc.PROMPT, max_new_tokens=N)
    np.testing.assert_array_equal(got.new_tokens[0], want)


@pytest.mark.parametrize("variant", ["llama-mask", "gpt2", "llama", "llama-gqa-ort"])
def test_left_padded_batch_of_3_equals_per_sequence_runs(variant: str) -> None:
    """llama-mask pads in one batched run; the others (no attention_mask input, or fixed
    buffers) run the rows one after another; every row equals its own greedy run."""
    ids, mask = gc.padded(gc.PROMPTS, pad=0)
    sess = gc.ort(variant) if variant == "llama-gqa-ort" else gc.ours(variant)
    ref_model = gc.model("llama") if variant == "llama-gqa-ort" else gc.model(variant)
    got = olkv.generate(sess, ids, attention_mask=mask, max_new_tokens=N)
    assert got.sequences.shape == (3, ids.shape[1] + N)
    np.testing.assert_array_equal(got.sequences[:, :ids.shape[1]], ids)
    for r, p in enumerate(gc.PROMPTS):
        np.testing.assert_array_equal(got.new_tokens[r], gc.ort_greedy(ref_model, p, N), err_msg=f"row {r}")


@pytest.mark.parametrize("n", [1, 2, 7])
def test_max_new_tokens_exact(n: int) -> None:
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=n)
    assert out.new_tokens.shape == (1, n)
    assert out.stats.model_runs == n  # the prefill gives the first token; no run after the last
    np.testing.assert_array_equal(out.new_tokens[0], gc.ort_greedy(gc.model("llama"), gc.PROMPT, n))


def test_eos_single_and_list_each_row_stops_on_its_own() -> None:
    refs = [gc.ort_greedy(gc.model("llama-mask"), p, N) for p in gc.PROMPTS]
    eos = int(refs[1][3])  # row 1 stops after 4 tokens (unless eos appears earlier elsewhere)
    ids, mask = gc.padded(gc.PROMPTS)
    for eos_arg in (eos, [999, eos]):
        out = olkv.generate(gc.ours("llama-mask"), ids, attention_mask=mask, max_new_tokens=N, eos_token_id=eos_arg,
                            pad_token_id=255)
        for r, ref in enumerate(refs):
            hits = np.flatnonzero(ref == eos)
            row = out.new_tokens[r]
            if hits.size:
                k = int(hits[0])
                np.testing.assert_array_equal(row[:k + 1], ref[:k + 1])
                assert (row[k + 1:] == 255).all(), f"row {r} not padded after eos: {row}"
            else:
                np.testing.assert_array_equal(row[:ref.size], ref)
    # the batch is as wide as its longest row: max_new_tokens unless every row stopped
    ends = [int(np.flatnonzero(ref == eos)[0]) + 1 if (ref == eos).any() else N for ref in refs]
    assert out.new_tokens.shape[1] == max(ends)


def test_eos_everywhere_ends_early_and_pads_with_eos() -> None:
    ref = gc.ort_greedy(gc.model("llama"), gc.PROMPT, N)
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=N, eos_token_id=int(ref[2]))
    k = int(np.flatnonzero(ref == ref[2])[0])
    np.testing.assert_array_equal(out.new_tokens[0], ref[:k + 1])


def test_stop_sequences() -> None:
    ref = gc.ort_greedy(gc.model("llama"), gc.PROMPT, N)
    stop = [int(ref[4]), int(ref[5])]
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=N, stop_sequences=[[7, 7, 7], stop])
    np.testing.assert_array_equal(out.new_tokens[0], ref[:6])
    assert out.stats.decode_tokens == 5
    # a stop sequence may start in the prompt
    across = [[int(gc.PROMPT[-1]), int(ref[0])]]
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=N, stop_sequences=across)
    np.testing.assert_array_equal(out.new_tokens[0], ref[:1])
    assert out.stats.decode_tokens == 0


#: the same ids in each kind of container the stop arguments accept (built anew for each use:
#: iterators are read once)
CONTAINERS = {"list": list, "tuple": tuple, "iterator": iter, "generator": lambda ids: (t for t in ids),
              "map": lambda ids: map(lambda t: t, ids), "array": np.array}
STRATEGIES = {"greedy": {}, "tensor": dict(state_options=False),
              "sample": dict(do_sample=True, temperature=0.8, seed=5), "beams": dict(num_beams=2),
              "lookup": dict(prompt_lookup=2)}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_stop_arguments_in_any_container(strategy: str) -> None:
    """eos_token_id and stop_sequences as any iterable (a one-shot iterator included) or numpy
    array give what lists give, on every strategy (the greedy/sampling path used to read them
    twice: an iterator's eos was ignored, a 2-D array raised numpy's truth-value error)."""
    sess = gc.ours("llama")
    kw: dict = dict(max_new_tokens=8, pad_token_id=1, **STRATEGIES[strategy])
    free = olkv.generate(sess, gc.PROMPT, **kw).new_tokens[0]
    eos, stop = int(free[2]), [int(free[1]), int(free[2])]
    by_eos = olkv.generate(sess, gc.PROMPT, eos_token_id=[eos], **kw).new_tokens
    by_stop = olkv.generate(sess, gc.PROMPT, stop_sequences=[stop], **kw).new_tokens
    if strategy != "beams":  # (an eos hypothesis changes the beams' ranking)
        for got in (by_eos, by_stop):
            np.testing.assert_array_equal(got[0], free[:3])  # (one row: nothing after the stop)
    for name, make in CONTAINERS.items():
        got = olkv.generate(sess, gc.PROMPT, eos_token_id=make([eos]), **kw).new_tokens
        np.testing.assert_array_equal(got, by_eos, err_msg=f"eos_token_id as {name}")
        got = olkv.generate(sess, gc.PROMPT, stop_sequences=make([make(stop)]), **kw).new_tokens
        np.testing.assert_array_equal(got, by_stop, err_msg=f"stop_sequences as {name}")


@pytest.mark.parametrize("eos,stops,want", [
    (np.int64(7), np.array([[0]]), StopCondition((7,), ((0,),))),  # a falsy array is not dropped
    (iter([7, 8]), iter([iter([1, 2]), (3,)]), StopCondition((7, 8), ((1, 2), (3,)))),
    (np.array([7]), np.array([[1, 2], [3, 4]]), StopCondition((7,), ((1, 2), (3, 4)))),
    ((t for t in [9]), [np.array([5, 6])], StopCondition((9,), ((5, 6),))),
    (None, [5, np.int64(6)], StopCondition((), ((5,), (6,)))),  # an int in stop_sequences: one token
])
def test_stop_condition_reads_any_iterable_once(eos, stops, want) -> None:
    assert StopCondition.of(eos, stops) == want


def _rename(mp: onnx.ModelProto, mapping: dict) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(mp)
    for node in m.graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
    for vi in list(m.graph.input) + list(m.graph.output):
        vi.name = mapping.get(vi.name, vi.name)
    return m


def test_other_naming_conventions_and_cache_position() -> None:
    """past_key_N / present_key_N names (older torch exports) and an unused cache_position input."""
    base = gc.model("llama")
    mapping = {}
    for i in range(gc.CFG.layers):
        for kv in ("key", "value"):
            mapping[f"past_key_values.{i}.{kv}"] = f"past_{kv}_{i}"
            mapping[f"present.{i}.{kv}"] = f"present_{kv}_{i}"
    m = _rename(base, mapping)
    m.graph.input.append(onnx.helper.make_tensor_value_info("cache_position", onnx.TensorProto.INT64, ["seq"]))
    io = DecoderIO.from_session(oc.ort(m))
    assert io.cache_position == "cache_position" and io.layers == gc.CFG.layers
    assert [k.past for k in io.kv[:2]] == ["past_key_0", "past_value_0"]
    got = olkv.generate(oc.ours(m), gc.PROMPT, max_new_tokens=N)
    np.testing.assert_array_equal(got.new_tokens[0], gc.ort_greedy(base, gc.PROMPT, N))


def test_unrecognized_input_is_named() -> None:
    m = onnx.ModelProto()
    m.CopyFrom(gc.model("llama"))
    m.graph.input.append(onnx.helper.make_tensor_value_info("token_type_ids", onnx.TensorProto.INT64, ["b", "s"]))
    with pytest.raises(ValueError, match="token_type_ids"):
        olkv.generate(oc.ort(m), gc.PROMPT, max_new_tokens=2)


class _FakeArg:
    def __init__(self, name: str, shape: Any, type_: str = "tensor(float)") -> None:
        self.name, self.shape, self.type = name, shape, type_


class _FakeSession:
    def __init__(self, inputs: List[_FakeArg], outputs: List[_FakeArg]) -> None:
        self._i, self._o = inputs, outputs

    def get_inputs(self) -> List[_FakeArg]:
        return self._i

    def get_outputs(self) -> List[_FakeArg]:
        return self._o


@pytest.mark.parametrize("past,present", [
    ("past_key_values.{i}.{kv}", "present.{i}.{kv}"),
    ("past.{i}.{kv}", "present_key_values.{i}.{kv}"),
    ("past_key_values_{i}_{kv}", "present_{i}_{kv}"),
])
def test_decoder_io_naming(past: str, present: str) -> None:
    ins = [_FakeArg("input_ids", ["b", "s"], "tensor(int64)"), _FakeArg("use_cache_branch", [1], "tensor(bool)")]
    outs = [_FakeArg("logits", ["b", "s", 32])]
    for i in range(2):
        for kv in ("key", "value"):
            ins.append(_FakeArg(past.format(i=i, kv=kv), ["b", 4, "past", 8], "tensor(float16)"))
            outs.append(_FakeArg(present.format(i=i, kv=kv), ["b", 4, "total", 8], "tensor(float16)"))
    io = DecoderIO.from_session(_FakeSession(ins, outs))
    assert io.layers == 2 and io.dtype == np.float16 and not io.shared_buffer
    assert io.use_cache_branch == "use_cache_branch"
    assert [(k.layer, k.kind) for k in io.kv] == [(0, "key"), (0, "value"), (1, "key"), (1, "value")]
    assert io.output_names[0] == "logits"


def test_decoder_io_errors() -> None:
    ids = _FakeArg("input_ids", ["b", "s"], "tensor(int64)")
    logits = _FakeArg("logits", ["b", "s", 32])
    with pytest.raises(ValueError, match="no matching present"):
        DecoderIO.from_session(_FakeSession([ids, _FakeArg("past_key_values.0.key", ["b", 4, "p", 8])], [logits]))
    with pytest.raises(ValueError, match="kv_heads and head_dim"):
        DecoderIO.from_session(_FakeSession([ids, _FakeArg("past_key_values.0.key", ["b", "h", "p", 8])],
                                            [logits, _FakeArg("present.0.key", ["b", "h", "t", 8])]))
    with pytest.raises(ValueError, match="no past key/value"):
        DecoderIO.from_session(_FakeSession([ids], [logits]))
    with pytest.raises(ValueError, match="input_ids"):
        DecoderIO.from_session(_FakeSession([], [logits]))
    with pytest.raises(TypeError):
        DecoderIO.from_session(object())


def test_argument_errors() -> None:
    sess = gc.ours("llama")
    with pytest.raises(ValueError, match="max_new_tokens"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=0)
    with pytest.raises(ValueError, match="left padding"):
        olkv.generate(sess, [[1, 2, 3]], attention_mask=[[1, 1, 0]], max_new_tokens=2)
    with pytest.raises(ValueError, match="num_return_sequences"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=2, num_return_sequences=2)
    with pytest.raises(TypeError, match="integer"):
        olkv.generate(sess, np.array([1.0, 2.0]), max_new_tokens=2)
    with pytest.raises(ValueError, match="tokenizer"):
        olkv.generate(sess, "hello", max_new_tokens=2)
    with pytest.raises(ValueError, match="temperature"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=2, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=2, do_sample=True, top_p=1.5)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(top_k=2.7), TypeError, "top_k"),  # not silently 2
    (dict(max_new_tokens=2.0), TypeError, "max_new_tokens"),
    (dict(temperature="0.5", do_sample=True), TypeError, "temperature"),
    (dict(do_sample="yes"), TypeError, "do_sample"),
    (dict(eos_token_id=[1.7]), TypeError, "eos_token_id"),
    (dict(eos_token_id="7"), TypeError, "eos_token_id"),
    (dict(pad_token_id=1.5), TypeError, "pad_token_id"),
    (dict(pad_token_id=2**70, eos_token_id=[1, 2]), ValueError, "pad_token_id"),  # not OverflowError
    (dict(pad_token_id=256, eos_token_id=[1, 2]), ValueError,  # the Gather failed once a row finished
     r"pad_token_id: token id 256 is beyond the model's vocabulary of 256 tokens \(ids 0..255\)"),
    (dict(early_stopping=1, num_beams=2), TypeError, "early_stopping"),  # 1 == True, yet acted as False
    (dict(eos_token_id=np.array(-1)), ValueError, "eos_token_id"),  # a 0-d array is one id
    (dict(eos_token_id=-1), ValueError, "eos_token_id"),
    (dict(eos_token_id=np.array([[1, 2]])), TypeError, "eos_token_id"),
    (dict(stop_sequences=5), TypeError, "stop_sequences"),
    (dict(stop_sequences="ab"), TypeError, "stop_sequences"),
    (dict(stop_sequences=[[1.5]]), TypeError, "each sequence of stop_sequences"),
    (dict(stop_sequences=np.zeros((1, 0), np.int64)), ValueError, "empty"),
    (dict(stop_sequences=[iter([])]), ValueError, "empty"),
    (dict(length_penalty=float("nan"), num_beams=2), ValueError, "length_penalty"),
    (dict(repetition_penalty=float("inf")), ValueError, "repetition_penalty"),
    (dict(num_beams=2.0), TypeError, "num_beams"),
    (dict(num_beams=257, num_return_sequences=1), ValueError, "vocabulary"),  # 256 tokens
    (dict(prompt_lookup=-1), ValueError, "prompt_lookup"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(seed="x"), TypeError, "seed"),
    (dict(progress="yes"), TypeError, "progress"),
    (dict(return_scores="yes"), TypeError, "return_scores"),
])
def test_generation_arguments_follow_the_validation_rule(kw, exc, match) -> None:
    """One rule per argument kind: integers through operator.index (floats, strings and bools
    raise TypeError), reals finite, huge values ValueError; checked before the model runs."""
    kw = {"max_new_tokens": 2, **kw}
    with pytest.raises(exc, match=match):
        olkv.generate(gc.ours("llama"), gc.PROMPT, **kw)
    shared = {k: v for k, v in kw.items() if k in ("top_k", "temperature", "do_sample", "eos_token_id",
                                                    "stop_sequences", "pad_token_id", "repetition_penalty")}
    if shared:  # the Generator takes these options too, under the same rule
        with pytest.raises(exc, match=match):
            olkv.Generator(gc.ours("llama"), **shared)


def test_token_ids_beyond_the_vocabulary() -> None:
    """Prompt ids beyond the vocabulary are named before the model runs; a default pad (the first
    eos id) beyond it gives way to the first eos id inside it, so a row that finishes early does
    not feed the model an id it cannot embed."""
    sess = gc.ours("llama")  # 256 tokens
    for make in (lambda: olkv.generate(sess, [3, 300], max_new_tokens=2),
                 lambda: olkv.Generator(sess).append_tokens([3, 300])):
        with pytest.raises(ValueError, match=r"token id 300 is beyond the model's vocabulary of 256 tokens"):
            make()
    ids = np.array([gc.PROMPT, gc.PROMPT[::-1]])
    alone = [olkv.generate(sess, row, max_new_tokens=6).new_tokens[0] for row in ids]
    eos = int(alone[0][1])  # row 0 stops at its second new token
    assert eos not in alone[1].tolist()
    out = olkv.generate(sess, ids, max_new_tokens=6, eos_token_id=[50000, eos])
    np.testing.assert_array_equal(out.new_tokens[0], [alone[0][0], eos, eos, eos, eos, eos])
    np.testing.assert_array_equal(out.new_tokens[1], alone[1])
    assert olkv.Generator(sess, eos_token_id=[999, eos]).pad_token_id == eos
    assert olkv.Generator(sess, eos_token_id=[999]).pad_token_id == 0


def test_draft_with_another_vocabulary_is_refused() -> None:
    """Both models declare their vocabulary: refused before any run (no token streamed)."""
    streamed: List[Any] = []
    with pytest.raises(ValueError, match=r"vocabulary \(512 logits\) differs from the target's \(256\)"):
        olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=4, draft_session=gc.ours("llama", vocab=512),
                      streamer=lambda tokens, text: streamed.append(tokens))
    assert streamed == []


def test_position_check_counts_the_positions_run() -> None:
    """prompt + max_new_tokens - 1 positions run (the last new token is chosen from the logits of
    the one before it), the count a Generator checks step by step."""
    io = dataclasses.replace(DecoderIO.from_session(gc.ours("gpt2")), max_positions=128)
    for prompt, new in ((100, 29), (1, 128), (128, 1)):
        io.check_generation(prompt, new, "the request")
    for prompt, new in ((100, 30), (129, 1)):
        with pytest.raises(ValueError, match="the request, which runs all but the last new token, needs 129 "
                                             "positions; the model addresses at most 128"):
            io.check_generation(prompt, new, "the request")


def test_stats_and_scores() -> None:
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=5, return_scores=True, state_options=False)
    s = out.stats
    assert s.runner == "tensor"
    assert s.prefill_ms > 0 and s.decode_ms > 0 and s.decode_tokens == 4 and s.decode_tokens_per_s > 0
    cfg = gc.CFG
    # pasts held at the end: prompt + 4 fed tokens, K and V, all layers, float32
    assert s.cache_bytes == 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * 4 * (gc.PROMPT.size + 4)
    assert "tokens/s" in s.summary()
    assert len(out.scores) == 5 and out.scores[0].shape == (1, cfg.vocab)
    want = gc.ort_logits_loop(gc.model("llama"), gc.PROMPT, out.new_tokens[0][:4])
    want = want - want.max(-1, keepdims=True)
    want = want - np.log(np.exp(want).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.concatenate(out.scores), want, atol=2e-3)
    assert all(np.exp(sc).sum() == pytest.approx(1.0, abs=1e-4) for sc in out.scores)


def test_huge_max_new_tokens_reserves_nothing_up_front() -> None:
    """max_new_tokens is an upper bound: on the cache path a bound far beyond memory lets the
    state grow on demand (no reservation), so generation stops at eos as on the tensor path."""
    sess = gc.ours("llama")
    ref = olkv.generate(sess, gc.PROMPT, max_new_tokens=6, state_options=False)
    eos = int(ref.sequences[0, gc.PROMPT.size + 2])
    for opts in (None, False):
        out = olkv.generate(sess, gc.PROMPT, max_new_tokens=10**9, eos_token_id=eos, state_options=opts)
        np.testing.assert_array_equal(out.sequences[0, gc.PROMPT.size:], ref.sequences[0, gc.PROMPT.size:][:3])


def test_arguments_refused_before_the_model_runs() -> None:
    """num_beams above the vocabulary, uint64 ids beyond int64 and a num_return_sequences that
    makes too many rows raise ValueError naming the argument, without running the model."""
    sess = gc.ours("llama")
    runs = []
    real_run = sess.run

    def counting(*a: Any, **k: Any) -> Any:
        runs.append(1)
        return real_run(*a, **k)

    sess.run = counting
    cases = [
        (dict(input_ids=gc.PROMPT, num_beams=gc.CFG.vocab + 1), "num_beams=257 exceeds the vocabulary"),
        (dict(input_ids=np.array([2**63], np.uint64)), "beyond any vocabulary"),
        (dict(input_ids=gc.PROMPT, do_sample=True, num_return_sequences=2**40), "num_return_sequences"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            olkv.generate(sess, max_new_tokens=2, **kw)
    assert not runs
