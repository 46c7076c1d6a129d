"""RULER's own sampling (``sampling="official"``, the default): the items NVIDIA/RULER's scripts write.

For the same tokenizer, template, ``--length`` (RULER's ``max_seq_length``), seed and input files, item
``i`` here is RULER's sample ``i`` of ``scripts/data/prepare.py`` at commit c3f5e3b: the same ``input``,
``outputs``, ``length`` (and niah's answer ``index``/``token_position_answer``). What makes that so:

* **Streams.** Like each ``scripts/data/synthetic/*.py``, a task draws from ONE ``random.Random(seed)``
  (RULER: the seeded global ``random``) and, for vt, one ``numpy.random.RandomState(seed)`` (the seeded
  global ``numpy.random``), in RULER's order; the fixed-seed shuffles (``random.Random(seed).shuffle``)
  are fresh generators as in RULER.
* **Sizing consumes the streams.** Before the first item, RULER estimates tokens per haystack unit from
  one sample, then binary-searches the haystack between the increment and max(3 x the estimate, 2 x the
  increment) (cwe: from a 4,096-word sample, 2 x), drawing a fresh sample at every step. Each item then
  starts at the found size and, while its fresh sample exceeds ``length``, steps down by the increment
  (niah essay 500 words, niah noise/needle 25 lines, vt 10 lines, 5 for both below 4,096; cwe 10 words;
  qa 10 documents) and draws again. fwe grows from ``(length - 50) // 6`` words by ``(length - 50) // 32``
  until the text reaches ``length - 50`` tokens and backs off one step; each item draws a new vocabulary
  and shrinks by the same step while it exceeds ``length - 50``. vt first builds its one-shot example
  the same way at 500 tokens (raw text, step 5, no generated tokens) and rewrites its names and value per
  item (RULER's ``randomize_icl``).
* **Token counts** are the whole prompt (``input + answer_prefix``, chat template included) tokenized in
  one piece, plus RULER's ``tokens_to_generate``.

Because all draws come from one stream in order, item ``i`` does not depend on ``limit`` (as in RULER), but
item ``i`` needs items ``0 .. i-1`` drawn first.

Where RULER would loop forever (an item still exceeds ``length`` at the increment, e.g.
niah_multiquery at 1,024 tokens with a tokenizer for which 500 essay words never fit) it redraws at that size up to
:data:`FLOOR_REDRAWS` times as RULER does, then bisects below the increment (a fresh draw per step) down
to the task's smallest haystack; if nothing fits, ``TooShortError`` names the ``--length`` needed. From
that point on the task's items are kvbench's, not RULER's (``meta["ruler_identical"]`` is false). The
same holds for vt's one-shot example when 5 noise lines exceed its 500 tokens (a byte-level tokenizer):
kvbench keeps the 5-line example. RULER's step-down can also land below the smallest haystack its draw survives
(vt's 5 lines, one per variable; a line haystack's one line per needle; qa's gold documents): every draw there
raises, RULER's loop catches it and, at or below the increment, never steps again. kvbench does not take that
step: it redraws at the size it has and leaves as above (vt's example: it goes to 5 lines).
cwe beyond its 8,166 wonderwords needs RULER's ``english_words.json`` (a git-lfs file of the RULER
repository): put it at ``$KVBENCH_DATA_DIR/ruler/english_words.json``; without it a ``KvbenchError``
says so.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Iterator

from kvbench.errors import KvbenchError, TooShortError
from kvbench.tasks import Context, PromptLength, Question
from kvbench.tasks.ruler_data import VT
from kvbench.tasks.ruler_tasks import VT_HOPS, VT_ICL_TOKENS, RulerTask, data_dir, vt_context

__all__ = ["FLOOR_REDRAWS", "official_items", "text_tokens"]

#: Fresh draws at the increment before kvbench stops repeating RULER's endless retry loop.
FLOOR_REDRAWS = 64


def text_tokens(measure: PromptLength) -> Callable[[str], int]:
    """Tokens of raw text under ``measure``'s tokenizer: its ``text_tokens`` attribute when it has one
    (``kvbench.prompt.prompt_length``), else the difference against a one-character body."""
    direct = getattr(measure, "text_tokens", None)
    if direct is not None:
        return direct

    def probe(body: str) -> Context:
        return Context("ruler", "probe", "text", "", body, (Question("0", "", "", 0, ("x",), ("string_match_all",)),))

    base = measure(probe(".")) - 1
    return lambda text: measure(probe(text)) - base


class _Run:
    """One task's RULER streams and token accounting."""

    def __init__(self, gen: RulerTask, measure: PromptLength):
        import numpy as np

        self.gen, self.measure = gen, measure
        self.rand = random.Random(gen.seed)
        self.np = np.random.RandomState(gen.seed)
        self.length = gen.length
        self.identical = True

    def total(self, ctx: Context) -> int:
        """RULER's ``length``: the whole prompt's tokens plus the generated tokens."""
        return self.measure(ctx) + self.gen.gen

    def search(self, draw: Callable[[int], int], lo: int, hi: int, limit: int | None = None) -> int | None:
        """RULER's binary search: the largest ``mid`` whose fresh draw ``draw(mid)`` (a token total)
        fits ``limit`` (default ``length``), None if none did."""
        return _bisect(lambda mid: (mid, draw(mid)), lo, hi, self.length if limit is None else limit)[0]

    def step_down(
        self,
        draw: Callable[[int], tuple[Context, int] | None],
        n: int,
        inc: int,
        floor: int,
        drawable: int | None = None,
    ) -> Context:
        """RULER's per-sample loop from ``n``: redraw, dropping ``inc`` units while above ``inc``, until a
        draw fits. ``draw`` returns (context, total) or None where RULER's draw raises. Past RULER's
        endless retries (see the module docstring) bisect below ``n``, down to ``floor``, with fresh draws.
        ``drawable`` (default ``floor``) is the smallest size RULER's draw survives: a step below it is a
        loop RULER never leaves (every draw raises, and at or below ``inc`` RULER steps no further), so
        kvbench stays at ``n`` and takes the same exit."""
        drawable = floor if drawable is None else drawable
        misses = 0
        while True:
            got = draw(n)
            if got is not None and got[1] <= self.length:
                return self._final(got)
            if n > inc and n - inc >= drawable:
                n -= inc
                continue
            misses += 1
            if misses >= FLOOR_REDRAWS:
                break
        self.identical = False
        best = _bisect(lambda mid: draw(mid) or (None, self.length + 1), floor, n - 1, self.length)
        if best[0] is None:
            got = draw(floor)
            need = got[1] if got is not None else None
            g = self.gen
            raise TooShortError(
                f"--length {self.length} is too short for {g.bench}/{g.task}: with the smallest haystack "
                f"({floor} {g.unit}) a prompt takes {need} tokens with the {g.gen} to generate; "
                + (f"use --length >= {need}" if need is not None else "use a longer --length")
            )
        return self._final(best)

    def _final(self, got: tuple[Context, int]) -> Context:
        ctx, total = got
        meta = {**ctx.meta, "prompt_tokens": total - self.gen.gen, "sampling": "official"}
        meta["ruler_identical"] = self.identical
        return Context(ctx.bench, ctx.task, ctx.item, ctx.instruction, ctx.body, ctx.questions, meta, ctx.glue)


def _bisect(draw: Callable[[int], tuple[object, int]], lo: int, hi: int, limit: int) -> tuple[object, int | None]:
    """Binary search over ``[lo, hi]`` as RULER's: ``draw(mid)`` -> (value, tokens) with a fresh draw per
    step; returns the (value, tokens) of the largest ``mid`` within ``limit``, or (None, None)."""
    best: tuple[object, int | None] = (None, None)
    while lo <= hi:
        mid = (lo + hi) // 2
        got = draw(mid)
        if got[1] <= limit:
            best, lo = got, mid + 1
        else:
            hi = mid - 1
    return best


def _estimate(sample_tokens: int, units: int, length: int) -> int:
    """RULER's upper bound: ``int((max_seq_length / (sample_tokens / units)) * 3)``."""
    return int((length / (sample_tokens / units)) * 3)


# --------------------------------------------------------------------------------------------------
# niah


def _niah(run: _Run, count: int) -> Iterator[Context]:
    gen = run.gen
    if gen.cfg.haystack == "essay":
        inc = 500
    else:
        inc = 25 if gen.length >= 4096 else 5

    def sample(item: int, n: int) -> Context:
        keys, values, needles = gen.needles(run.rand)
        body = gen.haystack(run.rand, n, needles)
        queries, answers = gen.pick(run.rand, keys, values)
        return gen.assemble(item, n, keys, values, needles, queries, answers, body)

    n = _niah_size(run, lambda n: sample(0, n), inc)
    for item in range(count):
        yield run.step_down(lambda m, item=item: _with_total(run, sample(item, m)), n, inc, gen.floor(item))


def _with_total(run: _Run, ctx: Context) -> tuple[Context, int]:
    return ctx, run.total(ctx)


def _niah_size(run: _Run, sample: Callable[[int], Context], inc: int) -> int:
    """Estimate from one sample of ``inc`` units, then binary search (niah, qa share this)."""
    est = _estimate(run.measure(sample(inc)), inc, run.length)
    best = run.search(lambda mid: run.total(sample(mid)), inc, max(est, inc * 2))
    return best if best is not None else inc


# --------------------------------------------------------------------------------------------------
# vt


def _vt_names(run: _Run, size: int) -> list[str]:
    """RULER's ``generate_chains`` names for one chain: ``size``-letter strings, redrawn while repeated."""
    names = ["".join(run.rand.choices(string.ascii_uppercase, k=size)) for _ in range(VT_HOPS + 1)]
    while len(set(names)) < VT_HOPS + 1:
        names.append("".join(run.rand.choices(string.ascii_uppercase, k=size)))
    return names


class _VtCrash(Exception):
    """RULER's ``generate_chains`` fails (IndexError) when it drew a repeated variable name."""


def _vt(run: _Run, count: int) -> Iterator[Context]:
    gen = run.gen
    raw = text_tokens(run.measure)

    def chain(icl: bool) -> tuple[list[str], str | None]:
        names = _vt_names(run, 3 if icl else 5)
        value = None if icl else str(run.np.randint(10000, 99999))
        if len(names) > VT_HOPS + 1:  # RULER starts a second chain from the extra name, then fails
            if not icl:
                run.np.randint(10000, 99999)
            raise _VtCrash
        return names, value

    def searching(f):
        """A draw during RULER's size search, where its script has no retry: a crash is fatal there."""

        def call(*args):
            try:
                return f(*args)
            except _VtCrash:
                raise KvbenchError(
                    f"RULER's own vt script fails at --length {gen.length} --seed {gen.seed} (it draws a repeated "
                    "variable name while sizing); use another --seed"
                ) from None

        return call

    def body(names: list[str], value: str, n: int) -> str:
        positions = sorted(run.rand.sample(range(n), VT_HOPS + 1))
        return vt_context(names, value, n, positions)

    # 1. The one-shot example: RULER's first call (max_seq_length 500, step 5, nothing generated).
    def icl_text(n: int) -> tuple[str, list[str]]:
        names, _ = chain(icl=True)
        text = VT.full().format(context=body(names, "12345", n), query="12345", num_v=VT_HOPS + 1)
        return text, names

    est = _estimate(raw(searching(icl_text)(5)[0]), 5, VT_ICL_TOKENS)
    best = run.search(lambda mid: raw(searching(icl_text)(mid)[0]), 5, max(est, 10), VT_ICL_TOKENS)
    n = best if best is not None else 5
    misses = 0
    while True:
        try:
            text, names = icl_text(n)
            if raw(text) <= VT_ICL_TOKENS:
                break
        except _VtCrash:  # RULER's retry loop catches it
            pass
        if n > 5:
            if n - 5 >= VT_HOPS + 1:
                n -= 5
            else:  # below one line per variable every RULER draw raises and its loop never ends:
                n, run.identical = VT_HOPS + 1, False  # kvbench takes the smallest size it can draw
            continue
        misses += 1
        if misses >= FLOOR_REDRAWS:  # RULER loops forever here (e.g. a byte-level tokenizer): keep 5 lines
            run.identical = False
            break
    example = text + " " + " ".join(names) + "\n"
    example_tokens = raw(example)

    # 2. The items.
    inc = 10 if gen.length >= 4096 else 5

    def plain(item: int, n: int) -> tuple[Context, list[str], str]:
        names, value = chain(icl=False)
        return gen.assemble(item, n, None, names, int(value), body(names, value, n)), names, value

    def randomized_example() -> str:
        out = example
        for name in out.strip().split()[-(VT_HOPS + 1) :]:
            out = out.replace(name, "".join(run.rand.choices(string.ascii_uppercase, k=len(name))))
        return out.replace("12345", str(run.np.randint(10000, 99999)))

    est = _estimate(run.measure(searching(plain)(0, inc)[0]), inc, gen.length)
    best = run.search(lambda mid: run.total(searching(plain)(0, mid)[0]) + example_tokens, inc, max(est, inc * 2))
    n = best if best is not None else inc

    def sample(item: int, m: int) -> tuple[Context, int] | None:
        try:
            ctx, names, value = plain(item, m)
        except _VtCrash:  # RULER's retry loop catches it
            return None
        icl = randomized_example()[:-1]  # assemble adds the newline back (+ the template's own "\n")
        full = gen.assemble(item, m, icl, names, int(value), ctx.body)
        return full, run.total(full)

    for item in range(count):
        yield run.step_down(lambda m, item=item: sample(item, m), n, inc, gen.floor(item))


# --------------------------------------------------------------------------------------------------
# cwe


class _CweWords:
    """cwe's word sources: the shuffled wonderwords list, and RULER's ``english_words.json`` fallback
    (loaded only when a draw needs more words than wonderwords has)."""

    def __init__(self, words: list[str]):
        self.words, self._fallback = words, None

    def sample(self, rand: random.Random, k: int) -> list[str]:
        if k <= len(self.words):
            return rand.sample(self.words, k)
        return rand.sample(self.fallback(k), k)

    def fallback(self, k: int) -> list[str]:
        if self._fallback is None:
            root = data_dir()
            path = None if root is None else root / "ruler" / "english_words.json"
            if path is None or not path.is_file():
                raise KvbenchError(
                    f"RULER's cwe draws {k} words here, more than wonderwords' {len(self.words)}: put RULER's "
                    "english_words.json (git lfs) at $KVBENCH_DATA_DIR/ruler/english_words.json, or use a "
                    "shorter --length"
                )
            with open(path, encoding="utf-8") as f:
                self._fallback = list(json.load(f).values())
        return self._fallback


def _cwe(run: _Run, count: int) -> Iterator[Context]:
    gen = run.gen
    words = _CweWords(gen.words)
    (ex_n, ex_common, ex_uncommon), repeats = gen.example, gen.repeats

    def sample(item: int, n: int) -> Context:
        ex_context, ex_answer = gen.listing(words.sample(run.rand, ex_n), ex_common, ex_uncommon)
        body, answer = gen.listing(words.sample(run.rand, n), *repeats)
        return gen.assemble(item, n, ex_context, ex_answer, body, answer)

    inc = 10
    per_word = run.measure(sample(0, 4096)) / 4096
    est = int(gen.length // per_word) * 2
    best = run.search(lambda mid: run.total(sample(0, mid)), inc, max(est, inc * 2))
    n = best if best is not None else inc
    for item in range(count):
        # RULER draws cwe below 10 words too (all of them common): only kvbench's bisection stops at 10
        yield run.step_down(lambda m, item=item: _with_total(run, sample(item, m)), n, inc, gen.floor(item), drawable=1)


# --------------------------------------------------------------------------------------------------
# fwe


def _fwe(run: _Run, count: int) -> Iterator[Context]:
    gen = run.gen
    budget = gen.length - gen.gen  # RULER: max_seq_length -= tokens_to_generate
    size, inc = budget // 50, budget // 32
    if size < 4 or inc < 1:
        raise TooShortError(f"--length {gen.length} is too short for {gen.bench}/fwe; use --length >= 250")

    vocab = gen.vocab(run.rand, size)
    n = budget // 6
    while run.measure(gen.assemble(0, n, vocab)) < budget:
        n += inc
    n -= inc
    for item in range(count):
        vocab = gen.vocab(run.rand, size)
        m = n
        ctx = gen.assemble(item, m, vocab)
        while run.measure(ctx) > budget:
            m -= inc
            if m <= 0:
                raise TooShortError(f"--length {gen.length} is too short for {gen.bench}/fwe; use a longer --length")
            ctx = gen.assemble(item, m, vocab)
        yield run._final((ctx, run.total(ctx)))


# --------------------------------------------------------------------------------------------------
# qa


def _qa(run: _Run, count: int) -> Iterator[Context]:
    gen = run.gen
    inc = 10

    def sample(item: int, n: int) -> Context:
        return gen.assemble(item, n, gen.choose(run.rand, item, n))

    def attempt(item: int, n: int) -> tuple[Context, int] | None:
        try:
            return _with_total(run, sample(item, n))
        except ValueError:  # RULER's random.sample raises below the gold documents; its loop goes on
            return None

    n = _niah_size(run, lambda n: sample(0, n), inc)
    for item in range(count):
        yield run.step_down(lambda m, item=item: attempt(item, m), n, inc, gen.floor(item))


_FAMILIES = {"niah": _niah, "vt": _vt, "cwe": _cwe, "fwe": _fwe, "qa": _qa}


def official_items(gen: RulerTask, count: int, measure: PromptLength) -> Iterator[Context]:
    """The first ``count`` items of RULER's scripts for task generator ``gen`` (it supplies the text assembly;
    the draws and sizing are RULER's, see the module docstring)."""
    if count <= 0:
        return iter(())
    return _FAMILIES[gen.family](_Run(gen, measure), count)
