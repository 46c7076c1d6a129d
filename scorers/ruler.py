"""RULER's official metrics (NVIDIA/RULER ``scripts/eval/synthetic/constants.py``), per item, 0–100.

The official evaluator post-processes each prediction (:func:`postprocess_pred`), averages the per-item
fractions over all items, multiplies by 100 and rounds only that final aggregate to 2 decimals. These
functions return the unrounded per-item value ×100; averaging and rounding are the reporter's job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kvbench.scorers import register_scorer

__all__ = ["postprocess_pred", "string_match_all", "string_match_part"]

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess_pred(prediction: str) -> str:
    """RULER's prediction clean-up: strip, replace every char in ``[\\x00-\\x1f]`` with ``\\n``, strip."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def _matches(prediction: str, references: Sequence[str]) -> list[bool]:
    if isinstance(references, str) or not references:
        raise ValueError(f"references must be a non-empty sequence of strings, got {references!r}")
    pred = postprocess_pred(prediction).lower()
    return [ref.lower() in pred for ref in references]


@register_scorer("string_match_all")
def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Percent (0–100) of references found in the prediction, case-insensitive substring match.

    Used by RULER's niah, vt, cwe and fwe tasks. Not rounded (the official evaluator rounds only the
    final aggregate to 2 decimals). Empty references raise ``ValueError``.
    """
    hits = _matches(prediction, references)
    return 100.0 * sum(hits) / len(hits)


@register_scorer("string_match_part")
def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """100.0 if any reference is in the prediction (case-insensitive substring match), else 0.0.

    Used by RULER's qa tasks. Not rounded (the official evaluator rounds only the final aggregate to
    2 decimals). Empty references raise ``ValueError``.
    """
    return 100.0 if any(_matches(prediction, references)) else 0.0
