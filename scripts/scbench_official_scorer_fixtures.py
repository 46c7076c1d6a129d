"""Regenerate tests/fixtures/scbench_official/scores.json from microsoft/MInference's own SCBench scoring code.

Contains no MInference code. It imports ``compute_scores`` and ``eval_utils`` from the given checkout's
``scbench/`` folder with the imports scoring never calls (torch, jieba, rouge, transformers' classes, minference,
vllm, lmcache_vllm, tempdir) stood in by empty modules, and ``evaluate.load("rouge")`` pointed at the rouge
metric script of a huggingface/evaluate checkout (offline). tqdm, rich, numpy, nltk, rouge_score and
tree_sitter_languages are the real packages, as the official scorer uses them.

For every SCBench task it takes a "prediction file": the committed hub-layout fixture rows
(``tests/fixtures/scbench/scbench_<task>/``) or the generated rows of :func:`generated_rows` (the fixture row
with answers that repeat characters or tokens, a choice option led by another option's letter, a float mf label,
a second row of the same repository for repoqa), and gives each turn a prediction from :func:`variants`
(exact, embedded, case-changed, repeated three times, every character doubled, a repeated token or character,
cut, padded with control characters, empty, unrelated, and task-specific forms). It writes the predictions as
``run_scbench.py`` does (``get_ground_truth`` labels, ``task`` / ``lang`` / ``repo`` / ``func_name`` fields,
``eval_utils.dump_jsonl``), runs ``compute_scores(..., scdq_mode=True)`` on the file and records the per-item
value of every turn by wrapping the two official per-item entry points it calls (``get_score_one`` and
``repo_qa_utils.compute_score``; the latter is also run on each item alone for its pass@1 at 0.8).

Recorded per turn: ``official``, the official per-item value (0-1, what kvbench's official scorer must give
x 100), and ``revised``, the expected value of kvbench's revised scorer (0-100) from its definition, not from
kvbench's code:

* ``qa_chn`` (DESIGN.md: normalise, maximum character-level F1 over the *complete* references): the official
  ``qa_f1_score_zh`` given the list of complete answers instead of the answer string;
* ``choice_eng`` (DESIGN.md: only an explicit option counts): 100 iff the prediction was built in one of the
  forms DESIGN.md lists (``B``, ``B.``, ``B. <option text>``, ``(B)``, ``Option B``, ``Answer: B``) with the
  gold letter; every other form (the option text alone, "Based on ...", "The answer is B", another option's
  text after the letter, ...) is 0. Forms kvbench accepts beyond that list (``B)``, ``B:``, ``**B**``) are not
  generated;
* ``repoqa_and_kv`` kv turns (kvbench's revision of bug c): the official ``kv_retrieval`` scorer on the
  prediction text;
* every other scorer key has no revision: ``100 * official``.

Usage (see tests/fixtures/scbench_official/README.md)::

    python scripts/scbench_official_scorer_fixtures.py --scbench /tmp/mi/scbench --rouge /tmp/evaluate/rouge \\
        --commit <MInference commit> --evaluate-commit <evaluate commit>
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import sys
import tempfile
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scbench_official_fixtures import FIXTURES, MIXED, OUT, TASKS, fixture_rows, import_modules  # noqa: E402

SCORES = OUT / "scores.json"
MODEL = "kvbench-fixture"  # the official model_name argument (only names the summary file)
#: Top-level modules the official scoring files import but scoring never calls.
SCORING_STUBBED = tuple("torch jieba rouge transformers minference vllm lmcache_vllm tempdir".split())
#: compute_scores' sub-task order (scdq mode) for the mixed tasks.
SUBTASKS = {
    "scbench_summary_with_needles": ["scbench_summary", "scbench_passkey"],
    "scbench_repoqa_and_kv": ["scbench_repoqa", "scbench_kv"],
}
OPTIONS = "ABCD"


# --- the official code ---------------------------------------------------------------------------------------


def import_scoring(scbench: Path, rouge: Path) -> tuple[ModuleType, ModuleType]:
    """``(compute_scores, eval_utils)``; ``evaluate.load("rouge")`` (run at import) loads ``rouge``'s script."""
    import evaluate

    real_load = evaluate.load

    def load(path: str, *args, **kwargs):
        return real_load(str(rouge) if path == "rouge" else path, *args, **kwargs)

    evaluate.load = load
    try:
        cs, ev = import_modules(scbench, ["compute_scores", "eval_utils"], SCORING_STUBBED)
    finally:
        evaluate.load = real_load
    return cs, ev


def official_file(cs: ModuleType, ev: ModuleType, task: str, rows: list[dict], predictions: list[list[str]],
                  workdir: Path) -> list[list[float]]:  # fmt: skip
    """Per-turn official values of ``predictions`` (one per turn of each row) scored as one prediction file."""
    data_name = f"scbench_{task}"
    preds = []  # as run_scbench.py's main loop writes them
    for i, (row, answers) in enumerate(zip(rows, predictions, strict=True)):
        labels = ev.get_ground_truth(copy.deepcopy(row), data_name)
        for turn_idx, (answer, label, turn) in enumerate(zip(answers, labels, row["multi_turns"], strict=True)):
            case = {"id": i, "turn_idx": turn_idx, "prediction": answer, "ground_truth": label}
            if data_name in MIXED:
                case["task"] = turn["task"]
            if task in ("repoqa", "repoqa_and_kv"):
                case["lang"], case["repo"] = row["lang"], row["repo"]
                if task == "repoqa" or turn["task"] == "scbench_repoqa":
                    case["func_name"] = turn["name"]
            preds.append(case)
    path = workdir / f"preds_{data_name}.jsonl"
    ev.dump_jsonl(preds, path)

    items: list[tuple[object, float]] = []  # (what the official per-item scorer got as the prediction, value)
    real_one, real_repoqa = cs.get_score_one, cs.compute_repoqa_score

    def get_score_one(pred, label, task_name, model_name):
        value = real_one(pred, label, task_name, model_name)
        items.append((pred, value))
        return value

    def compute_repoqa_score(model_name, preds_, labels, needle_by_repo, *args, **kwargs):
        for pred, label in zip(preds_, labels, strict=True):
            alone = real_repoqa(model_name, [pred], [label], needle_by_repo, *args, **kwargs)
            items.append((pred, alone[model_name]["scores"]["all"][0.8]["pass@1"]))
        return real_repoqa(model_name, preds_, labels, needle_by_repo, *args, **kwargs)

    cs.get_score_one, cs.compute_repoqa_score = get_score_one, compute_repoqa_score
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cs.compute_scores(path, data_name, MODEL, scdq_mode=True)
    finally:
        cs.get_score_one, cs.compute_repoqa_score = real_one, real_repoqa

    order = [p for sub in SUBTASKS.get(data_name, [None]) for p in preds if sub is None or p["task"] == sub]
    assert len(order) == len(items), (task, len(order), len(items))
    values: dict[tuple[int, int], float] = {}
    for pred, (given, value) in zip(order, items, strict=True):
        assert given == pred or given == pred["prediction"], (task, given, pred)
        values[pred["id"], pred["turn_idx"]] = float(value)
    return [[values[i, j] for j in range(len(row["multi_turns"]))] for i, row in enumerate(rows)]


# --- the rows ------------------------------------------------------------------------------------------------


def generated_rows(task: str) -> list[dict]:
    """The fixture row of ``task`` with answers that stress the scorers (repeated characters and tokens, ...)."""
    (row,) = fixture_rows(task)
    row = copy.deepcopy(row)
    turns = row["multi_turns"]
    if task == "qa_chn":
        turns[0]["answer"], turns[1]["answer"] = "谢谢你", "哈哈哈，NBA球星"
    elif task == "qa_eng":
        turns[0]["answer"], turns[1]["answer"] = "Baden-Baden", "the the end"
    elif task == "many_shot":
        turns[0]["answer"], turns[1]["answer"] = "(C)", "(A)(A)"
    elif task == "vt":
        turns[0]["answer"], turns[1]["answer"] = ["AAAAA", "BBBBB", "AAAAA"], ["X", "XY"]
    elif task == "choice_eng":  # option texts led by another option's letter
        turns[0].update(answer="Delta", options=["Delta", "Alpha", "Cape", "Beta"])
        turns[1].update(answer="Bay", options=["Cove", "Dune", "Bay", "Atoll"])
    elif task == "mf":
        turns[0]["answer"], turns[1]["answer"] = 1111, 2.5
    elif task in ("kv", "prefix_suffix"):
        turns[0]["answer"], turns[1]["answer"] = "aaaa-aaaa-aaaa", "abab"
    elif task == "summary":
        turns[0]["answer"] = "the the the ledgers ledgers agree."
        turns[1]["answer"] = "Ledgers agree.\nShip logs agree.\nLedgers agree."
    elif task == "summary_with_needles":
        turns[1]["answer"] = "11111"
        turns[0]["answer"] = "Storm storm storm days.\nThe ledgers agree."
    elif task == "repoqa":  # a second row of the same repository: its needles join the pool
        second = copy.deepcopy(row)
        second["id"] = 1
        second["multi_turns"] = [
            dict(turns[0], name="clamp_twice", answer=turns[0]["answer"].replace("def clamp(", "def clamp_twice(")
                 + "\n    return value"),
            dict(turns[1], name="repeat", answer="def repeat(x):\n    return x x x x x x"),
        ]  # fmt: skip
        return [row, second]
    elif task == "repoqa_and_kv":
        turns[1]["answer"] = "aaaa-aaaa"
    return [row]


# --- the predictions -----------------------------------------------------------------------------------------


def _generic(answer: str) -> list[tuple[str, str]]:
    first = answer.split()[0] if answer.split() else answer
    return [
        ("exact", answer),
        ("in a sentence", f"The answer is {answer}."),
        ("upper case", answer.upper()),
        ("lower case", answer.lower()),
        ("repeated three times", " ".join([answer] * 3)),
        ("every character doubled", "".join(c * 2 for c in answer)),
        ("first token repeated four times", " ".join([first] * 4)),
        ("first character repeated four times", answer[:1] * 4),
        ("first half", answer[: len(answer) // 2]),
        ("padded with whitespace and control characters", f"\n\t {answer} \x07\n"),
        ("empty", ""),
        ("unrelated", "I cannot find it in the document."),
    ]


def _choice(turn: dict) -> list[tuple[str, str, str | None]]:
    """(why, prediction, the explicit letter by DESIGN.md's list or None)."""
    options, gold_text = turn["options"], turn["answer"]
    gold = OPTIONS[options.index(gold_text)]
    wrong = OPTIONS[(options.index(gold_text) + 1) % 4]
    out: list[tuple[str, str, str | None]] = []
    for who, letter in (("gold", gold), ("wrong", wrong)):
        text = options[OPTIONS.index(letter)]
        out += [
            (f"{who} letter alone", letter, letter),
            (f"{who} letter and dot", f"{letter}.", letter),
            (f"{who} letter in parentheses", f"({letter})", letter),
            (f"{who} letter, dot, its option text", f"{letter}. {text}", letter),
            (f"Option + {who} letter", f"Option {letter}", letter),
            (f"Answer: + {who} letter", f"Answer: {letter}", letter),
            (f"{who} option text alone", text, None),
            (f"{who} letter repeated", f"{letter} {letter} {letter}", None),
        ]
    other_text = options[OPTIONS.index(wrong)]
    out += [
        ("Based on ... (reads as B officially)", f"Based on the passage, {gold_text}.", None),
        ("The answer is + gold letter", f"The answer is {gold}", None),
        ("gold letter, dot, another option's text", f"{gold}. {other_text}", None),
        ("lower-case gold letter", gold.lower(), None),
        ("gold letter doubled", gold * 2, None),
        ("two letters", f"{gold} or {wrong}", None),
        # the official fallbacks (the prediction does not start with a letter): punctuation to spaces, double
        # spaces collapsed, "answer is:" / "answer:" / "answer is" / "option is" prefixes, then the first word
        # that is a substring of "ABCD"; none of these forms is explicit by DESIGN.md's list
        ("answer is: + gold letter, full stop", f"the answer is: {gold}.", None),
        ("answer is + two spaces + gold letter", f"the answer is  {gold}", None),
        ("answer: on its own line", f"Well,\nmy answer:\n{gold}", None),
        ("option is + quoted wrong letter", f'the right option is "{wrong}"', None),
        ("answer is + gold option text", f"the answer is {gold_text}", None),
        ("ends with answer is", "so the answer is", None),
        ("ends with answer is + one character", "so the answer is:", None),
        ("answer is twice: wrong letter first", f"the answer is {wrong}, no, the answer is {gold}", None),
        ("answer is + quoted gold letter", f'the answer is "{gold}"', None),
        ("answer is + comma + gold letter", f"the answer is, {gold}", None),
        ("answer is + ellipsis + gold letter", f"the answer is... {gold}", None),
        ("answer is + ?! + gold letter", f"the answer is?! {gold}", None),
        ("answer is: + blank line + gold letter", f"the answer is:\n\n{gold}", None),
        ("answer: + gold option text", f"my answer: {gold_text}", None),
        ("option is + gold option text", f"the best option is {gold_text}", None),
        ("quoted gold letter", f"'{gold}'", None),
        ("gold letter in braces", f"{{{gold}}}", None),
        ("question mark, comma, exclamation, then wrong letter", f"hmm? well, sure! {wrong}", None),
        ("empty", "", None),
        ("unrelated", "I cannot tell from the story.", None),
    ]
    return out


def _code(turn: dict, row: dict) -> list[tuple[str, str]]:
    code = turn["answer"]
    others = [t["answer"] for t in row["multi_turns"] if t is not turn and t.get("name")]
    other = others[0] if others else "def other():\n    pass"
    lines = code.splitlines()
    return [
        ("fenced function", f"```python\n{code}\n```"),
        ("the function unfenced", code),
        ("fenced, with prose around", f"Here it is:\n```python\n{code}\n```\nThat is the function."),
        ("fenced without a language tag", f"```\n{code}\n```"),
        ("prose block first, then the function", f"```text\nsee below\n```\n```python\n{code}\n```"),
        ("another needle of the repository", f"```python\n{other}\n```"),
        ("every line repeated", "```python\n" + "\n".join(x for ln in lines for x in (ln, ln)) + "\n```"),
        ("first half of the lines", "```python\n" + "\n".join(lines[: len(lines) // 2]) + "\n```"),
        ("first token repeated", " ".join([code.split()[0]] * 8)),
        ("empty", ""),
    ]


def variants(task: str, turn: dict, row: dict) -> list[tuple[str, str, str | None]]:
    """Predictions for ``turn``: ``(why, prediction, explicit choice letter)`` (the letter for choice_eng only)."""
    sub = turn.get("task")
    if task == "choice_eng":
        return _choice(turn)
    if task == "repoqa" or sub == "scbench_repoqa":
        return [(w, p, None) for w, p in _code(turn, row)]
    answer = turn["answer"]
    if task == "vt":
        names = list(answer)
        out = [
            ("all names", " ".join(names)),
            ("first name only", names[0]),
            ("all names lower case", ", ".join(n.lower() for n in names)),
            ("first name repeated three times", " ".join([names[0]] * 3)),
            ("every character doubled", " ".join("".join(c * 2 for c in n) for n in names)),
            ("names reversed, comma-separated", ", ".join(reversed(names))),
            ("empty", ""),
        ]
        return [(w, p, None) for w, p in out]
    if task == "mf":
        a = str(answer)
        out = [
            ("exact", a),
            ("with a fraction", f"{a}.7"),
            ("in a sentence", f"The number is {a}, I think."),
            ("digits repeated", a + a),
            ("leading zero", "0" + a),
            ("another number first", f"3.14 and then {a}"),
            ("every character doubled", "".join(c * 2 for c in a)),
            ("repeated three times", " ".join([a] * 3)),
            ("empty", ""),
        ]
        return [(w, p, None) for w, p in out]
    out = _generic(answer)
    if task == "many_shot":
        out.append(("another option letter", "(B)" if answer != "(B)" else "(C)"))
    if task in ("summary",) or sub == "scbench_summary":
        words = answer.split()
        out += [
            ("one word per line", "\n".join(words)),
            ("every word doubled", " ".join(w for x in words for w in (x, x))),
            ("words reversed", " ".join(reversed(words))),
            ("sentence repeated on three lines", "\n".join([answer] * 3)),
        ]
    if task == "qa_chn":
        out += [
            ("characters split by Chinese commas", "，".join(answer)),
            ("answer, full stop, answer", f"{answer}。{answer}"),
        ]
    return [(w, p, None) for w, p in out]


# --- expected revised values ---------------------------------------------------------------------------------


def revised_value(cs: ModuleType, task: str, turn: dict, prediction: str, letter: str | None, official: float) -> float:
    """kvbench's revised scorer's expected value (0-100) from the revision's definition (module docstring)."""
    if task == "qa_chn":
        answers = turn["answer"] if isinstance(turn["answer"], list) else [turn["answer"]]
        return 100.0 * float(cs.qa_f1_score_zh(prediction, answers))
    if task == "choice_eng":
        gold = OPTIONS[turn["options"].index(turn["answer"])]
        return 100.0 if letter == gold else 0.0
    if task == "repoqa_and_kv" and turn["task"] == "scbench_kv":
        return 100.0 * float(cs.get_score_one_kv_retrieval(prediction, turn["answer"], MODEL))
    return 100.0 * official


def cases_for(cs: ModuleType, ev: ModuleType, task: str, source: str, rows: list[dict],
              workdir: Path) -> list[dict]:  # fmt: skip
    """One case per prediction variant: every turn of every row gets its k-th variant (cycled)."""
    per_turn = [[variants(task, turn, row) for turn in row["multi_turns"]] for row in rows]
    n = max(len(v) for turns in per_turn for v in turns)
    cases = []
    for k in range(n):
        picked = [[v[k % len(v)] for v in turns] for turns in per_turn]
        predictions = [[p for _, p, _ in turns] for turns in picked]
        official = official_file(cs, ev, task, rows, predictions, workdir)
        turns_out = []
        for row, chosen, values in zip(rows, picked, official, strict=True):
            turns_out.append([
                {"why": why, "prediction": pred, "official": value,
                 "revised": revised_value(cs, task, turn, pred, letter, value)}
                for turn, (why, pred, letter), value in zip(row["multi_turns"], chosen, values, strict=True)
            ])  # fmt: skip
        cases.append({"task": task, "rows": source, "turns": turns_out})
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scbench", type=Path, required=True, help="scbench/ of a microsoft/MInference checkout")
    ap.add_argument("--rouge", type=Path, required=True, help="metrics/rouge/ of a huggingface/evaluate checkout")
    ap.add_argument("--commit", required=True, help="the MInference checkout's commit")
    ap.add_argument("--evaluate-commit", required=True, help="the evaluate checkout's commit")
    args = ap.parse_args()
    if not (args.rouge / "rouge.py").is_file():
        sys.exit(f"error: {args.rouge}/rouge.py not found; pass --rouge <evaluate checkout>/metrics/rouge")

    cs, ev = import_scoring(args.scbench, args.rouge)
    generated: dict[str, list[dict]] = {}
    cases: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in TASKS:
            generated[task] = generated_rows(task)
            sources: list[tuple[str, list[dict]]] = [
                (f"scbench/scbench_{task}/test-00000-of-00001.parquet", fixture_rows(task)),
                (f"generated:{task}", generated[task]),
            ]
            for source, rows in sources:
                new = cases_for(cs, ev, task, source, rows, Path(tmp))
                cases += new
                print(f"{task}: {source}: {len(new)} cases, {sum(len(t) for c in new for t in c['turns'])} turns")
    doc = {"minference_commit": args.commit, "evaluate_commit": args.evaluate_commit, "model_name": MODEL,
           "generated_rows": generated, "cases": cases}  # fmt: skip
    SCORES.write_text(json.dumps(doc, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n", "utf-8")
    print(f"wrote {SCORES.relative_to(FIXTURES.parent.parent)}: {len(cases)} cases")


if __name__ == "__main__":
    main()
