"""RULER's task generators: the text of one item of a RULER task from its draws and haystack size.

Each task family (niah, vt, cwe, fwe, qa) is a :class:`RulerTask` whose methods draw an item's keys,
values or words from a given ``random.Random`` and assemble its :class:`~kvbench.tasks.Context` around a
haystack of ``n`` units. The two samplings drive them: :mod:`kvbench.tasks.ruler` (``per_item``: one RNG per
item, probe-based sizing) and :mod:`kvbench.tasks.ruler_official` (RULER's own streams and sizing). The fixed
ingredients (templates, word lists, needle configurations) are in :mod:`kvbench.tasks.ruler_data`; the
external data files (essays, SQuAD, HotpotQA) are read here, from ``$KVBENCH_DATA_DIR``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import string
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from kvbench.errors import KvbenchError, MissingDataError
from kvbench.tasks import Context, PromptLength, Question
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
    "DATA_ENV",
    "DATA_FILES",
    "DataFileError",
    "REFETCH",
    "VT_HOPS",
    "VT_ICL_TOKENS",
    "RulerTask",
    "data_dir",
    "data_path",
    "draw_needle_part",
    "file_id",
    "make_task",
    "read_data_file",
    "search_largest",
    "vt_context",
]

#: External file each task needs, relative to ``$KVBENCH_DATA_DIR``.
DATA_FILES = {
    **{t: "ruler/PaulGrahamEssays.json" for t, c in NIAH_CONFIGS.items() if c.haystack == "essay"},
    "qa_1": "ruler/squad.json",
    "qa_2": "ruler/hotpotqa.json",
}
DATA_ENV = "KVBENCH_DATA_DIR"
#: vt: variables in a chain after the first (a chain names ``VT_HOPS + 1`` variables).
VT_HOPS = 4
#: vt: raw-text tokens of the one-shot example (RULER builds it at max_seq_length=500).
VT_ICL_TOKENS = 500
_CWE_NUM = 10


def data_dir() -> Path | None:
    """``$KVBENCH_DATA_DIR`` as a path, or None when unset or empty."""
    value = os.environ.get(DATA_ENV, "").strip()
    return Path(value).expanduser() if value else None


def data_path(task: str) -> Path:
    """The data file ``task`` needs (:data:`DATA_FILES`) under :func:`data_dir`; :class:`MissingDataError`
    naming the fix when the directory is unset or the file is absent."""
    rel = DATA_FILES[task]
    root = data_dir()
    fix = (f"`kvbench data fetch ruler --data-dir DIR` fetches it (online), then pass --data-dir DIR (or set "
           f"{DATA_ENV}=DIR); or put {rel} under such a directory by hand")
    if root is None:
        raise MissingDataError(f"RULER task {task} needs {rel}, but {DATA_ENV} is not set: {fix}")
    path = root / rel
    if not path.is_file():
        raise MissingDataError(f"RULER task {task} needs {path}, which does not exist: {fix}")
    return path


_LOADED: dict[str, tuple[tuple, object]] = {}  # family -> (file id, parsed contents)


def file_id(path: Path) -> tuple[str, int, int]:
    """``(resolved path, size in bytes, mtime in ns)``: changes whenever the file is replaced or edited."""
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


#: What to do about a data file that cannot be used (a bench's error and ``kvbench data fetch``'s refusal say it).
REFETCH = "remove it and fetch it again with `kvbench data fetch ruler --data-dir DIR`"


class DataFileError(KvbenchError):
    """A RULER data file that cannot be used; ``reason``: why, without the path or the fix."""

    def __init__(self, path: Path, reason: str, unreadable: bool = False) -> None:
        self.reason = reason
        what = f"cannot read RULER data file {path}" if unreadable else f"RULER data file {path}"
        super().__init__(f"{what}: {reason}; {REFETCH}")


def read_data_file(task: str, path: Path):
    """The parsed contents of RULER data file ``path`` for ``task`` (:data:`DATA_FILES`): a QA file's
    (questions, documents), at least one question; the essays' haystack, non-empty. A file that cannot be
    read, parsed or used is a :class:`DataFileError` naming it and the fix. The one check of a data file:
    the bench reads through it, and ``kvbench data fetch`` runs it on every file before recording it."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFileError(path, str(exc), unreadable=True) from None
    try:
        if task in ("qa_1", "qa_2"):
            value = parse_squad(raw) if task == "qa_1" else parse_hotpotqa(raw)
            if not value[0]:
                raise FormatError("it holds no answerable question, so the task has no context")
        else:
            if not isinstance(raw, dict) or not isinstance(raw.get("text"), str) or not raw["text"].strip():
                raise FormatError('expected {"text": "<non-empty essay text>"}')
            value = _Essay(re.sub(r"\s+", " ", raw["text"]).split(" "))
    except FormatError as exc:
        raise DataFileError(path, str(exc)) from None
    return value


def _load(task: str, path: Path):
    """Parsed contents of ``path`` for ``task``'s family (:func:`read_data_file`), kept while the file is
    unchanged."""
    family = task if task.startswith("qa") else "essay"
    fid = file_id(path)
    if family in _LOADED and _LOADED[family][0] == fid:
        return _LOADED[family][1]
    value = read_data_file(task, path)
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
# Task generators: build(item, n) -> Context with n haystack units; sizing lives in the samplings.


class RulerTask(ABC):
    """One RULER task's item text: ``build(item, n)`` draws item ``item`` from its own RNG (:meth:`rng`) with a
    haystack of ``n`` units (:attr:`unit`); each family's draw and assembly steps are separate methods so
    that RULER's own sampling can draw them from its streams instead. ``gen``: RULER's tokens to generate."""

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


def draw_needle_part(rng: random.Random, kind: str) -> str:
    """One needle key or value of ``kind`` (RULER's ``type_k`` / ``type_v``): ``"numbers"`` (7 digits),
    ``"uuids"`` or ``"words"`` (an adjective-noun key), one draw from ``rng`` as RULER's."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "words":
        keys = niah_keys()
        return keys[rng.randrange(len(keys))]  # RULER: random.choice(words), the same single draw
    raise ValueError(f"unknown needle kind {kind!r}")


class _Niah(RulerTask):
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
            keys.append(draw_needle_part(rng, c.type_k))
            values.append([])
            for _ in range(c.num_v):
                values[-1].append(draw_needle_part(rng, c.type_v))
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
                    NEEDLE.format(
                        type_v=c.type_v, key=draw_needle_part(rng, c.type_k), value=draw_needle_part(rng, c.type_v)
                    )
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


def vt_context(names: list[str], value: int | str, n: int, positions: list[int]) -> str:
    """vt's haystack: ``n`` noise lines with the chain ``VAR names[0] = value``, ``VAR names[j+1] = VAR
    names[j]`` inserted before the lines at ``positions`` (sorted, one per variable)."""
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(len(names) - 1)]
    lines = [NOISE] * n
    for j, pos in enumerate(positions):
        lines.insert(pos + j, chain[j])
    return "\n".join(lines).replace(". \n", ".\n")


class _Vt(RulerTask):
    family = "vt"
    unit = "lines"

    def __init__(self, bench, task, seed, length):
        super().__init__(bench, task, seed, length)
        self.icl_n, self.icl_positions = 5, list(range(5))

    def incremental(self) -> int:
        return 10 if self.length >= 4096 else 5

    def floor(self, item: int) -> int:
        return VT_HOPS + 1

    def _icl_input(self, names: list[str], value: int, n: int, positions: list[int]) -> str:
        ctx = vt_context(names, value, n, positions)
        return VT.full().format(context=ctx, query=value, num_v=VT_HOPS + 1)

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
            names = _distinct_names(rng, VT_HOPS + 1, 3)
            return names, sorted(rng.sample(range(n), VT_HOPS + 1))

        def fits(n: int) -> bool:
            names, positions = layout(n)
            return tokens(self._icl_input(names, 12345, n, positions)) <= VT_ICL_TOKENS

        n = search_largest(fits, 5, VT_ICL_TOKENS, start=5) or 5
        self.icl_n, self.icl_positions = n, layout(n)[1]

    def build(self, item: int, n: int) -> Context:
        rng = self.rng(item)
        names = _distinct_names(rng, VT_HOPS + 1, 5)
        value = rng.randint(10000, 99998)  # np.random.randint(10000, 99999): high exclusive
        icl_names = _distinct_names(rng, VT_HOPS + 1, 3)
        icl_value = rng.randint(10000, 99998)
        positions = sorted(rng.sample(range(n), VT_HOPS + 1))
        icl = self._icl_input(icl_names, icl_value, self.icl_n, self.icl_positions) + " " + " ".join(icl_names)
        return self.assemble(item, n, icl, names, value, vt_context(names, value, n, positions))

    def assemble(self, item: int, n: int, icl: str | None, names: list[str], value: int, body: str) -> Context:
        """The context around ``body``; ``icl`` (the one-shot example, without its trailing newline) leads
        the instruction unless None."""
        instruction = VT.instruction_text() if icl is None else icl + "\n\n" + VT.instruction_text()
        question = VT.question_text().format(query=value)
        prefix = VT.answer_prefix.format(num_v=VT_HOPS + 1, query=value)
        meta = {"n": n, "value": value, "chain": names, "icl_lines": self.icl_n}
        return self.context(item, instruction, body, question, prefix, names, "string_match_all", meta)


class _Cwe(RulerTask):
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

    def listing(self, chosen: list[str], common_repeats: int, uncommon_repeats: int) -> tuple[str, list[str]]:
        """The numbered word list (``1. w 2. w …``) of ``chosen``'s first 10 words repeated ``common_repeats``
        times and the rest ``uncommon_repeats`` times, ``Random(seed)``-shuffled; and the 10 common words."""
        common, uncommon = chosen[:_CWE_NUM], chosen[_CWE_NUM:]
        words = common * common_repeats + uncommon * uncommon_repeats
        random.Random(self.seed).shuffle(words)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words)), common

    def build(self, item: int, n: int) -> Context:
        rng = self.rng(item)
        ex_words, ex_common, ex_uncommon = self.example
        ex_context, ex_answer = self.listing(rng.sample(self.words, ex_words), ex_common, ex_uncommon)
        order = list(self.words)
        rng.shuffle(order)  # the item's words in draw order: the first n do not depend on n
        body, answer = self.listing(order[:n], *self.repeats)
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


class _Fwe(RulerTask):
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


class _Qa(RulerTask):
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


def make_task(bench: str, task: str, seed: int, length: int) -> RulerTask:
    """The generator of RULER ``task`` labelled ``bench``, sized for ``length`` tokens; reads the task's data
    file now (:class:`MissingDataError` when absent), ValueError for an unknown task."""
    if task in NIAH_CONFIGS:
        essay = _load(task, data_path(task)) if task in DATA_FILES else None
        return _Niah(bench, task, seed, length, essay)
    if task == "vt":
        return _Vt(bench, task, seed, length)
    if task == "cwe":
        return _Cwe(bench, task, seed, length)
    if task == "fwe":
        return _Fwe(bench, task, seed, length)
    if task in ("qa_1", "qa_2"):
        return _Qa(bench, task, seed, length, _load(task, data_path(task)))
    raise ValueError(f"unknown RULER task {task!r}; valid tasks: {', '.join(TASKS)}")


# --------------------------------------------------------------------------------------------------
# Search


def search_largest(fits: Callable[[int], bool], lo: int, hi: int, start: int) -> int | None:
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
