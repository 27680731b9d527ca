"""generate(), Generator and Engine on one export of each architecture whose layers differ from
Llama's (GPT-NeoX, Phi-2, OPT, StableLM, OLMo 2, Granite, GPT-J, StarCoder2) and of the rotary
scalings (Llama 3, Phi-3 longrope), beyond test_generate_fixtures.py's greedy runs: generations
long enough to cross the longrope exports' switch at 32 positions against onnxruntime's loop;
beam search and seeded sampling on the cache path against the tensor path; speculative
decoding with a draft of another architecture and with prompt lookup; paged and prefix-sharing
states; Generator rewinds and turns; continuous batching against generate() alone.

The onnxruntime-genai Phi-3 longrope export picks its rotary factors from the width of the
attention mask of each run: a verification run of speculative decoding that reaches past 32
positions, or a row batched with longer ones, sees the long factors earlier than one-token
greedy steps do. Those cases are compared with the same algorithm driven on onnxruntime's
session instead of with greedy output.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest

import _fixtures as fx
import _ort_compare as oc

olkv = pytest.importorskip("onnx_light_kv")
from onnx_light_kv.serve import Engine  # noqa: E402

NAMES = ["gptneox-torchscript", "phi-dynamo", "opt-optimum", "stablelm-dynamo23", "olmo2-optimum", "granite-genai",
         "gptj-dynamo", "starcoder2-torchscript", "llama3-genai", "phi3longrope-optimum", "phi3longrope-genai"]
PROMPT = np.array([5, 17, 42, 99, 7, 130, 5, 17])
#: new tokens of the long runs: past the longrope switch (32 positions), within the genai exports' 64
LONG = 50
PAGED = {"layout": "paged", "block_size": 16}


def _available() -> List[str]:
    return [n for n in NAMES if n in fx.names()]


def _ours(name: str) -> Any:
    return oc.ours(fx.model_path(name))


def _greedy_ort(name: str, prompt: np.ndarray, n: int) -> np.ndarray:
    steps = fx.Decoder(name, oc.ort(fx.model_path(name))).generate(prompt[None, :], n - 1)
    return fx.greedy_tokens(steps)[0]


def _mask_width_rope(name: str) -> bool:
    """The export whose rotary factors follow the attention mask's width (module docstring)."""
    return name == "phi3longrope-genai"


@pytest.mark.parametrize("name", _available())
def test_cache_path_equals_tensor_path_and_onnxruntime(name: str) -> None:
    sess = _ours(name)
    want = _greedy_ort(name, PROMPT, LONG)
    for options in (None, False, PAGED, dict(PAGED, prefix_cache=True)):
        got = olkv.generate(sess, PROMPT, max_new_tokens=LONG, state_options=options).new_tokens[0]
        np.testing.assert_array_equal(got, want, err_msg=f"{name} state_options={options}")
    for kw in (dict(num_beams=3, num_return_sequences=2, length_penalty=0.5, return_scores=True),
               dict(num_beams=2, do_sample=True, seed=5, temperature=0.8),
               dict(num_return_sequences=2, do_sample=True, seed=3, top_k=20, return_scores=True)):
        a = olkv.generate(sess, PROMPT, max_new_tokens=8, **kw)
        b = olkv.generate(sess, PROMPT, max_new_tokens=8, state_options=False, **kw)
        np.testing.assert_array_equal(a.sequences, b.sequences, err_msg=f"{name} {kw}")
        if a.sequences_scores is not None:
            np.testing.assert_allclose(a.sequences_scores, b.sequences_scores, atol=1e-4)
        for x, y in zip(a.scores or [], b.scores or []):
            np.testing.assert_allclose(x, y, atol=1e-3)


@pytest.mark.parametrize("name", _available())
def test_speculative_decoding_with_another_architecture_and_prompt_lookup(name: str) -> None:
    sess = _ours(name)
    draft = _ours("llama-dynamo")
    cases = [dict(draft_session=draft, num_draft_tokens=3), dict(prompt_lookup=3)]
    if _mask_width_rope(name):  # the same algorithm on onnxruntime's session
        ort = oc.ort(fx.model_path(name))
        for kw in cases:
            want = olkv.generate(ort, PROMPT, max_new_tokens=30, **kw).new_tokens[0]
            for options in (None, False):
                got = olkv.generate(sess, PROMPT, max_new_tokens=30, state_options=options, **kw).new_tokens[0]
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {kw} {options}")
        return
    want = _greedy_ort(name, PROMPT, 30)
    for kw in cases:
        for options in (None, False):
            got = olkv.generate(sess, PROMPT, max_new_tokens=30, state_options=options, **kw).new_tokens[0]
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {kw} {options}")
    a = olkv.generate(sess, PROMPT, max_new_tokens=12, draft_session=draft, do_sample=True, seed=1)
    b = olkv.generate(sess, PROMPT, max_new_tokens=12, draft_session=draft, do_sample=True, seed=1,
                      state_options=False)
    np.testing.assert_array_equal(a.sequences, b.sequences)


@pytest.mark.parametrize("name", _available())
def test_generator_rewind_and_turns(name: str) -> None:
    sess = _ours(name)
    for options in (None, PAGED):
        g = olkv.Generator(sess, max_length=60, state_options=options)
        g.append_tokens(PROMPT)
        for _ in range(40):
            g.generate_next_token()
        first = g.sequences
        for keep in (PROMPT.size + 30, PROMPT.size + 17, PROMPT.size, PROMPT.size + 33):
            g.rewind_to(keep)
            while g.length < first.shape[1]:
                g.generate_next_token()
            np.testing.assert_array_equal(g.sequences, first, err_msg=f"{name} {options} rewind_to({keep})")
        g.rewind_to(PROMPT.size + 5)
        turn = np.array([11, 12, 13])
        g.append_tokens(turn)
        for _ in range(5):
            g.generate_next_token()
        history = np.concatenate([first[0, :PROMPT.size + 5], turn])
        fresh = olkv.generate(sess, history, max_new_tokens=5, state_options=options)
        np.testing.assert_array_equal(g.sequences[0], fresh.sequences[0], err_msg=f"{name} {options} turn")
        g.close()


PROMPTS = [np.array([5, 17, 42, 99, 7, 130]), np.array([1]), np.array([200, 9, 9, 4, 8])]


@pytest.mark.parametrize("name", _available())
def test_padded_batch_with_a_one_token_row_and_single_new_tokens(name: str) -> None:
    """A left-padded batch holding a one-token prompt (greedy, beams) equals its rows run alone;
    max_new_tokens=1 gives the first greedy token on every strategy."""
    sess = _ours(name)
    width = max(p.size for p in PROMPTS)
    ids = np.zeros((len(PROMPTS), width), np.int64)
    mask = np.zeros_like(ids)
    for r, p in enumerate(PROMPTS):
        ids[r, width - p.size:], mask[r, width - p.size:] = p, 1
    for kw in (dict(max_new_tokens=10), dict(max_new_tokens=6, num_beams=2, num_return_sequences=2)):
        batch = olkv.generate(sess, ids, attention_mask=mask, **kw).new_tokens
        rows = np.concatenate([olkv.generate(sess, p, state_options=False, **kw).new_tokens for p in PROMPTS])
        np.testing.assert_array_equal(batch, rows, err_msg=f"{name} {kw}")
    first = _greedy_ort(name, PROMPT, 1)
    for kw in ({}, dict(num_beams=2), dict(prompt_lookup=2), dict(draft_session=sess), dict(state_options=PAGED)):
        got = olkv.generate(sess, PROMPT, max_new_tokens=1, **kw).new_tokens[0]
        if "num_beams" not in kw:
            np.testing.assert_array_equal(got, first, err_msg=f"{name} {kw}")
        assert got.shape == (1,)


ENGINE_NAMES = ["phi-dynamo", "olmo2-optimum", "gptj-dynamo", "llama3-genai", "granite-genai"]


def _alone(sess: Any, req: Dict[str, Any]) -> List[int]:
    kw = dict(req)
    ids = np.array(kw.pop("input_ids"))
    new = [int(t) for t in olkv.generate(sess, ids, **kw).new_tokens[0]]
    stop = olkv.generation.StopCondition.of(kw.get("eos_token_id"), None)
    for i in range(len(new)):
        if stop.hit(np.array(new[:i + 1])):
            return new[:i + 1]
    return new


@pytest.mark.parametrize("name", [n for n in ENGINE_NAMES if n in fx.names()])
@pytest.mark.parametrize("paged", [False, True])
def test_engine_equals_generate_alone(name: str, paged: bool) -> None:
    """Requests of different lengths (one token, a shared 20-token prefix, 37 tokens), greedy
    and sampled, joining at different steps; paged with the prefix cache or contiguous."""
    sess = _ours(name)
    shared = list(np.arange(3, 40) * 7 % 250)
    reqs = [dict(input_ids=shared[:20] + [5, 6], max_new_tokens=8),
            dict(input_ids=[7], max_new_tokens=5),
            dict(input_ids=shared[:20] + [9], max_new_tokens=6, do_sample=True, top_p=0.9, seed=7),
            dict(input_ids=shared, max_new_tokens=4, do_sample=True, top_k=20, seed=3),
            dict(input_ids=shared[:33], max_new_tokens=1)]
    reqs[0]["eos_token_id"] = [_alone(sess, reqs[0])[3]]
    want = [_alone(sess, r) for r in reqs]
    opts = dict(block_size=16, prefix_cache=True) if paged else {}
    with Engine(sess, max_batch=4, max_length=64, **opts) as eng:
        if paged:
            assert eng.block_size == 16
        ids: Dict[int, int] = {}
        step = 0
        while len(ids) < len(reqs) or eng.has_work():
            for i, r in enumerate(reqs):
                if i not in ids.values() and step >= i:
                    kw = dict(r)
                    ids[eng.add_request(np.array(kw.pop("input_ids")), **kw)] = i
            eng.step()
            step += 1
            assert step < 200
        got = {i: eng.request(rid).tokens for rid, i in ids.items()}
    for i in range(len(reqs)):
        assert got[i] == want[i], f"{name} request {i}"


@pytest.mark.parametrize("name,rows", [("gpt2-torchscript", 128), ("gptj-dynamo", 128), ("llama-genai", 128),
                                       ("llama-torchscript", None), ("opt-optimum", None)])
def test_position_table_is_a_limit_known_up_front(name: str, rows: Any) -> None:
    """A model whose positions index a table (GPT-2's learned positions, GPT-J's sin/cos table, the
    genai exports' cos cache) reports its rows; generate() refuses a request past them before
    running anything and runs one that ends exactly there (``rows + 1`` tokens: the last new
    token is chosen from the last row's logits and never run); a Generator stops at the step
    that would pass them and keeps its tokens, the same ones. Rotary computed in the graph
    (Llama's torch exports) has no limit; OPT's table is reached from the attention mask with an
    offset, not found."""
    if name not in fx.names():
        pytest.skip(f"{name} not in the fixtures")
    from onnx_light_kv.generation.decoder_io import DecoderIO

    sess = _ours(name)
    assert DecoderIO.from_session(sess).max_positions == rows
    if "genai" not in name:  # (a genai export's head size is also read from its file)
        assert DecoderIO.from_session(olkv.InferenceSession(fx.model_bytes(name))).max_positions is None  # no file
    if rows is None:
        return
    with pytest.raises(ValueError, match=f"needs {rows + 1} positions; the model addresses at most {rows}"):
        olkv.generate(sess, PROMPT, max_new_tokens=rows + 2 - PROMPT.size)
    ids, mask = np.zeros((2, 12), np.int64), np.zeros((2, 12), np.int64)
    ids[0, 4:], mask[0, 4:] = PROMPT, 1
    ids[1, 2:], mask[1, 2:] = 3, 1  # the longer row (10 tokens) sets the count, not the 12 columns
    with pytest.raises(ValueError, match=f"needs {rows + 1} positions"):
        olkv.generate(sess, ids, attention_mask=mask, max_new_tokens=rows + 2 - 10)
    out = olkv.generate(sess, PROMPT, max_new_tokens=rows + 1 - PROMPT.size)
    assert out.sequences.shape == (1, rows + 1)
    g = olkv.Generator(sess)
    g.append_tokens(PROMPT)
    with pytest.raises(ValueError, match=f"needs {rows + 1} positions"):
        while True:
            g.generate_next_token()
    assert g.length == rows + 1  # the token chosen from the last position's logits is kept
    np.testing.assert_array_equal(g.sequences, out.sequences)
    with Engine(sess, max_batch=2, max_length=2 * rows) as eng:  # max_length beyond the table: lowered
        assert eng.max_length == rows + 1
        with pytest.raises(ValueError, match=f"exceed the engine's max_length={rows + 1}"):
            eng.add_request(PROMPT, max_new_tokens=rows + 2 - PROMPT.size)
        rid = eng.add_request(PROMPT, max_new_tokens=rows + 1 - PROMPT.size)
        eng.run_until_done()
        assert eng.request(rid).finish_reason == "length"


def test_position_scan_skips_large_model_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model file over the scan limit is not parsed for its position table (None: no limit)."""
    from onnx_light_kv.generation import decoder_io

    if "gpt2-torchscript" not in fx.names():
        pytest.skip("gpt2-torchscript not in the fixtures")
    sess = _ours("gpt2-torchscript")
    monkeypatch.setattr(decoder_io, "POSITION_SCAN_MAX_BYTES", 1024)
    assert decoder_io.DecoderIO.from_session(sess).max_positions is None
    monkeypatch.undo()
    assert decoder_io.DecoderIO.from_session(sess).max_positions == 128


def test_position_table_of_the_standard_rotary_op_is_known(tmp_path: Any) -> None:
    """The built-in decoders use the standard (opset 23) RotaryEmbedding, whose cos/sin caches
    (input 1 and 2) are indexed by position_ids (input 3): loaded from a file, the table's rows are
    the limit, and generate() refuses a request past it before running anything (it ran to the
    table's end and failed there; the server answered 500 after generating)."""
    from onnx_light_kv import models as M
    from onnx_light_kv.generation.decoder_io import DecoderIO

    cfg = M.DecoderConfig(layers=1, hidden=32, q_heads=2, kv_heads=1, head_dim=16, vocab=64, max_positions=40)
    path = tmp_path / "decoder.onnx"
    path.write_bytes(M.model_bytes(M.llama_decoder(cfg, attention_mask_input=True)))
    sess = olkv.InferenceSession(str(path), threads=1)
    assert DecoderIO.from_session(sess).max_positions == 40
    with pytest.raises(ValueError, match="needs 41 positions; the model addresses at most 40"):
        olkv.generate(sess, [1, 2, 3], max_new_tokens=39)
    assert olkv.generate(sess, [1, 2, 3], max_new_tokens=38).sequences.shape == (1, 41)
