"""Shared models and references of the generation tests.

The reference loops here are written independently of ``onnx_light_kv.generation``: they drive
an onnxruntime session by hand with the built-in models' known input names.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Sequence

import numpy as np
import onnx

import _ort_compare as oc

M = oc.models()
CFG = M.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256, max_positions=256)
PROMPT = np.array([3, 17, 42, 5, 99, 7, 250], dtype=np.int64)
#: three prompts of different lengths, for left-padded batches
PROMPTS = [np.array([3, 17, 42, 5, 99, 7, 250]), np.array([1, 1, 2, 3]), np.array([200, 9])]

VARIANTS = {
    "llama": ("llama", {}),
    "llama-mask": ("llama", {"attention_mask_input": True}),
    "llama-derived-positions": ("llama", {"position_ids_input": False}),
    "llama-opset24": ("llama", {"opset": 24}),
    "gpt2": ("gpt2", {}),
    "gpt2-derived-positions": ("gpt2", {"position_ids_input": False}),
    "llama-gqa-ort": ("llama_gqa_ort", {}),
}


@functools.lru_cache(maxsize=None)
def model(name: str, dtype: str = "float32", seed: int = 0, vocab: int = 256,
          logit_scale: float = 8.0) -> onnx.ModelProto:
    """A built-in model by variant name."""
    kind, kw = VARIANTS[name]
    cfg = CFG.replace(dtype=dtype, seed=seed, vocab=vocab, logit_scale=logit_scale)
    if kind == "llama":
        return M.llama_decoder(cfg, **kw)
    if kind == "gpt2":
        return M.gpt2_decoder(cfg, **kw)
    return M.llama_decoder_gqa_ort(cfg, **kw)


@functools.lru_cache(maxsize=None)
def ours(name: str, dtype: str = "float32", seed: int = 0, vocab: int = 256,
         logit_scale: float = 8.0) -> Any:
    """Our session on a variant (one thread)."""
    return oc.ours(model(name, dtype, seed, vocab, logit_scale))


@functools.lru_cache(maxsize=None)
def ort(name: str, dtype: str = "float32", seed: int = 0, vocab: int = 256,
        logit_scale: float = 8.0) -> Any:
    """An onnxruntime session on a variant (one thread)."""
    return oc.ort(model(name, dtype, seed, vocab, logit_scale))


def padded(prompts: Sequence[np.ndarray], pad: int = 0) -> Any:
    """Left-padded ``[batch, width]`` ids and their attention mask."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = p
        mask[r, width - len(p):] = 1
    return ids, mask


def _feeds(sess: Any, mp: onnx.ModelProto, ids: List[int], past_len: int,
           past: Dict[str, np.ndarray]) -> Dict[str, Any]:
    names = {i.name for i in sess.get_inputs()}
    feeds: Dict[str, Any] = {"input_ids": np.array([ids], np.int64)}
    if "position_ids" in names:
        feeds["position_ids"] = np.arange(past_len, past_len + len(ids), dtype=np.int64)[None, :]
    if "attention_mask" in names:
        feeds["attention_mask"] = np.ones((1, past_len + len(ids)), np.int64)
    feeds.update(past)
    return feeds


def ort_logits_loop(mp: onnx.ModelProto, prompt: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """onnxruntime's last-position float32 logits after ``prompt`` and after each of ``tokens``
    (presents fed back by hand): ``[len(tokens) + 1, vocab]``."""
    sess = oc.ort(mp)
    cfg, kind = M.config_of(mp), M.kind_of(mp)
    cap = len(prompt) + len(tokens) + 1
    length = cap if kind == "llama_gqa_ort" else 0
    past = {n: np.zeros((1, cfg.heads_kv(kind), length, cfg.head_dim), cfg.np_dtype) for n in M.past_names(cfg.layers)}
    outs_names = ["logits"] + M.present_names(cfg.layers)
    rows = []
    feed, past_len = list(prompt), 0
    for step in range(len(tokens) + 1):
        outs = sess.run(outs_names, _feeds(sess, mp, feed, past_len, past))
        rows.append(outs[0][0, -1].astype(np.float32))
        past = dict(zip(M.past_names(cfg.layers), outs[1:]))
        past_len += len(feed)
        if step < len(tokens):
            feed = [int(tokens[step])]
    return np.stack(rows)


def ort_greedy(mp: onnx.ModelProto, prompt: Sequence[int], n: int) -> np.ndarray:
    """``n`` greedy tokens after ``prompt`` by an onnxruntime loop written by hand."""
    sess = oc.ort(mp)
    cfg, kind = M.config_of(mp), M.kind_of(mp)
    cap = len(prompt) + n
    length = cap if kind == "llama_gqa_ort" else 0
    shape = (1, cfg.heads_kv(kind), length, cfg.head_dim)
    past = {nm: np.zeros(shape, cfg.np_dtype) for nm in M.past_names(cfg.layers)}
    outs_names = ["logits"] + M.present_names(cfg.layers)
    out: List[int] = []
    feed, past_len = [int(t) for t in prompt], 0
    for _ in range(n):
        outs = sess.run(outs_names, _feeds(sess, mp, feed, past_len, past))
        tok = int(np.argmax(outs[0][0, -1].astype(np.float32)))
        out.append(tok)
        past = dict(zip(M.past_names(cfg.layers), outs[1:]))
        past_len += len(feed)
        feed = [tok]
    return np.array(out, np.int64)


def full_logprobs(sess: Any, mp: onnx.ModelProto, seq: Sequence[int]) -> np.ndarray:
    """float64 log-softmax of the last-position logits of ``seq`` run from an empty past."""
    cfg, kind = M.config_of(mp), M.kind_of(mp)
    past = {nm: np.zeros((1, cfg.heads_kv(kind), 0, cfg.head_dim), cfg.np_dtype) for nm in M.past_names(cfg.layers)}
    logits = sess.run(["logits"], _feeds(sess, mp, [int(t) for t in seq], 0, past))[0][0, -1].astype(np.float64)
    m = logits.max()
    return logits - m - np.log(np.exp(logits - m).sum())
