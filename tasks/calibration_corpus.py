"""A generic synthetic corpus for calibrating methods on the shipped model (not task data), in the vocabulary of
RULER's haystacks (:mod:`kvbench.tasks.ruler_data`).

With the benches, not the core (which imports no bench) nor training: ``kvbench paper`` writes its label corpora
with it and scripts/calibrate_tiny.sh the shipped artifacts' corpus; the trainer (kvbench-training, ``training/``)
reads :func:`synthetic_text` for its tokenizer corpus."""

from __future__ import annotations

import random
import string
from pathlib import Path

from kvbench.atomic import write_atomic


def synthetic_text(rng: random.Random, n_chars: int) -> str:
    """Plain text of at least ``n_chars`` characters in the haystack vocabulary: noise sentences, needle
    sentences, variable assignments and coded words, one per line."""
    from kvbench.tasks.ruler_data import NEEDLE, NOISE, niah_key_parts

    adjs, nouns = niah_key_parts()
    lines: list[str] = []
    size = 0
    while size < n_chars:
        kind = rng.random()
        if kind < 0.4:
            line = NOISE
        elif kind < 0.7:
            key = f"{rng.choice(adjs)}-{rng.choice(nouns)}"
            line = NEEDLE.format(type_v="numbers", key=key, value=rng.randint(10**6, 10**7 - 1))
        elif kind < 0.85:
            name = "".join(rng.choices(string.ascii_uppercase, k=5))
            other = "".join(rng.choices(string.ascii_uppercase, k=5))
            line = f"VAR {name} = {rng.randint(10000, 99998)}" if rng.random() < 0.5 else f"VAR {name} = VAR {other}"
        else:
            line = " ".join("".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(rng.randint(3, 12)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


#: Kinds of document in the generic calibration corpus (one sub-corpus each, for leave-one-corpus-out).
CALIBRATION_KINDS = ("haystack", "words", "assignments")


def _words(rng: random.Random, n_chars: int) -> str:
    """``n_chars // 6`` random lowercase words of 2-9 letters, space-separated."""
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(n_chars // 6))


def _assignments(rng: random.Random, n_chars: int) -> str:
    """``VAR NAME = value`` lines (a number, or an earlier variable 60 % of the time) until ``n_chars``."""
    names: list[str] = []
    lines: list[str] = []
    while sum(len(x) + 1 for x in lines) < n_chars:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        rhs = f"VAR {rng.choice(names)}" if names and rng.random() < 0.6 else str(rng.randint(10000, 99999))
        lines.append(f"VAR {name} = {rhs}")
        names.append(name)
    return "\n".join(lines)


_WRITERS = {"haystack": synthetic_text, "words": _words, "assignments": _assignments}


def write_calibration_corpus(out_dir: str | Path, n_docs: int = 16, n_chars: int = 4000, seed: int = 0) -> Path:
    """A generic synthetic corpus for calibrating methods on the shipped model (TriAttention statistics,
    GateSight rollout labels): ``out_dir/<kind>/<i>.txt`` for each kind of ``CALIBRATION_KINDS``, ``n_docs``
    documents of about ``n_chars`` characters each. Not task data: no instruction, no question, no RULER
    item; text in the haystack vocabulary (``haystack``: :func:`synthetic_text`'s mix
    of noise sentences, needle sentences, variable assignments and coded words), runs of random lowercase
    words (``words``), and variable-assignment lines (``assignments``). Seeds are drawn from a namespace of
    their own (``kvbench-calibration:…``), disjoint from training and evaluation. Deterministic. Returns
    ``out_dir``."""
    out_dir = Path(out_dir)
    for kind in CALIBRATION_KINDS:
        for i in range(n_docs):
            rng = random.Random(f"kvbench-calibration:{seed}:{kind}:{i}")
            write_atomic(out_dir / kind / f"{i:03d}.txt", _WRITERS[kind](rng, n_chars) + "\n")
    return out_dir
