"""One generic registry of named things: methods, benches, scorers, engines, allocations and CLI commands.

A :class:`Registry` knows three kinds of entries:

* **built-ins**: entry points of the registry's group that kvbench's own distribution declares (its
  pyproject.toml, the same path as a plugin's: the methods), or a table ``name -> "module:attr"`` given at
  construction; listed first (a table in its order, entry points as installed) without importing anything,
  imported one at a time on first :meth:`Registry.get`;
* **entry points** of the registry's group (``[kvbench.methods] keynorm = mypkg.keynorm:KeyNorm`` in an
  installed distribution's metadata): the entry point's key is the registered name, listed without loading
  the plugin, loaded on first :meth:`Registry.get`;
* **added** objects (:meth:`Registry.add`, what decorators such as ``register_method`` call).

A name has one owner. Two sources claiming one name (a plugin or an added object against a built-in, two
plugins, two added objects) is a :class:`RegistryError` naming both; the module a built-in or entry point
points to registering that very object through its decorator is no collision. A loaded class that declares a
``name`` other than its registered name is refused too (its rows would carry the other name).

This module imports nothing heavy (no torch, no method): ``kvbench --help`` lists commands through it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

from kvbench.errors import KvbenchError

T = TypeVar("T")

__all__ = ["Registry", "RegistryError", "UnknownNameError", "load_spec"]


class RegistryError(KvbenchError, ValueError):
    """A registration conflicts with another one (the message names both sources), or the registered object
    does not fit its registry. A ValueError too: registering is a call with a bad value."""


class UnknownNameError(RegistryError):
    """No entry under the name looked up; the message lists the valid names."""


def load_spec(spec: str) -> object:
    """The object a ``"module:attr"`` spec names (``attr`` may be dotted), importing ``module``."""
    module, _, attr = spec.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def _points_to(spec: str, obj: object) -> bool:
    """Whether ``obj`` is the object ``spec`` (``"module:attr"``) names, judged by its ``__module__`` and
    ``__qualname__`` (so it can be decided while ``module`` is still being imported)."""
    module, _, attr = spec.partition(":")
    return getattr(obj, "__module__", None) == module and getattr(obj, "__qualname__", None) == attr


#: The distribution whose entry points are built-ins: kvbench itself.
OWN_DISTRIBUTION = "kvbench"


def _is_builtin(ep: EntryPoint) -> bool:
    return ep.dist is not None and ep.dist.name == OWN_DISTRIBUTION


def _entry_point_source(ep: EntryPoint) -> str:
    if _is_builtin(ep):
        return f"built-in {ep.value}"
    dist = ep.dist
    owner = f"dist {dist.name} {dist.version}" if dist is not None else "dist unknown"
    return f"entry point {ep.value} ({owner})"


def uninstall_command(ep: EntryPoint) -> str:
    """The command that removes entry point ``ep``: ``pip uninstall <its distribution>``."""
    dist = ep.dist
    return f"pip uninstall {dist.name if dist is not None else '<the distribution declaring ' + ep.value + '>'}"


class Registry(Generic[T]):
    """Named objects of one kind (``"method"``, ``"bench"``, …), open to the entry-point group ``group``.

    Args:
      kind: what an entry is, in messages (``unknown method 'x'; valid methods: …``).
      group: the entry-point group read for plugins, e.g. ``"kvbench.methods"``.
      builtins: ``name -> "module:attr"``, imported lazily; their order is the order of :meth:`names`.
      plural: ``kind`` in the plural (default ``kind + "s"``).
      check: called as ``check(name, obj)`` on every object before it is registered or handed out; raises
        :class:`RegistryError` (or ValueError / TypeError) when ``obj`` does not fit.
      own_entry_points: the built-ins are kvbench's own entry points of ``group`` (none installed: an unknown
        name's error says to reinstall kvbench, whose installed metadata then predates them).

    A registry is also a read-only collection of its names: ``name in registry``, ``iter(registry)`` and
    ``len(registry)`` read :meth:`names` (nothing imported).
    """

    def __init__(
        self,
        kind: str,
        group: str,
        builtins: Mapping[str, str],
        *,
        plural: str | None = None,
        check: Callable[[str, T], None] | None = None,
        own_entry_points: bool = False,
    ) -> None:
        self.kind = kind
        self.group = group
        self.plural = plural or f"{kind}s"
        self._builtins = dict(builtins)
        self._check = check
        self._own_entry_points = own_entry_points
        self._added: dict[str, tuple[T, str]] = {}  # name -> (object, source) from add()
        self._loaded: dict[str, T] = {}  # name -> object checked and handed out by get()
        self._entry_points: dict[str, EntryPoint] | None = None  # read once, on first use

    # --- reading ------------------------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Every registered name, built-ins first (in table or declaration order), then plugins' and added names
        sorted. Imports nothing; reads the installed distributions' entry points (once)."""
        builtins = self.builtin_names()
        others = (set(self._plugins()) | set(self._added)) - set(builtins)
        return [*builtins, *sorted(others)]

    def builtin_names(self) -> list[str]:
        """The built-ins' names: the table's, then kvbench's own entry points of the group, in order."""
        own = [name for name, ep in self._plugins().items() if _is_builtin(ep) and name not in self._builtins]
        return [*self._builtins, *own]

    def get(self, name: str) -> T:
        """The object registered under ``name``, importing just that entry (once); an unknown name is an
        :class:`UnknownNameError` listing the valid names, a plugin that fails to import a
        :class:`RegistryError` naming it."""
        if name in self._loaded:
            return self._loaded[name]
        plugins = self._plugins()
        if name in self._builtins:
            obj = self._load_builtin(name)
        elif name in plugins:
            obj = self._load_plugin(plugins[name])
        elif name in self._added:
            obj = self._added[name][0]
        else:
            raise self._unknown(name)
        if name in self._added and self._added[name][0] is not obj:
            raise self._collision(name, self.source(name), self._added[name][1])
        self._validate(name, obj, self.source(name))
        self._loaded[name] = obj
        return obj

    def source(self, name: str) -> str:
        """Where ``name`` comes from: ``"built-in kvbench.methods.snapkv:SnapKV"``, ``"entry point
        mypkg.keynorm:KeyNorm (dist mypkg 0.1)"`` or the source given to :meth:`add`."""
        plugins = self._plugins()
        if name in self._builtins:
            return f"built-in {self._builtins[name]}"
        if name in plugins:
            return _entry_point_source(plugins[name])
        if name in self._added:
            return self._added[name][1]
        raise self._unknown(name)

    def entry_point(self, name: str) -> EntryPoint | None:
        """The entry point registering ``name`` (a plugin's), or None for a built-in or added entry."""
        return self._plugins().get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.group!r}, {len(self._builtins)} built-in)"

    # --- registering --------------------------------------------------------------------------------------

    def add(self, name: str, obj: T, source: str) -> None:
        """Register ``obj`` under ``name``; ``source`` says where from, in messages (e.g. ``"register_method
        in mypkg.methods"``). The module of a built-in or entry point registering the very object its spec
        names is no collision; any other claim on a taken name is a :class:`RegistryError` naming both."""
        spec = self._spec(name)
        if spec is not None and not _points_to(spec, obj):
            plugin = self._plugins().get(name)
            raise self._collision(name, self.source(name), source, *([plugin] if plugin is not None else []))
        if spec is None and name in self._added and self._added[name][0] is not obj:
            raise self._collision(name, self._added[name][1], source)
        self._validate(name, obj, source)
        self._added[name] = (obj, source)

    # --- internals ----------------------------------------------------------------------------------------

    def _plugins(self) -> dict[str, EntryPoint]:
        """The group's entry points by name, read once; a plugin name claimed twice or taken by a built-in (or
        by an object added before, other than the one it points to) is a :class:`RegistryError`."""
        if self._entry_points is None:
            found: dict[str, EntryPoint] = {}
            # kvbench's own (the built-ins) first: a plugin taking a built-in's name is the second claimant
            for ep in sorted(entry_points(group=self.group), key=lambda ep: not _is_builtin(ep)):
                if ep.name in self._builtins:
                    raise self._collision(ep.name, f"built-in {self._builtins[ep.name]}", _entry_point_source(ep), ep)
                if ep.name in found and found[ep.name].value != ep.value:
                    first = found[ep.name]
                    raise self._collision(ep.name, _entry_point_source(first), _entry_point_source(ep), first, ep)
                if ep.name in self._added and not _points_to(ep.value, self._added[ep.name][0]):
                    raise self._collision(ep.name, self._added[ep.name][1], _entry_point_source(ep), ep)
                found[ep.name] = ep
            self._entry_points = found
        return self._entry_points

    def _spec(self, name: str) -> str | None:
        """The ``"module:attr"`` a built-in or entry point ``name`` names; None for neither."""
        if name in self._builtins:
            return self._builtins[name]
        plugin = self._plugins().get(name)
        return plugin.value if plugin is not None else None

    def _load_builtin(self, name: str) -> T:
        return load_spec(self._builtins[name])  # type: ignore[return-value]

    def _load_plugin(self, ep: EntryPoint) -> T:
        try:
            return ep.load()
        except (Exception, SystemExit) as exc:  # a broken plugin must be visible, naming the plugin
            # SystemExit: a plugin calling sys.exit() on import must not end kvbench (silently, maybe with 0)
            what = (
                f"it called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
            )
            raise RegistryError(
                f"the {self.group} entry point {ep.name!r} ({_entry_point_source(ep)}) failed to load: "
                f"{' '.join(what.split())}; fix that distribution or remove it with `{uninstall_command(ep)}`"
            ) from exc

    def _validate(self, name: str, obj: T, source: str) -> None:
        """A class must declare ``name`` as its ``name`` (rows record the class's name); then ``check``."""
        declared = getattr(obj, "name", None) if isinstance(obj, type) else None
        if isinstance(declared, str) and declared != name:
            raise RegistryError(
                f"{self.kind} {name!r} ({source}) is a class whose name is {declared!r}; the registered name and "
                f"the class's name must agree (set name = {name!r} in the class, or register it as {declared!r})"
            )
        if self._check is not None:
            self._check(name, obj)

    def _unknown(self, name: str) -> UnknownNameError:
        message = f"unknown {self.kind} {name!r}; valid {self.plural}: {', '.join(self.names())}"
        if self._own_entry_points and not self.builtin_names():
            message += (
                f" (kvbench's built-in {self.plural} are entry points of group {self.group} and none is installed: "
                "reinstall kvbench, e.g. pip install -e . in its checkout or bash scripts/setup.sh)"
            )
        return UnknownNameError(message)

    def _collision(self, name: str, first: str, second: str, *plugins: EntryPoint) -> RegistryError:
        """Two sources of ``name``; ``plugins``: the entry points among them, whose uninstall commands the
        message names."""
        own = __name__.split(".")[0]  # kvbench's own entry points (its built-ins) are not what to uninstall
        fix = " or ".join(f"`{uninstall_command(ep)}`" for ep in plugins if ep.dist is None or ep.dist.name != own)
        return RegistryError(
            f"{self.kind} {name!r} is already registered by {first}; {second} registers it too. Rename or "
            "uninstall one of them" + (f": {fix} fixes it" if fix else "")
        )
