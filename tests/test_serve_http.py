"""The OpenAI-compatible server over real HTTP on 127.0.0.1 (started and stopped by the tests):
the official openai client and raw httpx; every response checked against generate() alone."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest

from _gen_common import model, ours

olkv = pytest.importorskip("onnx_light_kv")
pytest.importorskip("starlette", reason="starlette (optional extra 'serve') is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="uvicorn (optional extra 'serve') is not installed")
httpx = pytest.importorskip("httpx", reason="httpx (the tests' HTTP client) is not installed")
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers (optional extra 'generate') is not installed")

from onnx_light_kv.serve import Engine  # noqa: E402
from onnx_light_kv.serve.http import DEFAULT_CHAT_TEMPLATE, create_app  # noqa: E402

MODEL = "llama-mask"
NAME = "tiny-llama"
MAX_LENGTH = 96


def _tokenizer() -> Any:
    vocab = {f"w{i}": i for i in range(255)}
    vocab["<pad>"] = 255
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<pad>"])
    return tok


TOK = _tokenizer()


def words(ids: Any) -> str:
    return " ".join(f"w{int(i)}" for i in ids)


def expected(prompt: Any, max_tokens: int, **kw: Any) -> List[int]:
    """generate() alone on the same ids."""
    ids = np.array(TOK.encode(prompt).ids if isinstance(prompt, str) else prompt, np.int64)
    return [int(t) for t in olkv.generate(ours(MODEL), ids, max_new_tokens=max_tokens, **kw).new_tokens[0]]


def expected_text(prompt: Any, max_tokens: int, chat: bool = False, **kw: Any) -> str:
    """What the server returns for generate()'s tokens: chat content is their text alone; a
    completion's text continues the prompt (prompt text + completion = the decode of both)."""
    new = expected(prompt, max_tokens, **kw)
    if chat:
        return TOK.decode(new)
    ids = list(TOK.encode(prompt).ids if isinstance(prompt, str) else prompt)
    return TOK.decode(ids + new)[len(TOK.decode(ids)):]


class Server:
    """uvicorn serving the app on a free loopback port, on a thread of the test process."""

    def __init__(self, app: Any) -> None:
        self.app = app
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        cfg = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def engine(self) -> Engine:
        return self.app.state.olkv["server"].loop.engine

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[Server]:
    eng = Engine(ours(MODEL), max_batch=16, max_length=MAX_LENGTH)
    srv = Server(create_app(eng, TOK, model_name=NAME))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    openai = pytest.importorskip("openai", reason="the openai client is not installed")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


P1, P2 = words([3, 17, 42, 5, 99, 7, 250]), words([200, 9])


def test_completions_openai_client(client: Any) -> None:
    r = client.completions.create(model=NAME, prompt=P1, max_tokens=10, temperature=0)
    assert r.choices[0].text == expected_text(P1, 10)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 7 and r.usage.completion_tokens == 10
    parts = [c.choices[0].text for c in client.completions.create(model=NAME, prompt=P2, max_tokens=8,
                                                                   temperature=0, stream=True)]
    assert "".join(parts) == expected_text(P2, 8) and len(parts) >= 8


def test_completions_sampling_seed_n_and_logprobs(client: Any) -> None:
    r = client.completions.create(model=NAME, prompt=P1, max_tokens=9, temperature=0.8, top_p=0.9, seed=5, n=2)
    for i, c in enumerate(sorted(r.choices, key=lambda c: c.index)):
        assert c.text == expected_text(P1, 9, do_sample=True, temperature=0.8, top_p=0.9, seed=5 + i)
    r = client.completions.create(model=NAME, prompt=[P1, P2], max_tokens=4, temperature=0, logprobs=2)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [expected_text(P1, 4), expected_text(P2, 4)]
    lp = r.choices[0].logprobs
    # each token's text within the completion: they concatenate to it, offsets where each starts
    assert "".join(lp.tokens) == expected_text(P1, 4) and [t.strip() for t in lp.tokens] == expected_text(P1, 4).split()
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(4)] and len(lp.token_logprobs) == 4
    assert all(len(t) == 2 and max(t.values()) == pytest.approx(v) for t, v in zip(lp.top_logprobs, lp.token_logprobs))
    # greedy: the likeliest alternative is the chosen token, with the same text in the same place
    assert [max(t, key=t.get) for t in lp.top_logprobs] == lp.tokens
    ids = [3, 17, 42]
    r = client.completions.create(model=NAME, prompt=ids, max_tokens=5, temperature=0)
    assert r.choices[0].text == expected_text(ids, 5)


def test_vllm_extra_sampling_parameters(server: Server) -> None:
    """top_k, min_p, repetition_penalty (vLLM's extra parameters) reach the engine: the text is
    generate()'s with the same options."""
    with httpx.Client(base_url=server.url, timeout=60) as h:
        body = dict(prompt=P1, max_tokens=9, temperature=0.8, top_k=5, min_p=0.05, repetition_penalty=1.4, seed=5,
                    min_tokens=3)
        r = h.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == expected_text(P1, 9, do_sample=True, temperature=0.8, top_k=5,
                                                               min_p=0.05, repetition_penalty=1.4, seed=5)
        r = h.post("/v1/completions", json=dict(prompt=P1, max_tokens=6, temperature=0, repetition_penalty=1.5))
        assert r.json()["choices"][0]["text"] == expected_text(P1, 6, repetition_penalty=1.5)
        r = h.post("/v1/completions", json=dict(prompt=P1, max_tokens=6, temperature=0.5, top_k=-1, seed=1))
        assert r.json()["choices"][0]["text"] == expected_text(P1, 6, do_sample=True, temperature=0.5, top_k=0, seed=1)


def test_logit_bias(server: Server) -> None:
    """OpenAI's logit_bias: the text is generate()'s with the biases as one-id sequence_bias;
    -100 on greedy's tokens keeps every one of them out."""
    greedy = expected(P1, 6)
    with httpx.Client(base_url=server.url, timeout=60) as h:
        bias = {str(t): -100 for t in greedy}
        r = h.post("/v1/completions", json=dict(prompt=P1, max_tokens=6, temperature=0, logit_bias=bias))
        assert r.status_code == 200, r.text
        want = expected(P1, 6, sequence_bias={(t,): -100.0 for t in greedy})
        assert r.json()["choices"][0]["text"] == expected_text(P1, 6, sequence_bias={(t,): -100.0 for t in greedy})
        assert not set(want) & set(greedy)
        r = h.post("/v1/completions", json=dict(prompt=P1, max_tokens=5, temperature=0.7, seed=3,
                                                logit_bias={"7": 2.5, "42": -1}))
        assert r.json()["choices"][0]["text"] == expected_text(P1, 5, do_sample=True, temperature=0.7, top_k=0, seed=3,
                                                               sequence_bias={(7,): 2.5, (42,): -1.0})


@pytest.mark.parametrize("chat", [False, True])
def test_stream_usage_stop_token_ids_and_ignore_eos(server: Server, chat: bool) -> None:
    """stream_options.include_usage: a last chunk with no choices and the usage; vLLM's
    stop_token_ids end a choice ("stop") on those ids, ignore_eos runs past the eos ids."""
    new = expected(P1, 8)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    prompt = dict(messages=[{"role": "user", "content": P1}]) if chat else dict(prompt=P1)
    with httpx.Client(base_url=server.url, timeout=60) as h:
        body = dict(prompt, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})
        events = []
        with h.stream("POST", path, json=body) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        last = events[-1]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 8
        assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 8
        assert all("usage" not in e for e in events[:-1])
        if chat:
            return
        stop_at = new[2]
        r = h.post(path, json=dict(prompt, max_tokens=8, temperature=0, stop_token_ids=[stop_at])).json()
        k = new.index(stop_at) + 1
        assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == k
        assert r["choices"][0]["text"] == expected_text(P1, k)
        both = dict(prompt, max_tokens=8, temperature=0, stop_token_ids=[stop_at], ignore_eos=True)
        assert h.post(path, json=both).json()["usage"]["completion_tokens"] == k  # (stop ids still stop)


@pytest.mark.parametrize("stream", [False, True])
def test_min_tokens_holds_stop_strings_back(server: Server, stream: bool) -> None:
    """vLLM's min_tokens: stop strings take effect from that many tokens on; one completed
    before stays in the text."""
    new = expected(P1, 12)
    stop = f"w{new[0]}"  # the first token's text: without min_tokens the completion stops at once
    with httpx.Client(base_url=server.url, timeout=60) as h:
        def text(**kw: Any) -> Tuple[str, Any]:
            body = dict(prompt=P1, max_tokens=12, temperature=0, stop=[stop], **kw)
            if not stream:
                c = h.post("/v1/completions", json=body).json()["choices"][0]
                return c["text"], c["finish_reason"]
            out, reason = "", None
            with h.stream("POST", "/v1/completions", json=dict(body, stream=True)) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        c = json.loads(line[6:])["choices"][0]
                        out += c["text"]
                        reason = c.get("finish_reason") or reason
            return out, reason

        assert text() == (" ", "stop")
        full = expected_text(P1, 12)
        got, reason = text(min_tokens=3)
        later = [i for i, t in enumerate(new) if i >= 3 and t == new[0]]  # a later stop, if the text has one
        assert got.startswith(expected_text(P1, 3))
        if later:
            assert reason == "stop" and len(got) < len(full)
        else:
            assert (got, reason) == (full, "length")

@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("span", [False, True], ids=["inside a token", "across tokens"])
def test_logprob_tokens_end_where_a_stop_string_cuts(client: Any, stream: bool, span: bool) -> None:
    """A stop string ending the text inside a token, or spanning two tokens (the first one's text
    held back, then cut): the logprob tokens end with the text (they concatenate to it), and chat
    lists no token past the cut."""
    full = expected_text(P1, 6)
    words_ = full.split(" ")
    stop = (words_[2] + " " + words_[3]) if span else words_[2][:2]
    if stream:
        parts = list(client.completions.create(model=NAME, prompt=P1, max_tokens=6, temperature=0, stop=[stop],
                                               logprobs=0, stream=True))
        text = "".join(p.choices[0].text for p in parts)
        toks = [t for p in parts if p.choices[0].logprobs for t in p.choices[0].logprobs.tokens]
    else:
        c = client.completions.create(model=NAME, prompt=P1, max_tokens=6, temperature=0, stop=[stop],
                                      logprobs=0).choices[0]
        text, toks = c.text, c.logprobs.tokens
    assert text == full[:full.index(stop)] and "".join(toks) == text
    msgs = [{"role": "user", "content": P2}]
    want = expected_text(_chat_ids(msgs), 6, chat=True)
    cut = want.split(" ")[1][:2]
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=6, temperature=0, stop=[cut],
                                       logprobs=True)
    content = r.choices[0].message.content
    assert content == want[:want.index(cut)] and "".join(c.token for c in r.choices[0].logprobs.content) == content


def test_stop_strings(client: Any) -> None:
    full = expected_text(P1, 12).split()
    stop = full[4]
    first = full.index(stop)
    r = client.completions.create(model=NAME, prompt=P1, max_tokens=12, temperature=0, stop=[stop, "zz"])
    assert r.choices[0].text == "".join(" " + w for w in full[:first]) + " " and r.choices[0].finish_reason == "stop"
    parts = [c.choices[0] for c in client.completions.create(model=NAME, prompt=P1, max_tokens=12, temperature=0,
                                                              stop=stop, stream=True)]
    assert "".join(p.text for p in parts) == r.choices[0].text and parts[-1].finish_reason == "stop"


def _chat_ids(messages: List[Dict[str, str]], template: str = DEFAULT_CHAT_TEMPLATE) -> List[int]:
    import jinja2

    text = jinja2.Environment().from_string(template).render(messages=messages, add_generation_prompt=True)
    return TOK.encode(text, add_special_tokens=False).ids


def test_chat_openai_client(client: Any) -> None:
    msgs = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": P2}]
    want = expected_text(_chat_ids(msgs), 7, chat=True)
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=7, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=NAME, messages=msgs, max_tokens=7, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert [c.token.strip() for c in content] == want.split()[:3] and all(len(c.top_logprobs) == 2 for c in content)
    assert [max(c.top_logprobs, key=lambda a: a.logprob).token for c in content] == [c.token for c in content]
    three = r.choices[0].message.content
    assert "".join(c.token for c in content) == three and bytes(b for c in content for b in c.bytes) == three.encode()


def test_models_health_metrics(server: Server, client: Any) -> None:
    assert [m.id for m in client.models.list().data] == [NAME]
    with httpx.Client(base_url=server.url, timeout=30) as h:
        assert h.get("/health").json() == {"status": "ok"}
        text = h.get("/metrics").text
    for name in ("olkv_requests_total", "olkv_tokens_per_second", "olkv_queue_depth", "olkv_cache_reserved_bytes",
                 "olkv_cache_blocks_used", "olkv_prefix_cache_hits_total", "olkv_http_requests_total"):
        assert f"# TYPE {name} " in text, name
    assert 'olkv_http_requests_total{route="/v1/completions",status="200"}' in text
    assert "\nolkv_cache_blocks_used NaN\n" in text  # contiguous layout: no blocks


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "JSON object"),
    ("/v1/completions", {"prompt": P1, "temperature": "hot"}, 400, "'temperature' must be a number"),
    ("/v1/completions", {"prompt": P1, "temperature": 7}, 400, "'temperature' must be in"),
    ("/v1/completions", {"prompt": P1, "n": 0}, 400, "'n' must be in"),
    ("/v1/completions", {"prompt": P1, "max_tokens": 10 ** 9}, 400, "maximum context length"),
    ("/v1/completions", {"prompt": P1, "max_tokens": -1}, 400, "'max_tokens' must be >= 1"),
    ("/v1/completions", {"prompt": P1, "max_tokens": True}, 400, "'max_tokens' must be an integer"),
    ("/v1/completions", {"prompt": 5}, 400, "'prompt' must be"),
    ("/v1/completions", {"prompt": [1, 100000]}, 400, "token-id prompts"),
    ("/v1/completions", {"prompt": "w1 \udcff"}, 400, "not valid Unicode"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, 400, "not valid Unicode"),
    ("/v1/chat/completions", {"messages": [{"role": "\ud800", "content": "w1"}]}, 400, "not valid Unicode"),
    ("/v1/completions", {"prompt": P1, "stop": [1]}, 400, "'stop' must be"),
    ("/v1/completions", {"prompt": P1, "logprobs": 9}, 400, "'logprobs' must be in"),
    ("/v1/completions", {"prompt": P1, "model": "gpt-9"}, 404, "does not exist"),
    ("/v1/chat/completions", {"messages": []}, 400, "'messages' must be"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "'role'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400, "content must be a string"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "top_logprobs": 2}, 400,
     "needs 'logprobs'"),
    # an integer beyond any float, and JSON nested beyond the parser's recursion limit
    ("/v1/completions", b'{"prompt": "w1", "temperature": ' + b"9" * 400 + b"}", 400, "'temperature' must be in"),
    ("/v1/completions", b'{"prompt": "w1", "top_p": -' + b"9" * 400 + b"}", 400, "'top_p' must be in"),
    ("/v1/completions", b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, "nested too deeply"),
    ("/v1/completions", {"prompt": [[1, 2]] * 17}, 400, "at most 16 prompts"),
    ("/v1/completions", {"prompt": P1, "top_k": -2}, 400, "'top_k' must be"),
    ("/v1/completions", {"prompt": P1, "top_k": 2 ** 40}, 400, "'top_k' must be"),
    ("/v1/completions", {"prompt": P1, "min_p": 1.5}, 400, "'min_p' must be in"),
    ("/v1/completions", {"prompt": P1, "repetition_penalty": 0}, 400, "'repetition_penalty' must be > 0"),
    ("/v1/completions", {"prompt": P1, "max_tokens": 4, "min_tokens": 5}, 400, "'min_tokens' must be in"),
    ("/v1/completions", {"prompt": P1, "presence_penalty": 0.5}, 400, "not supported"),
    ("/v1/completions", {"prompt": P1, "logit_bias": [1, 2]}, 400, "'logit_bias' must be an object"),
    ("/v1/completions", {"prompt": P1, "stream_options": {"include_usage": True}}, 400, "only allowed with"),
    ("/v1/completions", {"prompt": P1, "stream": True, "stream_options": {"include_usage": 1}}, 400,
     "'include_usage' must be a boolean"),
    ("/v1/completions", {"prompt": P1, "stop_token_ids": [-1]}, 400, "'stop_token_ids' must be"),
    ("/v1/completions", {"prompt": P1, "stop_token_ids": 3}, 400, "'stop_token_ids' must be"),
    ("/v1/completions", {"prompt": P1, "ignore_eos": "yes"}, 400, "'ignore_eos' must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}],
                              "response_format": {"type": "json_object"}}, 400, "not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "no tool calling"),
    ("/v1/completions", {"prompt": P1, "best_of": 3}, 400, "'best_of' other than 'n'"),
    ("/v1/completions", {"prompt": P1, "logit_bias": {"x": 1}}, 400, "'logit_bias' keys must be token ids"),
    ("/v1/completions", {"prompt": P1, "logit_bias": {"-3": 1}}, 400, "'logit_bias' keys must be token ids"),
    ("/v1/completions", {"prompt": P1, "logit_bias": {"3": 101}}, 400, "'logit_bias' must be in"),
    ("/v1/completions", {"prompt": P1, "logit_bias": {"3": "1"}}, 400, "'logit_bias' must be a number"),
    ("/v1/completions", {"prompt": P1, "logit_bias": {"99999": 1}}, 400, "sequence_bias: token id 99999"),
    # a body past the server's limit (8 MiB): refused before it is parsed or tokenized
    ("/v1/completions", b'{"prompt": "' + b"w1 " * (3 << 20) + b'"}', 413, "exceeds the server's limit"),
    ("/v1/completions", {"prompt": P1, "max_tokens": 2, "seed": 2 ** 63 - 1, "n": 2}, 400, "'seed' must be in"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": words(range(100))}]}, 400,
     "and no room is left for a completion"),  # no max_tokens sent: the prompt alone is too long
])
def test_malformed_requests(server: Server, path: str, body: Any, status: int, needle: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as h:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = h.post(path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert needle in err["message"] and err["type"] == "invalid_request_error"
        if "no room" in needle:
            assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
        assert h.get("/health").status_code == 200


@pytest.mark.parametrize("method, path, status", [("GET", "/v1/completions", 405), ("POST", "/v1/embeddings", 404),
                                                  ("POST", "/v1/models", 405), ("GET", "/nothing", 404)])
def test_unknown_routes_and_methods_get_openai_error_bodies(server: Server, method: str, path: str,
                                                            status: int) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as h:
        r = h.request(method, path)
        assert r.status_code == status and r.headers["content-type"].startswith("application/json")
        err = r.json()["error"]
        assert path in err["message"] and err["type"] == "invalid_request_error"


def _wait(cond: Any, what: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts(server: Server, monkeypatch: Any, stream: bool) -> None:
    """A client that goes away while its tokens keep coming has its request aborted, streamed
    or not (a non-streaming request's connection is checked while it runs, not only when idle)."""
    eng = server.engine
    before = eng.stats()
    step = eng.step

    def slow_step() -> Any:  # so that the 80 tokens cannot all be produced before the disconnect is seen
        time.sleep(0.02)
        return step()

    monkeypatch.setattr(eng, "step", slow_step)
    body = json.dumps({"prompt": P1, "max_tokens": 80, "stream": stream}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        _wait(lambda: eng.stats()["generated_tokens"] >= before["generated_tokens"] + 3, "the request runs")
    _wait(lambda: eng.stats()["finished"]["abort"] > before["finished"]["abort"] and eng.stats()["running"] == 0,
          "the disconnected request was not aborted")
    monkeypatch.undo()
    after = eng.stats()
    assert after["finished"]["length"] == before["finished"]["length"]
    assert after["generated_tokens"] - before["generated_tokens"] < 80
    # the server keeps serving
    with httpx.Client(base_url=server.url, timeout=30) as h:
        r = h.post("/v1/completions", json={"prompt": P2, "max_tokens": 3, "temperature": 0})
        assert r.json()["choices"][0]["text"] == expected_text(P2, 3)


def test_a_queued_stream_whose_client_left_is_never_prefilled(server: Server, monkeypatch: Any) -> None:
    """A streaming request whose client leaves before its first token (here while the engine's
    step is held) is aborted before its prompt is prefilled, as a non-streaming one is."""
    eng = server.engine
    gate = threading.Event()
    step = eng.step

    def held_step() -> Any:
        gate.wait(20)
        return step()

    monkeypatch.setattr(eng, "step", held_step)
    before = eng.stats()
    body = json.dumps({"prompt": P1, "max_tokens": 5, "stream": True}).encode()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(0.5)
        time.sleep(1.0)  # the client is polled every 0.25 s
    finally:
        gate.set()
        monkeypatch.undo()
    _wait(lambda: eng.stats()["finished"]["abort"] > before["finished"]["abort"], "the request was not aborted")
    _wait(lambda: eng.stats()["running"] == 0 and eng.stats()["queued"] == 0, "the engine did not drain")
    assert eng.stats()["prompt_tokens"] == before["prompt_tokens"]


def test_32_concurrent_streaming_clients(server: Server) -> None:
    rng = np.random.default_rng(0)
    cases = []
    for i in range(32):
        prompt = words(rng.integers(0, 255, size=int(rng.integers(2, 20))))
        n = int(rng.integers(4, 24))
        sampled = i % 3 == 0
        kw = dict(do_sample=True, temperature=0.7, seed=i) if sampled else {}
        cases.append((prompt, n, sampled, expected_text(prompt, n, **kw)))

    async def one(h: Any, prompt: str, n: int, sampled: bool, i: int) -> str:
        body = {"prompt": prompt, "max_tokens": n, "stream": True, "temperature": 0.7 if sampled else 0}
        if sampled:
            body["seed"] = i
        text = []
        async with h.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            done = False
            async for line in r.aiter_lines():
                if not line:
                    continue
                assert line.startswith("data: ")
                if line == "data: [DONE]":
                    done = True
                    break
                text.append(json.loads(line[6:])["choices"][0]["text"])
            assert done
        return "".join(text)

    async def all_of() -> List[str]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     limits=httpx.Limits(max_connections=64)) as h:
            return await asyncio.gather(*(one(h, p, n, s, i) for i, (p, n, s, _) in enumerate(cases)))

    t0 = time.time()
    got = asyncio.run(asyncio.wait_for(all_of(), timeout=120))
    assert time.time() - t0 < 120
    for i, (g, (_, _, _, want)) in enumerate(zip(got, cases)):
        assert g == want, f"client {i}"


def test_chat_template_from_tokenizer_config(tmp_path: Any) -> None:
    TOK.save(str(tmp_path / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w7{% endif %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    eng = Engine(ours(MODEL), max_batch=4, max_length=MAX_LENGTH)
    srv = Server(create_app(eng, str(tmp_path / "tokenizer.json"), model_name=NAME))
    try:
        msgs = [{"role": "user", "content": "w4 w5 w6"}]
        assert _chat_ids(msgs, template) == [4, 5, 6, 7]
        with httpx.Client(base_url=srv.url, timeout=30) as h:
            r = h.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 5, "temperature": 0})
        assert r.json()["choices"][0]["message"]["content"] == expected_text([4, 5, 6, 7], 5, chat=True)
    finally:
        srv.stop()


def test_chat_default_max_tokens_fits_a_short_position_table(tmp_path: Any) -> None:
    """A model that addresses fewer positions than the engine's max_length: the engine serves
    max_positions + 1 of them, so a chat request without max_tokens fills exactly that (it got a
    400 asking for max_length - prompt new tokens, which the model cannot run)."""
    from onnx_light_kv import models

    rows = 40
    cfg = models.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256, max_positions=rows)
    path = tmp_path / "m.onnx"  # the position table is read from the model file
    path.write_bytes(models.model_bytes(models.build("llama", cfg, attention_mask_input=True)))
    sess = olkv.InferenceSession(str(path))
    eng = Engine(sess, max_batch=2, max_length=MAX_LENGTH)
    assert eng.max_length == rows + 1
    srv = Server(create_app(eng, TOK, model_name=NAME))
    try:
        msgs = [{"role": "user", "content": "w4 w5 w6"}]
        prompt = _chat_ids(msgs)
        with httpx.Client(base_url=srv.url, timeout=60) as h:
            r = h.post("/v1/chat/completions", json={"messages": msgs, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        new = rows + 1 - len(prompt)
        # the usage counts every new token, those without text (the special <pad>, 255) too
        assert body["usage"]["completion_tokens"] == new
        assert body["choices"][0]["finish_reason"] == "length"
        want = olkv.generate(sess, np.array(prompt), max_new_tokens=new).new_tokens[0]
        assert 255 in want.tolist()  # (this case does produce tokens without text)
        assert body["choices"][0]["message"]["content"] == TOK.decode([int(t) for t in want])
    finally:
        srv.stop()


def test_chat_templates_render_as_transformers_does(tmp_path: Any) -> None:
    """The tokenizer config's bos/eos tokens reach the template, an undefined name tests false
    (Qwen 2.5's `{% if tools %}` failed every request), {% continue %} works, blocks trim their
    newline; a template that reaches Python's internals is refused in its sandbox (it ran shell
    commands); one that does not compile fails create_app with ValueError (the server exited
    with a traceback after loading the model)."""
    TOK.save(str(tmp_path / "tokenizer.json"))
    template = ("{{ bos_token }} {% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
                "{{ m['content'] }} {% endfor %}{% if tools %}w1{% endif %}"
                "{% if add_generation_prompt %}w7 {{ eos_token }}{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "bos_token": {"content": "w9"}, "eos_token": "w8"}))
    eng = Engine(ours(MODEL), max_batch=4, max_length=MAX_LENGTH)
    srv = Server(create_app(eng, str(tmp_path / "tokenizer.json"), model_name=NAME))
    try:
        msgs = [{"role": "system", "content": "w3"}, {"role": "user", "content": "w4 w5 w6"}]
        with httpx.Client(base_url=srv.url, timeout=30) as h:
            r = h.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 5, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 6  # w9 w4 w5 w6 w7 w8: no system, no tools
        assert r.json()["choices"][0]["message"]["content"] == expected_text([9, 4, 5, 6, 7, 8], 5, chat=True)
    finally:
        srv.stop()
    proof = tmp_path / "proof.txt"
    evil = "{{ cycler.__init__.__globals__.os.popen('touch " + str(proof) + "').read() }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": evil}))
    eng = Engine(ours(MODEL), max_batch=4, max_length=MAX_LENGTH)
    srv = Server(create_app(eng, str(tmp_path / "tokenizer.json"), model_name=NAME))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as h:
            r = h.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2})
        assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
        assert not proof.exists()
    finally:
        srv.stop()
    with pytest.raises(ValueError, match=r"the chat template does not compile: .* \(line 1\)"):
        create_app(Engine(ours(MODEL), max_length=MAX_LENGTH), TOK, chat_template="{% for m in messages %}{{ m }")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_with_several_choices(server: Server, stream: bool) -> None:
    """n > 1 with a stop string: every choice ends before its stop string (outputs the engine had
    already queued for a stopped choice raised KeyError: a 500, or a stream cut off)."""
    body = {"prompt": P1, "max_tokens": 12, "n": 3, "temperature": 1.0, "seed": 5, "stop": ["3"], "stream": stream}
    with httpx.Client(base_url=server.url, timeout=60) as h:
        r = h.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        if stream:
            texts, reasons = [""] * 3, [None] * 3
            lines = [x[6:] for x in r.text.splitlines() if x.startswith("data: ")]
            assert lines[-1] == "[DONE]"
            for x in lines[:-1]:
                c = json.loads(x)["choices"][0]
                texts[c["index"]] += c["text"]
                reasons[c["index"]] = c["finish_reason"] or reasons[c["index"]]
        else:
            cs = r.json()["choices"]
            texts, reasons = [c["text"] for c in cs], [c["finish_reason"] for c in cs]
    for i in range(3):
        full = expected_text(P1, 12, do_sample=True, temperature=1.0, seed=5 + i)
        cut = full.find("3")
        assert texts[i] == (full if cut < 0 else full[:cut]) and reasons[i] == ("stop" if cut >= 0 else "length")


def test_cli_serve(tmp_path: Any) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(model(MODEL).SerializeToString())
    TOK.save(str(tmp_path / "tokenizer.json"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "onnx_light_kv", "serve", str(path), "--tokenizer",
                             str(tmp_path / "tokenizer.json"), "--port", str(port), "--max-batch", "4",
                             "--max-length", "64", "--threads", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.time() < deadline, "the CLI server did not come up"
            time.sleep(0.2)
        r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": P2, "max_tokens": 4, "temperature": 0},
                       timeout=30)
        assert r.json()["choices"][0]["text"] == expected_text(P2, 4)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_engine_loop_fails_only_the_request_whose_prompt_fails() -> None:
    """A request whose prefill the model refuses gets the error through its own callback; the
    loop counts no step error and a request beside it completes."""
    from onnx_light_kv.serve.http import EngineLoop

    eng = Engine(ours(MODEL), max_batch=4, max_length=MAX_LENGTH)
    eng._vocab = None  # as for a model whose logits have a symbolic vocabulary
    loop = EngineLoop(eng)
    got: Dict[str, List[Any]] = {"good": [], "bad": []}
    try:
        loop.submit([3, 17, 42], got["good"].append, max_new_tokens=4)
        loop.submit([3, 99999], got["bad"].append, max_new_tokens=4)
        _wait(lambda: got["bad"] and got["good"] and got["good"][-1][0].finished, "both requests end")
    finally:
        loop.close()
    assert len(got["bad"]) == 1 and isinstance(got["bad"][0], ValueError) and "99999" in str(got["bad"][0])
    assert sum(len(item[0].tokens) for item in got["good"]) == 4 and loop.step_errors == 0


def test_engine_loop_close_leaves_a_long_step_to_finish() -> None:
    """close() while a step runs past its wait: the engine is not closed under the step (the
    step failed with IndexError and the engine kept a live state); the thread closes it once the
    step ends, with no step error."""
    from onnx_light_kv.serve.http import EngineLoop

    eng = Engine(ours(MODEL), max_batch=4, max_length=MAX_LENGTH)
    started, release = threading.Event(), threading.Event()
    real_step = eng.step

    def slow_step() -> Any:
        started.set()
        release.wait(30)
        return real_step()

    eng.step = slow_step  # type: ignore[method-assign]
    loop = EngineLoop(eng)
    loop.close_wait_s = 0.05
    got: List[Any] = []
    loop.submit([3, 17, 42], got.append, max_new_tokens=4)
    assert started.wait(30)
    loop.close()
    assert loop._thread.is_alive() and not eng._closed  # left to the thread
    release.set()
    loop._thread.join(30)
    assert not loop._thread.is_alive() and eng._closed and loop.step_errors == 0


def _per_position() -> int:
    with Engine(ours(MODEL), max_length=MAX_LENGTH) as eng:
        return eng.stats()["request_bytes"] // MAX_LENGTH


def test_a_request_that_can_never_fit_the_budget_is_refused_alone(monkeypatch: Any) -> None:
    """On a paged engine with a budget of two blocks, a request needing three gets a 400 up
    front while a request running beside it completes."""
    eng = Engine(ours(MODEL), max_length=MAX_LENGTH, block_size=16, budget=2 * 16 * _per_position())
    step = eng.step

    def slow_step() -> Any:  # the small request still runs when the big one arrives
        time.sleep(0.01)
        return step()

    monkeypatch.setattr(eng, "step", slow_step)
    srv = Server(create_app(eng, TOK, model_name=NAME))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as h:
            small = {"prompt": P2, "max_tokens": 20, "temperature": 0, "stream": True}  # 22 positions
            with h.stream("POST", "/v1/completions", json=small) as r:
                lines = r.iter_lines()
                parts = [next(lines)]
                big = h.post("/v1/completions", json={"prompt": P1, "max_tokens": 40})  # 47 positions
                assert big.status_code == 400 and "can never fit" in big.json()["error"]["message"], big.text
                parts += list(lines)
        text = "".join(json.loads(p[6:])["choices"][0]["text"] for p in parts if p.startswith("data: {"))
        assert text == expected_text(P2, 20)
        assert srv.app.state.olkv["server"].loop.step_errors == 0
    finally:
        srv.stop()


@pytest.mark.parametrize("factory", ["none", "given", "failing twice"])
def test_engine_loop_recovers_from_a_failed_step(factory: str) -> None:
    """A step that raises (a failure the engine did not contain) fails the requests in flight;
    the loop goes on with a fresh engine (without a factory: one like the failed engine; while
    the factory fails, submit raises RuntimeError). The failed request's id reaches no request
    of the new engine (its late abort leaves the new request running), and the counters go on
    from the failed engine's."""
    from onnx_light_kv.serve.http import EngineLoop

    sess = ours(MODEL)
    eng = Engine(sess, max_batch=3, max_length=MAX_LENGTH)
    made: List[int] = []

    def make() -> Engine:
        made.append(1)
        if factory == "failing twice" and len(made) <= 2:
            raise MemoryError("no room")
        return Engine(sess, max_batch=3, max_length=MAX_LENGTH)

    def boom() -> Any:
        raise RuntimeError("boom")

    eng.step = boom
    loop = EngineLoop(eng, None if factory == "none" else make)
    got: Dict[str, List[Any]] = {"a": [], "c": []}
    try:
        a = loop.submit([3, 17, 42], got["a"].append, max_new_tokens=4)
        _wait(lambda: got["a"], "the failed step reaches the request in flight")
        assert len(got["a"]) == 1 and isinstance(got["a"][0], RuntimeError) and loop.step_errors == 1
        if factory == "failing twice":
            with pytest.raises(RuntimeError, match="cannot be rebuilt: no room"):
                loop.submit([1, 2], got["c"].append, max_new_tokens=2)
            assert loop.stats()["requests"] == 1 and loop.stats()["finished"]["abort"] == 1
        c = loop.submit([200, 9], got["c"].append, max_new_tokens=5)
        assert c != a and loop.engine is not eng
        assert (loop.engine.max_batch, loop.engine.max_length) == (3, MAX_LENGTH)
        loop.abort(a)  # what the failed request's handler does when it ends
        _wait(lambda: got["c"] and got["c"][-1][0].finished, "the new request ends")
        assert [t for item in got["c"] for t in item[0].tokens] == expected([200, 9], 5)
        st = loop.stats()
        assert st["requests"] == 2 and st["finished"]["abort"] == 1 and st["finished"]["length"] == 1
    finally:
        loop.close()


@pytest.mark.parametrize("factory,statuses", [
    (False, [500, 200]),
    (True, [500, 503, 200]),  # the factory fails at the rebuild and again at the next request
])
def test_app_recovers_after_a_failed_step(factory: bool, statuses: List[int]) -> None:
    """create_app with or without engine_factory: the request in flight when a step raises
    gets a 500, a request while no engine can be made a 503, and then the app serves again."""
    sess = ours(MODEL)
    eng = Engine(sess, max_length=MAX_LENGTH)
    made: List[int] = []

    def make() -> Engine:
        made.append(1)
        if len(made) <= 2:
            raise MemoryError("no room")
        return Engine(sess, max_length=MAX_LENGTH)

    def boom() -> Any:
        raise RuntimeError("boom")

    eng.step = boom
    srv = Server(create_app(eng, TOK, model_name=NAME, engine_factory=make if factory else None))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as h:
            got = []
            for _ in statuses:
                r = h.post("/v1/completions", json={"prompt": P2, "max_tokens": 3, "temperature": 0})
                got.append(r.status_code)
                if r.status_code != 200:
                    assert r.json()["error"]["type"] == "server_error", r.text
            assert got == statuses
            assert r.json()["choices"][0]["text"] == expected_text(P2, 3)
    finally:
        srv.stop()


def test_serve_fails_at_once_where_it_cannot_listen() -> None:
    """A port in use or an unknown host is one OSError naming host:port before the model loads
    (uvicorn reported it only after loading, in its own log lines, with exit status 3)."""
    import socket

    from onnx_light_kv.serve import http as H

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            H.serve("no-such-model.onnx", "no-such-tokenizer.json", port=port)
    with pytest.raises(OSError, match="cannot listen on nosuchhost.invalid"):
        H._check_listen("nosuchhost.invalid", 0)


def test_eos_options_reach_the_engine() -> None:
    """ignore_eos drops the tokenizer's eos ids; stop_token_ids are added to them."""
    from onnx_light_kv.serve.http import _Params

    def eos(**body: Any) -> Any:
        return _Params(dict(prompt="w1", **body), False, 64, 1).engine_options(0, [5, 6])["eos_token_id"]

    assert eos() == [5, 6]
    assert eos(ignore_eos=True) is None
    assert eos(stop_token_ids=[9]) == [5, 6, 9]
    assert eos(ignore_eos=True, stop_token_ids=[9]) == [9]
