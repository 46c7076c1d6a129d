"""The import graph of kvbench's packages: no circle, no private name across modules, no core module that names
a method, no import of a name its module does not define.

The graph is built with :mod:`ast` from the source files of ``kvbench`` (``kvbench/``), ``kvbench.methods``
(``methods/``), ``kvbench.tasks`` (``tasks/``), ``kvbench.scorers`` (``scorers/``) and the trainer's distribution
``kvbench_training`` (``training/kvbench_training/``); nothing is imported.

What counts as an edge ``A -> B``:

- every ``import`` statement in A at any depth: module level, inside functions and methods (a lazy import that
  closes a cycle is still a circle), inside ``try`` blocks; only imports under ``if TYPE_CHECKING:`` are left
  out, since they never run;
- ``import a.b.c`` is an edge to the longest prefix of ``a.b.c`` that is a project module;
  ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, otherwise to ``a.b``;
- the parent packages that Python also runs on the way (``a`` and ``a.b`` for ``import a.b.c``) are not edges,
  nor are modules named by strings (``importlib.import_module`` over a registry's table of built-ins).

Rules (each failure prints the offending edges as ``file:line``):

(a) no cycle between modules;
(b) no private name (one leading underscore, not a dunder) taken from another project module, whether by
    ``from X import _name`` or as the attribute ``mod._name`` of an imported module;
(c) no module outside ``kvbench.methods`` names a method module, by an import or by a string holding the dotted
    path. A *method module* is ``kvbench.methods.<m>`` or anything under it where some module of ``<m>``
    registers a method (a class decorated ``@register_method``); the rest of ``methods/`` (``base``, shared
    utilities) is shared code that anyone may import;
(d) no method module imports another method's modules; the methods package's own ``__init__`` (its registry
    table) may;
(e) no code hands transformers the bare name ``ATTN_IMPL`` (``attn_implementation=ATTN_IMPL``,
    ``set_attn_implementation(ATTN_IMPL)``) in a function that does not call ``register_attention()``: nothing
    registers kvbench's attention on import, so such a call works only where something else registered first;
(f) every ``from X import name`` of a project module ``X`` finds ``name`` bound at ``X``'s top level (a name
    moved away fails here rather than at the first call of a lazy import).

``PENDING`` lists the edges still to be removed by the owners of those files; it is emptied at integration.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "kvbench": ROOT / "kvbench",
    "kvbench.methods": ROOT / "methods",
    "kvbench.tasks": ROOT / "tasks",
    "kvbench.scorers": ROOT / "scorers",
    "kvbench_training": ROOT / "training" / "kvbench_training",  # the kvbench-training distribution
}
# directories under the packages that are data or an import-only stand-in, not kvbench modules
NOT_MODULES = {"__pycache__", "builtin", "templates", "vllm_stubs"}
METHODS = "kvbench.methods"
_PATH_STRING = re.compile(r"kvbench\.methods\.\w+(\.\w+)*(:\w+)?")

# Known edges still to be removed, each (rule, source module, target module[.name]), with the file and line
# that owns the fix. Emptied at integration: every entry here is a defect.
PENDING: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class Edge:
    """One import of project module ``dst`` by project module ``src`` at ``file:line``; ``name`` is the
    imported name (for ``from dst import name`` and ``dst.name``), empty for a whole-module import."""

    src: str
    dst: str
    file: str
    line: int
    name: str = ""

    def __str__(self) -> str:
        what = f"{self.dst}.{self.name}" if self.name else self.dst
        return f"{self.file}:{self.line}: {self.src} -> {what}"


def project_modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the packages in PACKAGES."""
    modules: dict[str, Path] = {}
    for package, directory in PACKAGES.items():
        for path in sorted(directory.rglob("*.py")):
            parts = path.relative_to(directory).with_suffix("").parts
            if NOT_MODULES.intersection(parts):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules.setdefault(".".join((package, *parts)), path)
    return modules


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve_from(node: ast.ImportFrom, module: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    base = _package_of(module, path).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _longest_module(dotted: str, modules: dict[str, Path]) -> str | None:
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in modules:
            return ".".join(parts[:k])
    return None


def module_edges(module: str, path: Path, modules: dict[str, Path]) -> tuple[list[Edge], list[Edge], list[Edge]]:
    """The edges of ``module``: (imports, private names taken, method paths named in strings)."""
    file = str(path.relative_to(ROOT))
    imports: list[Edge] = []
    private: list[Edge] = []
    strings: list[Edge] = []
    aliases: dict[str, str] = {}  # local name bound to a whole project module
    nodes = list(_runtime_nodes(_tree(path)))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                dst = _longest_module(alias.name, modules)
                if dst is None:
                    continue
                imports.append(Edge(module, dst, file, node.lineno))
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_from(node, module, path)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    imports.append(Edge(module, f"{source}.{alias.name}", file, node.lineno))
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif source in modules:
                    edge = Edge(module, source, file, node.lineno, alias.name)
                    imports.append(edge)
                    if _is_private(alias.name) and source != module:
                        private.append(edge)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _PATH_STRING.fullmatch(node.value):
            strings.append(Edge(module, node.value.partition(":")[0], file, node.lineno))
    for node in nodes:
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            dst = _dotted(node.value, aliases)
            if dst in modules and dst != module:
                private.append(Edge(module, dst, file, node.lineno, node.attr))
    return imports, private, strings


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The dotted module path an expression such as ``kvbench.tasks.ruler`` or ``ruler`` names, through the
    file's import bindings ``aliases``; None when it starts from no imported name."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(attrs)])


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def graph_edges(modules: dict[str, Path]) -> tuple[list[Edge], list[Edge], list[Edge]]:
    """:func:`module_edges` of every module in ``modules``, concatenated per kind."""
    per_module = [module_edges(module, path, modules) for module, path in modules.items()]
    return tuple([e for edges in per_module for e in edges[k]] for k in range(3))  # type: ignore[return-value]


@functools.cache
def all_edges() -> tuple[list[Edge], list[Edge], list[Edge]]:
    return graph_edges(project_modules())


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components with more than one module (or a module importing itself), each
    sorted; Tarjan's algorithm, iterative."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.src, set()).add(e.dst)
        graph.setdefault(e.dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return found


@functools.cache
def method_packages() -> frozenset[str]:
    """Every ``m`` such that a module ``kvbench.methods.m[.…]`` registers a method (``@register_method``)."""
    found = set()
    for module, path in project_modules().items():
        if not module.startswith(METHODS + "."):
            continue
        tree = _tree(path)
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        if any(_named(d) == "register_method" for c in classes for d in c.decorator_list):
            found.add(module[len(METHODS) + 1 :].split(".")[0])
    return frozenset(found)


def _method_of(module: str) -> str | None:
    """``m`` for a method module ``kvbench.methods.m[.…]``; None for shared code and modules outside methods/."""
    if not module.startswith(METHODS + "."):
        return None
    first = module[len(METHODS) + 1 :].split(".")[0]
    return first if first in method_packages() else None


def _report(rule: str, edges: list[Edge]) -> list[Edge]:
    """The edges of ``rule`` not in PENDING, printed."""
    left = [e for e in edges if (rule, e.src, f"{e.dst}.{e.name}" if e.name else e.dst) not in PENDING]
    for e in left:
        print(f"({rule}) {e}")
    return left


def test_no_import_cycle() -> None:
    imports, _, _ = all_edges()
    kept = [e for e in imports if ("a", e.src, e.dst) not in PENDING]
    components = cycles(kept)
    for component in components:
        members = set(component)
        print(f"(a) cycle between {', '.join(component)}:")
        for e in kept:
            if e.src in members and e.dst in members:
                print(f"    {e}")
    assert not components, f"{len(components)} import cycle(s); edges printed above"


def test_no_private_name_across_modules() -> None:
    _, private, _ = all_edges()
    left = _report("b", private)
    assert not left, f"{len(left)} private name(s) imported from another module; printed above"


def test_core_names_no_method() -> None:
    imports, _, strings = all_edges()
    bad = [
        e
        for e in imports + strings
        if not e.src.startswith(METHODS + ".") and e.src != METHODS and _method_of(e.dst) is not None
    ]
    left = _report("c", bad)
    assert not left, f"{len(left)} core module import(s) of a method module; printed above"


def test_methods_import_no_other_method() -> None:
    imports, _, strings = all_edges()
    bad = [
        e
        for e in imports + strings
        if _method_of(e.src) is not None and _method_of(e.dst) not in (None, _method_of(e.src))
    ]
    left = _report("d", bad)
    assert not left, f"{len(left)} method module import(s) of another method's module; printed above"


def top_level_names(path: Path) -> set[str] | None:
    """Names bound at the top level of a module (through ``if``/``try``/``with`` blocks too); None when the
    module can bind names the checker cannot see (a star import, a module ``__getattr__``)."""
    names: set[str] = set()
    stack = list(_tree(path).body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            stack.extend(ast.iter_child_nodes(node))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
    return None if "__getattr__" in names else names


def test_imported_names_exist() -> None:
    imports, _, _ = all_edges()
    modules = project_modules()
    bound = {module: top_level_names(path) for module, path in modules.items()}
    bad = [e for e in imports if e.name and bound[e.dst] is not None and e.name not in bound[e.dst]]
    left = _report("f", bad)
    assert not left, f"{len(left)} import(s) of a name its module does not define; printed above"


def _unregistered_attention_uses(module: str, path: Path) -> list[Edge]:
    """Calls in ``module`` that pass ``ATTN_IMPL`` to transformers from a function (or module body) that never
    calls ``register_attention()`` (rule e)."""
    file = str(path.relative_to(ROOT))
    tree = _tree(path)
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = []
    for scope in scopes:
        calls = [n for n in ast.walk(scope) if isinstance(n, ast.Call)]
        if any(_called_name(c) == "register_attention" for c in calls):
            continue
        for call in calls:
            values = [k.value for k in call.keywords if k.arg == "attn_implementation"]
            if _called_name(call) == "set_attn_implementation":
                values += call.args
            if any(_named(v) == "ATTN_IMPL" for v in values):
                found.append(Edge(module, "kvbench.engines.attention", file, call.lineno, "ATTN_IMPL"))
    return found


def _called_name(call: ast.Call) -> str:
    return _named(call.func)


def _named(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def test_attention_registered_where_its_name_is_used() -> None:
    bad = sorted(
        {e for module, path in project_modules().items() for e in _unregistered_attention_uses(module, path)},
        key=str,
    )
    left = _report("e", bad)
    assert not left, f"{len(left)} use(s) of ATTN_IMPL without register_attention(); printed above"


def _graph(source: dict[str, str], tmp_path: Path) -> tuple[list[Edge], list[Edge], list[Edge]]:
    modules = {}
    for name, text in source.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        modules[name] = path
    return graph_edges(modules)


def test_checker_sees_lazy_cycles_and_private_attributes(tmp_path: Path, monkeypatch) -> None:
    """The checker itself: a function-level import closes a cycle; ``mod._x`` is a private name taken; an import
    under ``if TYPE_CHECKING:`` is no edge."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    source = {
        "a": "import b\n",
        "b": "def f():\n    import a\n    return a._hidden\n",
        "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nfrom b import _y, __doc__\n",
    }
    imports, private, _ = _graph(source, tmp_path)
    assert cycles(imports) == [["a", "b"]]
    assert sorted((e.src, e.dst, e.name) for e in private) == [("b", "a", "_hidden"), ("c", "b", "_y")]
    assert not [e for e in imports if e.src == "c" and e.dst == "a"]
