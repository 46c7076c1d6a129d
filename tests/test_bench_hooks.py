"""Bench hooks: a bench's own prompt assembly (``Bench.assemblies``, applied by :mod:`kvbench.prompt`) and its
sub-task naming (``Bench.sub_task``, the report's ``sub`` column); the core names no bench for either."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from kvbench.models import byte_tokenizer
from kvbench.prompt import Rendered, encode, prompt_length, prompt_text, render
from kvbench.registry import Registry
from kvbench.report import data as D
from kvbench.tasks import BENCHES, BUILTIN_BENCHES, Assembly, Bench, Context, Question, context_assembly
from kvbench.tasks.scbench import SCBenchBench
from kvbench.tasks.scbench_prompt import ASSEMBLY, SCBenchAssembly

ROOT = Path(__file__).resolve().parents[1]


class Reversed(Assembly):
    """The body's words in reverse order, then each question after a blank line (a test's own assembly)."""

    name = "reversed"

    def _body(self, context: Context) -> str:
        return " ".join(reversed(context.body.split()))

    def prompt_text(self, tokenizer, context, j=0):
        return context.instruction + self._body(context) + "\n\n" + context.questions[j].text

    def render(self, tokenizer, context, max_length=None):
        questions = [encode(tokenizer, "\n\n" + q.text) for q in context.questions]
        return Rendered(encode(tokenizer, context.instruction), encode(tokenizer, self._body(context)), questions, None)


REVERSED = Reversed()


class HookBench(Bench):
    """A bench declaring both hooks: its ``reversed`` assembly and sub-tasks named by the scorer's suffix."""

    name = "test-hooks"
    assemblies = {"reversed": f"{__name__}:REVERSED"}

    def tasks(self):
        return ["mixed"]

    def contexts(self, task, *, length, limit, seed, prompt_length):
        return iter(())

    @classmethod
    def sub_task(cls, task, scorer):
        return scorer.rpartition("@")[2] if task == "mixed" and "@" in scorer else ""


@pytest.fixture(autouse=True)
def benches(monkeypatch) -> Registry:
    """The bench registry with its built-ins and :class:`HookBench` (the process's own registry untouched)."""
    import kvbench.tasks as tasks

    fresh = Registry("bench", "kvbench.test-benches", BUILTIN_BENCHES, plural="benches", check=tasks._check_bench)
    fresh.add(HookBench.name, HookBench, "a test")
    monkeypatch.setattr(tasks, "BENCHES", fresh)
    return fresh


def _context(bench: str, assembly: str) -> Context:
    question = Question("0", "Which word?", "", 4, ("a",), ("string_match_all",))
    return Context(bench, "mixed", "0", "Read. ", "one two three", (question,), assembly=assembly)


def test_a_context_is_rendered_by_the_assembly_its_bench_declares():
    tok = byte_tokenizer()
    ctx = _context("test-hooks", "reversed")
    assert context_assembly(ctx) is REVERSED
    rendered = render(tok, ctx)
    assert rendered.body_ids == encode(tok, "three two one") and rendered.question_ids == [
        encode(tok, "\n\nWhich word?")
    ]
    assert prompt_text(tok, ctx) == "Read. three two one\n\nWhich word?"
    assert prompt_length(tok)(ctx) == len(rendered.context_ids) + len(rendered.question_ids[0])  # the default count
    assert context_assembly(_context("test-hooks", "kvbench")) is None  # kvbench.prompt's own
    assert render(tok, _context("test-hooks", "kvbench")).body_ids == encode(tok, "one two three")


def test_an_assembly_the_bench_does_not_declare_is_an_error():
    with pytest.raises(KvbenchError, match="assembly 'scbench' is not one bench 'test-hooks' declares"):
        render(byte_tokenizer(), _context("test-hooks", "scbench"))
    with pytest.raises(KvbenchError, match="bench 'nowhere' declares \\(its assemblies: none\\)"):
        render(byte_tokenizer(), _context("nowhere", "reversed"))


def test_scbench_declares_its_assembly_and_sub_tasks():
    assert BENCHES.get("scbench") is SCBenchBench and isinstance(ASSEMBLY, SCBenchAssembly)
    assert context_assembly(_context("scbench", "scbench")) is ASSEMBLY
    assert SCBenchBench.sub_task("repoqa_and_kv", "scbench_repoqa_and_kv_kv") == "kv"
    assert SCBenchBench.sub_task("repoqa_and_kv", "scbench_repoqa_and_kv_repoqa_revised") == "repoqa"
    assert SCBenchBench.sub_task("kv", "scbench_kv_revised") == "" and SCBenchBench.sub_task("kv", "scbench_kv") == ""
    assert Bench.sub_task("mixed", "x@y") == ""  # the base: no sub-tasks


def _row(bench: str, task: str, scorer: str) -> dict:
    return {"model": "m", "engine": "torch", "method": "full", "allocation": "flat", "bench": bench, "task": task,
            "item": "0", "question": "0", "p": 1.0, "score": 50.0, "scorer": scorer}  # fmt: skip


def test_the_report_asks_the_rows_bench_for_its_sub_task():
    df = D.frame(
        [
            _row("test-hooks", "mixed", "string_match_all@left"),
            _row("test-hooks", "other", "string_match_all@left"),
            _row("scbench", "repoqa_and_kv", "scbench_repoqa_and_kv_kv"),
            _row("test-hooks", "repoqa_and_kv", "scbench_repoqa_and_kv_kv"),  # not scbench's row: its bench says
            _row("not-installed", "repoqa_and_kv", "scbench_repoqa_and_kv_repoqa"),  # every bench asked
        ]
    )
    assert list(df["sub"]) == ["left", "", "kv", "", "repoqa"]


def _code_without_docstrings(path: Path) -> str:
    """The module's code as ``ast.unparse`` writes it (no comments) with every docstring dropped."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


@pytest.mark.parametrize("rel", ["kvbench/prompt.py", "kvbench/report/data.py"])
def test_the_core_names_no_bench(rel):
    code = _code_without_docstrings(ROOT / rel).lower()
    assert "scbench" not in code and "ruler" not in code and "needle" not in code
