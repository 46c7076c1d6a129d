"""Allocation objects own their selection: the built-ins select exactly as the budget primitives do, an allocation
that declares ``needs_gate_means`` gets the method's gate means (a plugin's plain counts function included), the
registry holds allocations only, docs/extending.md's Allocations example installs and runs, and a plugin's method
with an offline artifact and a plugin's allocation are covered by the invariant suite without editing it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvbench import allocations, budgets, selection
from kvbench.artifacts import ReadOnce
from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod
from kvbench.registry import Registry, RegistryError
from tests.test_cli_core import _doc_blocks
from tests.test_registry import _run_cli, write_dist

ROOT = Path(__file__).resolve().parents[1]


def _scores(layers: int = 3, heads: int = 2, n: int = 40, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(heads, n, generator=g) for _ in range(layers)]


def _as_lists(kept: selection.Kept) -> list[list[list[int]]]:
    return [[idx.tolist() for idx in heads] for heads in kept]


def test_builtin_allocations_select_exactly_as_the_primitives():
    scores, n, prot, weights = _scores(), 40, 4, [0.5, 2.0, 1.0]
    for p in (0.9, 0.5, 0.3, 0.1):
        k = budgets.per_head_budget(n, prot, p)
        expected = {
            "flat": selection.select_per_head(scores, allocations.flat(k, 3), prot),
            "pyramid": selection.select_per_head(scores, allocations.pyramid(k, 3, n - prot), prot),
            "gate": selection.select_per_head(scores, allocations.gate(k, weights, n - prot), prot),
            "global": selection.select_global(scores, budgets.total_budget(n, prot, p, 3, 2), prot),
        }
        for name, kept in expected.items():
            chosen = allocations.get_allocation(name)
            got = chosen.select(scores, n, prot, p, weights if chosen.needs_gate_means else None)
            assert _as_lists(got) == _as_lists(kept), (name, p)
    needs = [allocations.get_allocation(a).needs_gate_means for a in allocations.ALLOCATIONS]
    assert needs == [False, False, True, False]
    assert isinstance(allocations.get_allocation("global"), allocations.GlobalAllocation)
    assert not isinstance(allocations.get_allocation("global"), allocations.LayerAllocation)


class _Method(EvictionMethod):
    """Scores nothing itself; its gate means are fixed (what the allocation must be given)."""

    name = "alloc-probe"

    def score(self, parent):
        raise AssertionError("not called")

    def gate_means(self, parent):
        return [3.0, 1.0, 0.0]


PARENT = SimpleNamespace(n=40, prot=4, n_attn_layers=3, n_kv_heads=2)


class _Recording(allocations.LayerAllocation):
    """Flat counts; records the gate means it was given."""

    def __init__(self, needs: bool) -> None:
        self.needs_gate_means = needs
        self.seen: list = []

    def counts(self, k, n_layers, capacity, gate_means=None):
        self.seen.append(gate_means)
        return [k] * n_layers


def _registry_with(monkeypatch, **added) -> None:
    """``allocations.ALLOCATIONS`` replaced by the built-ins plus ``added`` (name -> object)."""
    table = {name: f"kvbench.allocations:{name.upper()}" for name in ("flat", "gate", "global")}
    registry = Registry("allocation", "kvbench.test-none", table, check=allocations._check_allocation)
    for name, obj in added.items():
        registry.add(name.replace("_", "-"), obj, "a test")
    monkeypatch.setattr(allocations, "ALLOCATIONS", registry)


def test_an_allocation_declaring_needs_gate_means_gets_the_methods(monkeypatch):
    hungry, plain = _Recording(needs=True), _Recording(needs=False)

    def ratio(k, n_layers, capacity, gate_means):  # a plugin's plain counts function, asking for gate means
        ratio.seen.append(gate_means)
        return budgets.apportion(list(gate_means), n_layers * k, lo=0, hi=capacity)

    ratio.seen, ratio.needs_gate_means = [], True
    _registry_with(monkeypatch, hungry=hungry, plain=plain, by_ratio=ratio)
    method, scores = _Method(), _scores()
    for name in ("hungry", "plain", "by-ratio", "gate"):
        kept = method.select(PARENT, scores, 0.5, name)
        assert sum(len(idx) - 4 for heads in kept for idx in heads) == 3 * 2 * 18, name
    assert hungry.seen == [[3.0, 1.0, 0.0]] and plain.seen == [None] and ratio.seen == [[3.0, 1.0, 0.0]]
    by_ratio = method.select(PARENT, scores, 0.5, "by-ratio")
    assert [len(heads[0]) - 4 for heads in by_ratio] == [36, 18, 0]  # 54 entries 3 : 1 : 0, capacity 36
    assert _as_lists(by_ratio) == _as_lists(method.select(PARENT, scores, 0.5, "gate"))


def test_a_plugin_allocation_breaking_the_budget_is_named_when_a_method_selects(monkeypatch):
    _registry_with(monkeypatch, short=lambda k, n_layers, capacity, gate_means: [k] * (n_layers - 1))
    with pytest.raises(KvbenchError) as err:
        _Method().select(PARENT, _scores(), 0.5, "short")
    assert str(err.value) == (
        "allocation 'short' (a test) gave per-layer counts [18, 18] for k=18, 3 layers, capacity 36: expected 3 "
        "counts in [0, 36] summing to 54"
    )


def test_the_registry_holds_allocations_only():
    for bad in (42, allocations.LayerAllocation, allocations.GlobalAllocation):
        with pytest.raises(RegistryError, match="is neither an Allocation instance nor a counts function"):
            allocations.ALLOCATIONS.add("not-an-allocation", bad, "a test")
    assert "not-an-allocation" not in allocations.ALLOCATIONS
    assert allocations.ALLOCATIONS.get("pyramid") is allocations.PYRAMID
    assert allocations.PYRAMID(10, 3, 100) == [17, 9, 4]


def test_prepare_offline_refuses_an_artifact_method_that_cannot_make_its_artifact(tmp_path):
    class WithArtifact(_Method):
        def artifact_sha256(self, model_fingerprint):
            return "0" * 64

    with pytest.raises(KvbenchError, match="alloc-probe scores with an offline artifact: override prepare_offline"):
        WithArtifact.prepare_offline(None, None, tmp_path, seed=1)
    prepared = _Method.prepare_offline(None, None, tmp_path, seed=7)
    assert type(prepared) is _Method and prepared.seed == 7


def test_read_once_reads_again_only_when_path_or_fingerprint_changes(tmp_path):
    reads = []

    def read(path, fingerprint):
        reads.append((path.name, fingerprint))
        if fingerprint == "bad":
            raise KvbenchError("wrong model")
        return len(reads)

    cache = ReadOnce(read)
    a, b = tmp_path / "a", tmp_path / "b"
    assert [cache.get(a, "fp"), cache.get(a, "fp"), cache.get(b, "fp"), cache.get(b, None)] == [1, 1, 2, 3]
    with pytest.raises(KvbenchError):
        cache.get(a, "bad")
    assert cache.get(b, None) == 3 and len(reads) == 4  # the failed read left the last artifact in place


def _doc_example(tmp_path: Path) -> Path:
    """docs/extending.md's Allocations example as an installed distribution; returns the directory for the path."""
    blocks = _doc_blocks("Allocations")
    project = tomllib.loads(blocks["toml"])["project"]
    modules = {"mypkg/__init__.py": "", "mypkg/alloc.py": blocks["python"]}
    return write_dist(tmp_path / "site", project["name"], project["entry-points"], modules)


def test_the_allocations_example_of_docs_extending_runs(tmp_path):
    """The example's allocation is listed, and ``kvbench run --allocation deep-first`` writes rows under it whose
    kept entries equal the flat allocation's (the same budget, shared otherwise)."""
    site = _doc_example(tmp_path)
    listed = _run_cli(["list", "allocations"], site)
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    assert listed.returncode == 0 and names == ["flat", "pyramid", "gate", "global", "deep-first"], listed.stdout
    assert listed.stdout.splitlines()[-1].endswith("entry point mypkg.alloc:DEEP_FIRST (dist mypkg 0.1)")
    out = tmp_path / "out"
    args = ["run", "--model", "tiny-random", "--method", "snapkv", "--bench", "needle", "--p", "0.5", "--limit", "1",
            "--length", "900", "--threads", "1", "--no-reference", "--allocation", "deep-first,flat",
            "--out", str(out)]  # fmt: skip
    done = _run_cli(args, site)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    by_allocation = {r["allocation"]: r for r in rows}
    assert set(by_allocation) == {"deep-first", "flat"}, rows
    assert by_allocation["deep-first"]["kept_entries"] == by_allocation["flat"]["kept_entries"]

    sys.path.insert(0, str(site))
    try:
        from mypkg.alloc import DEEP_FIRST  # the doc's object, in-process
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("mypkg", None)
    assert DEEP_FIRST.counts(10, 4, 100) == [4, 8, 12, 16]
    kept = DEEP_FIRST.select(_scores(layers=4), 40, 4, 0.5)
    assert [len(heads[0]) - 4 for heads in kept] == [7, 14, 22, 29]  # 72 entries shared 1 : 2 : 3 : 4


FAKE_METHODS = '''
import hashlib
from pathlib import Path

from kvbench.methods import EvictionMethod


class KeyWeight(EvictionMethod):
    """Key norms times a weight read from its artifact file, made by prepare_offline."""

    name = "fake-artifact"
    path = None

    @classmethod
    def prepare_offline(cls, model, tokenizer, workdir, *, seed=0):
        workdir.mkdir(parents=True, exist_ok=True)
        method = cls(seed=seed)
        method.path = workdir / "weight.txt"
        method.path.write_text("2.5")
        return method

    def artifact_sha256(self, model_fingerprint):
        return hashlib.sha256(Path(self.path).read_bytes()).hexdigest()

    def score(self, parent):
        weight = float(Path(self.path).read_text())
        return [-weight * parent.keys(f).float().norm(dim=-1) for f in range(parent.n_attn_layers)]


class Unprepared(EvictionMethod):
    """Has an artifact but no way to make one: the suite must fail it."""

    name = "fake-unprepared"

    def artifact_sha256(self, model_fingerprint):
        return "0" * 64

    def score(self, parent):
        raise FileNotFoundError("no artifact")


def last_layer_only(k, n_layers, capacity, gate_means):
    """Everything to the last layers, as far as capacity allows; needs the gate means to be given."""
    assert gate_means is not None and len(gate_means) == n_layers
    counts, left = [0] * n_layers, n_layers * k
    for f in reversed(range(n_layers)):
        counts[f] = min(capacity, left)
        left -= counts[f]
    return counts


last_layer_only.needs_gate_means = True
'''


def test_the_invariant_suite_covers_a_plugins_method_and_allocation_unedited(tmp_path):
    """A plugin distribution adding a method with an artifact (made by its ``prepare_offline``), one without a way
    to make it, and an allocation: the unedited invariant suite runs them, passing the first and the allocation
    (with every method it runs) and failing the second by name."""
    points = {
        "kvbench.methods": {"fake-artifact": "fakeplug:KeyWeight", "fake-unprepared": "fakeplug:Unprepared"},
        "kvbench.allocations": {"last-layer-only": "fakeplug:last_layer_only"},
    }
    site = write_dist(tmp_path / "site", "fakeplug", points, {"fakeplug.py": FAKE_METHODS})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
               "tests/test_methods_invariants.py", "-k", "fake or last-layer-only or random"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    outcomes = {test: outcome for outcome, test in re.findall(r"^(PASSED|FAILED|ERROR) \S+::(\S+)", done.stdout, re.M)}
    for family in ("qwen3_next", "qwen3_5"):
        assert outcomes.get(f"test_method_invariants[{family}-fake-artifact]") == "PASSED", done.stdout
        assert outcomes.get(f"test_method_invariants[{family}-random]") == "PASSED", done.stdout  # with the plugin's
        assert outcomes.get(f"test_allocation_invariants[{family}-last-layer-only]") == "PASSED", done.stdout
        assert outcomes.get(f"test_method_invariants[{family}-fake-unprepared]") == "FAILED", done.stdout
    assert "fake-unprepared scores with an offline artifact: override prepare_offline" in done.stdout


def test_gate_means_take_the_max_over_each_kv_heads_query_heads():
    """A layer's gate mean (the gate allocation's weight) is the mean over tokens per query head, then the MAX
    over the query heads of each KV head, then the mean over KV heads: query heads 0.1, 0.9 | 0.5, 0.3 (two KV
    heads) give (0.9 + 0.5) / 2 = 0.7 (averaging the query heads would give 0.45)."""
    from kvbench.engines.base import ParentSession

    gate = torch.tensor([[0.0, 0.8, 0.4, 0.2], [0.2, 1.0, 0.6, 0.4]])  # [n = 2 tokens, H = 4 query heads]
    parent = SimpleNamespace(n_attn_layers=2, n_kv_heads=2, gate=lambda f: gate * (f + 1) / 2)
    assert ParentSession.gate_means(parent) == pytest.approx([0.35, 0.7])
