"""Offline generation of four SCBench tasks (``kv``, ``mf``, ``prefix_suffix``, ``vt``) in the hub's row schema.

microsoft/SCBench cannot be downloaded everywhere, but four of its twelve tasks are synthetic. This module
builds rows of those four tasks with their hub field names and types, one long context per row with
:data:`TURNS` questions (``multi_turns``), each row as large as fits a token budget. The rows are
kvbench's own draws, not SCBench's items: scores on them are not comparable with published SCBench numbers.

**Schema** (hub card ``dataset_info`` of microsoft/SCBench, rev 283310b, and what the official runner reads):

* ``kv``: ``id`` int64, ``context`` string, ``multi_turns`` list<struct<answer: string, input: string>>;
* ``mf``: ``id`` int64, ``context`` list<int64>, ``multi_turns`` list<struct<answer: int64, input: string>>;
* ``prefix_suffix``: ``context`` string, ``multi_turns`` list<struct<answer: string, input: string>> (no ``id``);
* ``vt``: ``index`` int64, ``input`` string (the context), ``length`` int64, ``multi_turns``
  list<struct<answer: list<string>, input: string>> (no ``id``; RULER's own record fields).

**Constructions.** Every row draws from its own ``random.Random`` seeded with a string of (seed, task, row
index, purpose), never global state, so row ``i`` depends only on (task, length, seed, i) and the
``measure`` given.

* ``kv`` follows InfiniteBench's kv_retrieval (OpenBMB/InfiniteBench ``data/construct_synthetic_dataset.py``
  ``build_kv_retrieval``, records from nelson-liu/lost-in-the-middle ``scripts/make_kv_retrieval_data.py``):
  keys and values are random version-4 UUID strings (here from the row's RNG), the context is
  ``"JSON data:\\n"`` + the object on one line (``{"k": "v", "k": "v"}``, InfiniteBench's format, which is
  ``json.dumps``'), and a turn asks ``Key: "<key>"\\nThe value associated with the specified key is: `` with
  the value as its answer. Differs: 5 distinct keys per row, one drawn in each fifth of the object (their
  order of asking shuffled), where InfiniteBench asks one key per item; InfiniteBench's input starts with a
  newline, these do not; the number of pairs is sized to ``length`` (InfiniteBench: 2,500 pairs at 128K).
* ``mf`` follows InfiniteBench's math_find (``generate_math_qa`` / ``generate_random_list`` of the same
  script in the version that builds math_find): a list of random integers in ``[lo, hi]`` with ``lo`` drawn
  from 0..19 and ``hi`` from 79..99 (InfiniteBench moves the bound that matters per question kind; a row
  here serves several kinds, so both move), and the turn inputs are InfiniteBench's ``inputs``, e.g.
  ``You should answer with only one number, no other words. The largest number of the list is: `` (the
  official SCBench prompt turns "The largest number of the list" into "What is the largest number of the
  list?"). Five of its seven kinds per row (largest, second/third largest, smallest, second/third smallest,
  median number), each once, in random order; "second largest" is the largest value below the largest
  (InfiniteBench removes every copy of the maximum). Differs: the list has an odd length, so the median is
  an element and an integer, sized to ``length`` (InfiniteBench: 60,000 numbers); its first three numbers
  are distinct, so every kind has an answer.
* ``vt`` follows RULER's variable tracking (NVIDIA/RULER ``scripts/data/synthetic/variable_tracking.py``)
  with :data:`TURNS` chains of 4 hops, one per turn: chain ``c`` is ``VAR A = <5-digit value>`` then
  ``VAR B = VAR A `` … (five distinct 5-letter upper-case names, RULER's statements), each chain's
  statements inserted in order at positions drawn in the current list of noise lines (RULER's repeated
  "The grass is green. …"), chains one after another as RULER inserts several chains. ``input`` is RULER's
  instruction + ``"\\n\\n"`` + that text; a turn is RULER's question and answer prefix (``Question: Find all
  variables that are assigned the value V in the text above. Answer: According to the chain(s) of variable
  assignment in the text above, 5 variables are assigned the value V, they are: ``), its answer the
  chain's five names. ``length`` is the row's measured tokens. Differs: no one-shot example; the five values
  are distinct; the number of noise lines is sized to ``length``. RULER's strings come from
  :mod:`kvbench.tasks.ruler_data` (``NOISE``, ``VT``).
* ``prefix_suffix``: SCBench's construction of this task is not public in a form reachable here (only its
  description, "finding strings with specific prefix and suffix patterns", its scorer, which is kv's
  ``label in prediction``, and its schema were found), so this is kvbench's own: ``context`` is
  ``"There is a list of strings:\\n"`` + one random string per line (12-20 characters from ASCII letters and
  digits); a turn asks ``What is the string that starts with "<p>" and ends with "<s>"?`` with ``p`` the
  first and ``s`` the last 4 characters of one listed string, the answer that string. One target in each
  fifth of the list; for each target, two other strings (drawn anywhere, rewritten at their own length) start
  with its prefix and two end with its suffix (distractors); every (prefix, suffix) asked matches exactly
  one string of the list.

**Sizing.** The size parameter (kv pairs, mf pairs of list elements, vt noise lines, prefix_suffix strings)
is the largest, found by search, for which ``measure(row) <= length``: the smallest row is measured, then a
probe, then the boundary is bracketed by extrapolation and closed by interpolation with bisection steps (about
five to eight ``measure`` calls a row). Content is drawn so that a larger size extends a smaller one (the
same pairs, numbers and strings first), so ``measure`` grows with the size almost everywhere; the row
returned has ``measure(row) <= length`` and one unit more does not fit.

Unverified against SCBench's real rows (not downloadable here): the turn wording of kv, mf and
prefix_suffix, the prefix_suffix construction, the vt row's instruction text and one-shot example, the
numbers' range and the parquet column order.
"""

from __future__ import annotations

import json
import random
import string
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from kvbench.atomic import write_with
from kvbench.errors import KvbenchError, TooShortError
from kvbench.tasks.ruler_data import NOISE, VT

__all__ = [
    "GENERATED_TASKS",
    "GENERATOR_VERSION",
    "SEED_RANGE",
    "TURNS",
    "generate_row",
    "generate_rows",
    "hub_schema",
    "kv_row",
    "mf_answer",
    "write_hub_layout",
]

#: The SCBench tasks kvbench can generate offline.
GENERATED_TASKS = ("kv", "mf", "prefix_suffix", "vt")
#: Questions (turns) per row.
TURNS = 5
#: Bumped whenever generated rows change for the same inputs.
GENERATOR_VERSION = 1
#: Seeds accepted: ``0 <= seed < 2**32``.
SEED_RANGE = (0, 2**32)
#: The hub file of a task under the output directory.
HUB_FILE = "scbench_{task}/test-00000-of-00001.parquet"

KV_INPUT = 'Key: "{key}"\nThe value associated with the specified key is: '
MF_KINDS = (
    "largest number",
    "second largest number",
    "third largest number",
    "smallest number",
    "second smallest number",
    "third smallest number",
    "median number",
)
MF_INPUT = "You should answer with only one number, no other words. The {kind} of the list is: "
PS_INTRO = "There is a list of strings:\n"
PS_INPUT = 'What is the string that starts with "{prefix}" and ends with "{suffix}"?'
PS_AFFIX = 4  # characters of the prefix and of the suffix asked
PS_CHARS = string.ascii_letters + string.digits
PS_LENGTHS = (12, 20)  # string lengths, inclusive
PS_DISTRACTORS = 2  # strings sharing a target's prefix (and as many its suffix), per target
VT_HOPS = 4
_MAX_UNITS_PER_TOKEN = 8  # search cap: a size above 8 units per token of ``length`` means measure is broken


def _rng(seed: int, task: str, index: int, purpose: str) -> random.Random:
    return random.Random(f"kvbench-scbench:{task}:{seed}:{index}:{purpose}")


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _spread(fracs: list[float], n: int) -> list[int]:
    """One distinct position per fifth of ``range(n)`` (``n >= len(fracs)``), at fraction ``fracs[j]`` of
    fifth ``j``."""
    k = len(fracs)
    bounds = [j * n // k for j in range(k + 1)]
    return [bounds[j] + int(f * (bounds[j + 1] - bounds[j])) for j, f in enumerate(fracs)]


class _Gen(ABC):
    """One row's generator: ``build(size)`` is the row at a size; ``n_min`` the smallest size; ``unit``
    names the size in messages (:meth:`what`)."""

    n_min = 1
    unit = "units"

    def what(self, size: int) -> str:
        return f"{size} {self.unit}"

    def __init__(self, task: str, seed: int, index: int) -> None:
        self.task, self.seed, self.index = task, seed, index

    def rng(self, purpose: str) -> random.Random:
        return _rng(self.seed, self.task, self.index, purpose)

    @abstractmethod
    def build(self, size: int) -> dict:
        """The row at ``size`` units (the schema of the task's hub rows)."""

    def finish(self, row: dict, tokens: int) -> dict:
        return row


class _Kv(_Gen):
    n_min = TURNS
    unit = "key-value pairs"

    def __init__(self, task, seed, index):
        super().__init__(task, seed, index)
        self._content = self.rng("pairs")
        self._pairs: list[tuple[str, str]] = []
        self._keys: set[str] = set()
        q = self.rng("queries")
        self._fracs = [q.random() for _ in range(TURNS)]
        self._order = q.sample(range(TURNS), TURNS)

    def _extend(self, n: int) -> None:
        while len(self._pairs) < n:
            key, value = _uuid(self._content), _uuid(self._content)
            if key not in self._keys:
                self._keys.add(key)
                self._pairs.append((key, value))

    def build(self, size: int) -> dict:
        self._extend(size)
        pairs = self._pairs[:size]
        spots = _spread(self._fracs, size)
        turns = [{"answer": pairs[spots[j]][1], "input": KV_INPUT.format(key=pairs[spots[j]][0])} for j in self._order]
        return {"id": self.index, "context": "JSON data:\n" + json.dumps(dict(pairs)), "multi_turns": turns}


def kv_row(seed: int, index: int, pairs: int, ask: list[int] | None = None) -> dict:
    """Row ``index`` of ``kv`` with exactly ``pairs`` key-value pairs, in the hub schema: the same pairs,
    context and question wording as :func:`generate_row` gives for (``seed``, ``index``) when its sizing
    lands on ``pairs`` (a larger row extends a smaller one). ``ask``: the pair positions (0-based, in context
    order) the turns ask, in that order; None asks the generator's own (one per fifth; then ``pairs >=
    TURNS``). Used for training rows with few pairs and by ``scripts/probe_kv.py``."""
    _check("kv", seed)
    least = _Kv.n_min if ask is None else 1
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < least:
        raise KvbenchError(f"scbench/kv: {pairs!r} pairs; give at least {least} (one per question without ask)")
    row = _Kv("kv", seed, index).build(pairs)
    if ask is None:
        return row
    if not ask or any(not 0 <= j < pairs for j in ask):
        raise KvbenchError(f"scbench/kv: ask positions {ask!r} must be a non-empty list within 0..{pairs - 1}")
    items = list(json.loads(row["context"].removeprefix("JSON data:\n")).items())
    turns = [{"answer": items[j][1], "input": KV_INPUT.format(key=items[j][0])} for j in ask]
    return {**row, "multi_turns": turns}


def mf_answer(values: list[int], kind: str) -> int:
    """The answer of an mf question ``kind`` (one of :data:`MF_KINDS`) on ``values`` (odd length for the median)."""
    if kind == "median number":
        return sorted(values)[len(values) // 2]
    distinct = sorted(set(values), reverse=kind.endswith("largest number"))
    rank = {"second": 1, "third": 2}.get(kind.split()[0], 0)
    return distinct[rank]


class _Mf(_Gen):
    n_min = 2  # size k -> a list of 2k + 1 numbers

    def what(self, size: int) -> str:
        return f"{2 * size + 1} numbers"

    def __init__(self, task, seed, index):
        super().__init__(task, seed, index)
        self._content = self.rng("values")
        self._lo, self._hi = self._content.randint(0, 19), self._content.randint(79, 99)
        self._values: list[int] = []
        self._kinds = self.rng("queries").sample(MF_KINDS, TURNS)

    def _extend(self, n: int) -> None:
        while len(self._values) < n:
            v = self._content.randint(self._lo, self._hi)
            if len(self._values) < 3 and v in self._values:
                continue  # the first three are distinct: every kind has an answer
            self._values.append(v)

    def build(self, size: int) -> dict:
        n = 2 * size + 1
        self._extend(n)
        values = self._values[:n]
        turns = [{"answer": mf_answer(values, k), "input": MF_INPUT.format(kind=k)} for k in self._kinds]
        return {"id": self.index, "context": values, "multi_turns": turns}


def mf_kinds(seed: int, index: int) -> list[str]:
    """The kinds (:data:`MF_KINDS` entries) that generated mf row ``index`` at ``seed`` asks, in turn order
    (the same at every ``--length``): what ``scripts/mf_by_kind.py`` groups a results file's mf scores by."""
    _check("mf", seed)
    return list(_Mf("mf", seed, index)._kinds)


class _PrefixSuffix(_Gen):
    n_min = TURNS * (1 + 2 * PS_DISTRACTORS)
    unit = "strings"

    def __init__(self, task, seed, index, turns: int = TURNS, distractors: int = PS_DISTRACTORS):
        super().__init__(task, seed, index)
        self.turns, self.distractors = turns, distractors
        self.n_min = turns * (1 + 2 * distractors)
        self._content = self.rng("strings")
        self._strings: list[str] = []
        q = self.rng("queries")
        self._fracs = [q.random() for _ in range(turns)]
        self._order = q.sample(range(turns), turns)

    @staticmethod
    def _draw(rng: random.Random, k: int) -> str:
        return "".join(rng.choices(PS_CHARS, k=k))

    def _extend(self, n: int) -> None:
        while len(self._strings) < n:
            self._strings.append(self._draw(self._content, self._content.randint(*PS_LENGTHS)))

    @staticmethod
    def _affixes(s: str) -> tuple[str, str]:
        return s[:PS_AFFIX], s[-PS_AFFIX:]

    @staticmethod
    def _bump(s: str) -> str:
        """``s`` with its last character replaced by the next one of :data:`PS_CHARS` (cyclically)."""
        return s[:-1] + PS_CHARS[(PS_CHARS.index(s[-1]) + 1) % len(PS_CHARS)]

    def build(self, size: int) -> dict:
        self._extend(size)
        strings = list(self._strings[:size])
        spots = _spread(self._fracs, size)
        asked: set[tuple[str, str]] = set()
        for p in spots:  # targets: distinct (prefix, suffix) pairs
            while self._affixes(strings[p]) in asked:
                strings[p] = self._bump(strings[p])
            asked.add(self._affixes(strings[p]))
        rng = random.Random(f"kvbench-scbench:{self.task}:{self.seed}:{self.index}:distractors:{size}")
        taken = set(spots)
        others = [i for i in range(size) if i not in taken]
        per = 2 * self.distractors  # distractors of one target
        chosen = rng.sample(others, per * self.turns)
        for j, p in enumerate(spots):
            prefix, suffix = self._affixes(strings[p])
            for d, i in enumerate(chosen[j * per : (j + 1) * per]):
                middle = self._draw(rng, len(strings[i]) - 2 * PS_AFFIX)  # the length of the string replaced
                if d < self.distractors:  # same prefix, another suffix
                    strings[i] = prefix + middle + self._draw(rng, PS_AFFIX)
                else:  # same suffix, another prefix
                    strings[i] = self._draw(rng, PS_AFFIX) + middle + suffix
        for i in others:  # no other string matches an asked pair
            while self._affixes(strings[i]) in asked:
                strings[i] = self._bump(strings[i])
        turns = []
        for j in self._order:
            target = strings[spots[j]]
            prefix, suffix = self._affixes(target)
            turns.append({"answer": target, "input": PS_INPUT.format(prefix=prefix, suffix=suffix)})
        return {"context": PS_INTRO + "\n".join(strings), "multi_turns": turns}


class _Vt(_Gen):
    n_min = VT_HOPS + 1
    unit = "noise lines"

    def __init__(self, task, seed, index, turns: int = TURNS):
        super().__init__(task, seed, index)
        rng = self.rng("chains")
        names: list[str] = []
        while len(names) < TURNS * (VT_HOPS + 1):
            name = "".join(rng.choices(string.ascii_uppercase, k=5))
            if name not in names:
                names.append(name)
        self._chains = [names[c * (VT_HOPS + 1) : (c + 1) * (VT_HOPS + 1)] for c in range(TURNS)][:turns]
        self._values = rng.sample(range(10000, 99999), TURNS)[:turns]  # RULER: np.random.randint(10000, 99999)

    def build(self, size: int) -> dict:
        lines = [NOISE] * size
        rng = random.Random(f"kvbench-scbench:{self.task}:{self.seed}:{self.index}:positions:{size}")
        for names, value in zip(self._chains, self._values, strict=True):
            chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(VT_HOPS)]
            spots = sorted(rng.sample(range(len(lines)), len(chain)))
            for p, statement in zip(reversed(spots), reversed(chain), strict=True):
                lines.insert(p, statement)
        turns = []
        for names, value in zip(self._chains, self._values, strict=True):
            ask = VT.question.format(query=value) + " " + VT.answer_prefix.format(num_v=VT_HOPS + 1, query=value)
            turns.append({"answer": list(names), "input": ask})
        text = VT.instruction + VT.glue + "\n".join(lines)
        return {"index": self.index, "input": text, "length": 0, "multi_turns": turns}

    def finish(self, row: dict, tokens: int) -> dict:
        return {**row, "length": tokens}


_GENERATORS: dict[str, type[_Gen]] = {"kv": _Kv, "mf": _Mf, "prefix_suffix": _PrefixSuffix, "vt": _Vt}


def _check(task: str, seed: int) -> None:
    if task not in GENERATED_TASKS:
        raise KvbenchError(f"scbench task {task!r} cannot be generated; kvbench generates {', '.join(GENERATED_TASKS)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        raise KvbenchError(f"--seed {seed!r}: give an integer from {SEED_RANGE[0]} to {SEED_RANGE[1] - 1}")


def _fit(gen: _Gen, measure: Callable[[dict], int], length: int) -> dict:
    """The row at the largest size whose ``measure`` is ``<= length`` (searched as the module docstring says)."""
    cap = max(_MAX_UNITS_PER_TOKEN * max(length, 1), gen.n_min + 64)
    lo = gen.n_min
    lo_row = gen.build(lo)
    lo_m = measure(lo_row)
    if lo_m > length:
        raise TooShortError(
            f"--length {length} is too short for scbench/{gen.task}: its smallest generated row ({gen.what(lo)}, "
            f"row {gen.index}) already needs {lo_m} tokens (context prompt, longest question and its answer); "
            f"use --length >= {lo_m}"
        )
    hi = hi_m = None
    other: tuple[int, int] | None = None  # a second measured point, for the first slope
    last, streak = "", 0
    while hi is None or hi - lo > 1:
        if hi is None:
            if other is None:
                guess = 2 * lo + 8
            else:
                slope = (lo_m - other[1]) / (lo - other[0]) if lo != other[0] else 0.0
                guess = int(lo + (length - lo_m) / slope * 1.02) + 2 if slope > 0 else 2 * lo
                guess = min(max(guess, lo + 1), 4 * lo + 64)
            if guess > cap:
                raise KvbenchError(
                    f"scbench/{gen.task}: a row of {gen.what(guess)} still measures {lo_m} <= {length} tokens; "
                    "the measure does not grow with the row (check the tokenizer / measure function)"
                )
        elif streak >= 2:
            guess = (lo + hi) // 2
        else:
            guess = int(lo + (length - lo_m) * (hi - lo) / (hi_m - lo_m))
            guess = min(max(guess, lo + 1), hi - 1)
        row = gen.build(guess)
        m = measure(row)
        if m <= length:
            other = (lo, lo_m)
            lo, lo_m, lo_row, side = guess, m, row, "lo"
        else:
            other = other if other is not None else (guess, m)
            hi, hi_m, side = guess, m, "hi"
        streak, last = (streak + 1 if side == last else 1), side
    return gen.finish(lo_row, lo_m)


def generate_row(
    task: str,
    index: int,
    *,
    length: int,
    seed: int,
    measure: Callable[[dict], int],
    turns: int = TURNS,
    distractors: int = PS_DISTRACTORS,
) -> dict:
    """Row ``index`` of ``task`` in the hub schema: the largest one with ``measure(row) <= length``.
    Depends only on (task, index, length, seed) and ``measure``. Raises :class:`TooShortError` when even the
    smallest row does not fit (naming the length needed) and :class:`KvbenchError` for an unknown task or a
    seed outside :data:`SEED_RANGE`.

    ``turns`` (``prefix_suffix`` and ``vt`` only, 1 to :data:`TURNS`) and ``distractors`` (``prefix_suffix``
    only, 0 to :data:`PS_DISTRACTORS`) make smaller rows than SCBench's for training curricula: the first
    ``turns`` chains of the full row (vt), or ``turns`` targets with ``distractors`` strings sharing each
    target's prefix and as many its suffix (prefix_suffix). The defaults give the rows evaluation uses."""
    _check(task, seed)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise KvbenchError(f"scbench/{task}: row index {index!r} must be a non-negative integer")
    if (turns, distractors) == (TURNS, PS_DISTRACTORS):
        return _fit(_GENERATORS[task](task, seed, index), measure, length)
    if task not in ("prefix_suffix", "vt") or not 1 <= turns <= TURNS or not 0 <= distractors <= PS_DISTRACTORS:
        raise KvbenchError(
            f"scbench/{task}: turns={turns!r}, distractors={distractors!r}; smaller rows are for prefix_suffix "
            f"(turns 1-{TURNS}, distractors 0-{PS_DISTRACTORS}) and vt (turns 1-{TURNS}, distractors "
            f"{PS_DISTRACTORS})"
        )
    if task == "vt":
        if distractors != PS_DISTRACTORS:
            raise KvbenchError(f"scbench/vt has no distractors; leave distractors at {PS_DISTRACTORS}")
        return _fit(_Vt(task, seed, index, turns), measure, length)
    return _fit(_PrefixSuffix(task, seed, index, turns, distractors), measure, length)


def generate_rows(task: str, *, length: int, limit: int, seed: int, measure: Callable[[dict], int]) -> Iterator[dict]:
    """Rows ``0 .. limit - 1`` of ``task``, lazily, in the hub schema (see :func:`generate_row`; row ``i``
    does not depend on ``limit``). Bad arguments raise at the call, not at the first row."""
    _check(task, seed)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise KvbenchError(f"--limit {limit!r}: give the number of rows, a whole number (0 gives none)")

    def rows() -> Iterator[dict]:
        for index in range(limit):
            yield generate_row(task, index, length=length, seed=seed, measure=measure)

    return rows()


def hub_schema(task: str):
    """The pyarrow schema of ``task``'s hub parquet (column names and types of the hub card)."""
    import pyarrow as pa

    if task not in GENERATED_TASKS:
        raise KvbenchError(f"scbench task {task!r} has no generated layout; tasks: {', '.join(GENERATED_TASKS)}")
    answer = {"kv": pa.string(), "prefix_suffix": pa.string(), "mf": pa.int64(), "vt": pa.list_(pa.string())}[task]
    turns = pa.list_(pa.struct([("answer", answer), ("input", pa.string())]))
    fields = {
        "kv": [("id", pa.int64()), ("context", pa.string()), ("multi_turns", turns)],
        "mf": [("id", pa.int64()), ("context", pa.list_(pa.int64())), ("multi_turns", turns)],
        "prefix_suffix": [("context", pa.string()), ("multi_turns", turns)],
        "vt": [("index", pa.int64()), ("input", pa.string()), ("length", pa.int64()), ("multi_turns", turns)],
    }[task]
    return pa.schema(fields)


def write_hub_layout(task: str, rows: Iterable[dict], out_dir: Path) -> Path:
    """Write ``out_dir/scbench_<task>/test-00000-of-00001.parquet`` with the hub's column names and types
    (:func:`hub_schema`), streaming ``rows`` in small batches into a temporary file that is renamed into
    place at the end; on any error the temporary file (and a folder this call created) is removed and an
    existing file is left as it was. Returns the file's path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = hub_schema(task)
    path = Path(out_dir) / HUB_FILE.format(task=task)
    created = [p for p in (path.parent, *path.parent.parents) if not p.exists()]

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema) as writer:
            batch: list[dict] = []
            for row in rows:
                batch.append(row)
                if len(batch) == 8:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                    batch = []
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))

    try:
        write_with(path, write)
    except BaseException:
        for folder in created:  # innermost first
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return path
