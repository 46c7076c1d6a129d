"""``kvbench train-tiny --arch qwen3_5``: the dense ``qwen3_5_text`` twin of tiny-trained (config, a few
training steps with exact resume, the engine runs it). No long training here."""

from __future__ import annotations

import json

import pytest
import torch

import kvbench_training as T
from kvbench.errors import KvbenchError
from tests.test_train_tiny import tokenizer, train_with

SMALL_DENSE = {
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "hidden_size": 64,
    "intermediate_size": 96,
}


def n_params(config) -> int:
    from kvbench.models import build_random

    return sum(p.numel() for p in build_random(config).parameters())


def test_dense_twin_config_matches_the_moe_layout():
    moe, dense = T.tiny_trained_config(1873), T.tiny_trained_config(1873, "qwen3_5")
    assert moe.model_type == "qwen3_next" and dense.model_type == "qwen3_5_text"
    same = ("layer_types", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
            "linear_conv_kernel_dim", "tie_word_embeddings", "max_position_embeddings", "vocab_size")  # fmt: skip
    assert {k: getattr(dense, k) for k in same} == {k: getattr(moe, k) for k in same}
    assert dense.layer_types.count("full_attention") >= 3
    assert dense.layer_types.count("linear_attention") == 3 * dense.layer_types.count("full_attention")
    assert dense.rope_parameters["partial_rotary_factor"] == moe.rope_parameters["partial_rotary_factor"] == 0.25
    # the dense MLP is as wide as the MoE's experts and shared expert together
    assert dense.intermediate_size == moe.num_experts * moe.moe_intermediate_size + moe.shared_expert_intermediate_size
    a, b = n_params(moe), n_params(dense)
    assert abs(a - b) / a < 0.01, (a, b)
    with pytest.raises(KvbenchError, match="--arch"):
        T.tiny_trained_config(1873, "llama")


def _train(out, **kw):
    args = dict(
        steps=4, batch_size=1, lr=1e-3, seed=1, curriculum=((0.0, 256),), progress=False, save_every=100,
        tokenizer=tokenizer(), model_over=SMALL_DENSE, arch="qwen3_5",
    )  # fmt: skip
    args.update(kw)
    return train_with(out, **args)


def test_dense_twin_trains_resumes_exactly_and_runs_in_the_engine(tmp_path, one_thread):
    from safetensors.torch import load_file

    from kvbench.engines.torch_engine import TorchEngine
    from kvbench.models import load_model

    stop = _train(tmp_path / "a", stop_after=2)
    assert stop.name == "checkpoint-2"
    resumed, straight = _train(tmp_path / "a"), _train(tmp_path / "b")
    wa, wb = load_file(resumed / "model.safetensors"), load_file(straight / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not any("experts" in k for k in wa) and any("mlp.up_proj" in k for k in wa)
    log = json.loads((straight / "training_log.json").read_text())
    assert [e["step"] for e in log] == [1, 2, 3, 4] and all(e["loss"] == e["loss"] for e in log)  # finite
    assert json.loads((straight / "kvbench_builtin.json").read_text())["name"] == "tiny-trained-dense"
    assert json.loads((straight / "training_args.json").read_text())["arch"] == "qwen3_5"

    lm = load_model(str(straight))
    assert lm.model.config.model_type == "qwen3_5_text" and lm.random_weights is False
    engine = TorchEngine(lm.model, lm.tokenizer)
    parent = engine.prefill(lm.tokenizer("The grass is green. The sky is blue.")["input_ids"], 2)
    try:
        assert parent.n_attn_layers == 1 and len(parent.signals().beta) == 3
    finally:
        parent.release()
    card = (T.export_builtin(straight, tmp_path / "ship") / "MODEL_CARD.md").read_text()
    assert card.startswith("# tiny-trained-dense:") and "Qwen3.5 (`qwen3_5_text`)" in card and "dense MLP" in card

    # a later stage keeps its architecture
    with pytest.raises(KvbenchError, match="--arch qwen3_5"):
        _train(tmp_path / "c", init=straight, tokenizer=None, arch="qwen3_next", model_over={})


def test_checkpoints_from_before_arch_resume_as_qwen3_next(tmp_path, one_thread):
    """A checkpoint written before --arch existed (its arguments have no ``arch``) resumes as qwen3_next."""
    from kvbench_training.loop import CHECKPOINT_FILES
    from tests.test_train_tiny import train_small as train_moe

    stop = train_moe(tmp_path / "a", stop_after=2, steps=3)
    state_path = stop / "trainer_state.pt"
    state = torch.load(state_path, weights_only=False)
    del state["args"]["arch"]
    torch.save(state, state_path)
    (stop / CHECKPOINT_FILES).unlink()  # nor had such a checkpoint the file listing (issue 67) that it now fails
    final = train_moe(tmp_path / "a", steps=3)
    assert json.loads((final / "training_args.json").read_text())["arch"] == "qwen3_next"
    assert json.loads((final / "kvbench_builtin.json").read_text())["name"] == "tiny-trained"
