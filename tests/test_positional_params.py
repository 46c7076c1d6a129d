"""No function of kvbench's code (``kvbench/``, ``methods/``, ``tasks/``, ``scorers/``) takes more than
:data:`LIMIT` positional parameters (issue 45): a call with that many bare arguments is read by counting commas.
Parameters after ``*`` (keyword-only) are not counted, nor the ``self``/``cls`` of a method, which no call spells
out. The source is walked with :mod:`ast`, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("kvbench", "methods", "tasks", "scorers")
LIMIT = 8

#: Functions over the limit when this test was written (session 28), each in a file another helper owned then:
#: ``path::qualified name`` -> why it is still here. Making their parameters keyword-only (a bare ``*`` first;
#: Typer passes options by name) removes them; then delete the entry.
KNOWN: dict[str, str] = {}


def over_limit(source: str, limit: int = LIMIT) -> dict[str, int]:
    """``{qualified name: positional parameters}`` of the functions and lambdas of ``source`` that take more than
    ``limit`` positional parameters (a method's first, bound one not counted unless it is a staticmethod)."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                name = f"{prefix}{getattr(child, 'name', f'<lambda:{child.lineno}>')}"
                count = len(child.args.posonlyargs) + len(child.args.args)
                decorators = {ast.unparse(d) for d in getattr(child, "decorator_list", [])}
                if in_class and not isinstance(child, ast.Lambda) and "staticmethod" not in decorators:
                    count -= 1
                if count > limit:
                    found[name] = count
                visit(child, f"{name}.", False)
                continue
            visit(child, prefix, in_class)

    visit(ast.parse(source), "", False)
    return found


def test_the_checker_finds_a_function_over_the_limit_and_spares_the_rest():
    source = """
def nine(a, b, c, d, e, f, g, h, i): pass
def eight(a, b, c, d, e, f, g, h, *, i, j): pass
class C:
    def method(self, a, b, c, d, e, f, g, h): pass
    @staticmethod
    def static(a, b, c, d, e, f, g, h, i): pass
    def outer(self):
        def inner(a, b, c, d, e, f, g, h, i, /): pass
squeeze = lambda a, b, c, d, e, f, g, h, i: a
"""
    found = over_limit(source)
    assert found == {"nine": 9, "C.static": 9, "C.outer.inner": 9, "<lambda:10>": 9}


def test_no_function_takes_more_than_eight_positional_parameters():
    found = {}
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, count in over_limit(path.read_text(encoding="utf-8")).items():
                found[f"{rel}::{name}"] = count
    new = {where: count for where, count in found.items() if where not in KNOWN}
    assert not new, f"functions over {LIMIT} positional parameters (make the rest keyword-only, after *): {new}"
