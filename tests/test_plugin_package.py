"""One plugin distribution made of docs/extending.md's examples (a method, an allocation, an engine, a bench with
its scorers), installed through entry points only, run end to end by ``kvbench run`` with all four at once, and
listed by ``kvbench list`` with where each comes from (issue 45)."""

from __future__ import annotations

import json

from tests.test_extending_engines_benches import doc_example
from tests.test_registry import _run_cli, write_dist

SECTIONS = ("A method", "Allocations", "Engines", "Benches")


def install_all(site):
    """Every section's modules and entry points in one distribution ``mypkg``."""
    modules: dict[str, str] = {}
    entry_points: dict[str, dict[str, str]] = {}
    for section in SECTIONS:
        mods, project = doc_example(section)
        clash = set(modules) & set(mods) - {"mypkg/__init__.py"}
        assert not clash, f"two sections of docs/extending.md write {clash}"
        modules.update(mods)
        for group, eps in project["project"]["entry-points"].items():
            entry_points.setdefault(group, {}).update(eps)
    return write_dist(site, "mypkg", entry_points, modules), entry_points


def test_the_plugin_package_runs_every_extension_kind_together(tmp_path):
    site, eps = install_all(tmp_path / "site")
    assert set(eps) >= {"kvbench.methods", "kvbench.allocations", "kvbench.engines", "kvbench.benches",
                        "kvbench.scorers"}, eps  # fmt: skip
    (method,) = eps["kvbench.methods"]
    (allocation,) = eps["kvbench.allocations"]
    (engine,) = eps["kvbench.engines"]
    (bench,) = eps["kvbench.benches"]
    scorers = set(eps["kvbench.scorers"])

    for what, names in [("methods", {method}), ("allocations", {allocation}), ("engines", {engine}),
                        ("benches", {bench}), ("scorers", scorers)]:  # fmt: skip
        listed = _run_cli(["list", what], site)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        for name in names:
            line = next((ln for ln in listed.stdout.splitlines() if ln.split()[:1] == [name]), None)
            assert line is not None, f"kvbench list {what} lacks {name}: {listed.stdout}"
            assert "(dist mypkg 0.1)" in line, line  # where it comes from
    # the built-ins are still listed beside the plugins
    assert "torch" in _run_cli(["list", "engines"], site).stdout
    assert "string_match_all" in _run_cli(["list", "scorers"], site).stdout

    out = tmp_path / "out"
    args = ["run", "--model", "tiny-random", "--engine", engine, "--bench", bench, "--method", f"{method},full",
            "--allocation", allocation, "--p", "0.5", "--limit", "1", "--length", "900", "--threads", "1",
            "--no-reference", "--out", str(out)]  # fmt: skip
    done = _run_cli(args, site)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    pruned = [r for r in rows if r["method"] == method]
    assert pruned and all(r["real_fork"] for r in pruned)
    assert {(r["engine"], r["bench"], r["allocation"]) for r in pruned} == {(engine, bench, allocation)}
    assert {r["scorer"] for r in rows} == scorers
    assert all(0.0 <= r["score"] <= 100.0 for r in rows)
