"""The generic registry (kvbench.registry) and the registries built on it: lazy built-ins, entry points whose key
is the name, collisions naming both sources, and a throwaway plugin distribution run through `kvbench run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvbench import allocations
from kvbench.commands import COMMANDS
from kvbench.engines import ENGINES
from kvbench.errors import KvbenchError
from kvbench.methods import METHODS, EvictionMethod, register_method
from kvbench.registry import Registry, RegistryError, UnknownNameError
from kvbench.scorers import BUILTIN_SCORERS, SCORERS
from kvbench.tasks import BENCHES, Bench, UnknownBenchError, get_bench

KEYNORM = '''
from kvbench.methods import EvictionMethod


class KeyNorm(EvictionMethod):
    """Keeps the keys with the smallest norm."""

    name = "keynorm"

    def score(self, parent):
        return [-parent.keys(f).float().norm(dim=-1) for f in range(parent.n_attn_layers)]
'''


def write_dist(root: Path, dist: str, entry_points: dict[str, dict[str, str]], modules: dict[str, str]) -> Path:
    """A distribution ``dist`` 0.1 laid out as installed under ``root`` (its modules and a ``.dist-info`` with
    METADATA and entry_points.txt, ``group -> {name: "module:attr"}``); returns ``root``, to put on the path."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, source in modules.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    sections = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(sections))
    return root


def write_module(root: Path, name: str, source: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def things(tmp_path, monkeypatch):
    """A module ``regthings`` on the path holding two objects, imported by nobody yet."""
    write_module(tmp_path / "mods", "regthings", "class Alpha:\n    name = 'alpha'\n\ndef beta():\n    return 2\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.delitem(sys.modules, "regthings", raising=False)
    yield
    sys.modules.pop("regthings", None)


def test_builtins_are_listed_without_import_and_imported_one_at_a_time(things):
    reg = Registry("thing", "kvbench.test-none", {"alpha": "regthings:Alpha", "beta": "regthings:beta"})
    assert reg.names() == ["alpha", "beta"] and "beta" in reg and list(reg) == ["alpha", "beta"] and len(reg) == 2
    assert "regthings" not in sys.modules  # listing imports nothing
    assert reg.get("beta")() == 2 and "regthings" in sys.modules
    assert reg.get("alpha").__name__ == "Alpha" and reg.source("alpha") == "built-in regthings:Alpha"


def test_unknown_name_lists_the_valid_ones(things):
    reg = Registry("thing", "kvbench.test-none", {"alpha": "regthings:Alpha"})
    with pytest.raises(UnknownNameError, match=r"unknown thing 'gamma'; valid things: alpha$"):
        reg.get("gamma")
    with pytest.raises(UnknownNameError, match="valid things: alpha"):
        reg.source("gamma")
    with pytest.raises(UnknownBenchError, match="unknown bench 'nope'; valid benches: needle, ruler, scbench"):
        get_bench("nope")


def test_add_colliding_with_a_builtin_or_another_add_names_both(things):
    reg = Registry("thing", "kvbench.test-none", {"alpha": "regthings:Alpha"})

    class Alpha:
        name = "alpha"

    with pytest.raises(RegistryError, match=r"'alpha' is already registered by built-in regthings:Alpha; mine"):
        reg.add("alpha", Alpha, "mine")
    assert "regthings" not in sys.modules  # decided without importing the built-in

    def one():
        return 1

    reg.add("one", one, "first place")
    reg.add("one", one, "first place")  # the same object again: no collision
    with pytest.raises(RegistryError, match="already registered by first place; second place registers it too"):
        reg.add("one", lambda: 1, "second place")
    assert reg.get("one") is one and reg.source("one") == "first place" and reg.names() == ["alpha", "one"]


def test_a_builtins_own_decorator_is_no_collision():
    from kvbench.methods.snapkv import SnapKV  # its @register_method ran on import

    METHODS.add("snapkv", SnapKV, "again")
    assert METHODS.get("snapkv") is SnapKV and METHODS.source("snapkv") == "built-in kvbench.methods.snapkv:SnapKV"

    class Impostor(EvictionMethod):
        name = "snapkv"

        def score(self, parent):
            return []

    with pytest.raises(RegistryError) as err:
        register_method(Impostor)
    assert "built-in kvbench.methods.snapkv:SnapKV" in str(err.value)
    assert "tests.test_registry.test_a_builtins_own_decorator_is_no_collision.<locals>.Impostor" in str(err.value)


def test_a_class_must_declare_its_registered_name(things):
    reg = Registry("thing", "kvbench.test-none", {"gamma": "regthings:Alpha"})
    with pytest.raises(RegistryError, match="'gamma' .*built-in regthings:Alpha.* name is 'alpha'"):
        reg.get("gamma")


def test_an_entry_points_key_is_its_name_listed_without_loading(tmp_path, monkeypatch, things):
    group = "kvbench.test-registry-good"
    root = write_dist(tmp_path / "d", "goodplug", {group: {"delta": "goodplug:Delta"}},
                      {"goodplug.py": "class Delta:\n    name = 'delta'\n"})  # fmt: skip
    monkeypatch.syspath_prepend(str(root))
    reg = Registry("thing", group, {"alpha": "regthings:Alpha"})
    assert reg.names() == ["alpha", "delta"] and "goodplug" not in sys.modules
    assert reg.source("delta") == "entry point goodplug:Delta (dist goodplug 0.1)"
    assert reg.get("delta").__name__ == "Delta" and "goodplug" in sys.modules
    sys.modules.pop("goodplug", None)


def test_a_plugin_taking_a_builtins_name_names_both(tmp_path, monkeypatch, things):
    group = "kvbench.test-registry-clash"
    root = write_dist(tmp_path / "d", "clashplug", {group: {"alpha": "clashplug:Alpha"}}, {"clashplug.py": ""})
    monkeypatch.syspath_prepend(str(root))
    reg = Registry("thing", group, {"alpha": "regthings:Alpha"})
    for look_up in (reg.names, lambda: reg.get("alpha")):
        with pytest.raises(RegistryError) as err:
            look_up()
        assert str(err.value).startswith(
            "thing 'alpha' is already registered by built-in regthings:Alpha; entry point clashplug:Alpha (dist "
            "clashplug 0.1) registers it too"
        )


def test_two_plugins_taking_one_name_name_both(tmp_path, monkeypatch):
    group = "kvbench.test-registry-twins"
    for dist in ("oneplug", "twoplug"):
        root = write_dist(tmp_path / dist, dist, {group: {"delta": f"{dist}:Delta"}}, {f"{dist}.py": ""})
        monkeypatch.syspath_prepend(str(root))
    with pytest.raises(RegistryError) as err:
        Registry("thing", group, {}).names()
    assert "oneplug:Delta (dist oneplug 0.1)" in str(err.value) and "twoplug:Delta (dist twoplug 0.1)" in str(err.value)


def test_entry_point_key_and_class_name_must_agree(tmp_path, monkeypatch):
    group = "kvbench.test-registry-name"
    root = write_dist(tmp_path / "d", "namedplug", {group: {"epsilon": "namedplug:Zeta"}},
                      {"namedplug.py": "class Zeta:\n    name = 'zeta'\n"})  # fmt: skip
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(RegistryError) as err:
        Registry("thing", group, {}).get("epsilon")
    assert "'epsilon' (entry point namedplug:Zeta (dist namedplug 0.1))" in str(err.value)
    assert "name is 'zeta'" in str(err.value)
    sys.modules.pop("namedplug", None)


def test_a_plugin_that_fails_to_import_is_named(tmp_path, monkeypatch):
    group = "kvbench.test-registry-broken"
    root = write_dist(tmp_path / "d", "brokenplug", {group: {"eta": "brokenplug:Eta"}},
                      {"brokenplug.py": "raise ImportError('no such dependency')\n"})  # fmt: skip
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(RegistryError, match="entry point 'eta' .*brokenplug 0.1.* failed to load: .*no such dep"):
        Registry("thing", group, {}).get("eta")


def test_a_plugin_registered_by_decorator_and_entry_point_is_one_entry(tmp_path, monkeypatch):
    group = "kvbench.test-registry-deco"
    write_module(tmp_path / "mods", "regholder", "REGISTRY = None\n")
    source = "import regholder\n\nclass Theta:\n    name = 'theta'\n\nregholder.REGISTRY.add('theta', Theta, 'deco')\n"
    root = write_dist(tmp_path / "d", "decoplug", {group: {"theta": "decoplug:Theta"}}, {"decoplug.py": source})
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.syspath_prepend(str(root))
    import regholder

    reg = regholder.REGISTRY = Registry("thing", group, {})
    assert reg.get("theta").__module__ == "decoplug"  # its own decorator's add() was no collision
    assert reg.source("theta") == "entry point decoplug:Theta (dist decoplug 0.1)"
    for module in ("decoplug", "regholder"):
        sys.modules.pop(module, None)


def test_every_builtin_table_entry_resolves():
    assert sorted(METHODS.builtin_names()) == sorted(
        ["full", "random", "snapkv", "keydiff", "triattention", "kvzip", "gatesight", "oracle"])  # fmt: skip
    for name in METHODS.builtin_names():
        assert issubclass(METHODS.get(name), EvictionMethod) and METHODS.get(name).name == name
        assert METHODS.source(name).startswith("built-in kvbench.methods.")  # kvbench's own entry point
    for name in BENCHES.names():
        assert issubclass(BENCHES.get(name), Bench)
    for name in BUILTIN_SCORERS:
        assert callable(SCORERS.get(name))
    from kvbench.scorers.scbench import SCORER_NAMES

    assert set(SCORER_NAMES) <= set(BUILTIN_SCORERS)  # every SCBench scorer is in the table
    assert list(allocations.ALLOCATIONS) == ["flat", "pyramid", "gate", "global"]
    assert allocations.ALLOCATIONS.get("pyramid")(10, 3, 100, None) == allocations.pyramid(10, 3, 100)
    assert ENGINES.names() == ["torch", "vllm"] and all(callable(ENGINES.get(n)) for n in ENGINES)
    import typer

    assert isinstance(COMMANDS.get("gatesight"), typer.Typer)


def test_layer_counts_checks_a_plugin_allocations_total(monkeypatch):
    registry = Registry("allocation", "kvbench.test-none", {"flat": "kvbench.allocations:flat_counts"})
    registry.add("short", lambda k, n_layers, capacity, gate_means: [k] * (n_layers - 1), "a bad plugin")
    monkeypatch.setattr(allocations, "ALLOCATIONS", registry)
    assert allocations.layer_counts("flat", 4, 3, 10) == [4, 4, 4]
    with pytest.raises(KvbenchError, match="'short' \\(a bad plugin\\) gave per-layer counts \\[4, 4\\]"):
        allocations.layer_counts("short", 4, 3, 10)


def test_methods_calibration_and_commands_hooks():
    from kvbench.methods.snapkv import SnapKV

    assert not SnapKV.has_calibration() and not hasattr(SnapKV, "commands")
    with pytest.raises(KvbenchError, match="snapkv has no calibration step"):
        SnapKV.calibrate(None, [], max_tokens=1, out=None)

    class Calibrated(SnapKV):
        @classmethod
        def calibrate(cls, lm, texts, *, max_tokens, out):
            return Path("x")

    assert Calibrated.has_calibration()


def test_the_registries_import_no_torch():
    code = (
        "import sys, kvbench.commands, kvbench.methods, kvbench.registry, kvbench.tasks, kvbench.scorers\n"
        "import kvbench.engines\n"
        "names = [r.names() for r in (kvbench.methods.METHODS, kvbench.commands.COMMANDS, kvbench.tasks.BENCHES,\n"
        "         kvbench.scorers.SCORERS, kvbench.engines.ENGINES)]\n"
        "assert 'gatesight' in names[0] and 'gatesight' in names[1] and 'needle' in names[2], names\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert not [m for m in sys.modules if m.startswith('kvbench.methods.')], 'a method module imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _kvbench_cli() -> list[str]:
    """The installed console script beside this interpreter (the real entry point), else the module."""
    script = Path(sys.executable).parent / "kvbench"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from kvbench.cli import main; main()"]


def _run_cli(args: list[str], plugin: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([*_kvbench_cli(), *args], env=env, capture_output=True, text=True, timeout=600)


def test_a_plugin_distribution_runs_through_kvbench_run(tmp_path):
    plugin = write_dist(tmp_path / "site", "myplugin", {"kvbench.methods": {"keynorm": "myplugin:KeyNorm"}},
                        {"myplugin/__init__.py": KEYNORM})  # fmt: skip
    out = tmp_path / "out"
    args = ["run", "--model", "tiny-random", "--method", "keynorm", "--bench", "needle", "--p", "0.5", "--limit", "1",
            "--length", "900", "--threads", "1", "--no-reference", "--out", str(out)]  # fmt: skip
    done = _run_cli(args, plugin)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert rows and {r["method"] for r in rows} == {"keynorm"} and {r["p"] for r in rows} == {0.5}
    assert all(r["bench"] == "needle" for r in rows)


def test_a_plugin_taking_a_builtin_name_is_an_error_naming_both(tmp_path):
    plugin = write_dist(tmp_path / "site", "myplugin", {"kvbench.methods": {"snapkv": "myplugin:KeyNorm"}},
                        {"myplugin/__init__.py": KEYNORM})  # fmt: skip
    done = _run_cli(["list", "methods"], plugin)
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "method 'snapkv' is already registered by built-in kvbench.methods.snapkv:SnapKV" in message, message
    assert "entry point myplugin:KeyNorm (dist myplugin 0.1) registers it too" in message, message


def test_a_command_two_contributors_claim_is_an_error_naming_both(tmp_path, monkeypatch):
    """kvbench.commands gathers the built-in tables of its contributors; one name in two tables (or a core
    command's name in a contributor's table) is refused, naming both."""
    from kvbench import commands

    write_module(tmp_path, "contrib_a", 'BUILTIN_COMMANDS = {"dup": "contrib_a:app", "results": "contrib_a:app"}\n')
    write_module(tmp_path, "contrib_b", 'BUILTIN_COMMANDS = {"dup": "contrib_b:app"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(commands, "CONTRIBUTORS", ("contrib_b", "contrib_a"))
    with pytest.raises(RegistryError, match="command 'dup' is a built-in of both contrib_b and contrib_a"):
        commands.builtin_commands()
    monkeypatch.setattr(commands, "CONTRIBUTORS", ("contrib_b",))
    assert commands.builtin_commands() == {**commands.CORE_COMMANDS, "dup": "contrib_b:app"}
    monkeypatch.setattr(commands, "CONTRIBUTORS", ("contrib_a",))
    with pytest.raises(RegistryError, match="command 'results' is a built-in of both kvbench.commands and contrib_a"):
        commands.builtin_commands()
