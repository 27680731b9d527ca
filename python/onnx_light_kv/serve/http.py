"""An OpenAI-compatible HTTP server over an :class:`~onnx_light_kv.serve.Engine`.

``python -m onnx_light_kv serve MODEL.onnx --tokenizer tokenizer.json`` (extra ``serve``:
starlette, uvicorn, jinja2) serves

* ``POST /v1/completions`` and ``POST /v1/chat/completions``: ``max_tokens``, ``temperature``
  (0: greedy), ``top_p``, ``stop`` (strings), ``seed``, ``n``, ``logprobs`` (completions: the
  number of alternatives, 0-5; chat: ``logprobs`` + ``top_logprobs``), ``stream`` (server-sent
  events ending with ``data: [DONE]``), ``logit_bias`` (token id -> bias in [-100, 100]), and
  vLLM's ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``stop_token_ids`` and
  ``ignore_eos``; ``stream_options.include_usage``; token-id prompts are accepted by
  completions (what the server cannot do, such as ``response_format`` json, ``tools`` or
  ``best_of`` other than ``n``, gets a 400 instead of being ignored);
* ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format).

Chat prompts use the ``chat_template`` of the ``tokenizer_config.json`` next to the tokenizer
when there is one (rendered with jinja2, ``add_generation_prompt=True``), else the default
:data:`DEFAULT_CHAT_TEMPLATE`: one ``role: content`` line per message, then ``assistant:``.

Errors use OpenAI's body (``{"error": {"message", "type", "param", "code"}}``): malformed JSON
or parameters get 400 (as does a request that can never fit the engine), an unknown model 404, a
failed model call 500, an engine that cannot take requests now 503. One thread runs the engine's
steps; the event loop only queues requests and streams tokens, so a client that disconnects has
its request aborted at the next step and nothing a client sends reaches another request's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import os
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple

from .._optional import require
from .._validate import integer
from ..generation.text import check_text
from .engine import Engine, StepOutput

__all__ = ["EngineLoop", "create_app", "serve", "DEFAULT_CHAT_TEMPLATE", "add_arguments", "run"]

_log = logging.getLogger("onnx_light_kv")

#: seconds between two checks that a non-streaming request's client is still connected
_DISCONNECT_POLL_S = 0.25
#: seconds that requests in flight get to finish when ``serve`` is stopped (Ctrl-C, SIGTERM)
_SHUTDOWN_GRACE_S = 5
#: the largest request body :func:`create_app` reads (``max_request_bytes``); a larger one is a 413
MAX_REQUEST_BYTES = 8 << 20
#: the engine stats that count since the start (a rebuilt engine's count on from its predecessor's)
_COUNTERS = ("requests", "prompt_tokens", "generated_tokens", "steps", "admission_paused", "prefix_hits",
             "prefix_tokens")

#: the chat template used when the tokenizer has none (jinja2 syntax, documented in the README)
DEFAULT_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}")


class RequestError(Exception):
    """A client error: HTTP ``status`` with OpenAI's error body."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400,
                 code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> Dict[str, Any]:
        """The JSON error body."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class EngineLoop:
    """Runs ``engine.step()`` on a thread of its own while there is work and hands each
    request's outputs to the callback it was submitted with (called on the loop thread).

    A failed model call ends only the requests it ran (the engine finishes them with
    ``finish_reason == "error"``; their callbacks receive the error). Should a step raise
    nonetheless, the engine's state is unknown: the requests in flight get the error and
    ``factory`` makes a fresh engine (None: :meth:`Engine.fresh`, the same session and options),
    so the server keeps serving. Request ids are never reused, so an abort of a request of the
    failed engine reaches no other; :meth:`stats` keeps counting across engines.
    """

    #: seconds :meth:`close` waits for a running step before leaving the engine to the thread
    close_wait_s = 30.0

    def __init__(self, engine: Engine, factory: Optional[Callable[[], Engine]] = None) -> None:
        self.engine = engine
        self._factory = factory if factory is not None else engine.fresh
        self._lock = threading.Lock()
        self._sinks: Dict[int, Callable[[Any], None]] = {}
        self._wake = threading.Event()
        self._stop = False
        self._lost: Optional[BaseException] = None  # why the last rebuild failed
        self._retired: Dict[str, Any] = {"finished": {}}  # the counters of the engines replaced
        self.step_errors = 0
        self._thread = threading.Thread(target=self._run, name="olkv-engine", daemon=True)
        self._thread.start()

    @property
    def max_length(self) -> int:
        """The engine's positions per sequence."""
        return self.engine.max_length

    def stats(self) -> Dict[str, Any]:
        """The engine's :meth:`~Engine.stats` plus ``step_errors``; the counters (requests,
        finished, tokens, steps, ...) include those of the engines a failed step replaced."""
        with self._lock:
            st = dict(self.engine.stats(), step_errors=self.step_errors)
            past = self._retired
            for k in _COUNTERS:
                st[k] += past.get(k, 0)
            st["finished"] = {r: n + past["finished"].get(r, 0) for r, n in st["finished"].items()}
        return st

    def submit(self, input_ids: Any, sink: Callable[[Any], None], session: Optional[str] = None,
               **options: Any) -> int:
        """Add a request (``Engine.add_request`` options); ``sink`` receives ``(StepOutput,
        logprobs, top_logprobs, finish_reason)`` tuples, or an exception if the engine fails.
        ``session`` (a conversation id) only matters to backends with several engines.

        Raises:
            ValueError, TypeError: the engine refuses the request. RuntimeError: the loop is
            closed, or its engine failed and cannot be rebuilt now.
        """
        with self._lock:
            if self._stop:
                raise RuntimeError("the engine loop is closed")
            if self._lost is not None:  # the rebuild after a failed step failed: try again
                try:
                    self._swap(self._factory())
                except Exception as e:
                    raise RuntimeError(f"the engine failed and cannot be rebuilt: {e}") from e
            rid = self.engine.add_request(input_ids, **options)
            self._sinks[rid] = sink
        self._wake.set()
        return rid

    def abort(self, rid: int) -> None:
        """Abort a request (no more outputs are delivered for it)."""
        with self._lock:
            self._sinks.pop(rid, None)
            self.engine.abort(rid)
        self._wake.set()

    def close(self) -> None:
        """Stop the thread and close the engine. A step still running after 30 s (a very long
        prefill) is not cut short: the thread closes the engine when that step ends (closing it
        under a running step would fail the step)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=self.close_wait_s)
        if self._thread.is_alive():
            _log.warning("the engine step is still running: the engine closes when it ends")
            return
        self.engine.close()

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            if self._stop:
                self.engine.close()  # (again after close() joined it: closing twice does nothing)

    def _loop(self) -> None:
        while not self._stop:
            if not self.engine.has_work():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                outs = self.engine.step()
            except Exception as e:  # a failure the engine did not contain must not end the server
                _log.exception("engine step failed; failing the requests in flight")
                self.step_errors += 1
                with self._lock:
                    sinks, self._sinks = self._sinks, {}
                    self._replace()
                for sink in sinks.values():
                    sink(e)
                continue
            with self._lock:
                for out in outs:
                    sink = self._sinks.get(out.request_id)
                    req = self.engine.request(out.request_id)
                    if sink is not None and req.finish_reason == "error":
                        sink(ValueError(req.error))  # this request alone failed
                    elif sink is not None:
                        n = len(out.tokens)
                        lps = req.token_logprobs[len(req.token_logprobs) - n:] if req.logprobs is not None else None
                        tops = req.top_logprobs[len(req.top_logprobs) - n:] if req.logprobs else None
                        sink((out, lps, tops, req.finish_reason))
                    if out.finished:
                        self._sinks.pop(out.request_id, None)
                        self.engine.release(out.request_id)

    def _replace(self) -> None:
        """Close the engine a step failed in (its requests end) and make a fresh one (under
        the lock). If that fails, the next :meth:`submit` tries again."""
        try:
            self.engine.close()
        except Exception:
            _log.exception("closing the failed engine failed")
        try:
            self._swap(self._factory())
        except Exception as e:
            _log.exception("the engine could not be rebuilt")
            self._lost = e

    def _swap(self, engine: Engine) -> None:
        """Go on with ``engine``, keeping the counters of the closed one (under the lock)."""
        st = self.engine.stats()
        for k in _COUNTERS:
            self._retired[k] = self._retired.get(k, 0) + st[k]
        for r, n in st["finished"].items():
            self._retired["finished"][r] = self._retired["finished"].get(r, 0) + n
        self.engine = engine
        self._lost = None


# -- request parsing ---------------------------------------------------------------------------
def _valid_text(text: str, param: str) -> None:
    """A prompt text tokenizers can encode, else a 400 naming ``param`` (see check_text)."""
    try:
        check_text(text, f"'{param}'")
    except ValueError as e:
        raise RequestError(str(e), param) from None


def _get(body: Dict[str, Any], name: str, kinds: Tuple[type, ...], default: Any, what: str) -> Any:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in kinds:
        raise RequestError(f"'{name}' must be {what}, got {json.dumps(v)}", name)
    if not isinstance(v, kinds):
        raise RequestError(f"'{name}' must be {what}, got {type(v).__name__}", name)
    return v


def _number(body: Dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = _get(body, name, (int, float), default, "a number")
    try:
        v = float(v)
    except OverflowError:  # an integer beyond any float: out of range
        v = math.inf if v > 0 else -math.inf
    if not lo <= v <= hi:
        raise RequestError(f"'{name}' must be in [{lo}, {hi}], got {v}", name)
    return v


def _logit_bias(body: Dict[str, Any]) -> Dict[Tuple[int, ...], float]:
    """OpenAI's ``logit_bias``: ``{"token id": bias}`` with biases in [-100, 100], added to the
    logits of those ids at every step (-100 all but bans a token), as a one-id ``sequence_bias``."""
    raw = _get(body, "logit_bias", (dict,), {}, "an object mapping token ids to numbers")
    out: Dict[Tuple[int, ...], float] = {}
    for key, value in raw.items():
        try:
            tid = int(key) if isinstance(key, str) and key.strip().isdigit() else -1
        except ValueError:
            tid = -1
        if tid < 0:
            raise RequestError(f"'logit_bias' keys must be token ids (non-negative integers), got {json.dumps(key)}",
                               "logit_bias")
        out[(tid,)] = _number({"logit_bias": value}, "logit_bias", 0.0, -100.0, 100.0)
    return out


class _Params:
    """The sampling and output parameters of one completions or chat request."""

    def __init__(self, body: Dict[str, Any], chat: bool, max_length: int, prompt_len: int,
                 session: Optional[str] = None) -> None:
        user = body.get("user")
        if user is not None and not isinstance(user, str):
            raise RequestError("'user' must be a string", "user")
        #: the conversation key for session-affinity routing (x-session-id header, else 'user')
        self.session = session or user
        #: completions' text continues the prompt's (decoded after it); chat content stands alone
        self.chat = chat
        room = max_length - prompt_len
        key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        given = body.get(key) is not None
        # chat's default is the room left, at least one token (the check below refuses none left)
        self.max_tokens = int(_get(body, key, (int,), 16 if not chat else max(room, 1), "an integer"))
        if self.max_tokens < 1:
            raise RequestError(f"'{key}' must be >= 1, got {self.max_tokens}", key)
        if self.max_tokens > room:
            if given:
                more = f"'{key}' asks for {self.max_tokens} more"
            else:
                more = "no room is left for a completion" if room < 1 else (
                    f"only {room} more fit ('{key}' defaults to {self.max_tokens})")
            raise RequestError(f"this model's maximum context length is {max_length} tokens; the prompt has "
                               f"{prompt_len} and {more}", key if given else ("messages" if chat else "prompt"),
                               code="context_length_exceeded")
        self.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        self.top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
        if self.top_p == 0.0:
            raise RequestError("'top_p' must be > 0", "top_p")
        self.n = int(_get(body, "n", (int,), 1, "an integer"))
        if not 1 <= self.n <= 16:
            raise RequestError(f"'n' must be in [1, 16], got {self.n}", "n")
        self.seed = _get(body, "seed", (int,), None, "an integer")
        if self.seed is not None and not 0 <= self.seed <= 2 ** 63 - self.n:  # choice i seeds seed + i
            raise RequestError(f"'seed' must be in [0, 2**63 - n] (choice i uses seed + i), got {self.seed} "
                               f"with n={self.n}", "seed")
        stop = body.get("stop")
        if stop is None:
            self.stop: List[str] = []
        elif isinstance(stop, str):
            self.stop = [stop]
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
            self.stop = list(stop)
        else:
            raise RequestError("'stop' must be a string or a list of at most 4 strings", "stop")
        if any(s == "" for s in self.stop):
            raise RequestError("'stop' strings must not be empty", "stop")
        self.stream = bool(_get(body, "stream", (bool,), False, "a boolean"))
        # vLLM's extra sampling parameters (transformers' meanings; top_k 0 or -1: the whole vocabulary)
        top_k = int(_get(body, "top_k", (int,), 0, "an integer"))
        if not -1 <= top_k <= 2 ** 31:
            raise RequestError(f"'top_k' must be -1, 0 or a positive integer up to 2**31, got {top_k}", "top_k")
        self.top_k = max(top_k, 0)
        self.min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
        self.repetition_penalty = _number(body, "repetition_penalty", 1.0, 0.0, 2.0 ** 64)
        if self.repetition_penalty == 0.0:
            raise RequestError("'repetition_penalty' must be > 0", "repetition_penalty")
        self.min_tokens = int(_get(body, "min_tokens", (int,), 0, "an integer"))
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise RequestError(f"'min_tokens' must be in [0, {key}={self.max_tokens}], got {self.min_tokens}",
                               "min_tokens")
        self.logit_bias = _logit_bias(body)
        # vLLM's ignore_eos and stop_token_ids (ids that end a choice as the eos ids do)
        self.ignore_eos = bool(_get(body, "ignore_eos", (bool,), False, "a boolean"))
        stop_ids = _get(body, "stop_token_ids", (list,), [], "a list of token ids")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2 ** 63 for t in stop_ids):
            raise RequestError("'stop_token_ids' must be a list of token ids (non-negative integers)", "stop_token_ids")
        self.stop_token_ids: List[int] = list(stop_ids)
        options = _get(body, "stream_options", (dict,), {}, "an object")
        if options and not self.stream:
            raise RequestError("'stream_options' is only allowed with 'stream': true", "stream_options")
        #: a last chunk with the usage and no choices (OpenAI's stream_options.include_usage)
        self.include_usage = bool(_get(options, "include_usage", (bool,), False, "a boolean"))
        # what this server cannot do is refused, not ignored
        fmt = _get(body, "response_format", (dict,), {}, "an object")
        if fmt.get("type", "text") != "text":
            raise RequestError(f"'response_format' {json.dumps(fmt.get('type'))} is not supported by this server "
                               "(only \"text\": no constrained decoding)", "response_format")
        for name in ("tools", "functions"):
            if body.get(name):
                raise RequestError(f"'{name}' is not supported by this server (no tool calling)", name)
        best_of = _get(body, "best_of", (int,), None, "an integer")
        if best_of is not None and best_of not in (1, self.n):
            raise RequestError(f"'best_of' other than 'n' is not supported by this server, got {best_of}", "best_of")
        for name in ("presence_penalty", "frequency_penalty"):
            if _number(body, name, 0.0, -2.0, 2.0) != 0.0:
                raise RequestError(f"'{name}' is not supported by this server (only 0)", name)
        if chat:
            self.logprobs = bool(_get(body, "logprobs", (bool,), False, "a boolean"))
            top = int(_get(body, "top_logprobs", (int,), 0, "an integer"))
            if not 0 <= top <= 20:
                raise RequestError("'top_logprobs' must be in [0, 20]", "top_logprobs")
            if top and not self.logprobs:
                raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
            self.top = top
        else:
            lp = _get(body, "logprobs", (int,), None, "an integer")
            if lp is not None and not 0 <= lp <= 5:
                raise RequestError("'logprobs' must be in [0, 5]", "logprobs")
            self.logprobs, self.top = lp is not None, int(lp or 0)
            if _get(body, "echo", (bool,), False, "a boolean"):
                raise RequestError("'echo' is not supported by this server", "echo")
            if body.get("suffix") is not None:
                raise RequestError("'suffix' is not supported by this server", "suffix")

    def engine_options(self, i: int, eos: List[int]) -> Dict[str, Any]:
        """``Engine.add_request`` options of choice ``i`` (seeds ``seed + i``)."""
        sample = self.temperature > 0
        # top_k=0 unless the request gives one: the OpenAI API has no top_k, its sampling covers
        # the whole vocabulary
        return dict(max_new_tokens=self.max_tokens, do_sample=sample, temperature=self.temperature if sample else 1.0,
                    top_k=self.top_k if sample else 0, top_p=self.top_p if sample else 1.0,
                    min_p=self.min_p if sample else 0.0, repetition_penalty=self.repetition_penalty,
                    min_new_tokens=self.min_tokens, sequence_bias=self.logit_bias or None,
                    seed=None if self.seed is None else self.seed + i,
                    eos_token_id=([] if self.ignore_eos else eos) + self.stop_token_ids or None,
                    logprobs=self.top if self.logprobs else None)


#: prompt tokens decoded before the new ones, so that the new text reads as it does after the
#: prompt (a SentencePiece word's leading space, which a decode of the new tokens alone drops)
_CONTEXT_TOKENS = 6


class _TextStream:
    """Incremental detokenization with stop strings: ``push(tokens)`` returns the new text
    (held back while it may be the start of a stop string) and whether a stop string ended it.
    The new tokens are decoded after the last few tokens of ``prompt`` and the text of those
    removed, as vLLM does: ``prompt text + completion`` reads as the decode of both."""

    def __init__(self, tokenizer: Any, stop: List[str], prompt: Sequence[int] = (), min_tokens: int = 0) -> None:
        self.tok, self.stop = tokenizer, stop
        # stop strings take effect from this many tokens on (vLLM's min_tokens): the text of the
        # tokens before is sent whole, so a stop string ending there never matches later
        self.min_tokens = min_tokens
        self.context = list(prompt[-_CONTEXT_TOKENS:])
        self.context_text = tokenizer.decode(self.context, skip_special_tokens=True) if self.context else ""
        self.ids: List[int] = []
        self.sent = 0
        self.text = ""
        self.stopped = False
        self.pieces: List[str] = []  # the text of each token of the last push (see push)
        self.piece_end = 0  # the length of the text of the pieces reported so far
        self.pending: List[Any] = []  # logprob entries whose text is not all sent yet
        self._whole = ""  # the decoded text of self.ids up to its last complete character

    def _decode(self, ids: List[int]) -> str:
        if self.context:
            both = self.tok.decode(self.context + ids, skip_special_tokens=True)
            if both.startswith(self.context_text):
                return both[len(self.context_text):]
        return self.tok.decode(ids, skip_special_tokens=True)

    def _token_pieces(self, tokens: List[int]) -> None:
        """Each new token's text, as the growth of the decoded text it brings: a token that ends
        inside a multi-byte character gets "" and the one completing it the character, so the
        pieces concatenate to the text (a token decoded alone loses a SentencePiece space and
        turns a partial character into U+FFFD)."""
        self.pieces = []
        base = len(self.ids) - len(tokens)
        for k in range(len(tokens)):
            cur = self._decode(self.ids[:base + k + 1])
            if cur.endswith("\ufffd") or not cur.startswith(self._whole):
                self.pieces.append("")
                continue
            self.pieces.append(cur[len(self._whole):])
            self._whole = cur

    def alternatives(self, pos: int, alts: Sequence[int]) -> List[str]:
        """The text each token of ``alts`` would have added in place of ``self.ids[pos]``: each is
        decoded after the tokens before it (the last few, prompt context included) and the text
        of those removed, as :meth:`_token_pieces` does for the chosen token, so a SentencePiece
        word keeps its leading space. A token that ends inside a multi-byte character, or whose
        text does not extend its context's, is decoded alone."""
        ctx = (self.context + self.ids[:pos])[-_CONTEXT_TOKENS:]
        base = self.tok.decode(ctx, skip_special_tokens=False) if ctx else ""
        out = []
        for a in alts:
            text = ""
            if ctx:
                both = self.tok.decode(ctx + [int(a)], skip_special_tokens=False)
                if both.startswith(base) and not both.endswith("\ufffd"):
                    text = both[len(base):]
                else:
                    text = self.tok.decode([int(a)], skip_special_tokens=False)
            else:
                text = self.tok.decode([int(a)], skip_special_tokens=False)
            out.append(text)
        return out

    def sent_entries(self, final: bool) -> List[Any]:
        """The pending logprob entries ``(token, logprob, top, text)`` whose text lies within the
        text sent so far (:attr:`text`): a token whose text is held back (it may start a stop
        string) waits. At the end (``final``: finished or stopped) the token the text ends in
        is cut to its part within it, and the tokens after it are dropped, so the entries'
        texts concatenate to the returned text."""
        out = []
        while self.pending:
            t, lp, top, s = self.pending[0]
            room = len(self.text) - self.piece_end
            if len(s) > room:
                if not final:
                    break
                if room <= 0:
                    self.pending.clear()
                    break
                s = s[:room]
            self.pending.pop(0)
            self.piece_end += len(s)
            out.append((t, lp, top, s))
        return out

    def push(self, tokens: List[int], final: bool = False, pieces: bool = False) -> str:
        """The new text of ``tokens`` (see the class); ``pieces``: also set :attr:`pieces`."""
        self.ids.extend(tokens)
        if pieces:
            self._token_pieces(tokens)
        text = self._decode(self.ids)
        if not final and text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for more
            return ""
        armed = len(self.ids) >= self.min_tokens
        for s in self.stop if armed else ():
            at = text.find(s, max(0, self.sent - len(s)))
            if at >= 0:
                text = text[:at]
                self.stopped = True
        hold = 0
        if armed and not self.stopped and not final:
            for s in self.stop:
                for k in range(min(len(s) - 1, len(text)), 0, -1):
                    if text.endswith(s[:k]):
                        hold = max(hold, k)
                        break
        end = max(self.sent, len(text) - hold)
        piece = text[self.sent:end]
        self.sent = end
        self.text = text[:end]
        return piece


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class _Server:
    """The app's state: engine loop, tokenizer, model name, chat template and counters."""

    def __init__(self, loop: EngineLoop, tokenizer: Any, model_name: str, template: Any,
                 special: Dict[str, str]) -> None:
        self.loop, self.tok, self.model = loop, tokenizer, model_name
        self.template, self.special = template, special
        names = ["</s>", "<|endoftext|>", "<eos>", "<|im_end|>", "<|eot_id|>"]
        if special.get("eos_token"):
            names.insert(0, special["eos_token"])
        self.eos = list(dict.fromkeys(i for i in (tokenizer.token_to_id(t) for t in names) if i is not None))
        self.http = {}  # (route, status) -> count
        self.started = time.time()

    # -- prompts -------------------------------------------------------------------------------
    def completion_prompts(self, body: Dict[str, Any]) -> List[List[int]]:
        p = body.get("prompt")
        if isinstance(p, str):
            prompts: List[Any] = [p]
        elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            prompts = list(p)
        elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            prompts = [p]
        elif isinstance(p, list) and p and all(isinstance(x, list) for x in p):
            prompts = list(p)
        else:
            raise RequestError("'prompt' must be a string, a list of strings, a list of token ids or a list of "
                               "such lists (non-empty)", "prompt")
        if len(prompts) > 16:
            raise RequestError("at most 16 prompts per request", "prompt")
        out = []
        for text in prompts:
            if isinstance(text, list):
                out.append(self._check_ids(text))
                continue
            _valid_text(text, "prompt")
            ids = self.tok.encode(text).ids
            if not ids:
                raise RequestError("a prompt encodes to no tokens", "prompt")
            out.append(list(ids))
        return out

    def _check_ids(self, ids: List[Any]) -> List[int]:
        vocab = self.tok.get_vocab_size()
        if not ids or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < vocab for x in ids):
            raise RequestError(f"token-id prompts must be non-empty lists of ints in [0, {vocab})", "prompt")
        return list(ids)

    def chat_prompt(self, body: Dict[str, Any]) -> List[int]:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise RequestError("'messages' must be a non-empty list", "messages")
        clean = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise RequestError(f"messages[{i}] must be an object with a 'role' string", "messages")
            _valid_text(m["role"], "messages")
            c = m.get("content")
            if isinstance(c, list):  # content parts: text only
                if not all(isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str)
                           for x in c):
                    raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
                c = "".join(x["text"] for x in c)
            if not isinstance(c, str):
                raise RequestError(f"messages[{i}].content must be a string", "messages")
            _valid_text(c, "messages")
            clean.append({"role": m["role"], "content": c})
        try:
            text = self.template.render(messages=clean, add_generation_prompt=True, **{
                "bos_token": "", "eos_token": "", **self.special})
        except RequestError:
            raise
        except Exception as e:
            raise RequestError(f"chat template failed on these messages: {e}", "messages") from None
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if not ids:
            raise RequestError("the messages encode to no tokens", "messages")
        return list(ids)

    # -- running -------------------------------------------------------------------------------
    def start(self, prompt: List[int], opts: Dict[str, Any], session: Optional[str]) -> Tuple[int, "asyncio.Queue[Any]"]:
        loop = asyncio.get_running_loop()
        q: "asyncio.Queue[Any]" = asyncio.Queue()
        try:
            rid = self.loop.submit(prompt, lambda item: loop.call_soon_threadsafe(q.put_nowait, item),
                                   session=session, **opts)
        except (ValueError, TypeError) as e:
            raise RequestError(str(e)) from None
        except RuntimeError as e:  # closed, or its engine failed and cannot be rebuilt now
            raise RequestError(str(e), status=503) from None
        return rid, q

    async def choices(self, prompts: List[List[int]], params: _Params, request: Any, until_first: bool = False
                      ) -> AsyncIterator[Tuple[int, str, Optional[List[Any]], Optional[str], int]]:
        """Yield ``(choice index, text delta, logprob entries, finish_reason, tokens)`` as the
        engine produces them; aborts every request of the call when the consumer stops, or when
        ``request``'s client disconnects (polled; ``until_first``: only until the first yield)."""
        runs = []
        for pi, prompt in enumerate(prompts):
            for j in range(params.n):
                runs.append((len(runs), prompt, j))
        merged: "asyncio.Queue[Any]" = asyncio.Queue()
        rids: Dict[int, int] = {}
        streams = {i: _TextStream(self.tok, params.stop, () if params.chat else prompt, params.min_tokens)
                   for i, prompt, _ in runs}
        pumps = []
        try:
            for i, prompt, j in runs:
                rid, q = self.start(prompt, params.engine_options(j, self.eos), params.session)
                rids[i] = rid

                async def pump(i: int = i, q: "asyncio.Queue[Any]" = q) -> None:
                    while True:
                        item = await q.get()
                        await merged.put((i, item))
                        if isinstance(item, Exception) or item[0].finished:
                            return

                pumps.append(asyncio.ensure_future(pump()))
            left = len(runs)
            clock = asyncio.get_running_loop()
            polled = clock.time()
            yielded = False
            while left:
                if request is not None and until_first and yielded:
                    request = None
                if request is not None and clock.time() - polled >= _DISCONNECT_POLL_S:
                    if await request.is_disconnected():  # (a stream's client is seen by the response)
                        return
                    polled = clock.time()
                try:
                    i, item = await asyncio.wait_for(merged.get(), timeout=_DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    continue
                if i not in rids:  # a choice that ended at a stop string: outputs already queued
                    continue
                if isinstance(item, Exception):
                    raise RequestError(f"the model failed: {item}", status=500)
                out, lps, tops, reason = item
                ts = streams[i]
                piece = ts.push(list(out.tokens), final=out.finished, pieces=lps is not None)
                entries = None
                if lps is not None:
                    first = len(ts.ids) - len(out.tokens)  # the position of this output's first token
                    for k, (t, lp, top, s) in enumerate(zip(out.tokens, lps, tops or [None] * len(lps), ts.pieces)):
                        if top:  # each alternative's text in the place of the chosen token
                            top = list(zip(ts.alternatives(first + k, list(top)), top.values()))
                        ts.pending.append((t, lp, top, s))
                    entries = ts.sent_entries(final=out.finished or ts.stopped)
                if ts.stopped and not out.finished:
                    self.loop.abort(rids[i])
                    left -= 1
                    rids.pop(i)
                    yielded = True
                    yield i, piece, entries, "stop", len(out.tokens)
                    continue
                if out.finished:
                    left -= 1
                    rids.pop(i)
                    yielded = True
                    yield i, piece, entries, "stop" if (ts.stopped or reason == "stop") else "length", len(out.tokens)
                elif piece or entries or out.tokens:  # (tokens without text, as special ones, still count)
                    yielded = True
                    yield i, piece, entries, None, len(out.tokens)
        finally:
            for rid in rids.values():
                self.loop.abort(rid)
            for p in pumps:
                p.cancel()


def create_app(engine: Any, tokenizer: Any, *, model_name: str = "model", chat_template: Optional[str] = None,
               engine_factory: Optional[Callable[[], Engine]] = None,
               max_request_bytes: int = MAX_REQUEST_BYTES) -> Any:
    """The Starlette application serving ``engine`` (see the module docstring). The engine's
    steps run on a thread the app starts at startup and stops at shutdown. ``tokenizer``: a
    ``tokenizers.Tokenizer`` or a ``tokenizer.json`` path (a ``tokenizer_config.json`` next to it
    supplies the chat template unless ``chat_template`` is given). ``engine_factory`` makes the
    fresh engine the app goes on with when a step raises (None: :meth:`Engine.fresh`, one like
    ``engine``; see :class:`EngineLoop`). ``model_name`` is the id ``/v1/models`` lists and
    requests may name (another one gets a 404); ``max_request_bytes`` bounds a request body (a
    larger one gets a 413 before it is parsed).

    ``engine`` may also be a backend with :class:`EngineLoop`'s interface (``submit``, ``abort``,
    ``stats``, ``close``, ``max_length``), such as the Ray Serve router of
    :mod:`onnx_light_kv.serve.ray`, which spreads requests over several engines."""
    starlette = require("starlette")
    del starlette
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    from ..generation.text import load_tokenizer

    special: Dict[str, str] = {}
    if isinstance(tokenizer, (str, os.PathLike)):
        found, special = _template_next_to(os.fspath(tokenizer))
        chat_template = found if chat_template is None else chat_template
    template = compile_chat_template(chat_template or DEFAULT_CHAT_TEMPLATE)
    tok = load_tokenizer(tokenizer)
    state: Dict[str, Any] = {}

    def server() -> _Server:
        if "server" not in state:
            backend = EngineLoop(engine, engine_factory) if isinstance(engine, Engine) else engine
            state["server"] = _Server(backend, tok, model_name, template, special)
        return state["server"]

    def count(route: str, status: int) -> None:
        key = (route, status)
        srv = server()
        srv.http[key] = srv.http.get(key, 0) + 1

    def error(route: str, e: RequestError) -> JSONResponse:
        count(route, e.status)
        return JSONResponse(e.body(), status_code=e.status)

    async def raw_body(request: Request) -> bytes:
        """The body, refused with 413 past ``max_request_bytes`` (declared or read so far), so
        one huge request neither fills memory nor holds the event loop in its parsing."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_request_bytes:
            raise RequestError(f"the request body ({int(declared)} bytes) exceeds the server's limit of "
                               f"{max_request_bytes} bytes", status=413, code="request_too_large")
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_request_bytes:
                raise RequestError(f"the request body exceeds the server's limit of {max_request_bytes} bytes",
                                   status=413, code="request_too_large")
            parts.append(chunk)
        return b"".join(parts)

    def parse_body(raw: bytes) -> Dict[str, Any]:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(f"the request body is not valid JSON: {e}") from None
        except RecursionError:
            raise RequestError("the request body is not valid JSON: nested too deeply") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    def check_model(body: Dict[str, Any]) -> Dict[str, Any]:
        m = body.get("model")
        if m is not None and m != model_name:
            raise RequestError(f"the model '{m}' does not exist (this server serves '{model_name}')", "model",
                               status=404, code="model_not_found")
        return body

    async def completions(request: Request) -> Response:
        return await _generate(request, chat=False)

    async def chat(request: Request) -> Response:
        return await _generate(request, chat=True)

    async def _generate(request: Request, chat: bool) -> Response:
        route = "/v1/chat/completions" if chat else "/v1/completions"
        srv = server()

        def prepare(raw: bytes) -> Tuple[Dict[str, Any], List[List[int]], _Params]:
            body = check_model(parse_body(raw))
            prompts = [srv.chat_prompt(body)] if chat else srv.completion_prompts(body)
            params = _Params(body, chat, srv.loop.max_length, max(len(p) for p in prompts),
                             request.headers.get("x-session-id"))
            return body, prompts, params

        try:
            # parsing, the chat template and tokenization run on a worker thread: the event
            # loop keeps serving other requests' tokens meanwhile
            body, prompts, params = await asyncio.to_thread(prepare, await raw_body(request))
        except RequestError as e:
            return error(route, e)
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        nchoices = len(prompts) * params.n
        usage = {"prompt_tokens": sum(len(p) for p in prompts) * params.n}
        if params.stream:
            # the request is polled for a disconnect until the first token (a queued stream whose
            # client left is dropped before its prefill); then the response sees the client
            gen = srv.choices(prompts, params, request, until_first=True)
            # start the requests now, so that a refused one is a 400, not a broken stream
            try:
                first = await gen.__anext__()
            except StopAsyncIteration:  # every choice yields at least its end: the client went away
                count(route, 499)
                return Response(status_code=499)
            except RequestError as e:
                return error(route, e)
            count(route, 200)
            return StreamingResponse(_stream(srv, gen, first, cid, created, chat, nchoices,
                                             usage if params.include_usage else None),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        texts = [""] * nchoices
        reasons: List[Optional[str]] = [None] * nchoices
        lps: List[List[Any]] = [[] for _ in range(nchoices)]
        ntok = 0
        gen = srv.choices(prompts, params, request)
        try:
            async for i, piece, entries, reason, n in gen:
                texts[i] += piece
                ntok += n
                if entries:
                    lps[i].extend(entries)
                if reason is not None:
                    reasons[i] = reason
        except RequestError as e:
            return error(route, e)
        finally:
            await gen.aclose()
        if any(r is None for r in reasons):  # the client went away
            count(route, 499)
            return Response(status_code=499)
        usage["completion_tokens"] = ntok
        usage["total_tokens"] = usage["prompt_tokens"] + ntok
        choices = []
        for i in range(nchoices):
            if chat:
                c = {"index": i, "message": {"role": "assistant", "content": texts[i]},
                     "logprobs": _chat_logprobs(lps[i]) if params.logprobs else None, "finish_reason": reasons[i]}
            else:
                c = {"index": i, "text": texts[i], "logprobs": _completion_logprobs(lps[i]) if params.logprobs
                     else None, "finish_reason": reasons[i]}
            choices.append(c)
        count(route, 200)
        return JSONResponse({"id": cid, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": model_name, "choices": choices, "usage": usage})

    async def models(request: Request) -> Response:
        count("/v1/models", 200)
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model",
                                                         "created": int(server().started), "owned_by": "onnx-light-kv"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        st = server().loop.stats()
        if inspect.isawaitable(st):  # a backend of remote engines
            st = await st
        return PlainTextResponse(_metrics(server(), st), media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        server()  # starts the engine's thread
        try:
            yield
        finally:
            if "server" in state:
                state["server"].loop.close()

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        # unknown paths and methods get OpenAI's error body too, not starlette's plain text
        status = int(getattr(exc, "status_code", 500))
        what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        return error(request.url.path, RequestError(what.get(status, str(getattr(exc, "detail", exc))), None, status))

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/models", models, methods=["GET"]),
                            Route("/health", health, methods=["GET"]),
                            Route("/metrics", metrics, methods=["GET"])],
                    lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.olkv = state
    return app


async def _stream(srv: _Server, gen: Any, first: Any, cid: str, created: int, chat: bool,
                  nchoices: int, usage: Optional[Dict[str, int]] = None) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed call; ``usage`` (the prompt tokens counted): a last
    chunk with no choices and the usage, as OpenAI's ``stream_options.include_usage`` asks."""
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(i: int, piece: str, entries: Any, reason: Optional[str], role: bool = False) -> bytes:
        if chat:
            delta: Dict[str, Any] = {"role": "assistant", "content": piece} if role else (
                {"content": piece} if piece or reason is None else {})
            c: Dict[str, Any] = {"index": i, "delta": delta, "logprobs": _chat_logprobs(entries) if entries
                                 else None, "finish_reason": reason}
        else:
            c = {"index": i, "text": piece, "logprobs": _completion_logprobs(entries) if entries else None,
                 "finish_reason": reason}
        return _sse({"id": cid, "object": obj, "created": created, "model": srv.model, "choices": [c]})

    try:
        if chat:
            for i in range(nchoices):
                yield chunk(i, "", None, None, role=True)
        item = first
        ntok = 0
        while item is not None:
            i, piece, entries, reason, n = item
            ntok += n
            if piece or entries or reason is not None:  # tokens without text make no chunk
                yield chunk(i, piece, entries, reason)
            try:
                item = await gen.__anext__()
            except StopAsyncIteration:
                item = None
        if usage is not None:
            done = dict(usage, completion_tokens=ntok, total_tokens=usage["prompt_tokens"] + ntok)
            yield _sse({"id": cid, "object": obj, "created": created, "model": srv.model, "choices": [], "usage": done})
        yield b"data: [DONE]\n\n"
    except RequestError as e:
        yield _sse(e.body())
    finally:
        await gen.aclose()  # a disconnect cancels this generator: abort its requests


def _first_per_text(top: List[Tuple[str, float]]) -> Dict[str, float]:
    """``top``'s (text, logprob) pairs as a map, likeliest first; a text that several
    alternatives share keeps the likeliest one's logprob."""
    out: Dict[str, float] = {}
    for k, v in top:
        out.setdefault(k, v)
    return out


def _completion_logprobs(entries: List[Any]) -> Dict[str, Any]:
    tokens, lps, tops, offsets = [], [], [], []
    off = 0
    for t, lp, top, s in entries:  # s: the token's text within the completion's
        tokens.append(s)
        lps.append(lp)
        # (text, logprob) pairs, likeliest first: alternatives with one text (partial characters
        # all read U+FFFD) keep the likeliest's logprob
        tops.append(_first_per_text(top) if top else None)
        offsets.append(off)
        off += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _chat_logprobs(entries: List[Any]) -> Dict[str, Any]:
    content = []
    for t, lp, top, s in entries:  # s: the token's text within the content
        content.append({"token": s, "logprob": lp, "bytes": list(s.encode()),
                        "top_logprobs": [{"token": k, "logprob": v, "bytes": list(k.encode())}
                                         for k, v in (top or [])]})
    return {"content": content}


def _metrics(srv: _Server, st: Dict[str, Any]) -> str:
    lines: List[str] = []

    def metric(name: str, kind: str, help_: str, value: Any, labels: str = "") -> None:
        if not any(l.startswith(f"# HELP {name} ") for l in lines):
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
        v = float("nan") if value is None else float(value)
        lines.append(f"{name}{labels} {'NaN' if v != v else format(v, 'g')}")

    metric("olkv_requests_total", "counter", "Requests added to the engine.", st["requests"])
    for reason, n in st["finished"].items():
        metric("olkv_requests_finished_total", "counter", "Requests finished, by reason.", n, f'{{reason="{reason}"}}')
    metric("olkv_requests_running", "gauge", "Requests decoding.", st["running"])
    metric("olkv_requests_prefilling", "gauge", "Requests whose prompt is being prefilled.", st["prefilling"])
    metric("olkv_queue_depth", "gauge", "Requests waiting for admission.", st["queued"])
    metric("olkv_prompt_tokens_total", "counter", "Prompt tokens prefilled.", st["prompt_tokens"])
    metric("olkv_generation_tokens_total", "counter", "Tokens generated.", st["generated_tokens"])
    metric("olkv_tokens_per_second", "gauge", "Tokens generated per second over the recent steps.", st["tokens_per_s"])
    metric("olkv_engine_steps_total", "counter", "Engine steps run.", st["steps"])
    metric("olkv_cache_reserved_bytes", "gauge", "KV cache bytes reserved by running requests.",
           st["cache_reserved_bytes"])
    metric("olkv_cache_committed_bytes", "gauge", "KV cache bytes committed by the batched state.",
           st["cache_committed_bytes"])
    metric("olkv_cache_blocks_used", "gauge", "Paged cache blocks in use (NaN: contiguous layout).",
           st["cache_blocks_used"])
    metric("olkv_cache_blocks_free", "gauge", "Paged cache blocks free (NaN: contiguous layout).",
           st["cache_blocks_free"])
    metric("olkv_prefix_cache_hits_total", "counter", "Prompt prefixes reused from the prefix cache.", st["prefix_hits"])
    metric("olkv_admission_paused_total", "counter", "Steps that left requests queued for the cache budget.",
           st["admission_paused"])
    metric("olkv_engine_step_errors_total", "counter", "Engine steps that raised.", st.get("step_errors", 0))
    for (route, status), n in sorted(srv.http.items()):
        metric("olkv_http_requests_total", "counter", "HTTP requests by route and status.", n,
               f'{{route="{route}",status="{status}"}}')
    return "\n".join(lines) + "\n"


def compile_chat_template(source: str) -> Any:
    """A chat template compiled as transformers renders them: a sandboxed jinja2 environment (a
    template from a downloaded model must not reach Python's internals: no attribute of a
    function, module or class behind ``__``), ``trim_blocks`` and ``lstrip_blocks``, the
    ``loopcontrols`` extension (``{% break %}``, ``{% continue %}``), undefined names rendering
    as empty (``{% if tools %}``), and ``raise_exception(msg)`` failing the request with a 400.

    Raises:
        ValueError: the template does not compile (named with jinja2's message and line).
    """
    jinja2 = require("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg: str) -> None:
        raise RequestError(f"chat template: {msg}", "messages")

    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        line = getattr(e, "lineno", None)
        raise ValueError(f"the chat template does not compile: {e}" + (f" (line {line})" if line else "")) from None


def _template_next_to(tokenizer_path: str) -> Tuple[Optional[str], Dict[str, str]]:
    """The chat template and the special tokens (``bos_token``, ``eos_token``: strings, or
    transformers' AddedToken dicts' ``content``) of the ``tokenizer_config.json`` beside a
    tokenizer file (None and {} without one)."""
    folder = tokenizer_path if os.path.isdir(tokenizer_path) else os.path.dirname(tokenizer_path)
    cfg = os.path.join(folder, "tokenizer_config.json")
    if not os.path.exists(cfg):
        return None, {}
    try:
        with open(cfg, encoding="utf-8") as f:
            conf = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg}: not valid JSON: {e}") from None
    if not isinstance(conf, dict):
        raise ValueError(f"{cfg}: the tokenizer config must be a JSON object")
    t = conf.get("chat_template")
    if isinstance(t, list):  # named templates: the default one
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    special = {}
    for name in ("bos_token", "eos_token"):
        v = conf.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            special[name] = v
    return (t if isinstance(t, str) else None), special


# -- command line --------------------------------------------------------------------------------
def add_arguments(p: Any) -> None:
    """Register the serve subcommand's options."""
    p.add_argument("model", help="decoder .onnx file (cache path with an attention_mask input)")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json (a tokenizer_config.json next to it may give "
                                                      "the chat template)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--max-batch", type=int, default=16, help="requests decoding at once (one model call per step)")
    p.add_argument("--max-length", type=int, default=2048, help="positions per sequence, prompt included")
    p.add_argument("--max-tokens-per-step", type=int, default=2048, help="prompt tokens prefilled per step")
    p.add_argument("--budget", type=int, default=None, help="bytes the running requests' caches may reserve")
    p.add_argument("--threads", type=int, default=None, help="threads of the session (None: all CPUs)")
    p.add_argument("--model-name", default=None, help="the model id clients send (default: the file's name without .onnx)")
    p.add_argument("--block-size", type=int, default=None,
                   help="paged cache blocks of this many tokens (default: contiguous caches)")
    p.add_argument("--prefix-cache", action="store_true",
                   help="share the caches of common prompt prefixes between requests (paged layout)")


def _check_listen(host: str, port: int) -> None:
    """Raise OSError naming ``host:port`` when the server could not listen there (an unknown
    host, a port in use or not allowed), as uvicorn would only after loading the model, in lines
    of its own log."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(addr)
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve(model: str, tokenizer: str, *, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 16,
          max_length: int = 2048, max_tokens_per_step: int = 2048, budget: Optional[int] = None,
          threads: Optional[int] = None, model_name: Optional[str] = None, block_size: Optional[int] = None,
          prefix_cache: bool = False) -> None:
    """Load ``model`` and serve it with uvicorn until interrupted (``block_size`` /
    ``prefix_cache``: the :class:`Engine` options of those names)."""
    uvicorn = require("uvicorn")
    from .. import InferenceSession

    port = integer(port, "port", lo=0, hi=65535)
    _check_listen(host, port)  # before the model loads: a taken port or unknown host fails at once
    sess = InferenceSession(model, threads=threads)

    def factory() -> Engine:
        return Engine(sess, max_batch=max_batch, max_length=max_length, max_tokens_per_step=max_tokens_per_step,
                      budget=budget, block_size=block_size, prefix_cache=prefix_cache)

    base = os.path.basename(model)
    name = model_name or (base[:-len(".onnx")] if base.endswith(".onnx") else base)
    app = create_app(factory(), tokenizer, model_name=name, engine_factory=factory)
    extra: Dict[str, Any] = {}
    if "timeout_graceful_shutdown" in inspect.signature(uvicorn.Config).parameters:
        # Ctrl-C: streams in flight get this long to end, then are cancelled (their requests
        # aborted), instead of running to their last token
        extra["timeout_graceful_shutdown"] = _SHUTDOWN_GRACE_S
    uvicorn.run(app, host=host, port=port, log_level="info", **extra)


def run(args: Any) -> int:
    """Run the serve subcommand; returns the exit code."""
    serve(args.model, args.tokenizer, host=args.host, port=args.port, max_batch=args.max_batch,
          max_length=args.max_length, max_tokens_per_step=args.max_tokens_per_step, budget=args.budget,
          threads=args.threads, model_name=args.model_name, block_size=args.block_size,
          prefix_cache=args.prefix_cache)
    return 0


__all__ += ["RequestError", "StepOutput"]
