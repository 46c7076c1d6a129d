"""scripts/train_tiny.sh's stage skipping, run for real against a stand-in ``kvbench`` that records its calls.

A training run outlives a machine here, so a stage's final/ alone must carry it to the next one: the script
skips every stage before the latest finished one and trains from the stage after it."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_KVBENCH = """#!/usr/bin/env bash
# records each call; a train-tiny call "finishes" its stage by writing final/training_args.json
echo "$*" >> "$CALLS"
out=""
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
[ -n "$out" ] && mkdir -p "$out/final" && echo '{}' > "$out/final/training_args.json"
exit 0
"""


def _layout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "train_tiny.sh", repo / "scripts" / "train_tiny.sh")
    (repo / "scripts" / "calibrate_tiny.sh").write_text('echo "calibrate $*" >> "$CALLS"\n')
    (repo / ".venv" / "bin").mkdir(parents=True)
    fake = repo / ".venv" / "bin" / "kvbench"
    fake.write_text(FAKE_KVBENCH)
    fake.chmod(0o755)
    for name in ("tiny-trained", "tiny-trained-dense"):  # shipped weights as stages 1-6 / 1-7 exported them
        _ship(repo, name, 1024)
    return repo


def _ship(repo: Path, name: str, context_length: int) -> None:
    shipped = repo / "kvbench" / "builtin" / name
    shipped.mkdir(parents=True, exist_ok=True)
    (shipped / "kvbench_builtin.json").write_text(f'{{"name": "{name}", "context_length": {context_length}}}')


KV = ["stage10s", "stage10t", "stage10u"]  # SCBench kv key matching
MF = ["stage10n", "stage10o", "stage10p"]  # SCBench mf, then back to every task at 4,096 tokens
TEN = [*KV, *MF, "stage10q", "stage10r"]  # tiny-trained exports after 10r
TEN_DENSE = [*KV, "stage10v", *MF]  # the dense twin exports after 10p


def _run(repo: Path, arch: str, from_scratch: bool = True) -> list[str]:
    calls = repo / "calls.txt"
    calls.unlink(missing_ok=True)
    # the key-matching gate's probe stands in as "learned" (see test_a_stage_10_waits_for_the_probe)
    env = dict(os.environ, ARCH=arch, CALLS=str(calls), FROM_SCRATCH="1" if from_scratch else "0", PROBE="true")
    subprocess.run(["bash", "scripts/train_tiny.sh"], cwd=repo, env=env, check=True, capture_output=True)
    return calls.read_text().splitlines()


def _stages(calls: list[str]) -> list[str]:
    return [c.split("--out ")[1].split()[0].rsplit("/", 1)[1] for c in calls if c.startswith("train-tiny")]


@pytest.mark.parametrize(
    "arch,name,order",
    [
        (
            "qwen3_next",
            "tiny-trained",
            ["stage1", "stage2", "stage3", "stage4", "stage5", "stage6", "stage8", "stage9", *TEN],
        ),
        (
            "qwen3_5",
            "tiny-trained-dense",
            ["stage1", "stage2", "stage3", "stage3b", "stage4", "stage5", "stage6", "stage7", "stage8", "stage9"]
            + TEN_DENSE,
        ),
    ],
)
def test_stages_before_the_latest_finished_one_are_skipped(tmp_path, arch, name, order):
    repo = _layout(tmp_path)
    calls = _run(repo, arch)
    assert _stages(calls) == order and calls[-1] == f"calibrate {name}"
    # a fresh machine holding only stage 2's final/: stage 1 is not trained again, stage 2 is handed to
    # train-tiny (which returns a finished final/ as it is), the rest are trained
    shutil.rmtree(repo / "models")
    final = repo / "models" / name / "stage2" / "final"
    final.mkdir(parents=True)
    (final / "training_args.json").write_text("{}")
    assert _stages(_run(repo, arch)) == order[1:]
    # an incomplete final/ (no training_args.json, its last file) does not count as finished
    shutil.rmtree(repo / "models")
    final.mkdir(parents=True)
    (final / "model.safetensors").write_text("")
    assert _stages(_run(repo, arch)) == order


@pytest.mark.parametrize(
    "arch,name,last", [("qwen3_next", "tiny-trained", "stage6"), ("qwen3_5", "tiny-trained-dense", "stage7")]
)
def test_stages_8_and_9_start_from_the_shipped_weights_by_default(tmp_path, arch, name, last):
    """Without FROM_SCRATCH the script trains only the 4,096-token stages, stage 8 from the shipped model;
    with it, stage 8 starts from the last earlier stage's final/."""
    repo = _layout(tmp_path)
    calls = _run(repo, arch, from_scratch=False)
    ten = TEN_DENSE if arch == "qwen3_5" else TEN
    assert _stages(calls) == ["stage8", "stage9", *ten] and calls[-1] == f"calibrate {name}"
    assert f"--init kvbench/builtin/{name} " in calls[0]
    assert f"--init models/{name}/stage8/final " in calls[1] and f"--export kvbench/builtin/{name}" in calls[1]
    shutil.rmtree(repo / "models")
    calls = _run(repo, arch)
    stage8 = next(c for c in calls if "/stage8 " in c)
    assert f"--init models/{name}/{last}/final " in stage8


def test_weights_already_trained_to_4096_skip_stages_8_and_9(tmp_path):
    """The shipped model already exported after stage 9 (context_length 4,096): stages 8-9 are not trained
    again; the key-matching stages 10s-10u start from the shipped weights (10s: short keys; 10t, quoted pairs,
    from 10s; 10u, up to the full context's pairs at 1,536 then 4,096 tokens, from 10t), then the mf stages
    10n-10p and 10q-10r, the last of them exporting."""
    repo = _layout(tmp_path)
    _ship(repo, "tiny-trained", 4096)
    calls = _run(repo, "qwen3_next", from_scratch=False)
    assert _stages(calls) == TEN and "--init kvbench/builtin/tiny-trained " in calls[0]
    assert "--mix scbench_kv8_short=0.3,scbench_kv8_short_echo=0.2," in calls[0]
    assert (
        "--mix scbench_kv8_short_say=0.3,scbench_kv8_say=0.1,scbench_kv8_short_echo=0.1," in calls[1]
        and "--init models/tiny-trained/stage10s/final " in calls[1]
    )
    assert (
        "--mix scbench_kv16_say=0.1,scbench_kv32_say=0.15,scbench_kv64_say=0.1," in calls[2]
        and "--init models/tiny-trained/stage10t/final " in calls[2]
        and "--curriculum 1536@0,4096@0.8 " in calls[2]
    )
    # the mf stages follow 10u; only the last stage (10r: RULER's multi-key and fwe rows at 4,096) exports
    train = [c for c in calls if c.startswith("train-tiny")]
    assert "--init models/tiny-trained/stage10u/final " in train[3] and "--mix scbench_mf=0.6," in train[3]
    assert "--init models/tiny-trained/stage10q/final " in train[7] and "--curriculum 4096@0 " in train[7]
    assert [i for i, c in enumerate(train) if "--export" in c] == [7]
    assert "--export kvbench/builtin/tiny-trained" in train[7] and calls[-1] == "calibrate tiny-trained"


def test_the_dense_twin_exports_after_stage_10p(tmp_path):
    """tiny-trained-dense: 10v (4,096-token rows, from 10u's final/) follows 10u, the mf stages 10n-10p follow 10v,
    and only 10p exports, then calibration."""
    repo = _layout(tmp_path)
    _ship(repo, "tiny-trained-dense", 4096)
    calls = [c for c in _run(repo, "qwen3_5", from_scratch=False) if c.startswith("train-tiny")]
    assert _stages(calls) == TEN_DENSE
    assert "--init models/tiny-trained-dense/stage10u/final " in calls[3] and "--curriculum 4096@0 " in calls[3]
    assert "--init models/tiny-trained-dense/stage10v/final " in calls[4] and "--mix scbench_mf=0.6," in calls[4]
    assert [i for i, c in enumerate(calls) if "--export" in c] == [6]
    assert all("--eval-limit 0" in c for c in calls[:6])
    assert (
        "--init models/tiny-trained-dense/stage10o/final " in calls[6]
        and "--export kvbench/builtin/tiny-trained-dense" in calls[6]
    )


def test_a_stage_10_waits_for_the_probe(tmp_path):
    """Stage 10t starts only once the probe says stage 10s copies the asked pair's value (--echo, 6-character keys,
    8 pairs, top-1 0.5); a probe that says no stops the script (exit 3, naming what to do) with 10s trained and
    10t not."""
    repo = _layout(tmp_path)
    _ship(repo, "tiny-trained", 4096)
    probe = repo / "probe.sh"
    probe.write_text('echo "probe $*" >> "$CALLS"; exit 3\n')
    calls = repo / "calls.txt"
    env = dict(os.environ, ARCH="qwen3_next", CALLS=str(calls), FROM_SCRATCH="0", PROBE=f"bash {probe}")
    done = subprocess.run(["bash", "scripts/train_tiny.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 3 and "stage10s has not learned key matching at 8 pairs" in done.stderr
    lines = calls.read_text().splitlines()
    assert _stages(lines) == ["stage10s"]
    assert lines[-1].startswith(
        "probe models/tiny-trained/stage10s/final --pairs 8 --rows 4 --key-chars 6 --echo --require-top1 0.5 "
    )
    assert "models/tiny-trained/stage10s/probe-8echo.json" in lines[-1]


def test_a_finished_later_stage_skips_the_gates_before_it(tmp_path):
    """Only stage 10p's final/ on the machine (what the repository carries for the dense twin): no probe runs on
    the missing 10s-10u, no stage trains, and the export's calibration follows."""
    repo = _layout(tmp_path)
    _ship(repo, "tiny-trained-dense", 4096)
    final = repo / "models" / "tiny-trained-dense" / "stage10p" / "final"
    final.mkdir(parents=True)
    (final / "training_args.json").write_text("{}")
    probe = repo / "probe.sh"
    probe.write_text('echo "probe $*" >> "$CALLS"; exit 3\n')
    calls = repo / "calls.txt"
    env = dict(os.environ, ARCH="qwen3_5", CALLS=str(calls), FROM_SCRATCH="0", PROBE=f"bash {probe}")
    subprocess.run(["bash", "scripts/train_tiny.sh"], cwd=repo, env=env, check=True, capture_output=True)
    lines = calls.read_text().splitlines()
    assert not any(line.startswith("probe") for line in lines)
    assert _stages(lines) == ["stage10p"] and lines[-1] == "calibrate tiny-trained-dense"


@pytest.mark.parametrize(
    "arch,name,exported", [("qwen3_next", "tiny-trained", "stage10r"), ("qwen3_5", "tiny-trained-dense", "stage10p")]
)
def test_candidate_stages_follow_the_exported_one_and_stop_without_calibration(tmp_path, arch, name, exported):
    """CANDIDATES=1 (issue 63): with only the exported stage's final/ on the machine (what the repository carries),
    11p starts from it, 11a from 11p, 11b from 11a, 11c from 11b; no stage exports (the exported one is handed to
    train-tiny without --export, so it is returned as it is) and the shipped model is not calibrated again.
    UNTIL=stage11a stops after 11a."""
    repo = _layout(tmp_path)
    _ship(repo, name, 4096)
    final = repo / "models" / name / exported / "final"
    final.mkdir(parents=True)
    (final / "training_args.json").write_text("{}")
    calls = repo / "calls.txt"
    env = dict(os.environ, ARCH=arch, CALLS=str(calls), FROM_SCRATCH="0", PROBE="false", CANDIDATES="1")
    done = subprocess.run(["bash", "scripts/train_tiny.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines()
    later = ["stage11p", "stage11a", "stage11b", "stage11c"]
    assert _stages(lines) == [exported, *later] and not any("calibrate" in c for c in lines)
    train = [c for c in lines if c.startswith("train-tiny")]
    assert f"--init models/{name}/{exported}/final " in train[1] and "--curriculum 384@0,512@0.6 " in train[1]
    assert "--mix scbench_ps_short=0.45," in train[1]
    assert f"--init models/{name}/stage11p/final " in train[2] and "--mix scbench_ps_short=" in train[2]
    assert f"--init models/{name}/stage11a/final " in train[3] and "--curriculum 1536@0,4096@0.65 " in train[3]
    assert f"--init models/{name}/stage11b/final " in train[4] and "--curriculum 4096@0 " in train[4]
    assert not any("--export" in c for c in train)  # the shipped export is not redone either
    assert "--eval-limit 0" in train[0]
    multikey = "niah_multikey_2=0.18,niah_multikey_3=0.14" if arch == "qwen3_next" else "niah_multikey_2=0.12,"
    assert multikey in train[4]
    shutil.rmtree(repo / "models" / name / "stage11p")
    shutil.rmtree(repo / "models" / name / "stage11a")
    shutil.rmtree(repo / "models" / name / "stage11b")
    shutil.rmtree(repo / "models" / name / "stage11c")
    calls.unlink()
    env["UNTIL"] = "stage11a"
    subprocess.run(["bash", "scripts/train_tiny.sh"], cwd=repo, env=env, check=True, capture_output=True)
    assert _stages(calls.read_text().splitlines()) == [exported, "stage11p", "stage11a"]
