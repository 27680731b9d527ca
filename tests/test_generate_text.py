"""Text in and out (a tokenizer built locally with ``tokenizers``), streaming, progress, CLI."""

from __future__ import annotations

import os
from typing import Any, List

import numpy as np
import pytest

import _gen_common as gc

olkv = pytest.importorskip("onnx_light_kv")
from onnx_light_kv.__main__ import main  # noqa: E402

N = 6


def _tokenizer() -> Any:
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers (optional extra 'generate') is not installed")
    vocab = {f"w{i}": i for i in range(255)}
    vocab["<pad>"] = 255
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<pad>"])
    return tok


def _words(ids: Any) -> str:
    return " ".join(f"w{int(i)}" for i in ids)


def test_text_in_text_out_and_streamed_pieces(tmp_path: Any) -> None:
    tok = _tokenizer()
    want = gc.ort_greedy(gc.model("llama"), gc.PROMPT, N)
    pieces: List[str] = []
    seen: List[int] = []

    def streamer(tokens: np.ndarray, text: Any) -> None:
        seen.extend(int(t) for t in tokens)
        pieces.append(text[0])

    out = olkv.generate(gc.ours("llama"), _words(gc.PROMPT), tokenizer=tok, max_new_tokens=N, streamer=streamer)
    np.testing.assert_array_equal(out.new_tokens[0], want)
    assert out.text == [_words(want)]
    assert seen == list(want) and "".join(pieces) == out.text[0]
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    again = olkv.generate(gc.ours("llama"), [_words(gc.PROMPT), _words(gc.PROMPTS[2])], tokenizer=str(path),
                          max_new_tokens=N)
    assert again.text[0] == out.text[0]
    assert again.sequences[1, 0] == 255  # left-padded with the tokenizer's <pad>
    assert again.text[1] == _words(gc.ort_greedy(gc.model("llama"), gc.PROMPTS[2], N))


def test_transformers_style_streamer_protocol() -> None:
    calls: List[Any] = []

    class Recorder:
        def put(self, value: np.ndarray) -> None:
            calls.append(value)

        def end(self) -> None:
            calls.append("end")

    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=N, streamer=Recorder())
    np.testing.assert_array_equal(calls[0], gc.PROMPT[None, :])
    assert [int(c[0]) for c in calls[1:-1]] == list(out.new_tokens[0]) and calls[-1] == "end"


def test_progress_bar(capsys: Any) -> None:
    pytest.importorskip("tqdm", reason="tqdm (optional extra 'generate') is not installed")
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=N, progress=True)
    assert out.new_tokens.shape == (1, N)
    assert "tok" in capsys.readouterr().err


def test_cli_generate_ids_and_text(tmp_path: Any, capsys: Any) -> None:
    path = os.fspath(tmp_path / "llama.onnx")
    gc.M.save_model(gc.model("llama"), path)
    want = gc.ort_greedy(gc.model("llama"), gc.PROMPT, N)
    args = ["generate", path, "--prompt-ids", *map(str, gc.PROMPT), "--max-new-tokens", str(N), "--threads", "1"]
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == [str(t) for t in want]
    assert "prefill" in lines[1] and "tokens/s" in lines[1] and "cache" in lines[1]
    assert main(args + ["--num-beams", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    assert main(args + ["--draft", path]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == [str(t) for t in want] and "drafts accepted" in lines[1]
    # the processors: the CLI's tokens are generate's with the same options
    extra = ["--no-repeat-ngram-size", "2", "--repetition-penalty", "1.3", "--eos", str(want[0]),
             "--min-new-tokens", "3"]
    assert main(args + extra) == 0
    got = capsys.readouterr().out.strip().splitlines()[0].split()
    ref = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=N, no_repeat_ngram_size=2, repetition_penalty=1.3,
                        eos_token_id=want[0], min_new_tokens=3)
    assert got == [str(t) for t in ref.new_tokens[0]][:len(got)] and len(got) >= 3


@pytest.mark.parametrize("args, message", [
    (["--prompt-ids", "99999999999999999999999"], "--prompt-ids must be token ids in [0, 2**63), got 99999999999999999999999"),
    (["--prompt-ids", "3", "-1"], "--prompt-ids must be token ids in [0, 2**63), got -1"),
    (["--prompt", "hi"], "--prompt needs --tokenizer (or give --prompt-ids)"),
    (["--prompt-ids", "3", "--temperature", "0.5", "--seed", "1"],
     "--temperature, --seed only take effect with --sample (greedy choice ignores them)"),
    (["--prompt-ids", "3", "--top-k", "5"], "--top-k only takes effect with --sample (greedy choice ignores it)"),
    (["--prompt-ids", "3", "--num-draft-tokens", "8"],
     "--num-draft-tokens only takes effect with --draft (prompt lookup proposes --prompt-lookup tokens)"),
])
def test_cli_generate_refuses_bad_prompts(tmp_path: Any, capsys: Any, args: list, message: str) -> None:
    """One error line and exit status 2, no traceback (a huge id gave an OverflowError traceback)."""
    path = os.fspath(tmp_path / "llama.onnx")
    gc.M.save_model(gc.model("llama"), path)
    assert main(["generate", path, *args, "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"onnx-light-kv: error: {message} (ValueError)"


def test_cli_generate_text(tmp_path: Any, capsys: Any) -> None:
    path = os.fspath(tmp_path / "llama.onnx")
    gc.M.save_model(gc.model("llama"), path)
    want = gc.ort_greedy(gc.model("llama"), gc.PROMPT, N)
    tok = _tokenizer()
    tpath = os.fspath(tmp_path / "tokenizer.json")
    tok.save(tpath)
    assert main(["generate", path, "--prompt", _words(gc.PROMPT), "--tokenizer", tpath,
                 "--max-new-tokens", str(N)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == _words(want)


def test_beams_return_the_text_of_every_sequence() -> None:
    tok = _tokenizer()
    prompts = [_words(gc.PROMPT), _words(gc.PROMPTS[2])]
    out = olkv.generate(gc.ours("llama"), prompts, tokenizer=tok, max_new_tokens=4, num_beams=3,
                        num_return_sequences=2)
    assert len(out.text) == 4
    assert out.text == [_words(row) for row in out.new_tokens]


def test_stopped_rows_stream_no_more_text() -> None:
    """A row that stopped gets padding and an empty piece: each row's streamed pieces add up
    to its text, also when the padding is an ordinary token."""
    tok = _tokenizer()
    prompts = [_words(gc.PROMPT), _words(gc.PROMPT[::-1])]  # one batch (equal lengths: no padding)
    free = olkv.generate(gc.ours("llama"), prompts, tokenizer=tok, max_new_tokens=N)
    eos = int(free.new_tokens[0][1])  # row 0 stops after two tokens
    got = ["", ""]

    def streamer(tokens: np.ndarray, text: Any) -> None:
        for r, piece in enumerate(text):
            got[r] += piece

    out = olkv.generate(gc.ours("llama"), prompts, tokenizer=tok, max_new_tokens=N, eos_token_id=eos,
                        pad_token_id=7, streamer=streamer)
    assert out.text[0] == _words(free.new_tokens[0][:2])
    assert got == out.text


def test_bad_text_inputs_are_clear_errors(tmp_path: Any) -> None:
    tok = _tokenizer()
    with pytest.raises(ValueError, match="not valid Unicode"):  # a lone surrogate (undecodable bytes)
        olkv.generate(gc.ours("llama"), "w1 \udcff", tokenizer=tok, max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt 1"):
        olkv.generate(gc.ours("llama"), ["w1", "\ud800"], tokenizer=tok, max_new_tokens=2)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("not json")
    with pytest.raises(ValueError, match="cannot read the tokenizer"):
        olkv.generate(gc.ours("llama"), "w1", tokenizer=str(bad), max_new_tokens=2)


@pytest.mark.parametrize("args,needle", [
    (["generate", "MISSING.onnx", "--prompt-ids", "1", "2", "--max-new-tokens", "2"], "no such file"),
    (["generate", "DIR", "--prompt-ids", "1", "--max-new-tokens", "2"], "is a directory"),
    (["generate", "MODEL", "--prompt-ids", "1", "2", "--max-new-tokens", "0"], "max_new_tokens"),
    (["generate", "MODEL", "--prompt-ids", "1", "2", "--max-new-tokens", "2", "--threads", "100000"], "threads"),
    (["generate", "MODEL", "--prompt-ids", "1", "9999", "--max-new-tokens", "2"], "token id 9999 is beyond the model's vocabulary of 256 tokens"),
    (["generate", "MODEL", "--prompt-ids", "1", "2", "--max-new-tokens", "2", "--sample", "--temperature", "0"],
     "temperature"),
    (["generate", "MODEL", "--prompt", "w1", "--tokenizer", "MISSING.json", "--max-new-tokens", "2"], "not found"),
    (["demo", "--batch", "0"], "batch"),
])
def test_cli_user_errors_are_one_line(tmp_path: Any, capsys: Any, args: List[str], needle: str) -> None:
    """A user mistake ends the command with exit status 2 and one line naming it, no traceback."""
    path = os.fspath(tmp_path / "llama.onnx")
    gc.M.save_model(gc.model("llama"), path)
    subst = {"MODEL": path, "DIR": os.fspath(tmp_path), "MISSING.onnx": os.fspath(tmp_path / "missing.onnx"),
             "MISSING.json": os.fspath(tmp_path / "missing.json")}
    assert main([subst.get(a, a) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("onnx-light-kv: error: ") and needle in err[-1], err
    assert not any("Traceback" in line for line in err)


def test_streamer_pieces_add_up_when_the_text_ends_inside_a_character() -> None:
    """The last step's piece carries a character the generation cut short (U+FFFD, as the full
    decode has it): the pieces held it back for good, so the streamed text (and the CLI's line)
    lacked the text's last character."""
    from onnx_light_kv.generation.text import Streamer

    class Bytes:  # token t is byte t; decode as UTF-8 with replacement, as byte-level BPE does
        def decode(self, ids: List[int], skip_special_tokens: bool = True) -> str:
            return bytes(ids).decode("utf-8", errors="replace")

    for seq in ([0x61, 0xC3, 0xA9, 0x62], [0x61, 0xE2, 0x82], [0xF0, 0x9F, 0x98, 0x80], [0x61, 0xC3]):
        got: List[str] = []
        s = Streamer(lambda tokens, text: got.append(text[0]), Bytes(), 1)
        for t in seq:
            s.put(np.array([t], np.int64))
        s.end()
        assert "".join(got) == Bytes().decode(seq) and len(got) == len(seq), (seq, got)


def test_streamer_flushes_a_row_that_stops_before_the_others() -> None:
    """A row that stops (eos) while its text ends inside a character gets the rest of its text
    in its last step's piece, though other rows go on (it got "" and then only padding)."""
    from onnx_light_kv.generation.text import Streamer

    class Bytes:
        def decode(self, ids: List[int], skip_special_tokens: bool = True) -> str:
            return bytes(ids).decode("utf-8", errors="replace")

    rows = [[0x61, 0xC3], [0x62, 0x63, 0x64, 0x65]]  # row 0 stops after its second token
    got: List[List[str]] = [[], []]
    s = Streamer(lambda tokens, text: [got[r].append(p) for r, p in enumerate(text)], Bytes(), 2)
    for step in range(4):
        finished = np.array([step >= 2, False])
        s.put(np.array([rows[0][step] if step < 2 else 0, rows[1][step]], np.int64), finished)
    s.end()
    assert ["".join(g) for g in got] == [Bytes().decode(rows[0]), Bytes().decode(rows[1])], got
