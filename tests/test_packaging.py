"""The wheel kvbench builds: it holds everything kvbench reads from its own package directory (the shipped
trained models, their calibration artifacts, the decode kernel's C source, the report template, the vLLM
engine's torchvision stand-in), and building it prints no setuptools warning (a newcomer reads the
"Package ... is absent from the `packages` configuration" blocks as a broken install).

The build runs on a copy of the source tree (so the worktree gains no build/ directory) with the
environment's own setuptools (--no-build-isolation: no index needed), about 20-30 s."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# skipped at the top of the tree only (kvbench/results/ is a package of the same name as the top results/)
TOP_SKIP = {".git", ".venv", ".venv-vllm", "build", "results", "reports", "models", "tests", "benchmarks"}
SKIP_ANYWHERE = {"__pycache__", ".pytest_cache", ".ruff_cache", ".kvbench_cache"}


def _copy_source(dest: Path) -> None:
    def ignore(dir_: str, names: list[str]) -> set[str]:
        top = Path(dir_) == ROOT
        return {n for n in names if n in SKIP_ANYWHERE or (top and n in TOP_SKIP) or n.endswith(".egg-info")}
    shutil.copytree(ROOT, dest, ignore=ignore)


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], str]:
    """(names in the wheel, the build's stdout + stderr)."""
    pytest.importorskip("setuptools", reason="the no-isolation build uses the environment's setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    src, out = tmp / "src", tmp / "out"
    _copy_source(src)
    env = {**os.environ, "PIP_NO_INPUT": "1", "PYTHONWARNINGS": "default"}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(out), str(src)], capture_output=True, text=True, env=env,
                          timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    wheels = list(out.glob("kvbench-*.whl"))
    assert len(wheels) == 1, log[-4000:]
    with zipfile.ZipFile(wheels[0]) as zf:
        return set(zf.namelist()), log


def _package_files(rel: str) -> list[str]:
    """Every file under kvbench/<rel> in the source tree, as wheel names."""
    base = ROOT / "kvbench" / rel
    return sorted(p.relative_to(ROOT).as_posix() for p in base.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


@pytest.mark.parametrize("rel", ["builtin/tiny-trained", "builtin/tiny-trained-dense",
                                 "builtin/calibration/triattention", "builtin/calibration/gatesight",
                                 "builtin/calibration/generic/triattention", "builtin/calibration/generic/gatesight",
                                 "report/templates", "engines/vllm_stubs"])
def test_wheel_holds_the_shipped_data(built_wheel: tuple[set[str], str], rel: str) -> None:
    names, _ = built_wheel
    expected = _package_files(rel)
    assert expected, f"nothing under kvbench/{rel} in the source tree"
    missing = [n for n in expected if n not in names]
    assert not missing, f"the wheel lacks {missing}"


def test_wheel_holds_the_kernel_source_and_the_mapped_packages(built_wheel: tuple[set[str], str]) -> None:
    names, _ = built_wheel
    for name in ("kvbench/engines/decode_attention.c", "kvbench/builtin/tiny-trained/model.safetensors",
                 "kvbench/methods/gatesight/__init__.py", "kvbench/tasks/ruler.py", "kvbench/scorers/scbench.py",
                 "kvbench/engines/vllm_stubs/torchvision/transforms/v2/functional.py"):
        assert name in names, name


def test_wheel_build_prints_no_setuptools_warning(built_wheel: tuple[set[str], str]) -> None:
    _, log = built_wheel
    for marker in ("BuildBackendWarning", "SetuptoolsWarning", "SetuptoolsDeprecationWarning",
                   "absent from the `packages` configuration"):
        assert marker not in log, log[log.find(marker) - 300:log.find(marker) + 500]


def test_the_core_wheel_holds_no_trainer(built_wheel: tuple[set[str], str]) -> None:
    """The trainer is its own distribution (training/, kvbench-training): none of it ships in kvbench's wheel."""
    names, _ = built_wheel
    trainer = [n for n in names if n.startswith(("kvbench/training/", "kvbench_training/"))]
    assert not trainer, trainer
    assert "kvbench/tasks/calibration_corpus.py" in names  # the calibration corpus ships with kvbench (the benches')


def test_the_training_wheel_registers_train_tiny(tmp_path: Path) -> None:
    """training/ builds a kvbench-training wheel with the trainer and the ``train-tiny`` entry point of group
    ``kvbench.commands``, which is how ``kvbench train-tiny`` is mounted."""
    pytest.importorskip("setuptools", reason="the no-isolation build uses the environment's setuptools")
    src, out = tmp_path / "training", tmp_path / "out"
    shutil.copytree(ROOT / "training", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (wheel,) = out.glob("kvbench_training-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = zf.read(points).decode()
    assert {"kvbench_training/cli.py", "kvbench_training/loop.py"} <= names
    assert not [n for n in names if n.startswith("kvbench/")], names
    assert "[kvbench.commands]" in entry_points and "train-tiny = kvbench_training.cli:app" in entry_points
