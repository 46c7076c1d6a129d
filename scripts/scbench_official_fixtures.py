"""Regenerate tests/fixtures/scbench_official/ from microsoft/MInference's own SCBench code (run offline).

Contains no MInference code: it imports ``eval_utils.create_scdq_prompt`` and ``run_scbench.truncate_by_tokens``
(which calls ``run_scbench.truncate_input``) from the given checkout's ``scbench/`` folder, with that code's
heavy imports (torch, jieba, rouge, tqdm, transformers' model classes and SinkCache, datasets, vllm,
minference, evaluate, tree_sitter_languages, nltk, rich, ...) stood in by empty modules while it is imported
(the two functions use none of them). Then, for every SCBench task and every input row, it builds the
official shared-context ("scdq") prompts with ``use_chat_template=True`` and the shipped tokenizer
``kvbench/builtin/tiny-trained`` (``transformers.AutoTokenizer``), and keeps what the official runner feeds
the model:

* context ids: ``truncate_by_tokens(prompts[0], tok, max_input_length)`` (``tok.encode`` then the middle cut),
  with ``max_input_length`` computed as ``run_scbench.py``'s main loop does in scdq mode:
  ``max_seq_length - max_new_tokens * T`` (mixed tasks ``- sum(max_new_tokens) * T // 2``) ``- 1000``, with
  ``T`` = the row's turns capped at the official ``--max_turns`` 5 (and ``max_new_tokens`` = 500 when the
  task's is >= ``max_seq_length``, as there);
* query ids: ``tok.encode(prompt, add_special_tokens=False)`` of every query prompt (``GreedySearch.test_scdq``
  / ``GreedySearch_vLLM.test_scdq``), every turn of the row;
* the official generation budget of each turn (``DATA_NAME_TO_MAX_NEW_TOKENS``; mixed tasks by the turn's
  ``task``).

Rows: every row of the committed hub-layout fixtures ``tests/fixtures/scbench/scbench_<task>/*.parquet`` at
``max_seq_length`` 131,072 (the official default: nothing is cut), plus the cases of :data:`EXTRA`: rows whose
context starts with whitespace, rows long enough to be cut at a small ``max_seq_length`` (one plain task, one
mixed), and small limits on fixture rows (a cut through the instruction; ``L = max_input_length < 0``, nothing
cut). ``L`` of 0 or 1 is left out: the official ``truncate_input`` then keeps every id and
``truncate_by_tokens``' ``assert len_after <= max_tokens`` stops the run. The extra rows are written first,
deterministically, to ``tests/fixtures/scbench_official/inputs/scbench_<task>.json`` (a JSON list of rows in the
hub's schema). Output: ``tests/fixtures/scbench_official/<task>.json`` (compact JSON): what the official code
produced, and where its input came from.

Usage (see tests/fixtures/scbench_official/README.md)::

    python scripts/scbench_official_fixtures.py --scbench /tmp/mi/scbench \\
        --commit $(git -C <MInference checkout or bare mirror> log -1 --format=%H)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.abc
import importlib.machinery
import io
import json
import random
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "scbench_official"
TOKENIZER = ROOT / "kvbench" / "builtin" / "tiny-trained"
TASKS = (
    "kv prefix_suffix vt repoqa qa_eng qa_chn choice_eng many_shot summary mf summary_with_needles repoqa_and_kv"
).split()
MODEL_LIMIT = 131_072  # the official scripts' --max_seq_length
MAX_TURNS = 5  # the official --max_turns default
MIXED = ("scbench_summary_with_needles", "scbench_repoqa_and_kv")  # run_scbench.py's list
#: Top-level modules the official files import that the two functions used here do not need.
STUBBED = (
    "torch jieba rouge tqdm transformers datasets minference vllm lmcache_vllm evaluate tempdir rich "
    "tree_sitter_languages nltk numpy"
).split()


# --- importing the official code -----------------------------------------------------------------------------


class _Anything:
    """What a stand-in module's attributes are: classes that take any arguments (module-level calls such as
    ``evaluate.load("rouge")`` run at import) and subclassable."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        return self

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self


class _Stub(types.ModuleType):
    """An empty stand-in module (a package): any attribute is a new :class:`_Anything` subclass."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_Anything,), {})
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports every module whose top-level package is in ``stubbed`` as a :class:`_Stub`."""

    def __init__(self, stubbed: tuple[str, ...] = STUBBED) -> None:
        self.stubbed = stubbed

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.stubbed:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        if spec.name == "transformers.utils.import_utils":
            module._is_package_available = lambda name: False  # run_scbench.py: no vllm, no lmcache_vllm
        return module

    def exec_module(self, module):
        pass


def _is_under(module: types.ModuleType, folder: Path) -> bool:
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve().parent == folder.resolve()


def import_modules(scbench: Path, names: list[str], stubbed: tuple[str, ...] = STUBBED) -> list[types.ModuleType]:
    """The official modules ``names`` imported from ``scbench`` with ``stubbed`` stood in; afterwards
    ``sys.path`` is as before and ``sys.modules`` holds neither stand-ins nor official modules."""
    before = dict(sys.modules)
    for name in list(sys.modules):
        if name.split(".")[0] in stubbed:
            del sys.modules[name]
    finder = _StubFinder(stubbed)
    sys.meta_path.insert(0, finder)
    sys.path.insert(0, str(scbench))
    try:
        modules = [importlib.import_module(name) for name in names]
    finally:
        sys.path.remove(str(scbench))
        sys.meta_path.remove(finder)
        for name, module in list(sys.modules.items()):
            # the stand-ins and the official modules go; real packages imported meanwhile stay (rich, for
            # one, imports submodules lazily and breaks when they load twice)
            if name not in before and (isinstance(module, _Stub) or _is_under(module, scbench)):
                del sys.modules[name]
        sys.modules.update(before)
    for module in modules:
        assert Path(module.__file__).resolve().parent == scbench.resolve(), module.__file__
    return modules


def import_official(scbench: Path) -> tuple[types.ModuleType, types.ModuleType]:
    """``(eval_utils, run_scbench)`` imported from ``scbench`` with :data:`STUBBED` stood in."""
    eval_utils, run_scbench = import_modules(scbench, ["eval_utils", "run_scbench"])
    return eval_utils, run_scbench


# --- the official pipeline, one row -----------------------------------------------------------------------


def official(ev, rs, tok, task: str, row: dict, max_seq_length: int) -> dict:
    """What ``run_scbench.py`` feeds the model for ``row`` in scdq mode with ``--use_chat_template``."""
    data_name = f"scbench_{task}"
    max_new_tokens = ev.DATA_NAME_TO_MAX_NEW_TOKENS[data_name]
    if isinstance(max_new_tokens, dict):  # run_scbench.py's main loop, as written
        assert max(max_new_tokens.values()) <= max_seq_length
    elif max_new_tokens >= max_seq_length:
        max_new_tokens = 500
    turns = min(len(row["multi_turns"]), MAX_TURNS)
    if data_name in MIXED:
        max_input_length = max_seq_length - (sum(list(max_new_tokens.values())) * turns // 2)
    else:
        max_input_length = max_seq_length - max_new_tokens * turns
    max_input_length -= 1000  # scdq_mode
    encoded = ev.create_scdq_prompt(copy.deepcopy(row), data_name=data_name, tok=tok, use_chat_template=True)
    with contextlib.redirect_stdout(io.StringIO()):  # truncate_by_tokens prints the counts
        context_ids = rs.truncate_by_tokens(encoded["prompts"][0], tok, max_input_length)
    tokens_before = len(tok.encode(encoded["prompts"][0]))
    queries = [tok.encode(prompt, add_special_tokens=False) for prompt in encoded["prompts"][1:]]
    if isinstance(max_new_tokens, dict):  # test_scdq: max_length[example["task"][idx - 1]]
        per_turn = [max_new_tokens[t] for t in encoded["task"]]
    else:
        per_turn = [max_new_tokens] * len(queries)
    return {
        "max_seq_length": max_seq_length,
        "n_turns": len(row["multi_turns"]),
        "turns_for_reserve": turns,
        "max_input_length": max_input_length,
        "tokens_before": tokens_before,
        "truncated": len(context_ids) < tokens_before,
        "max_new_tokens": per_turn,
        "context_ids": [int(i) for i in context_ids],
        "query_ids": [[int(i) for i in q] for q in queries],
    }


# --- the rows --------------------------------------------------------------------------------------------


def fixture_rows(task: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(FIXTURES / "scbench" / f"scbench_{task}" / "test-00000-of-00001.parquet").to_pylist()


def _uuid(rng: random.Random) -> str:
    h = "".join(rng.choice("0123456789abcdef") for _ in range(32))
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def long_kv_row() -> dict:
    """A kv row of 24 pairs (about 1,900 tokens) and 6 turns (the reserve counts 5)."""
    rng = random.Random(20241213)
    pairs = [(_uuid(rng), _uuid(rng)) for _ in range(24)]
    context = "JSON data:\n{" + ", ".join(f'"{k}": "{v}"' for k, v in pairs) + "}"
    turns = [
        {"answer": pairs[i][1], "input": f'Key: "{pairs[i][0]}"\nThe value associated with the specified key is: '}
        for i in (0, 5, 11, 17, 20, 23)
    ]
    return {"id": 0, "context": context, "multi_turns": turns}


def long_summary_with_needles_row() -> dict:
    """A summary_with_needles row (about 1,500 tokens) of 3 turns: summary, passkey, summary."""
    rng = random.Random(7)
    subjects = ["The keeper", "The survey", "Each ledger", "The crew", "The archive", "A later study"]
    verbs = ["recorded", "compared", "listed", "described", "measured", "noted"]
    objects = ["storm days", "wind at dawn", "the tide tables", "ship arrivals", "fog signals", "lamp oil"]
    sentences = [
        f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} in year {1850 + i}." for i in range(90)
    ]
    sentences.insert(45, "The pass key is 58210. Remember it. 58210 is the pass key.")
    summary = "The ledgers record weather, tides and ships from 1850 on."
    turns = [
        {"answer": summary, "input": "Summarize the paper in one sentence.", "task": "scbench_summary"},
        {"answer": "58210", "input": "What is the pass key? The pass key is", "task": "scbench_passkey"},
        {"answer": summary, "input": "Summarize the paper in two sentences.", "task": "scbench_summary"},
    ]
    return {"context": "Abstract. " + " ".join(sentences), "multi_turns": turns, "id": 0}


def whitespace_led(task: str) -> dict:
    """The first fixture row of ``task`` with four spaces before its context (a BPE can merge them with the
    text before)."""
    row = copy.deepcopy(fixture_rows(task)[0])
    key = "input" if task == "vt" else "context"
    row[key] = "    " + row[key]
    return row


#: Rows written to inputs/scbench_<task>.json (in this order).
INPUTS = {
    "kv": [long_kv_row],
    "choice_eng": [lambda: whitespace_led("choice_eng")],
    "vt": [lambda: whitespace_led("vt")],
    "summary_with_needles": [long_summary_with_needles_row],
}
#: task -> [(source, row index, max_seq_length, why)] beyond every fixture row at the model limit.
EXTRA = {
    "kv": [
        ("inputs", 0, 150 * 5 + 1000 + 401, "long row, 6 turns: T = 5, L = 401 (odd: 200 + 200 ids kept)"),
        ("fixture", 0, 150 * 2 + 1000 - 1, "L = -1: nothing cut"),
        # not here: L = 0 or 1 with a longer context, where truncate_input keeps every id and then
        # truncate_by_tokens' `assert len_after <= max_tokens` stops the official run
    ],
    "summary_with_needles": [
        ("inputs", 0, (800 + 15) * 3 // 2 + 1000 + 301, "long mixed row, 3 turns: sum * T // 2 = 1222, L = 301"),
    ],
    "repoqa": [("fixture", 0, 1024 * 2 + 1000 + 51, "L = 51: the cut goes through the instruction")],
    "choice_eng": [("inputs", 0, MODEL_LIMIT, "context led by four spaces")],
    "vt": [("inputs", 0, MODEL_LIMIT, "context (under input) led by four spaces")],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scbench", type=Path, required=True, help="scbench/ of a microsoft/MInference checkout")
    ap.add_argument("--commit", required=True, help="that checkout's commit, recorded in every output file")
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default: all 12)")
    args = ap.parse_args()

    ev, rs = import_official(args.scbench)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    (OUT / "inputs").mkdir(parents=True, exist_ok=True)
    for task, makers in INPUTS.items():
        rows = [make() for make in makers]
        path = OUT / "inputs" / f"scbench_{task}.json"
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    for task in args.tasks.split(","):
        rows = {"fixture": fixture_rows(task)}
        sources = {"fixture": f"scbench/scbench_{task}/test-00000-of-00001.parquet"}
        if task in INPUTS:
            rows["inputs"] = json.loads((OUT / "inputs" / f"scbench_{task}.json").read_text(encoding="utf-8"))
            sources["inputs"] = f"scbench_official/inputs/scbench_{task}.json"
        plan = [("fixture", i, MODEL_LIMIT, "fixture row at the model limit") for i in range(len(rows["fixture"]))]
        cases = []
        for source, index, max_seq_length, why in plan + EXTRA.get(task, []):
            case = {"rows": sources[source], "index": index, "why": why}
            case.update(official(ev, rs, tok, task, rows[source][index], max_seq_length))
            cases.append(case)
            cut = f"cut {case['tokens_before']} -> {len(case['context_ids'])}" if case["truncated"] else "whole"
            print(f"{task}: {source}[{index}] at {max_seq_length}: {len(case['context_ids'])} context ids ({cut}), "
                  f"{len(case['query_ids'])} queries")  # fmt: skip
        doc = {"task": task, "minference_commit": args.commit, "tokenizer": "kvbench/builtin/tiny-trained",
               "cases": cases}  # fmt: skip
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        (OUT / f"{task}.json").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
