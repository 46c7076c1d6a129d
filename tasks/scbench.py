"""The ``scbench`` bench: SCBench's 12 tasks (microsoft/MInference ``scbench/``) in shared-context mode.

Each SCBench row is one long context with several queries (``multi_turns``). kvbench runs SCBench's
shared-context multi-query mode ("scdq", ``--same_context_different_query``): the context goes through
the chat template once and every turn is asked against it as its own :class:`~kvbench.tasks.Question`
(the official HF runner decodes each query with ``update_global_past_kv=False``, so every query sees only
the context). All turns of a row are asked (the paper runs every context with all its questions);
``$KVBENCH_SCBENCH_MAX_TURNS=5`` applies the official ``--max_turns 5`` cap instead.

**Prompts, token for token as the official code builds them** (``create_scdq_prompt`` with the chat
template; ``run_scbench.py`` for the truncation). Contexts are in SCBench's own assembly
(``Context.assembly == "scbench"``, rendered by :mod:`kvbench.prompt`): the context prompt is
``CTX_TEMPLATE.format(context)`` (:data:`INSTRUCTIONS` + the body, no glue; tasks whose template is
``"{context}"`` have no instruction) through the chat template and encoded in one call; each query is
appended directly after it (no separator). Questions per task (``multiturn_follow_up_templates_in_chat_tempate``):

* kv, prefix_suffix, vt, repoqa, many_shot, summary, mixed tasks: the turn's ``input``.
* qa_eng: ``"Question: {input}\nAnswer:"``; qa_chn: ``"问题：{input}\n答案："``.
* choice_eng: ``"Question: {input}\nA. {o0}\nB. {o1}\nC. {o2}\nD. {o3}\n\nThe the correct answer is"``
  (sic), with each turn's own options.
* mf: instruction = the first turn's ``input`` + ``"\n\n"`` (the official scdq ``prefix``); each question
  ``"What is {target}?\n\n{input}"`` with ``target`` = the first ``The .+ is`` match of the input, lower
  case, without the trailing ``" is"``.

No answer prefix (``answer_prefix=""``). Generation lengths: :data:`MAX_NEW_TOKENS` (official
``DATA_NAME_TO_MAX_NEW_TOKENS``; mixed tasks by each turn's ``task``). ``tests/test_scbench_official.py``
compares every task's ids with the official code's output (``tests/fixtures/scbench_official/``).

**Truncation.** As the official runner: the whole chat-templated context prompt is middle-truncated to the
model limit less :func:`reserve_tokens` (``max_new_tokens * T + 1000``; mixed tasks
``sum(max_new_tokens) * T // 2 + 1000``; ``T`` = the row's turns capped at 5; the official runner takes the
first row's turn count, kvbench each row's own). ``Context.meta`` records the row index and ``id``, the
number of turns and ``reserve_tokens``.

**Sizing and sources.** Hub rows are fixed: ``length``, ``prompt_length`` and ``seed`` are not used and
``limit`` is the number of rows per task (in file order). Without SCBench data, kv, mf, prefix_suffix and vt
are generated offline (:mod:`kvbench.tasks.scbench_generate`, see :class:`SCBenchBench`), sized to
``length`` and drawn with ``seed``; their contexts (and rows) say ``source="generated"``.

**Scorers.** Each question's ``scorers`` is ``(official, revised)`` from :mod:`kvbench.scorers.scbench`;
mixed tasks use their sub-task's pair. The references layouts (choice options, repoqa needle pool) are
documented there.

**Data.** ``$KVBENCH_DATA_DIR/scbench/`` (the CLI's ``--data-dir`` sets it) in the hub layout
``scbench_<task>/*.parquet`` (``test-00000-of-00001.parquet``) or ``scbench_<task>/*.jsonl``, or the hub's
raw ``data/scbench_<task>.jsonl``, or ``scbench_<task>.jsonl``. With ``KVBENCH_SCBENCH_HUB=1`` (or
``SCBenchBench(hub=True)``) a task missing locally is loaded with ``datasets.load_dataset("microsoft/SCBench",
"scbench_<task>", split="test")`` (online only) when the directory has no SCBench data. A task missing while
the directory has other SCBench tasks raises :class:`MissingDataError` (nothing is generated then); with no
SCBench data at all and no hub, the four generated tasks run and the other eight raise it.

Field types (hub card and the official runner): every row ``context`` (``str``; ``mf``: ``list[int]``,
formatted as ``str(list)`` like the official ``str.format``; ``vt`` may carry it as ``input``), ``id``
(int) and ``multi_turns: list[{input: str, answer}]``; ``choice_eng`` turns add ``options: list[str]`` (4)
with ``answer`` one of them; ``mf`` answers are ``int`` (a one-element list is also accepted, as the
official scorer does); ``vt`` answers a list of variable names (a str is one reference); ``many_shot``
rows add ``task: str``; ``repoqa`` rows add ``lang`` and ``repo`` and its turns ``name``; ``repoqa_and_kv``
rows add ``lang``, ``repo`` and each turn ``task`` in {``scbench_repoqa``, ``scbench_kv``} (``name`` on
repoqa turns); ``summary_with_needles`` turns add ``task`` in {``scbench_summary``, ``scbench_passkey``}.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError, MissingDataError
from kvbench.scorers.scbench import choice_references, scorer_names
from kvbench.scorers.scbench_repoqa import LANGUAGES, repoqa_references
from kvbench.task_cache import TaskDataCache
from kvbench.tasks import Bench, Context, PromptLength, Question, register_bench

__all__ = [
    "HUB_ID",
    "INSTRUCTIONS",
    "MAX_NEW_TOKENS",
    "TASKS",
    "MissingDataError",
    "SCBenchBench",
    "SCBenchDataError",
    "build_context",
    "data_root",
    "find_task_files",
    "iter_rows",
]

HUB_ID = "microsoft/SCBench"
HUB_ENV = "KVBENCH_SCBENCH_HUB"

#: The 12 tasks, in the order of the official ``scripts/run_all_tasks.sh``.
TASKS = (
    "kv",
    "prefix_suffix",
    "vt",
    "repoqa",
    "qa_eng",
    "qa_chn",
    "choice_eng",
    "many_shot",
    "summary",
    "mf",
    "summary_with_needles",
    "repoqa_and_kv",
)

#: Official ``DATA_NAME_TO_MAX_NEW_TOKENS``; mixed tasks by sub-task (the turn's ``task``).
MAX_NEW_TOKENS: dict[str, int | dict[str, int]] = {
    "kv": 150,
    "prefix_suffix": 150,
    "vt": 30,
    "repoqa": 1024,
    "qa_eng": 40,
    "qa_chn": 40,
    "choice_eng": 40,
    "many_shot": 10,
    "summary": 200,
    "mf": 5,
    "summary_with_needles": {"scbench_summary": 800, "scbench_passkey": 15},
    "repoqa_and_kv": {"scbench_repoqa": 1024, "scbench_kv": 80},
}

#: The text before ``{context}`` in the official scdq context template (``multiturn_templates_scdq``); the
#: other tasks' template is ``"{context}"`` alone. mf's is the first turn's input, see :func:`build_context`.
INSTRUCTIONS = {
    "kv": "Extract the value corresponding to the specified key in the JSON object below.\n\n",
    "choice_eng": "Read the book and answer the question.\n\n",
    "qa_eng": "Read the book and answer the question. Be very concise in your answer.\n\n",
    "qa_chn": "阅读以下书籍然后回答问题。\n\n",
    "repoqa": (
        "Based on the function description and code context, please retrieve and repeat the exact described "
        "function from the code context in a code block wrapped by ```:\n\n"
    ),
}

#: The official runner's ``--max_turns`` default: the turn count its truncation reserve is sized for.
OFFICIAL_MAX_TURNS = 5
MAX_TURNS_ENV = "KVBENCH_SCBENCH_MAX_TURNS"

_CHOICE_Q = "Question: {q}\nA. {o[0]}\nB. {o[1]}\nC. {o[2]}\nD. {o[3]}\n\nThe the correct answer is"
_QA_ENG_Q = "Question: {q}\nAnswer:"
_QA_CHN_Q = "问题：{q}\n答案："
_MF_TARGET = re.compile(r"The .+ is")
_SUBTASKS = {
    "summary_with_needles": {"scbench_summary": "summary", "scbench_passkey": "passkey"},
    "repoqa_and_kv": {"scbench_repoqa": "repoqa", "scbench_kv": "kv"},
}


class SCBenchDataError(KvbenchError):
    """An SCBench row does not have the fields and types of its task."""


# --- locating and reading the data -----------------------------------------------------------------------


def data_root(data_dir: str | os.PathLike | None = None) -> Path | None:
    """``<data_dir>/scbench`` (default ``$KVBENCH_DATA_DIR/scbench``), or None when neither is set."""
    base = data_dir if data_dir is not None else os.environ.get("KVBENCH_DATA_DIR")
    return Path(base) / "scbench" if base else None


def find_task_files(root: Path, task: str) -> list[Path]:
    """The files holding ``task`` under ``root``, first layout found: ``scbench_<task>/*.parquet``,
    ``scbench_<task>/*.jsonl``, ``data/scbench_<task>.jsonl``, ``scbench_<task>.jsonl``. Empty if none."""
    folder = root / f"scbench_{task}"
    for pattern in ("*.parquet", "*.jsonl"):
        files = sorted(folder.glob(pattern)) if folder.is_dir() else []
        if files:
            return files
    for path in (root / "data" / f"scbench_{task}.jsonl", root / f"scbench_{task}.jsonl"):
        if path.is_file():
            return [path]
    return []


def iter_rows(files: Iterable[Path], columns: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """Rows of jsonl / parquet ``files`` in order, streamed (parquet in small batches), as plain Python
    values (lists, dicts, ints, strs). ``columns`` limits what parquet files read."""
    for path in files:
        if path.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                pf = pq.ParquetFile(path)
                cols = [c for c in columns if c in pf.schema_arrow.names] if columns else None
                batches = iter(pf.iter_batches(batch_size=4, columns=cols))
                while (batch := next(batches, None)) is not None:
                    yield from batch.to_pylist()
            except (pa.ArrowException, OSError) as e:  # cut short, or not parquet at all
                raise SCBenchDataError(f"{path}: not a readable parquet file ({e}); remove it and fetch it again with "
                                       "`kvbench data fetch scbench --data-dir DIR`") from None  # fmt: skip
        else:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except json.JSONDecodeError as e:
                            raise SCBenchDataError(f"{path}:{n}: not a JSON line ({e.msg})") from None


_FIX = (
    f"`kvbench data fetch scbench --data-dir DIR` fetches it into DIR/scbench (online; by hand: `huggingface-cli "
    f"download {HUB_ID} --repo-type dataset --local-dir DIR/scbench`), and a run reads it with the same option "
    f"(or KVBENCH_DATA_DIR=DIR); or, online, set {HUB_ENV}=1 to load it through `datasets`"
)


def _missing(task: str, root: Path | None, generated_mode: bool = False) -> MissingDataError:
    """The missing-data error of ``task``: ``reason`` one line, ``fix`` the same for every task."""
    if generated_mode:
        from kvbench.tasks.scbench_generate import GENERATED_TASKS

        reason = (
            f"needs SCBench's hub data (no SCBench data {'under ' + str(root) if root else 'given'}; kvbench "
            f"generates only {', '.join(GENERATED_TASKS)} offline)"
        )
    elif root is not None:
        reason = f"no scbench_{task} data under {root} (scbench_{task}/*.parquet or *.jsonl, data/scbench_{task}.jsonl)"
    else:
        reason = f"no SCBench data for {task}: neither --data-dir nor $KVBENCH_DATA_DIR is set"
    return MissingDataError(reason=reason, fix=_FIX)


# --- turning rows into contexts --------------------------------------------------------------------------


def _err(task: str, index: int, what: str) -> SCBenchDataError:
    return SCBenchDataError(f"scbench/{task} row {index}: {what}")


def _text(value: Any, task: str, index: int, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _err(task, index, f"{field} must be a string, got {type(value).__name__}")
    return str(value)


def _body(task: str, index: int, row: dict) -> str:
    context = row.get("context")
    if context is None and task == "vt":
        context = row.get("input")  # some vt rows carry the context as ``input`` (official runner falls back)
    if task == "mf" and isinstance(context, (list, tuple)):
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in context):
            raise _err(task, index, "mf context must be a list of ints")
        return str([int(x) for x in context])  # the official str.format of a list of ints
    if not isinstance(context, str):
        raise _err(task, index, f"context must be a string, got {type(context).__name__}")
    return context


def _mf_label(value: Any, task: str, index: int) -> str:
    if isinstance(value, (list, tuple)) and value:
        value = value[0]  # the official scorer takes label[0] of a list
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _err(task, index, f"mf answer must be an int, got {type(value).__name__}")
    return str(value)


def _mf_question(text: str, task: str, index: int) -> str:
    found = _MF_TARGET.findall(text)
    if not found:
        raise _err(task, index, f"mf input has no 'The ... is' target: {text[:80]!r}")
    return f"What is {found[0].lower()[:-3]}?\n\n{text}"


def reserve_tokens(task: str, n_turns: int, max_turns: int | None = None) -> int:
    """What the official runner subtracts from ``--max_seq_length`` before it middle-truncates a context
    prompt in shared-context mode: ``max_new_tokens * T + 1000`` (mixed tasks ``sum(max_new_tokens) * T // 2
    + 1000``) with ``T = min(n_turns, max_turns or 5)``, the row's turns capped at the official 5."""
    turns = min(n_turns, max_turns or OFFICIAL_MAX_TURNS)
    mnt = MAX_NEW_TOKENS[task]
    per = sum(mnt.values()) * turns // 2 if isinstance(mnt, dict) else mnt * turns
    return per + 1000


def build_context(
    task: str,
    index: int,
    row: dict,
    needles: dict[str, list[tuple[str, str]]] | None = None,
    bench: str = "scbench",
    *,
    max_turns: int | None = None,
    source: str = "hub",
) -> Context:
    """The :class:`Context` of row ``index`` of ``task``, in SCBench's own assembly (``assembly="scbench"``).
    ``needles`` (repo -> [(name, source)]) is the repoqa needle pool, required for ``repoqa`` and
    ``repoqa_and_kv``. ``max_turns``: ask only the first turns (the official ``--max_turns``); None asks
    every turn. ``source``: ``"hub"`` or ``"generated"``, recorded in the context."""
    if task not in TASKS:
        raise ValueError(f"unknown scbench task {task!r}; valid tasks: {', '.join(TASKS)}")
    turns = row.get("multi_turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        raise _err(task, index, "multi_turns must be a non-empty list of {input, answer} objects")
    n_turns = len(turns)
    turns = turns[:max_turns] if max_turns else turns
    body = _body(task, index, row)
    instruction = INSTRUCTIONS.get(task, "")
    reserve = reserve_tokens(task, n_turns, max_turns)
    meta: dict[str, Any] = {"row": index, "n_turns": n_turns, "reserve_tokens": reserve}
    if "id" in row and row["id"] is not None:
        meta["id"] = row["id"] if isinstance(row["id"], (int, str)) else str(row["id"])

    lang = repo = None
    if task in ("repoqa", "repoqa_and_kv"):
        lang, repo = row.get("lang"), row.get("repo")
        if lang not in LANGUAGES:
            raise _err(task, index, f"lang must be one of {', '.join(LANGUAGES)}, got {lang!r}")
        if not isinstance(repo, str):
            raise _err(task, index, f"repo must be a string, got {type(repo).__name__}")
        if needles is None:
            raise ValueError(f"scbench/{task} needs the repo's needle pool")
        meta.update(lang=lang, repo=repo)
    if task == "many_shot" and row.get("task") is not None:
        meta["subtask"] = row["task"]
    if task == "mf":
        instruction = _text(turns[0].get("input"), task, index, "input") + "\n\n"

    questions = []
    subtasks = []
    for j, turn in enumerate(turns):
        text = _text(turn.get("input"), task, index, f"turn {j} input")
        answer = turn.get("answer")
        key, mnt = task, MAX_NEW_TOKENS[task]
        if task in _SUBTASKS:
            sub = turn.get("task")
            if sub not in _SUBTASKS[task]:
                raise _err(task, index, f"turn {j} task must be one of {', '.join(_SUBTASKS[task])}, got {sub!r}")
            subtasks.append(sub)
            key, mnt = f"{task}_{_SUBTASKS[task][sub]}", MAX_NEW_TOKENS[task][sub]
        assert isinstance(mnt, int)

        if task == "choice_eng":
            options = turn.get("options")
            if not isinstance(options, list) or len(options) != 4 or not all(isinstance(o, str) for o in options):
                raise _err(task, index, f"turn {j} options must be a list of 4 strings, got {options!r}")
            answer = _text(answer, task, index, f"turn {j} answer")
            if answer not in options:
                raise _err(task, index, f"turn {j} answer {answer!r} is not one of its options")
            text = _CHOICE_Q.format(q=text, o=options)
            refs = choice_references(answer, options)
        elif task == "mf":
            text = _mf_question(text, task, index)
            refs = (_mf_label(answer, task, index),)
        elif task == "vt" and isinstance(answer, list):
            refs = tuple(_text(a, task, index, f"turn {j} answer item") for a in answer)
            if not refs:
                raise _err(task, index, f"turn {j} answer is an empty list")
        elif key in ("repoqa", "repoqa_and_kv_repoqa"):
            name = _text(turn.get("name"), task, index, f"turn {j} name")
            refs = repoqa_references(_text(answer, task, index, f"turn {j} answer"), lang, name, needles.get(repo, []))
        elif task == "qa_eng" and isinstance(answer, list):
            refs = tuple(_text(a, task, index, f"turn {j} answer item") for a in answer)
            if not refs:
                raise _err(task, index, f"turn {j} answer is an empty list")
        else:
            refs = (_text(answer, task, index, f"turn {j} answer"),)
        if task == "qa_eng":
            text = _QA_ENG_Q.format(q=text)
        elif task == "qa_chn":
            text = _QA_CHN_Q.format(q=text)
        questions.append(Question(str(j), text, "", mnt, refs, scorer_names(key)))
    if subtasks:
        meta["subtasks"] = subtasks
    return Context(
        bench, task, str(index), instruction, body, tuple(questions), meta, glue="", assembly="scbench",
        reserve_tokens=reserve, source=source,
    )  # fmt: skip


def needle_pool(task: str, rows: Iterable[dict], max_turns: int | None = None) -> dict[str, list[tuple[str, str]]]:
    """repo -> [(name, source)] over ``rows`` in order, as the official ``compute_scores`` collects needles from
    the turns it asked: every turn of ``repoqa`` (the first ``max_turns`` of each row when capped), the
    ``scbench_repoqa`` turns of ``repoqa_and_kv``. Over every row of the task, as in a full official run (a
    ``--limit`` does not shrink the pool). Duplicate pairs are dropped (they cannot change which needle is
    the most similar)."""
    pool: dict[str, list[tuple[str, str]]] = {}
    seen: set[tuple[str, str, str]] = set()
    for row in rows:
        repo = row.get("repo")
        for turn in (row.get("multi_turns") or [])[:max_turns]:
            if task == "repoqa_and_kv" and turn.get("task") != "scbench_repoqa":
                continue
            name, source = turn.get("name"), turn.get("answer")
            if isinstance(repo, str) and isinstance(name, str) and isinstance(source, str):
                if (repo, name, source) not in seen:
                    seen.add((repo, name, source))
                    pool.setdefault(repo, []).append((name, source))
    return pool


# --- the bench -------------------------------------------------------------------------------------------


def max_turns_setting() -> int | None:
    """``$KVBENCH_SCBENCH_MAX_TURNS`` (the official ``--max_turns`` cap on the turns asked), None if unset."""
    text = os.environ.get(MAX_TURNS_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise KvbenchError(f"{MAX_TURNS_ENV}={text!r}: give a positive number of turns (5 is the official cap), "
                           "or unset it to ask every turn")  # fmt: skip
    return int(text)


def row_measure(tokenizer, task: str) -> Callable[[dict], int]:
    """``measure(row)``: the tokens a row of ``task`` needs as the model sees it, in SCBench's assembly
    (:mod:`kvbench.prompt`): its context prompt plus its longest query and that query's ``max_new_tokens``.
    Generators size their rows with it."""
    from kvbench.prompt import render

    def measure(row: dict) -> int:
        ctx = build_context(task, 0, row, needles={}, source="generated")
        rendered = render(tokenizer, ctx)
        need = (len(q) + spec.max_new_tokens for q, spec in zip(rendered.question_ids, ctx.questions, strict=True))
        return len(rendered.context_ids) + max(need)

    return measure


def _row_cache(directory: Path, key: dict) -> TaskDataCache:
    """Generated rows of one (task, length, seed, generator version, tokenizer) in one jsonl file under
    ``directory`` (:func:`_load_rows`, :func:`_rows_text`)."""
    return TaskDataCache(directory, key, f"{key['task']}-{key['length']}", ".jsonl", "SCBench")


def _load_rows(cache: TaskDataCache, length: int, measure: Callable[[dict], int]) -> list[dict]:
    """The cached rows, re-measured; none (regenerate) where the file is missing, unreadable, corrupt or
    its rows no longer fit ``length``."""
    rows = cache.load(lambda text: [json.loads(line) for line in text.split("\n") if line.strip()])
    if rows is None:
        return []
    return rows if all(isinstance(r, dict) and measure(r) <= length for r in rows) else []


def _rows_text(rows: list[dict]) -> str:
    """The cache file's text: one JSON row a line."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


@register_bench
class SCBenchBench(Bench):
    """SCBench in shared-context mode; see the module docstring.

    data_dir: the directory holding ``scbench/`` (default ``$KVBENCH_DATA_DIR``, read when contexts are
    requested). hub: load a task missing locally from the hub through ``datasets`` (default
    ``$KVBENCH_SCBENCH_HUB`` == ``"1"``). max_turns: ask only each row's first turns (the official
    ``--max_turns``; default ``$KVBENCH_SCBENCH_MAX_TURNS``, unset: every turn).

    Where the data comes from, for the whole bench at once: a task's local files when the data directory
    has SCBench data (a task without files is missing; nothing is generated), else the hub when asked for,
    else **generated offline** (:mod:`kvbench.tasks.scbench_generate`): kv, mf, prefix_suffix and vt are
    generated in SCBench's row schema, sized to ``length`` with the model's tokenizer and seeded by ``seed``,
    and the other tasks are missing. Generated contexts say ``source="generated"``, hub rows ``"hub"``.
    """

    name = "scbench"
    title = "SCBench"
    sub_task_caption = "Mixed SCBench tasks enter as the mean of their two sub-task scores."
    description = (
        "SCBench (12 tasks) in shared-context multi-query mode, official prompts; official + revised scorers. "
        "Without its data: kv, mf, prefix_suffix, vt generated offline."
    )
    cache_dir: Path | str | None = None
    assemblies = {"scbench": "kvbench.tasks.scbench_prompt:ASSEMBLY"}  # its contexts' assembly (build_context)

    @classmethod
    def sub_task(cls, task: str, scorer: str) -> str:
        """The sub-task a mixed task's scorer names (``scbench_repoqa_and_kv_kv`` and its ``_revised`` twin ->
        ``kv``; :func:`kvbench.scorers.scbench.scorer_names`), else ``""``."""
        name = scorer.removesuffix("_revised")
        prefix = f"scbench_{task}_"
        return name[len(prefix) :] if name.startswith(prefix) else ""

    def __init__(
        self, data_dir: str | os.PathLike | None = None, hub: bool | None = None, max_turns: int | None = None
    ) -> None:
        self.data_dir = data_dir
        self.hub = hub
        self.max_turns = max_turns
        self._pools: dict[str, dict[str, list[tuple[str, str]]]] = {}

    def tasks(self) -> list[str]:
        return list(TASKS)

    def _max_turns(self) -> int | None:
        return self.max_turns if self.max_turns is not None else max_turns_setting()

    def has_local_data(self) -> bool:
        """Whether the data directory holds any SCBench task (then nothing is generated)."""
        root = data_root(self.data_dir)
        return root is not None and any(find_task_files(root, t) for t in TASKS)

    def _source(self, task: str) -> tuple[str, Any]:
        """("files", [paths]), ("hub", dataset) or ("generated", None); raises MissingDataError."""
        root = data_root(self.data_dir)
        files = find_task_files(root, task) if root is not None else []
        if files:
            return "files", files
        if self.has_local_data():
            raise _missing(task, root)
        hub = self.hub if self.hub is not None else os.environ.get(HUB_ENV) == "1"
        if not hub:
            from kvbench.tasks.scbench_generate import GENERATED_TASKS

            if task in GENERATED_TASKS:
                return "generated", None
            raise _missing(task, root, generated_mode=True)
        try:
            import datasets

            return "hub", datasets.load_dataset(HUB_ID, f"scbench_{task}", split="test")
        except Exception as e:  # offline, unknown config, ...
            miss = _missing(task, root)
            raise MissingDataError(
                reason=f"{miss.reason} (loading {HUB_ID} config scbench_{task} from the hub failed: {e})", fix=_FIX
            ) from e

    def _rows(self, source: tuple[str, Any], columns: list[str] | None = None) -> Iterator[dict]:
        kind, obj = source
        return iter_rows(obj, columns) if kind == "files" else iter(obj)

    def _pool(self, task: str, source: tuple[str, Any]) -> dict[str, list[tuple[str, str]]]:
        if task not in self._pools:
            rows = self._rows(source, ["repo", "multi_turns"])
            self._pools[task] = needle_pool(task, rows, self._max_turns())
        return self._pools[task]

    def contexts(
        self, task: str, *, length: int, limit: int, seed: int, prompt_length: PromptLength
    ) -> Iterator[Context]:
        """Yield the first ``limit`` rows of ``task`` as contexts, all turns each (or the first
        ``max_turns``). Hub rows are fixed (``length`` and ``seed`` unused; the prompt is truncated as the
        official runner does); generated rows are sized to ``length`` with ``prompt_length``'s tokenizer and
        drawn with ``seed``. An unknown task raises ``ValueError`` and missing data
        :class:`MissingDataError`, both at once."""
        if task not in TASKS:
            raise ValueError(f"unknown scbench task {task!r}; valid tasks: {', '.join(TASKS)}")
        max_turns = self._max_turns()
        source = self._source(task)
        if source[0] == "generated":
            return self._generated(task, length, limit, seed, prompt_length, max_turns)
        return self._from_rows(task, limit, source, max_turns)

    def _from_rows(self, task: str, limit: int, source: tuple[str, Any], max_turns: int | None) -> Iterator[Context]:
        needles = self._pool(task, source) if task in ("repoqa", "repoqa_and_kv") and limit > 0 else None
        # islice stops at ``limit`` rows without reading the next: a bad line after them is not this run's
        index = -1
        for index, row in enumerate(itertools.islice(self._rows(source), max(limit, 0))):
            yield build_context(task, index, row, needles, bench=self.name, max_turns=max_turns)
        if index < 0 < limit and source[0] == "files":  # never "0 contexts" and success
            names = ", ".join(str(f) for f in source[1])
            raise SCBenchDataError(f"scbench/{task}: {names} holds no row, so the task has no context; remove it "
                                   "and fetch it again with `kvbench data fetch scbench --data-dir DIR`")  # fmt: skip

    def _generated(
        self, task: str, length: int, limit: int, seed: int, prompt_length: PromptLength, max_turns: int | None
    ) -> Iterator[Context]:
        from kvbench.tasks.ruler import tokenizer_fingerprint
        from kvbench.tasks.scbench_generate import GENERATOR_VERSION, generate_row

        tokenizer = getattr(prompt_length, "tokenizer", None)
        if tokenizer is None:
            raise KvbenchError("generating SCBench rows needs kvbench.prompt.prompt_length(tokenizer) (its tokenizer)")
        measure = row_measure(tokenizer, task)
        rows: list[dict] = []
        cache = None
        if self.cache_dir is not None:
            key = {"version": GENERATOR_VERSION, "task": task, "length": length, "seed": seed,
                   "tokenizer": tokenizer_fingerprint(prompt_length)}  # fmt: skip
            cache = _row_cache(Path(self.cache_dir), key)
            rows = _load_rows(cache, length, measure)
        fresh = False
        for index in range(limit):
            if index >= len(rows):
                rows.append(generate_row(task, index, length=length, seed=seed, measure=measure))
                fresh = True
                if cache is not None and (index + 1) % 8 == 0:
                    cache.store(_rows_text(rows))
            yield build_context(task, index, rows[index], {}, bench=self.name, max_turns=max_turns, source="generated")
        if cache is not None and fresh:
            cache.store(_rows_text(rows))
