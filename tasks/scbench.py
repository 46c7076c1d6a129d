"""The ``scbench`` bench: SCBench's 12 tasks (microsoft/MInference ``scbench/``) in shared-context mode.

Each SCBench row is one long context with several queries (``multi_turns``). kvbench runs SCBench's
shared-context multi-query mode ("scdq", ``--same_context_different_query``): the context goes through
the chat template once and every turn is asked against it as its own :class:`~kvbench.tasks.Question`
(the official HF runner decodes each query with ``update_global_past_kv=False``, so every query sees only
the context). All turns of a row are asked (the paper runs every context with all its questions; the
official ``--max_turns 5`` cut is not applied).

**Prompts** (official ``multiturn_templates_scdq`` / ``multiturn_follow_up_templates_in_chat_tempate``).
The official context prompt is ``INSTRUCTION + "\\n\\n" + context``; kvbench's core renders
``instruction + "\\n" + body + "\\n" + question``, so ``instruction`` carries the instruction plus one
``"\\n"`` (the core adds the other). Tasks whose official context template is ``"{context}"`` have an empty
instruction (the core still puts one ``"\\n"`` before the body), and the core puts ``"\\n"`` between the
body and the question where the official scdq prompt has none. Questions per task:

* kv, prefix_suffix, vt, repoqa, many_shot, summary, mixed tasks: the turn's ``input``.
* qa_eng: ``"Question: {input}\\nAnswer:"``; qa_chn: ``"问题：{input}\\n答案："``.
* choice_eng: ``"Question: {input}\\nA. {o0}\\nB. {o1}\\nC. {o2}\\nD. {o3}\\n\\nThe the correct answer is"``
  (sic), with each turn's own options.
* mf: instruction = the first turn's ``input`` (the official scdq ``prefix``); each question
  ``"What is {target}?\\n\\n{input}"`` with ``target`` = the first ``The .+ is`` match of the input, lower
  case, without the trailing ``" is"``.

No answer prefix (``answer_prefix=""``). Generation lengths: :data:`MAX_NEW_TOKENS` (official
``DATA_NAME_TO_MAX_NEW_TOKENS``; mixed tasks by each turn's ``task``).

**Sizing.** SCBench items are fixed: ``length`` and ``prompt_length`` are not used (the core
middle-truncates a body that exceeds the model limit and records it), ``limit`` is the number of rows per
task (in file order), and ``seed`` is unused (nothing is sampled). ``Context.meta`` records the row index
and ``id``, the number of turns and ``reserve_tokens``: what the official runner subtracts from
``--max_seq_length`` to size its middle truncation (``max_new_tokens * n_turns``; mixed tasks
``sum(max_new_tokens) * n_turns // 2``; + 1000 in shared-context mode), with this row's turn count (the
official runner uses the first row's).

**Scorers.** Each question's ``scorers`` is ``(official, revised)`` from :mod:`kvbench.scorers.scbench`;
mixed tasks use their sub-task's pair. The references layouts (choice options, repoqa needle pool) are
documented there.

**Data.** ``$KVBENCH_DATA_DIR/scbench/`` (the CLI's ``--data-dir`` sets it) in the hub layout
``scbench_<task>/*.parquet`` (``test-00000-of-00001.parquet``) or ``scbench_<task>/*.jsonl``, or the hub's
raw ``data/scbench_<task>.jsonl``, or ``scbench_<task>.jsonl``. With ``KVBENCH_SCBENCH_HUB=1`` (or
``SCBenchBench(hub=True)``) a task missing locally is loaded with ``datasets.load_dataset("microsoft/SCBench",
"scbench_<task>", split="test")`` (online only). Otherwise a missing task raises :class:`MissingDataError`.

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

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError, MissingDataError
from kvbench.scorers.scbench import choice_references, scorer_names
from kvbench.scorers.scbench_repoqa import LANGUAGES, repoqa_references
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

#: The instruction before the context (official scdq context template minus ``"\n{context}"``); mf's is
#: the first turn's input, see :func:`build_context`.
INSTRUCTIONS = {
    "kv": "Extract the value corresponding to the specified key in the JSON object below.\n",
    "choice_eng": "Read the book and answer the question.\n",
    "qa_eng": "Read the book and answer the question. Be very concise in your answer.\n",
    "qa_chn": "阅读以下书籍然后回答问题。\n",
    "repoqa": (
        "Based on the function description and code context, please retrieve and repeat the exact described "
        "function from the code context in a code block wrapped by ```:\n"
    ),
}

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
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(path)
            cols = [c for c in columns if c in pf.schema_arrow.names] if columns else None
            for batch in pf.iter_batches(batch_size=4, columns=cols):
                yield from batch.to_pylist()
        else:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except json.JSONDecodeError as e:
                            raise SCBenchDataError(f"{path}:{n}: not a JSON line ({e.msg})") from None


def _missing(task: str, root: Path | None) -> MissingDataError:
    where = (
        f"no SCBench data for task {task!r} under {root} (looked for {root / f'scbench_{task}'}/*.parquet "
        f"or *.jsonl, {root / 'data' / f'scbench_{task}.jsonl'}, {root / f'scbench_{task}.jsonl'})"
        if root is not None
        else f"no SCBench data for task {task!r}: neither --data-dir nor $KVBENCH_DATA_DIR is set"
    )
    return MissingDataError(
        f"{where}. Fix: put the hub dataset there, e.g. `huggingface-cli download {HUB_ID} --repo-type dataset "
        f"--local-dir DIR/scbench`, and pass --data-dir DIR (or set KVBENCH_DATA_DIR=DIR); or, online, set "
        f"{HUB_ENV}=1 to load {HUB_ID} through `datasets`."
    )


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


def _reserve(task: str, n_turns: int) -> int:
    mnt = MAX_NEW_TOKENS[task]
    per = sum(mnt.values()) * n_turns // 2 if isinstance(mnt, dict) else mnt * n_turns
    return per + 1000


def build_context(
    task: str, index: int, row: dict, needles: dict[str, list[tuple[str, str]]] | None = None, bench: str = "scbench"
) -> Context:
    """The :class:`Context` of row ``index`` of ``task``. ``needles`` (repo -> [(name, source)]) is the
    repoqa needle pool, required for ``repoqa`` and ``repoqa_and_kv``."""
    if task not in TASKS:
        raise ValueError(f"unknown scbench task {task!r}; valid tasks: {', '.join(TASKS)}")
    turns = row.get("multi_turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        raise _err(task, index, "multi_turns must be a non-empty list of {input, answer} objects")
    body = _body(task, index, row)
    instruction = INSTRUCTIONS.get(task, "")
    meta: dict[str, Any] = {"row": index, "n_turns": len(turns), "reserve_tokens": _reserve(task, len(turns))}
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
        instruction = _text(turns[0].get("input"), task, index, "input") + "\n"

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
    return Context(bench, task, str(index), instruction, body, tuple(questions), meta)


def needle_pool(task: str, rows: Iterable[dict]) -> dict[str, list[tuple[str, str]]]:
    """repo -> [(name, source)] over ``rows`` in order: every turn of ``repoqa``, the ``scbench_repoqa``
    turns of ``repoqa_and_kv``; duplicate pairs dropped."""
    pool: dict[str, list[tuple[str, str]]] = {}
    seen: set[tuple[str, str, str]] = set()
    for row in rows:
        repo = row.get("repo")
        for turn in row.get("multi_turns") or []:
            if task == "repoqa_and_kv" and turn.get("task") != "scbench_repoqa":
                continue
            name, source = turn.get("name"), turn.get("answer")
            if isinstance(repo, str) and isinstance(name, str) and isinstance(source, str):
                if (repo, name, source) not in seen:
                    seen.add((repo, name, source))
                    pool.setdefault(repo, []).append((name, source))
    return pool


# --- the bench -------------------------------------------------------------------------------------------


@register_bench
class SCBenchBench(Bench):
    """SCBench in shared-context mode; see the module docstring.

    data_dir: the directory holding ``scbench/`` (default ``$KVBENCH_DATA_DIR``, read when contexts are
    requested). hub: load a task missing locally from the hub through ``datasets`` (default
    ``$KVBENCH_SCBENCH_HUB`` == ``"1"``).
    """

    name = "scbench"
    description = "SCBench (12 tasks) in shared-context multi-query mode, official prompts; official + revised scorers."

    def __init__(self, data_dir: str | os.PathLike | None = None, hub: bool | None = None) -> None:
        self.data_dir = data_dir
        self.hub = hub
        self._pools: dict[str, dict[str, list[tuple[str, str]]]] = {}

    def tasks(self) -> list[str]:
        return list(TASKS)

    def _source(self, task: str) -> tuple[str, Any]:
        """("files", [paths]) or ("hub", dataset); raises MissingDataError."""
        root = data_root(self.data_dir)
        files = find_task_files(root, task) if root is not None else []
        if files:
            return "files", files
        hub = self.hub if self.hub is not None else os.environ.get(HUB_ENV) == "1"
        if not hub:
            raise _missing(task, root)
        try:
            import datasets

            return "hub", datasets.load_dataset(HUB_ID, f"scbench_{task}", split="test")
        except Exception as e:  # offline, unknown config, ...
            raise MissingDataError(
                f"{_missing(task, root)} (loading {HUB_ID} config scbench_{task} from the hub failed: {e})"
            ) from e

    def _rows(self, source: tuple[str, Any], columns: list[str] | None = None) -> Iterator[dict]:
        kind, obj = source
        return iter_rows(obj, columns) if kind == "files" else iter(obj)

    def _pool(self, task: str, source: tuple[str, Any]) -> dict[str, list[tuple[str, str]]]:
        if task not in self._pools:
            self._pools[task] = needle_pool(task, self._rows(source, ["repo", "multi_turns"]))
        return self._pools[task]

    def contexts(
        self, task: str, *, length: int, limit: int, seed: int, prompt_length: PromptLength
    ) -> Iterator[Context]:
        """Yield the first ``limit`` rows of ``task`` as contexts, all turns each. ``length``,
        ``prompt_length`` and ``seed`` are unused (SCBench items are fixed; the core truncates). An unknown
        task raises ``ValueError`` and missing data :class:`MissingDataError`, both at once."""
        if task not in TASKS:
            raise ValueError(f"unknown scbench task {task!r}; valid tasks: {', '.join(TASKS)}")
        source = self._source(task)
        return self._generate(task, limit, source)

    def _generate(self, task: str, limit: int, source: tuple[str, Any]) -> Iterator[Context]:
        needles = self._pool(task, source) if task in ("repoqa", "repoqa_and_kv") and limit > 0 else None
        if limit <= 0:
            return
        for index, row in enumerate(self._rows(source)):
            if index >= limit:
                break
            yield build_context(task, index, row, needles, bench=self.name)
