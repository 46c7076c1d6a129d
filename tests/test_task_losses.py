"""scripts/task_losses.py: per-task mean supervised loss over windows of a stage's log, checked by hand on a
made-up log, from a finished final/ (only its last stage) and from the latest checkpoint of a running stage."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("task_losses", ROOT / "scripts" / "task_losses.py")
task_losses = importlib.util.module_from_spec(spec)
spec.loader.exec_module(task_losses)

LOG = [
    {"step": 1, "tasks": {"a": 1.0, "b": 4.0}},
    {"step": 2, "tasks": {"a": 3.0}},
    {"step": 3, "tasks": {"b": 2.0}},
]


def test_windows_average_each_task_over_the_rows_drawn():
    tasks, rows = task_losses.windows(LOG, 2)
    assert tasks == ["a", "b"]
    assert rows == [("1-2", {"a": (2.0, 2), "b": (4.0, 1)}), ("3-3", {"b": (2.0, 1)})]


def test_a_finished_stage_shows_its_own_steps_and_a_running_one_its_latest_checkpoint(tmp_path, capsys):
    (tmp_path / "final").mkdir()
    earlier = [dict(e, stage=1, tasks={"old": 9.0}) for e in LOG]
    (tmp_path / "final" / "training_log.json").write_text(json.dumps(earlier + [dict(e, stage=2) for e in LOG]))
    assert task_losses.stage_log(tmp_path) == [dict(e, stage=2) for e in LOG]
    task_losses.main([str(tmp_path), "--window", "3"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| steps | a | b |" and out[2] == "| 1-3 | 2.000 (2) | 3.000 (2) |"
    running = tmp_path / "running"
    for step, log in ((1, LOG[:1]), (2, LOG[:2])):
        (running / f"checkpoint-{step}").mkdir(parents=True)
        torch.save({"log": log}, running / f"checkpoint-{step}" / "trainer_state.pt")
    assert task_losses.stage_log(running) == LOG[:2]
    with pytest.raises(SystemExit, match="no final/training_log.json and no checkpoint"):
        task_losses.stage_log(tmp_path / "nothing")
