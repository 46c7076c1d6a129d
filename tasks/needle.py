"""Built-in bench ``needle``: RULER's ``niah_single_1`` alone, as a quick default.

A thin alias of :class:`kvbench.tasks.ruler.RulerBench` restricted to ``niah_single_1`` (one 7-digit
number, keyed by an adjective-noun word, hidden in RULER's repeated noise sentence; 128 tokens to
generate). It uses the RULER generator itself, so ``needle``'s items equal ``ruler``'s ``niah_single_1``
items (same text, sizing and metric); only the ``bench`` label differs. It needs no data file.

Importing this module also registers ``ruler``.
"""

from __future__ import annotations

from kvbench.tasks import register_bench
from kvbench.tasks.ruler import RulerBench
from kvbench.tasks.ruler_data import NEEDLE, NOISE, TOKENS_TO_GENERATE

__all__ = ["MAX_NEW_TOKENS", "NEEDLE", "NOISE", "TASK", "NeedleBench"]

TASK = "niah_single_1"
MAX_NEW_TOKENS = TOKENS_TO_GENERATE["niah"]


@register_bench
class NeedleBench(RulerBench):
    name = "needle"
    description = "RULER niah_single_1 alone: one 7-digit magic number hidden in a noise haystack."

    def tasks(self) -> list[str]:
        return [TASK]
