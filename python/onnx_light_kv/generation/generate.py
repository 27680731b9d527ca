"""``generate``: transformers' ``generate`` arguments over any decoder session.

A thin wiring of the strategies: greedy and sampling run through :class:`.Generator`, beam
search through :func:`.beam_search.beam_search`, speculative decoding (a draft model or prompt
lookup) through :func:`.speculative.speculative_decode`; all of them on a runner
(:mod:`.runner`). Rows of a batch run together, except for speculative decoding and for
left-padded batches on a model that cannot mask padding (no ``attention_mask`` input, or
fixed-capacity past buffers): those rows run one after another, each on its own prompt, and
give the same tokens.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

from .._validate import integer, optional_integer, real
from .beam_search import beam_search
from .decoder_io import DecoderIO
from .generator import Generator
from .options import SamplingOptions, StopCondition, check_vocabulary, pad_id, prompt_ids
from .output import GenerationOutput, GenerationStats
from .runner import cache_path_available, make_runner, paged_states_available, require_truncate
from .speculative import DraftModel, PromptLookup, check_draft_vocabulary, speculative_decode
from .text import Progress, Streamer, default_pad_id, encode, load_tokenizer

#: the most rows (prompt rows times ``num_return_sequences``) one sampling call runs at once
_MAX_ROWS = 65536

__all__ = ["generate"]


def _early_stopping(value: Any) -> Union[bool, str]:
    """``early_stopping`` as True, False or "never" (a numpy bool as a bool: beam search tests
    ``is True``)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        if value != "never":
            raise ValueError(f"early_stopping must be True, False or 'never', got {value!r}")
        return value
    raise TypeError(f"early_stopping must be True, False or 'never', got {type(value).__name__} {value!r}")


def _check_length_penalty(length_penalty: float, max_new_tokens: int) -> None:
    """Beam scores divide by ``length ** length_penalty`` for lengths up to ``max_new_tokens``:
    ``ValueError`` unless that power stays a normal float64 (|exponent| <= 700 in e)."""
    top = 700.0 / math.log(max(max_new_tokens, 2))
    if abs(length_penalty) > top:
        raise ValueError(f"length_penalty must lie within +-{top:.4g} for max_new_tokens={max_new_tokens} "
                         f"(length ** length_penalty must stay within float64), got {length_penalty}")


def _prompt(input_ids: Any, attention_mask: Any, tokenizer: Any, pad_token_id: Optional[int],
            eos: Tuple[int, ...] = ()) -> Tuple[np.ndarray, np.ndarray]:
    if isinstance(input_ids, str) or (isinstance(input_ids, (list, tuple)) and input_ids
                                      and all(isinstance(t, str) for t in input_ids)):
        if tokenizer is None:
            raise ValueError("text input needs a tokenizer (a tokenizers.Tokenizer or a tokenizer.json path)")
        if attention_mask is not None:
            raise ValueError("attention_mask is computed from the text; pass token ids to give your own")
        pad = pad_token_id if pad_token_id is not None else (default_pad_id(tokenizer) or 0)
        return encode(tokenizer, input_ids, pad)
    ids, mask = prompt_ids(input_ids, attention_mask, "input_ids")
    if attention_mask is None and pad_token_id is not None and pad_token_id not in eos and (ids == pad_token_id).any():
        # transformers' rule: without a mask, a pad_token_id that is no eos id marks padding
        inferred = (ids != pad_token_id).astype(np.int64)
        if not inferred.any(axis=1).all():
            raise ValueError(f"a row of input_ids holds only pad_token_id={pad_token_id} (read as padding without "
                             "an attention_mask, as transformers reads it): it has no token to continue")
        try:
            return prompt_ids(ids, inferred, "input_ids")
        except ValueError:
            raise ValueError(f"input_ids hold pad_token_id={pad_token_id} elsewhere than as left padding (no "
                             "attention_mask was given, so it is read as padding, as transformers reads it); "
                             "pass attention_mask to say which positions are tokens") from None
    return ids, mask


def generate(session: Any, input_ids: Any, *, max_new_tokens: Optional[int] = None, attention_mask: Any = None,
             max_length: Optional[int] = None, min_new_tokens: int = 0, min_length: int = 0, do_sample: bool = False,
             temperature: float = 1.0, top_k: int = 50, top_p: float = 1.0,
             min_p: float = 0.0, typical_p: float = 1.0, epsilon_cutoff: float = 0.0, eta_cutoff: float = 0.0,
             repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
             bad_words_ids: Optional[Iterable[Iterable[int]]] = None, sequence_bias: Any = None,
             suppress_tokens: Optional[Iterable[int]] = None, begin_suppress_tokens: Optional[Iterable[int]] = None,
             forced_eos_token_id: Union[int, Iterable[int], None] = None,
             exponential_decay_length_penalty: Optional[Tuple[int, float]] = None, num_beams: int = 1, length_penalty: float = 1.0,
             early_stopping: Union[bool, str] = False, num_return_sequences: int = 1,
             eos_token_id: Union[int, Iterable[int], None] = None, pad_token_id: Optional[int] = None,
             stop_sequences: Optional[Iterable[Iterable[int]]] = None, seed: Optional[int] = None,
             draft_session: Any = None, num_draft_tokens: int = 4, prompt_lookup: int = 0, streamer: Any = None,
             progress: bool = False, return_scores: bool = False,
             state_options: Union[None, bool, Dict[str, Any]] = None,
             tokenizer: Any = None) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` tokens per row after ``input_ids`` with ``session``.

    ``session``: our ``InferenceSession`` or an ``onnxruntime.InferenceSession`` of a decoder
    with past/present inputs (recognized names: :mod:`onnx_light_kv.generation.decoder_io`).
    ``input_ids``: ``[batch, s]`` or ``[s]`` ids, left-padded when ``attention_mask`` has
    zeros (without ``attention_mask``, a ``pad_token_id`` that is no eos id marks the padding
    where it occurs, as in transformers; ``ValueError`` when it occurs elsewhere than as left
    padding); or a str / list of str with ``tokenizer`` (a ``tokenizers.Tokenizer`` or a
    ``tokenizer.json`` path; then ``text`` holds the decoded new tokens).
    ``max_length`` (transformers' meaning: positions per row, the prompt's padded width included)
    stands for ``max_new_tokens = max_length - input width`` when ``max_new_tokens`` is not given
    (one of the two is required: ``ValueError``; both: ``max_new_tokens`` wins, as there).
    ``min_new_tokens``: the eos ids are banned (``-inf``) until a row holds that many new
    tokens (stop sequences still stop it); ``min_length`` the same until a row holds that many
    positions, the prompt's padded width included (transformers' meaning). ``no_repeat_ngram_size``: a token that would repeat
    an n-gram of that size already in the row (prompt included, its padding left out) is banned.
    Exactly ``max_new_tokens`` new tokens unless a row stops on ``eos_token_id`` (int or list)
    or on one of ``stop_sequences`` (lists of ids; the stopping tokens are kept); stopped rows
    are padded with ``pad_token_id`` (default: the first eos id inside the model's vocabulary,
    else 0). Token ids (prompt, ``pad_token_id``) beyond a vocabulary the model fixes raise
    ``ValueError`` before the model runs.
    ``do_sample`` with ``temperature``, ``top_k`` (default 50, as in transformers and
    onnxruntime-genai; 0 samples from the whole vocabulary), ``top_p``, ``min_p``, ``typical_p``
    (1: off), ``epsilon_cutoff`` and ``eta_cutoff`` (0: off); ``repetition_penalty`` applies to
    greedy choice too, as do the token constraints ``sequence_bias`` (``{(ids...): bias}`` or
    ``[[ids, bias], ...]``: the bias is added to the last id's logit where a row ends with the
    ids before it), ``bad_words_ids`` (``[[ids], ...]``: sequences never produced),
    ``suppress_tokens`` (ids never produced) and ``begin_suppress_tokens`` (ids not produced as
    the first new token); ``forced_eos_token_id`` (id or ids: the last new token of a row that
    reaches ``max_new_tokens`` is one of them) and ``exponential_decay_length_penalty``
    (``(start, factor)``: after ``start`` new tokens, the eos logits grow by
    ``|logit| * (factor ** n - 1)`` at the n-th further token); their ids must lie inside a
    vocabulary the model fixes (``ValueError``). The rules and their order are transformers' (see
    :mod:`onnx_light_kv.generation.logits_process`); a row's left padding never matches a
    sequence. ``seed`` seeds a ``numpy.random.Generator``.
    ``num_beams > 1``: beam search with ``length_penalty`` (``ValueError`` when
    ``max_new_tokens ** length_penalty`` would leave float64's range) and ``early_stopping``
    (True, False or "never"; another type is a ``TypeError``), returning ``num_return_sequences`` per row; with ``do_sample`` it is beam
    sampling (transformers' rule: the candidates of each step are drawn from the softmax of the
    warped, summed beam scores, the warpers keeping at least ``max(2, number of eos ids + 1)``
    tokens per beam as transformers' ``min_tokens_to_keep``; ``ValueError`` when a row ends with
    fewer distinct hypotheses than ``num_return_sequences``; ``num_beams`` above a vocabulary
    the model fixes is a ``ValueError`` before the model runs). Without beams,
    ``num_return_sequences`` with ``do_sample`` gives that many samples per row (at most 65536
    rows in all, else ``ValueError``).
    Speculative decoding: ``draft_session`` (a smaller decoder with the same vocabulary)
    proposes ``num_draft_tokens`` per verification step, or ``prompt_lookup=n`` proposes up to
    ``n`` tokens copied from after the latest earlier match of the sequence's last 3-, 2- or
    1-gram (transformers' ``prompt_lookup_num_tokens``); greedy output is the greedy output
    token for token, sampled output keeps the target's distribution.
    ``streamer``: transformers-style ``put``/``end`` object or ``callable(tokens, text)`` (see
    :class:`~onnx_light_kv.generation.text.Streamer`; rows that run one after another stream one
    after another, each with its own prompt and ``end``); ``progress=True``: a tqdm bar.
    ``return_scores``: per-step log-probabilities in ``scores``. ``state_options``: None runs
    on the session's cache path (``create_state``) when it rewrites every layer (beam search on
    paged caches, whose beam reorder shares blocks instead of copying duplicated beams), else on
    the tensor path; False forces the tensor path; a dict of ``create_state`` keyword arguments
    (``dtype``, ``budget``, ``max_length``, ``layout``, ``block_size``, ``prefix_cache``,
    ``prefix_cache_bytes``, ``quant``, ``quant_group``, ``k_axis``, ``residual``) requires the
    cache path. Both give the same tokens (a quantized cache: close ones).
    Returns a :class:`GenerationOutput`.
    """
    if max_new_tokens is not None:
        max_new_tokens = integer(max_new_tokens, "max_new_tokens", lo=1)
    elif max_length is None:
        raise ValueError("give max_new_tokens (new tokens per row) or max_length (positions per row, prompt included)")
    if max_length is not None:
        max_length = integer(max_length, "max_length", lo=1)
    opts = SamplingOptions(do_sample, temperature, top_k, top_p, min_p, repetition_penalty, no_repeat_ngram_size,
                           min_new_tokens, typical_p, epsilon_cutoff, eta_cutoff, sequence_bias, bad_words_ids,
                           suppress_tokens, begin_suppress_tokens, forced_eos_token_id,
                           exponential_decay_length_penalty)
    stop = StopCondition.of(eos_token_id, stop_sequences)
    pad_token_id = optional_integer(pad_token_id, "pad_token_id", lo=0)
    num_beams = integer(num_beams, "num_beams", lo=1)
    num_return_sequences = integer(num_return_sequences, "num_return_sequences", lo=1)
    num_draft_tokens = integer(num_draft_tokens, "num_draft_tokens", lo=1)
    prompt_lookup = integer(prompt_lookup, "prompt_lookup", lo=0)
    length_penalty = real(length_penalty, "length_penalty")
    seed = optional_integer(seed, "seed", lo=0)
    for name, flag in (("progress", progress), ("return_scores", return_scores)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    ids, mask = _prompt(input_ids, attention_mask, tok, pad_token_id, stop.eos)
    min_length = integer(min_length, "min_length", lo=0)
    if min_length > ids.shape[1] + opts.min_new_tokens:  # (the larger bound of the two holds)
        opts = dataclasses.replace(opts, min_new_tokens=min_length - ids.shape[1])
    if max_new_tokens is None:
        assert max_length is not None
        if max_length <= ids.shape[1]:
            raise ValueError(f"max_length={max_length} leaves no room after the prompt ({ids.shape[1]} positions); "
                             "raise it or give max_new_tokens")
        max_new_tokens = max_length - ids.shape[1]
    if ids.shape[1] + max_new_tokens > np.iinfo(np.int64).max:
        raise ValueError(f"max_new_tokens={max_new_tokens} after a prompt of {ids.shape[1]} positions exceeds int64")
    early_stopping = _early_stopping(early_stopping)
    speculative = draft_session is not None or prompt_lookup > 0
    if num_beams > 1:
        if speculative:
            raise ValueError("speculative decoding (draft_session / prompt_lookup) does not combine with num_beams > 1")
        if num_return_sequences > num_beams:
            raise ValueError(f"num_return_sequences={num_return_sequences} exceeds num_beams={num_beams}")
        if streamer is not None:
            raise ValueError("a streamer cannot be used with beam search (beams change until the end)")
    elif num_return_sequences > 1:
        if not opts.do_sample:
            raise ValueError("greedy search returns one sequence per row: num_return_sequences > 1 needs "
                             "do_sample=True or num_beams > 1")
        if ids.shape[0] * num_return_sequences > _MAX_ROWS:
            raise ValueError(f"num_return_sequences={num_return_sequences} makes {ids.shape[0] * num_return_sequences} "
                             f"rows of {ids.shape[0]} prompt rows; at most {_MAX_ROWS} rows run at once")
        rows = np.repeat(np.arange(ids.shape[0]), num_return_sequences)
        ids, mask = ids[rows], mask[rows]
    if draft_session is not None and prompt_lookup > 0:
        raise ValueError("give either draft_session or prompt_lookup, not both")

    io = DecoderIO.from_session(session)
    draft_io = DecoderIO.from_session(draft_session) if draft_session is not None else None
    check_vocabulary(ids, io.vocab, "input_ids")
    opts.check_vocabulary(io.vocab)
    pad = pad_id(pad_token_id, stop, io.vocab)
    if num_beams > 1:
        _check_length_penalty(length_penalty, max_new_tokens)
        if io.vocab is not None and num_beams > io.vocab:  # (else beam_search checks at the first step)
            raise ValueError(f"num_beams={num_beams} exceeds the vocabulary ({io.vocab} tokens): there are not "
                             "that many distinct continuations")
    longest = int(mask.sum(axis=1).max())  # position ids count a row's tokens
    io.check_generation(longest, max_new_tokens, f"the longest prompt ({longest} token{'s' if longest != 1 else ''}) + "
                        f"max_new_tokens={max_new_tokens}")
    if draft_io is not None:
        if io.vocab is not None and draft_io.vocab is not None:  # (else the first draft step checks)
            check_draft_vocabulary(io.vocab, draft_io.vocab)
        draft_io.check_generation(longest, max_new_tokens, f"the draft model, for the longest prompt ({longest} "
                                  f"tokens) + max_new_tokens={max_new_tokens}")
    padded = not mask.all()
    per_row = speculative or (padded and not io.left_padding)
    groups = [np.array([r]) for r in range(ids.shape[0])] if per_row else [np.arange(ids.shape[0])]
    rng = np.random.default_rng(seed)
    stats = GenerationStats()
    bar = Progress(progress, max_new_tokens * len(groups))
    results: List[np.ndarray] = []
    scores_per_group: List[List[np.ndarray]] = []
    seq_scores: Optional[np.ndarray] = None
    try:
        for g in groups:
            g_ids, g_mask = ids[g], mask[g]
            if per_row:
                g_ids = g_ids[:, g_mask[0] != 0]
                g_mask = np.ones_like(g_ids)
            stream = Streamer(streamer, tok, len(g)) if streamer is not None else None
            if stream is not None:
                stream.prompt(g_ids)
            # (speculative decoding too: a verification step after n new tokens feeds at most
            # max_new_tokens - n - 1 drafts, so it never holds more than the others)
            capacity = g_ids.shape[1] + max_new_tokens
            if speculative:
                spec_scores: Optional[List[np.ndarray]] = [] if return_scores else None
                gen = _speculative(session, io, draft_session, draft_io, g_ids[0], opts, stop, max_new_tokens,
                                   num_draft_tokens, prompt_lookup, rng, capacity, state_options, stream, bar, stats,
                                   spec_scores)
                results.append(gen[None, :])
                scores_per_group.append(spec_scores or [])
            elif num_beams > 1:
                gen, bscores, step_scores = _beams(session, io, g_ids, g_mask, opts, stop, max_new_tokens, num_beams,
                                                   length_penalty, early_stopping, num_return_sequences, pad,
                                                   return_scores, capacity, state_options, bar, stats, rng)
                results.append(gen)
                seq_scores = bscores if seq_scores is None else np.concatenate([seq_scores, bscores])
                scores_per_group.append(step_scores)
            else:
                gen, step_scores = _greedy_or_sample(session, g_ids, g_mask, opts, stop, pad, max_new_tokens, rng,
                                                     return_scores, state_options, stream, bar, stats)
                results.append(gen)
                scores_per_group.append(step_scores)
            if stream is not None:
                stream.end()
    finally:
        bar.close()
    new = _pad_right(results, pad)
    sequences = np.concatenate([np.repeat(ids, num_return_sequences, axis=0) if num_beams > 1 else ids, new], axis=1)
    out = GenerationOutput(sequences=sequences, stats=stats, prompt_length=ids.shape[1], sequences_scores=seq_scores)
    if return_scores:
        out.scores = _merge_scores(scores_per_group)
    if tok is not None:
        _warn_unknown_ids(tok, new)
        per = num_return_sequences if num_beams > 1 else 1  # beams: nrs returned rows per prompt row
        out.text = [tok.decode([int(t) for t in _strip(row, stop, ids[r // per][mask[r // per] != 0])],
                               skip_special_tokens=True)
                    for r, row in enumerate(new)]
    return out


def _warn_unknown_ids(tok: Any, new: np.ndarray) -> None:
    """Warn when generated ids lie beyond the tokenizer's vocabulary: they decode to no text
    (a tokenizer smaller than the model's logits; models that pad their logits never choose
    the padding ids, so this only fires for a mismatched tokenizer)."""
    size = getattr(tok, "get_vocab_size", None)
    if size is None or new.size == 0:
        return
    n = int(size(with_added_tokens=True))
    beyond = new[new >= n]
    if beyond.size:
        warnings.warn(f"{beyond.size} generated token id(s) (e.g. {int(beyond[0])}) are beyond the tokenizer's "
                      f"vocabulary of {n}: they decode to no text (is it the model's tokenizer?)", stacklevel=3)


def _strip(row: np.ndarray, stop: StopCondition, prompt: np.ndarray) -> np.ndarray:
    """The new tokens of a row up to where it stopped (the padding after removed); ``prompt``
    is the row's prompt, which a stop sequence may start in."""
    tail = prompt[-stop.longest:]
    full = np.concatenate([tail, row])
    for i in range(row.size):
        if stop.hit(full[:tail.size + i + 1]):
            return row[:i + 1]
    return row


def _pad_right(parts: List[np.ndarray], pad: int) -> np.ndarray:
    width = max(p.shape[1] for p in parts)
    rows = sum(p.shape[0] for p in parts)
    out = np.full((rows, width), pad, np.int64)
    r = 0
    for p in parts:
        out[r:r + p.shape[0], :p.shape[1]] = p
        r += p.shape[0]
    return out


def _merge_scores(groups: List[List[np.ndarray]]) -> List[np.ndarray]:
    if len(groups) == 1:
        return groups[0]
    steps = max(len(g) for g in groups)
    vocab = next(s.shape[1] for g in groups for s in g)
    merged = []
    for t in range(steps):
        merged.append(np.concatenate([g[t] if t < len(g) else np.full((g[0].shape[0], vocab), -np.inf, np.float32)
                                      for g in groups]))
    return merged


def _greedy_or_sample(session: Any, ids: np.ndarray, mask: np.ndarray, opts: SamplingOptions, stop: StopCondition,
                      pad: int, max_new: int, rng: np.random.Generator, return_scores: bool, state_options: Any,
                      stream: Optional[Streamer], bar: Progress,
                      stats: GenerationStats) -> Tuple[np.ndarray, List[np.ndarray]]:
    g = Generator(session, max_length=ids.shape[1] + max_new, do_sample=opts.do_sample, temperature=opts.temperature,
                  top_k=opts.top_k, top_p=opts.top_p, min_p=opts.min_p, repetition_penalty=opts.repetition_penalty,
                  no_repeat_ngram_size=opts.no_repeat_ngram_size, min_length=ids.shape[1] + opts.min_new_tokens,
                  pad_token_id=pad, state_options=state_options)
    g.options = opts  # (with the options the Generator does not take)
    g._begin = ids.shape[1]  # begin_suppress_tokens apply to the first new token
    g.stop = stop  # parsed once, by generate (the caller's ids may be a one-shot iterator)
    g.rng = rng  # one random stream for the whole call
    g._stores_all = False  # the last new token is never run: the state holds one position fewer
    scores: List[np.ndarray] = []
    try:
        g.append_tokens(ids, mask)
        while not g.is_done():
            finished = g.done_rows()  # rows that stopped before this step get padding now
            g.generate_next_token()
            if return_scores:
                scores.append(g.last_scores)
            if stream is not None:
                stream.put(g.get_next_tokens(), finished)
            bar.update(1)
        stats.prefill_ms += g.timings["prefill_s"] * 1e3
        stats.decode_ms += g.timings["decode_s"] * 1e3
        stats.model_runs += 1 + int(g.timings["decode_runs"])
        new = g.sequences[:, ids.shape[1]:]
        stats.decode_tokens += int(sum(max(len(_strip(row, g.stop, ids[r][mask[r] != 0])) - 1, 0)
                                       for r, row in enumerate(new)))
        stats.cache_bytes = max(stats.cache_bytes, g.cache_bytes())
        stats.runner = g.runner_kind
    finally:
        g.close()
    return new, scores


def _beams(session: Any, io: DecoderIO, ids: np.ndarray, mask: np.ndarray, opts: SamplingOptions, stop: StopCondition,
           max_new: int, num_beams: int, length_penalty: float, early_stopping: Any, nrs: int, pad: int,
           return_scores: bool, capacity: int, state_options: Any, bar: Progress,
           stats: GenerationStats, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, List[np.ndarray]]:
    auto = state_options is None
    if auto and paged_states_available(session) and cache_path_available(session):
        # the paged layout reorders beams by page-table permutation: a duplicated beam shares
        # its blocks instead of being copied each step
        state_options = {"layout": "paged"}
    runner = make_runner(session, io, ids.shape[0], capacity, state_options, fallback=auto)
    if not runner.resizable:  # the cache path's row count is fixed: one row per beam from the start
        runner.close()
        runner = make_runner(session, io, ids.shape[0] * num_beams, capacity, state_options, fallback=auto)
    stats.runner = runner.kind
    marks: List[float] = [time.perf_counter()]
    peak = [0]

    def on_step() -> None:
        marks.append(time.perf_counter())
        peak[0] = max(peak[0], runner.cache_bytes())
        bar.update(1)

    try:
        res = beam_search(runner, ids, mask, opts, stop, max_new, num_beams, length_penalty, early_stopping, nrs, pad,
                          return_scores, on_step, rng)
    finally:
        runner.close()
    stats.runner = runner.kind  # (the tensor path where the cache path refused the first run)
    stats.prefill_ms += (marks[1] - marks[0]) * 1e3
    stats.decode_ms += (marks[-1] - marks[1]) * 1e3
    stats.model_runs += len(marks) - 1
    stats.decode_tokens += (len(marks) - 2) * ids.shape[0]
    stats.cache_bytes = max(stats.cache_bytes, peak[0])
    return _pad_right([t[None, :] for t in res.tokens], pad), res.scores, res.step_scores


def _speculative(session: Any, io: DecoderIO, draft_session: Any, draft_io: Optional[DecoderIO], prompt: np.ndarray,
                 opts: SamplingOptions, stop: StopCondition, max_new: int, k: int, prompt_lookup: int,
                 rng: np.random.Generator, capacity: int, state_options: Any, stream: Optional[Streamer],
                 bar: Progress, stats: GenerationStats,
                 scores: Optional[List[np.ndarray]]) -> np.ndarray:
    target = make_runner(session, io, 1, capacity, state_options)
    stats.runner = target.kind
    try:
        require_truncate(target, "speculative decoding")
    except NotImplementedError:
        target.close()
        raise
    if draft_session is not None:
        assert draft_io is not None
        draft = make_runner(draft_session, draft_io, 1, capacity, state_options)
        if not draft.can_truncate:
            target.close()
            draft.close()
            require_truncate(draft, "speculative decoding (the draft model)")
        proposer: Any = DraftModel(draft, opts)
    else:
        proposer = PromptLookup(max_ngram=3)
        k = prompt_lookup
    t0 = time.perf_counter()
    t_prefill = [t0]
    peak = [0]

    def on_prefill() -> None:
        t_prefill[0] = time.perf_counter()

    def emit(tokens: List[int]) -> None:
        peak[0] = max(peak[0], target.cache_bytes() + proposer.cache_bytes())
        bar.update(len(tokens))
        if stream is not None:
            for t in tokens:
                stream.put(np.array([t], np.int64))

    try:
        gen, counts = speculative_decode(target, proposer, prompt, opts, stop, max_new, k, rng, emit, on_prefill,
                                           scores)
    finally:
        target.close()
        if isinstance(proposer, DraftModel):
            proposer.runner.close()
    t1 = time.perf_counter()
    stats.runner = target.kind  # (the tensor path where the cache path refused the first run)
    stats.prefill_ms += (t_prefill[0] - t0) * 1e3
    stats.decode_ms += (t1 - t_prefill[0]) * 1e3
    stats.model_runs += 1 + counts["verify_steps"]
    stats.decode_tokens += max(gen.size - 1, 0)
    stats.draft_tokens += counts["draft_tokens"]
    stats.accepted_draft_tokens += counts["accepted_draft_tokens"]
    stats.cache_bytes = max(stats.cache_bytes, peak[0])
    return gen
