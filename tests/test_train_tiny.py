"""kvbench.train_tiny: tokenizer, config, training rows, determinism and exact resume."""

from __future__ import annotations

import random
from functools import lru_cache

import pytest
import torch

from kvbench import train_tiny as T

# A 4-layer model (3 GDN + 1 attention) keeps the training tests to a few seconds.
SMALL = {
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
}


@lru_cache(maxsize=1)
def tokenizer():
    return T.train_tokenizer(vocab_size=1024)


def test_tokenizer_digits_and_round_trip():
    tok = tokenizer()
    text = "One of the special magic numbers for able-apple is: 1234567.\nVAR ABCDE = 98765"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    pieces = tok.convert_ids_to_tokens(tok(" 1234567", add_special_tokens=False)["input_ids"])
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("1234567")
    assert all(len(p.strip("Ġ")) <= 1 for p in pieces if any(c.isdigit() for c in p))
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(tok(special, add_special_tokens=False)["input_ids"]) == 1
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_deterministic():
    assert T.train_tokenizer(vocab_size=1024).get_vocab() == tokenizer().get_vocab()


def test_config_layout():
    cfg = T.tiny_trained_config(2048)
    assert cfg.model_type == "qwen3_next"
    assert cfg.layer_types.count("full_attention") >= 3
    assert cfg.layer_types.count("linear_attention") == 3 * cfg.layer_types.count("full_attention")
    assert cfg.num_experts == 4 and cfg.num_experts_per_tok == 2
    assert cfg.linear_key_head_dim == cfg.linear_value_head_dim == 64
    assert cfg.tie_word_embeddings is False
    assert cfg.max_position_embeddings >= 4096
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25


@pytest.mark.parametrize("length", [256, 1024])
def test_training_examples_length_and_mask(length):
    tok = tokenizer()
    seen = set()
    for i in range(12):
        rng = random.Random(f"t:{length}:{i}")
        ids, mask, task, refs = T.training_example(rng, length, tok)
        seen.add(task)
        assert ids.shape == mask.shape == (length,)
        pad = ids == tok.pad_token_id
        assert not (mask.bool() & pad).any()
        if task == "text":
            assert mask[~pad].all()
            continue
        # the mask is one contiguous span ending with <|im_end|>: the reference answer
        where = mask.nonzero().flatten().tolist()
        assert where == list(range(where[0], where[-1] + 1))
        assert ids[where[-1]].item() == tok.eos_token_id
        assert (ids[where[-1] + 1 :] == tok.pad_token_id).all()
        answer = tok.decode(ids[where[:-1]])
        assert refs and all(ref in answer for ref in refs)
        if task.startswith("niah"):
            assert answer.strip() == ", ".join(refs) if len(refs) > 1 else answer == " " + refs[0]
    assert len(seen) >= 2


def test_batch_deterministic():
    tok = tokenizer()
    a = T.make_batch(tok, seed=3, step=7, batch_size=3, length=256)
    b = T.make_batch(tok, seed=3, step=7, batch_size=3, length=256)
    c = T.make_batch(tok, seed=3, step=8, batch_size=3, length=256)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]
    assert not torch.equal(a[0], c[0])


def test_loss_weights():
    ids = torch.tensor([[5, 6, 7, 8, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 0, 0]])
    w = T.loss_weights(ids, mask, pad_id=0, lm_weight=0.1)
    assert torch.allclose(w, torch.tensor([[0.1, 0.1, 1.0, 1.0, 0.0, 0.0]]))


def test_curriculum():
    cur = ((0.0, 256), (0.5, 512))
    assert [T.curriculum_length(cur, s, 10) for s in (0, 4, 5, 9)] == [256, 256, 512, 512]


def _train(out, **kw):
    args = dict(
        steps=5,
        batch_size=1,
        lr=1e-3,
        seed=1,
        curriculum=((0.0, 256),),
        progress=False,
        save_every=100,
        autocast=False,
        tokenizer=tokenizer(),
        model_over=SMALL,
    )
    args.update(kw)
    return T.train(out, **args)


def test_train_resume_exact(tmp_path, one_thread):
    from safetensors.torch import load_file

    from kvbench.models import load_model

    stop = _train(tmp_path / "a", stop_after=3)
    assert stop.name == "checkpoint-3" and (stop / "trainer_state.pt").exists()
    assert (stop / "model.safetensors").exists() and (stop / "tokenizer.json").exists()
    resumed = _train(tmp_path / "a")
    straight = _train(tmp_path / "b")
    wa, wb = load_file(resumed / "model.safetensors"), load_file(straight / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    lm = load_model(str(straight))
    assert lm.random_weights is False
    assert (straight / "MODEL_CARD.md").exists()
    assert lm.model.config.tie_word_embeddings is False


def test_training_seeds_disjoint_from_evaluation(monkeypatch):
    from kvbench.tasks.ruler import RulerBench

    seeds = []
    original = RulerBench.contexts

    def spy(self, task, **kw):
        seeds.append(kw["seed"])
        return original(self, task, **kw)

    monkeypatch.setattr(RulerBench, "contexts", spy)
    T.make_batch(tokenizer(), seed=0, step=0, batch_size=4, length=256)
    assert seeds and min(seeds) >= T.TRAIN_SEED_BASE > T.EVAL_SEED


def test_parse_curriculum():
    from kvbench.errors import KvbenchError

    assert T.parse_curriculum("256@0,512@0.3,1024@0.6") == ((0.0, 256), (0.3, 512), (0.6, 1024))
    with pytest.raises(KvbenchError):
        T.parse_curriculum("256@0.1")
