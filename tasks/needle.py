"""Built-in synthetic bench ``needle``: RULER ``niah_single_1`` (one number needle in a noise haystack).

Mirrors NVIDIA/RULER ``scripts/data/synthetic/niah.py`` with ``type_haystack=noise``, key ``words``,
value ``numbers``, k/v/q = 1/1/1: the noise sentence repeated on ``\\n``-joined lines, the needle
inserted before a random line (``random.sample(range(n_lines), 1)``), the singular-form template and
128 tokens to generate. Differences from RULER: keys come from the small built-in word lists below (RULER
draws from wonderwords' adjective x noun lists, which a later issue pins), each item has its own seeded
RNG, and every item gets the largest haystack that fits (RULER steps down by 25 lines).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from kvbench.tasks import Bench, Context, PromptLength, Question, register_bench

__all__ = ["MAX_NEW_TOKENS", "NEEDLE", "NOISE", "WORDS", "NeedleBench"]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic numbers for {key} is: {value}."
INSTRUCTION = (
    "A special magic number is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the number afterwards."
)
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
# RULER's template appends " The special magic ..." to the question; the answer prefix starts at "The"
# (as in kvpress' query-agnostic split), the space being the chat template's business.
ANSWER_PREFIX = "The special magic number for {key} mentioned in the provided text is"
MAX_NEW_TOKENS = 128  # RULER niah tokens_to_generate

# fmt: off
_ADJECTIVES = [
    "able", "absent", "active", "agile", "alert", "ancient", "angry", "bitter", "black", "blue", "bold",
    "brave", "brief", "bright", "broad", "busy", "calm", "careful", "cheap", "clean", "clever", "cold",
    "cool", "crisp", "curly", "damp", "dark", "deep", "dry", "dusty", "eager", "early", "easy", "empty",
    "faint", "fancy", "fast", "fierce", "flat", "fresh", "friendly", "funny", "gentle", "giant", "glad",
    "golden", "grand", "green", "happy", "heavy", "hollow", "honest", "huge", "humble", "icy", "jolly",
    "kind", "large", "late", "lazy", "light", "little", "lively", "loud", "lucky", "mellow", "mighty",
    "modern", "narrow", "neat", "nervous", "new", "noisy", "odd", "old", "orange", "pale", "plain", "polite",
    "proud", "purple", "quick", "quiet", "rapid", "rare", "red", "rich", "rough", "round", "royal", "rural",
    "rusty", "sad", "salty", "shiny", "short", "silent", "silly", "simple", "slow", "small", "smooth", "soft",
]
_NOUNS = [
    "anchor", "apple", "arrow", "badge", "basket", "beach", "bell", "berry", "blanket", "boat", "bottle",
    "bridge", "brush", "bucket", "button", "cabin", "camera", "candle", "canyon", "carpet", "castle", "cloud",
    "clover", "coast", "comet", "copper", "cotton", "crayon", "desert", "diamond", "dragon", "drum", "eagle",
    "engine", "falcon", "feather", "fence", "field", "flower", "forest", "fountain", "garden", "garlic",
    "glacier", "guitar", "hammer", "harbor", "helmet", "island", "jacket", "jungle", "kettle", "kitten",
    "ladder", "lantern", "lemon", "library", "lizard", "magnet", "marble", "meadow", "mirror", "monkey",
    "napkin", "ocean", "orchard", "otter", "palace", "panda", "parrot", "pebble", "pepper", "piano", "pillow",
    "planet", "pocket", "pumpkin", "rabbit", "river", "rocket", "saddle", "salmon", "shadow", "shelter",
    "spider", "sponge", "statue", "tiger", "tunnel", "valley", "violin",
]
# fmt: on
#: Needle keys, "adjective-noun", sorted and deduplicated as RULER builds its ``words`` list.
WORDS = sorted({f"{adj}-{noun}" for adj in _ADJECTIVES for noun in _NOUNS})


def _largest_fit(fits: Callable[[int], bool], start: int, cap: int) -> int:
    """Largest ``n`` in ``[1, cap]`` with ``fits(n)`` and not ``fits(n + 1)`` (or ``n == cap``), or 0 if
    ``fits(1)`` is false: gallop from ``start``, then bisect. O(log cap) calls; the result always
    satisfies ``fits`` (it was measured), so it fits even if ``fits`` is not quite monotone."""
    lo, hi = 0, cap + 1  # invariant: lo == 0 or fits(lo); hi == cap + 1 or not fits(hi)
    n = min(max(start, 1), cap)
    up = fits(n)
    lo, hi = (n, hi) if up else (lo, n)
    step = 1
    while hi - lo > 1:  # gallop away from the start until the boundary is bracketed
        n = lo + step if up else hi - step
        if not lo < n < hi:
            break
        if fits(n):
            lo = n
            if not up:
                break
        else:
            hi = n
            if up:
                break
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@register_bench
class NeedleBench(Bench):
    name = "needle"
    description = "Synthetic RULER niah_single_1: one 7-digit magic number hidden in a noise haystack."

    def tasks(self) -> list[str]:
        return ["niah_single_1"]

    def _context(self, task: str, item: int, seed: int, n_lines: int) -> Context:
        """Item ``item`` with ``n_lines`` noise lines; key and value do not depend on ``n_lines``."""
        rng = random.Random(f"{seed}-{task}-{item}")
        key = rng.choice(WORDS)
        value = str(rng.randint(10**6, 10**7 - 1))
        lines = [NOISE] * n_lines
        index = rng.sample(range(n_lines), 1)[0] if n_lines else 0
        lines.insert(index, NEEDLE.format(key=key, value=value))
        question = Question(
            qid="0",
            text=QUESTION.format(key=key),
            answer_prefix=ANSWER_PREFIX.format(key=key),
            max_new_tokens=MAX_NEW_TOKENS,
            references=(value,),
            scorers=("string_match_all",),
        )
        meta = {"depth": index / n_lines if n_lines else 0.0, "n_lines": n_lines, "key": key, "value": value}
        return Context(self.name, task, str(item), INSTRUCTION, "\n".join(lines), (question,), meta)

    def contexts(
        self, task: str, *, length: int, limit: int, seed: int, prompt_length: PromptLength
    ) -> Iterator[Context]:
        """Yield ``limit`` items, each with the most noise lines such that its prompt plus 128 generated
        tokens fits in ``length``. Item ``i`` depends on ``seed``, ``i`` and the sizing only, not on
        ``limit``. An unknown task raises ``ValueError`` at once; a ``length`` that cannot hold even one
        noise line raises ``ValueError`` when the first item is drawn."""
        if task not in self.tasks():
            raise ValueError(f"unknown needle task {task!r}; valid tasks: {', '.join(self.tasks())}")
        return self._generate(task, length, limit, seed, prompt_length)

    def _generate(
        self, task: str, length: int, limit: int, seed: int, prompt_length: PromptLength
    ) -> Iterator[Context]:
        hint = 1
        for i in range(limit):
            ctx = self._sized(task, i, seed, length, prompt_length, hint)
            hint = ctx.meta["n_lines"]  # later items have nearly the same size: start their search here
            yield ctx

    def _sized(
        self, task: str, item: int, seed: int, length: int, prompt_length: PromptLength, hint: int
    ) -> Context:
        """Item ``item`` with the most noise lines that fit ``length``, searched from ``hint`` lines."""
        budget = length - MAX_NEW_TOKENS
        ctxs: dict[int, Context] = {}

        def fits(n: int) -> bool:
            ctxs[n] = self._context(task, item, seed, n)
            return prompt_length(ctxs[n]) <= budget

        # A noise line costs at least one token, so at most `length` lines can fit.
        n = _largest_fit(fits, hint, cap=max(length, 1))
        if n == 0:
            bare = prompt_length(self._context(task, item, seed, 0))
            need = prompt_length(ctxs[1]) + MAX_NEW_TOKENS
            raise ValueError(
                f"--length {length} is too short for {self.name}/{task}: the prompt without haystack "
                f"already takes {bare} tokens (+{MAX_NEW_TOKENS} to generate); use --length >= {need}"
            )
        return ctxs[n]
