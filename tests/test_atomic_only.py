"""Every crash-safe write goes through :mod:`kvbench.atomic`: no other module of the source tree renames a
temporary file into place itself (``os.replace``, ``os.rename``, ``Path.replace``, ``Path.rename``,
``shutil.move``), so the temp-file handling lives in one place."""

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
