"""Issue 67: a training run killed by SIGKILL (here in the middle of writing a checkpoint, after an earlier one was
whole) and resumed reaches the uninterrupted run's weights bit for bit (the same SHA-256) and log; the write killed
midway leaves no temporary directory once the run resumes; a cut checkpoint is refused in one line naming the
previous whole one. A 4-layer model and six steps of one row keep it to seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvbench.atomic import sha256_of
from kvbench.errors import KvbenchError
from tests.test_cli import kvbench
from tests.test_train_tiny import tokenizer, train_small

ROOT = Path(__file__).resolve().parents[1]
STEPS, EVERY = 4, 2

# The run of train_small in a process of its own (the test's tokenizer saved and loaded: training it again costs
# seconds), SIGKILLed when checkpoint KILL_AT has its trainer state written but neither its file listing nor its
# rename into place: the state of a kill during a checkpoint write.
KILLED_RUN = """
import os, signal, sys
import torch
from transformers import AutoTokenizer
torch.set_num_threads(1)
from tests.test_train_tiny import train_small

out, kill_at, steps, every, tok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
real_save = torch.save

def save(obj, f, *args, **kwargs):
    real_save(obj, f, *args, **kwargs)
    if isinstance(obj, dict) and obj.get("step") == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

torch.save = save
train_small(out, steps=steps, save_every=every, tokenizer=AutoTokenizer.from_pretrained(tok))
"""


def _log(final: Path) -> list[tuple]:
    """Every logged step without its speed (tok/s is the one field that depends on the machine's load)."""
    return [(e["step"], e["loss"], e["lr"], e["len"], e["gnorm"], e["tasks"])
            for e in json.loads((final / "training_log.json").read_text())]  # fmt: skip


def test_a_run_killed_mid_checkpoint_resumes_to_the_uninterrupted_weights(tmp_path, one_thread):
    out = tmp_path / "killed"
    tokenizer().save_pretrained(tmp_path / "tokenizer")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    args = [str(out), str(STEPS), str(STEPS), str(EVERY), str(tmp_path / "tokenizer")]
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    (tmp,) = out.glob(f".checkpoint-{STEPS}.*.tmp")  # what the kill left: a write that never made it into place
    assert (tmp / "trainer_state.pt").is_file()

    resumed = train_small(out, steps=STEPS, save_every=EVERY)
    assert not list(out.glob(".checkpoint-*"))  # the killed write's folder is gone
    straight = train_small(tmp_path / "straight", steps=STEPS, save_every=EVERY)
    assert sha256_of(resumed / "model.safetensors") == sha256_of(straight / "model.safetensors")
    assert _log(resumed) == _log(straight) and len(_log(straight)) == STEPS
    last = out / f"checkpoint-{STEPS}"
    state = torch.load(last / "trainer_state.pt", weights_only=False)
    assert state["threads"] == 1 and state["numpy_rng"][0] == "MT19937"  # restored on resume with the rest
    listing = json.loads((last / "checkpoint_files.json").read_text())
    assert set(listing) == {p.name for p in last.iterdir()} - {"checkpoint_files.json"}
    weights = last / "model.safetensors"
    assert listing["model.safetensors"] == [weights.stat().st_size, sha256_of(weights)]


def test_a_cut_checkpoint_is_refused_naming_the_previous_whole_one(tmp_path, one_thread, capsys):
    out = tmp_path / "run"
    train_small(out, steps=STEPS + 2, save_every=EVERY, stop_after=4)  # checkpoints 2 and 4, no final/
    cut = out / "checkpoint-4"
    state = cut / "trainer_state.pt"
    full = state.stat().st_size
    os.truncate(state, full // 2)
    message = (f"checkpoint {cut} is damaged (trainer_state.pt has {full // 2} bytes, not the {full} written); the "
               f"previous whole checkpoint is {out / 'checkpoint-2'}: remove {cut} to resume from it")  # fmt: skip
    with pytest.raises(KvbenchError) as err:
        train_small(out, steps=STEPS + 2, save_every=EVERY)
    assert str(err.value) == message
    # the command line: one line, exit 2, before any model is built (the checkpoint is checked first)
    args = ["train-tiny", "--out", str(out), "--steps", str(STEPS + 2), "--save-every", str(EVERY), "--eval-limit", "0"]
    capsys.readouterr()
    assert kvbench(*args) == 2
    err_text = capsys.readouterr().err
    assert "Traceback" not in err_text and err_text.strip().splitlines() == [f"error: {err.value}"]
    # a checkpoint from before the listing existed: its trainer state is read to check it
    (cut / "checkpoint_files.json").unlink()
    with pytest.raises(KvbenchError, match=f"checkpoint {cut} is damaged .*previous whole checkpoint is "
                                           f"{out / 'checkpoint-2'}: remove {cut} to resume from it"):  # fmt: skip
        train_small(out, steps=STEPS + 2, save_every=EVERY)
    # removed as told, the run resumes from checkpoint-2 and finishes
    import shutil

    shutil.rmtree(cut)
    assert train_small(out, steps=STEPS + 2, save_every=EVERY) == out / "final"
    # with no whole checkpoint left, the fix is --no-resume
    for ckpt in out.glob("checkpoint-*"):
        os.truncate(ckpt / "model.safetensors", 10)
    shutil.rmtree(out / "final")
    with pytest.raises(KvbenchError, match="no earlier checkpoint is whole: remove .*, or start over with --no-resume"):
        train_small(out, steps=STEPS + 2, save_every=EVERY)
