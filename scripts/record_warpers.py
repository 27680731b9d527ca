"""Record transformers' sampling warpers and sequence-bias processors on fixed logits, for
``tests/test_generate_constraints.py`` (``tests/fixtures/transformers-warpers.json``).

Run with a Python environment that has torch, transformers and numpy (not needed by CI, which
only reads the committed file)::

    python scripts/record_warpers.py            # writes tests/fixtures/transformers-warpers.json

Logits: three [4, 40] float32 matrices of standard normals scaled by 0.5, 2 and 6 (seed 7), the
last row of each with five ``-inf`` entries. For each warper (``TypicalLogitsWarper``,
``EpsilonLogitsWarper``, ``EtaLogitsWarper``), parameter and ``min_tokens_to_keep`` in (1, 3),
the file holds which entries the warper set to ``-inf`` (a string of 0s and 1s per row); for ``SequenceBiasLogitsProcessor``
and ``NoBadWordsLogitsProcessor``, the processed logits of the first matrix after four fixed
sequences.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import (EpsilonLogitsWarper, EtaLogitsWarper, NoBadWordsLogitsProcessor,
                                                    SequenceBiasLogitsProcessor, TypicalLogitsWarper)

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "transformers-warpers.json")
WARPERS = {"typical_p": (TypicalLogitsWarper, (0.2, 0.5, 0.9, 0.99)),
           "epsilon_cutoff": (EpsilonLogitsWarper, (0.001, 0.02, 0.1, 0.5)),
           "eta_cutoff": (EtaLogitsWarper, (0.001, 0.02, 0.1, 0.5))}
SEQUENCES = [[1, 2, 3], [2, 3, 4], [5, 2, 3], [0, 1, 2]]
SEQUENCE_BIAS = [[[7], 1.5], [[2, 3, 9], -2.0], [[3, 9], 0.75], [[1, 2, 11], 3.0]]
BAD_WORDS, BAD_WORDS_EOS = [[4], [2, 3, 8], [1, 2, 12], [5]], [5]


def main() -> None:
    rng = np.random.default_rng(7)
    matrices = []
    for scale in (0.5, 2.0, 6.0):
        x = (rng.standard_normal((4, 40)) * scale).astype(np.float32)
        x[3, :5] = -np.inf
        matrices.append(x)
    ids = torch.zeros((4, 1), dtype=torch.long)
    warped = []
    for name, (cls, params) in WARPERS.items():
        for i, x in enumerate(matrices):
            for p in params:
                for keep in (1, 3):
                    out = cls(p, min_tokens_to_keep=keep)(ids, torch.from_numpy(x.copy()))
                    warped.append({"warper": name, "matrix": i, "value": p, "keep": keep,
                                   "dropped": ["".join("1" if d else "0" for d in row)
                                               for row in out.isinf().numpy()]})
    seqs = torch.tensor(SEQUENCES)
    first = torch.from_numpy(matrices[0].copy())
    biased = SequenceBiasLogitsProcessor(SEQUENCE_BIAS)(seqs, first.clone()).numpy()
    banned = NoBadWordsLogitsProcessor(BAD_WORDS, eos_token_id=BAD_WORDS_EOS)(seqs, first.clone()).numpy()

    def floats(a: np.ndarray) -> list:
        return [[None if np.isneginf(v) else float(v) for v in row] for row in a]

    doc = {"transformers": transformers.__version__, "torch": torch.__version__,
           "matrices": [floats(x) for x in matrices], "warped": warped,
           "sequences": SEQUENCES, "sequence_bias": SEQUENCE_BIAS, "sequence_bias_out": floats(biased),
           "bad_words": BAD_WORDS, "bad_words_eos": BAD_WORDS_EOS, "bad_words_out": floats(banned)}
    with open(OUT, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)}: {len(warped)} warper cases")


if __name__ == "__main__":
    main()
