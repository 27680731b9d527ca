"""Generation over any decoder session: greedy, sampling, beam search, speculative decoding.

* :func:`generate` -- transformers' ``generate`` arguments, returns :class:`GenerationOutput`;
* :class:`Generator` -- step-by-step control with onnxruntime-genai's verbs;
* :class:`DecoderIO` -- the model's feeds and fetches, discovered from its inputs/outputs;
* :mod:`.logits_process` -- the logits processors as numpy functions.

One file per strategy: ``generator.py`` (greedy and sampling), ``beam_search.py``,
``speculative.py`` (draft model and prompt lookup); ``runner.py`` executes the steps.
"""

from __future__ import annotations

from .decoder_io import DecoderIO, KVInput
from .generate import generate
from .generator import Generator
from .options import SamplingOptions, StopCondition
from .output import GenerationOutput, GenerationStats
from .runner import TensorRunner, make_runner

__all__ = ["generate", "Generator", "GenerationOutput", "GenerationStats", "DecoderIO", "KVInput",
           "SamplingOptions", "StopCondition", "TensorRunner", "make_runner"]
