"""Serving: continuous batching (:class:`Engine`), an OpenAI-compatible HTTP server
(:mod:`.http`, extra ``serve``) and scale-out on Ray Serve (:mod:`.ray`, extra ``ray``)."""

from __future__ import annotations

from .engine import Engine, Request, StepOutput

__all__ = ["Engine", "Request", "StepOutput"]
