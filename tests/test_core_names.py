"""The core names no extension: nothing under ``kvbench/`` imports a method, bench, scorer or paper module, or
names a registered method, bench or scorer in its code (string literals included; docstrings and ``help=`` texts
are prose and exempt). It asks the registries and the registered objects instead (a ragged allocation declares
itself, a bench supplies its own caption, the methods package names the no-prune reference).

Read with :mod:`ast` from the source files; nothing of kvbench is imported but the registries (for the names).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "kvbench"
#: (file, string) pairs that name something else than the extension of that name, each with what it is.
NOT_AN_EXTENSION = {
    ("kvbench/engines/hf_adapters.py", "gate"): "the attention output gate, a prefill signal (not the allocation)",
    ("kvbench/engines/torch_engine.py", "gate"): "the attention output gate, a prefill signal (not the allocation)",
}
#: Extension packages -> their source folder: the package itself (its registry) is the core's to use, a module
#: under it is not.
EXTENSION_PACKAGES = {
    "kvbench.methods": ROOT / "methods",
    "kvbench.tasks": ROOT / "tasks",
    "kvbench.scorers": ROOT / "scorers",
}


def core_files() -> list[Path]:
    files = []
    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(CORE).parts
        if "vllm_stubs" in parts or "__pycache__" in parts:
            continue
        files.append(path)
    return files


def _extension_module(dotted: str) -> str | None:
    """``dotted`` when it names a module under an extension package (``kvbench.tasks.ruler_data``, also as
    ``"kvbench.tasks.ruler_data:X"``); None for the packages themselves and everything else."""
    module = dotted.split(":")[0]
    for package, folder in EXTENSION_PACKAGES.items():
        if module.startswith(package + "."):
            first = module[len(package) + 1 :].split(".")[0]  # a module or subpackage, not a name of the package
            if (folder / f"{first}.py").is_file() or (folder / first / "__init__.py").is_file():
                return module
    return None


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


def _prose(tree: ast.AST) -> set[int]:
    """ids of the string constants that are prose: docstrings, ``help=`` texts (typer/argparse)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg == "help":
            ids.update(id(n) for n in ast.walk(node.value))
    return ids


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    prose = _prose(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node.lineno, node.value


def registered_names() -> dict[str, str]:
    """Every built-in method, bench and scorer name -> its kind (the registries list them without importing one)."""
    from kvbench.methods import METHODS
    from kvbench.scorers import SCORERS
    from kvbench.tasks import BENCHES

    return {name: kind for kind, reg in (("method", METHODS), ("bench", BENCHES), ("scorer", SCORERS)) for name in reg}


def test_the_scan_reads_the_core():
    files = {p.relative_to(CORE).parts[0] for p in core_files()}
    assert {"cli.py", "run", "results", "report", "engines", "allocations.py"} <= files


def test_core_imports_no_extension_module():
    bad = []
    for path in core_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, dotted in _imports(tree):
            if _extension_module(dotted):
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {dotted}")
        for line, text in _strings(tree):
            if _extension_module(text):
                bad.append(f"{path.relative_to(ROOT)}:{line}: names the module {text!r}")
    assert not bad, "the core imports or names an extension module:\n" + "\n".join(sorted(set(bad)))


def test_core_names_no_method_bench_or_scorer():
    names = registered_names()
    assert {"full", "gatesight", "ruler", "scbench"} <= set(names)  # the scan looks for the real names
    bad = []
    for path in core_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, text in _strings(tree):
            parts = [part.strip() for part in text.split(",")]  # "a,b": a --method list
            named = [part for part in parts if part in names]
            if named and len(named) == len(parts):
                bad.append(f"{path.relative_to(ROOT)}:{line}: names the {names[named[0]]} {text!r}")
    assert not bad, "the core names an extension (ask its registry or the registered object):\n" + "\n".join(bad)


def test_core_names_an_allocation_only_in_its_own_module():
    """The built-in allocations are named where they are registered (kvbench/allocations.py); elsewhere the core
    asks the allocation (e.g. ``Allocation.ragged``), never tests its name."""
    from kvbench.allocations import ALLOCATIONS

    bad = []
    for path in core_files():
        if path == CORE / "allocations.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = str(path.relative_to(ROOT))
        bad += [
            f"{rel}:{line}: {text!r}"
            for line, text in _strings(tree)
            if text in ALLOCATIONS and (rel, text) not in NOT_AN_EXTENSION
        ]
    assert not bad, "the core names an allocation outside kvbench/allocations.py:\n" + "\n".join(bad)


def test_the_detectors():
    code = 'import kvbench.tasks.ruler_data\nfrom kvbench.methods import METHODS\nx = "kvbench.tasks.commands"\n'
    tree = ast.parse(code)
    assert [d for _, d in _imports(tree) if _extension_module(d)] == ["kvbench.tasks.ruler_data"]
    assert [t for _, t in _strings(tree) if _extension_module(t)] == ["kvbench.tasks.commands"]
    code = 'def f(a=typer.Option("x", help="gatesight")):\n    """kvzip"""\n    return "snapkv"\n'
    assert sorted(t for _, t in _strings(ast.parse(code))) == ["snapkv", "x"]
