"""Every crash-safe write goes through :mod:`kvbench.atomic`: no other module of the source tree renames a
temporary file into place itself (``os.replace``, ``os.rename``, ``Path.replace``, ``Path.rename``,
``shutil.move``), so the temp-file handling lives in one place; and no module writes a final output in place
(``Path.write_text`` / ``write_bytes``, ``DataFrame.to_csv``, ``Figure.savefig`` to a path, ``open`` for writing):
such a write goes to the temporary path a :mod:`kvbench.atomic` helper hands its writer (a name ``tmp``), or is one
of the few writes listed in :data:`IN_PLACE` with the reason it is no final output."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = ("kvbench", "methods", "tasks", "scorers", "training")
#: The one module allowed to rename (path relative to the repository root -> why).
ALLOWED = {"kvbench/atomic.py": "the atomic-write helpers themselves"}
MODULE_CALLS = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("shutil", "move")}


def _is_rename(call: ast.Call) -> bool:
    """``os.replace(...)`` and the like, or ``x.replace(target)`` / ``x.rename(target)`` with one positional,
    non-literal argument: ``Path.replace``/``Path.rename`` (``str.replace`` takes two arguments; pandas'
    ``rename`` takes a literal label or keywords)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if isinstance(func.value, ast.Name) and (func.value.id, func.attr) in MODULE_CALLS:
        return True
    if func.attr not in ("replace", "rename") or call.keywords or len(call.args) != 1:
        return False
    return not isinstance(call.args[0], ast.Constant)


#: Writes that need no atomic helper, (file, enclosing function) -> why: none of them replaces a final output.
IN_PLACE = {
    ("kvbench/results/scan.py", "repair_tail"): "sets a crash's partial last line aside under a new, unique name",
    ("kvbench/results/store.py", "_make_dir"): "an empty probe file that tells a writable directory, removed at once",
    ("tasks/data_fetch.py", "download"): "a resumable download's .part file, moved into place by kvbench.atomic",
    ("kvbench/results/upgrade.py", "upgrade_results"): "a results file's backup, created new ('x'), replacing none",
    ("kvbench/report/render.py", "_draw"): "a figure into in-memory buffers (write() writes them atomically)",
}
WRITE_METHODS = {"write_text", "write_bytes", "to_csv", "savefig"}


def _mentions_tmp(node: ast.AST) -> bool:
    """Whether ``node`` (the written path) is built on a name holding ``tmp``: the temporary path or folder a
    :mod:`kvbench.atomic` helper (``write_with``, ``write_dir``) gives its writer."""
    return any(isinstance(n, ast.Name) and "tmp" in n.id for n in ast.walk(node))


def _in_place_write(call: ast.Call) -> ast.AST | None:
    """The path ``call`` writes in place, or None when it writes nothing (or only to a temporary path):
    ``p.write_text(…)`` / ``p.write_bytes(…)`` (the path ``p``), ``df.to_csv(path)`` / ``fig.savefig(path)`` (a
    first argument), ``open(path, "w…" / "a…" / "x…")``."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("write_text", "write_bytes"):
        target: ast.AST | None = func.value
    elif isinstance(func, ast.Attribute) and func.attr in ("to_csv", "savefig"):
        target = call.args[0] if call.args else None  # to_csv() with no path returns the text
    elif isinstance(func, ast.Name) and func.id == "open" and len(call.args) >= 2:
        mode = call.args[1]
        writes = not isinstance(mode, ast.Constant) or any(c in str(mode.value) for c in "wax")
        target = call.args[0] if writes else None
    else:
        return None
    return None if target is None or _mentions_tmp(target) else target


def _writes(path: Path) -> list[str]:
    """``file:line: call`` for each in-place write of ``path`` outside :data:`IN_PLACE`."""
    rel = str(path.relative_to(ROOT))
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for fn in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        name = getattr(fn, "name", "")
        nested = {id(c) for f in ast.walk(fn) if f is not fn and isinstance(f, ast.FunctionDef) for c in ast.walk(f)}
        for node in ast.walk(fn):
            if id(node) in nested or not isinstance(node, ast.Call) or _in_place_write(node) is None:
                continue
            if (rel, name) not in IN_PLACE:
                found.append(f"{rel}:{node.lineno} (in {name or 'the module'}): {ast.unparse(node)}")
    return sorted(set(found))


def _renames(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _is_rename(node)
    ]


def _sources() -> list[Path]:
    files = {p.resolve() for tree in TREES for p in (ROOT / tree).rglob("*.py")}
    return sorted(p for p in files if ROOT in p.parents and ".venv" not in p.parts)


def test_the_scan_sees_every_tree_and_the_helper():
    found = {p.relative_to(ROOT).parts[0] for p in _sources()}
    assert found == set(TREES)
    assert _renames(ROOT / "kvbench" / "atomic.py")  # the detector finds the helper's own renames


@pytest.mark.parametrize(
    "code, flagged",
    [
        ("os.replace(tmp, path)", True),
        ("os.rename(tmp, path)", True),
        ("shutil.move(tmp, path)", True),
        ("tmp.replace(path)", True),
        ("tmp.rename(path)", True),
        ("text.replace(old, new)", False),
        ("frame.rename(columns={'a': 'b'})", False),
        ("series.rename('label')", False),
        ("dataclasses.replace(ctx, glue=x)", False),
    ],
)
def test_the_detector(code, flagged):
    call = ast.parse(code).body[0].value
    assert _is_rename(call) is flagged


def test_no_rename_outside_the_atomic_module():
    offenders = [hit for p in _sources() if str(p.relative_to(ROOT)) not in ALLOWED for hit in _renames(p)]
    assert not offenders, "write through kvbench.atomic instead of renaming by hand:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "code, flagged",
    [
        ("path.write_text(text)", True),
        ("(out / 'report.md').write_text(md, encoding='utf-8')", True),
        ("figure.write_bytes(png)", True),
        ("frame.to_csv(out / 'x.csv', index=False)", True),
        ("fig.savefig(path, dpi=110)", True),
        ("open(path, 'w')", True),
        ("open(path, 'ab')", True),
        ("(tmp / 'x.json').write_text(text)", False),
        ("fig.savefig(tmp, format='png')", False),
        ("frame.to_csv(index=False)", False),
        ("open(path)", False),
        ("open(path, 'rb')", False),
        ("write_atomic(path, text)", False),
    ],
)
def test_the_write_detector(code, flagged):
    call = ast.parse(code).body[0].value
    assert (_in_place_write(call) is not None) is flagged


def test_no_final_output_written_in_place():
    """report.md, index.html, tables and figures, ``kvbench cost``'s JSON, GateSight's evaluation, the trainer's
    final model, …: every final output goes through kvbench.atomic, so a crash or a full disk never leaves half a
    file where a whole one was."""
    offenders = [hit for p in _sources() if str(p.relative_to(ROOT)) not in ALLOWED for hit in _writes(p)]
    assert not offenders, "write through kvbench.atomic (write_atomic, write_json, write_with, write_dir):\n" + (
        "\n".join(offenders)
    )


def test_every_in_place_exception_still_writes():
    """Each IN_PLACE entry names a function that exists and still writes in place (a stale entry is an
    exemption nobody needs)."""
    for (rel, name), _why in IN_PLACE.items():
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
        assert any(isinstance(c, ast.Call) and _in_place_write(c) is not None for c in ast.walk(fn)), (rel, name)
