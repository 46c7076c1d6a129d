"""kvbench_training (training/): tokenizer, config, training rows, determinism and exact resume."""

from __future__ import annotations

import dataclasses
import json
import random
from functools import lru_cache

import pytest
import torch

import kvbench_training as T
from kvbench.errors import KvbenchError

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


def _spans(mask: torch.Tensor) -> list[list[int]]:
    """Contiguous runs of 1s in ``mask`` as lists of positions."""
    spans: list[list[int]] = []
    for i in mask.nonzero().flatten().tolist():
        if spans and spans[-1][-1] == i - 1:
            spans[-1].append(i)
        else:
            spans.append([i])
    return spans


@pytest.mark.parametrize("length", [256, 1024])
def test_training_examples_length_and_mask(length):
    tok = tokenizer()
    seen = set()
    for i in range(40):
        rng = random.Random(f"t:{length}:{i}")
        ids, mask, task, refs = T.training_example(rng, length, tok)
        seen.add(task)
        assert ids.shape == mask.shape == (length,)
        pad = ids == tok.pad_token_id
        assert not (mask.bool() & pad).any()
        real = int((~pad).sum())
        assert (~pad[:real]).all() and pad[real:].all()  # right-padded
        spans = _spans(mask)
        if task == "repeat":  # the second half repeats the first; the mask is exactly the second half
            half = real // 2
            assert torch.equal(ids[:half], ids[half:real]) and spans == [list(range(half, real))]
        elif task in (*T.RECALL_DRAWS, "chains"):  # one supervised span per reference, spelling it
            assert len(spans) == len(refs) >= 1
            for span, ref in zip(spans, refs, strict=True):
                assert tok.decode(ids[span]).strip().rstrip(".") == ref
            context = tok.decode(ids[: spans[0][0]])
            for ref in refs:  # every answer is in the context before the questions
                assert all(part in context for part in ref.split())
        else:  # a RULER row: one contiguous span, the reference answer, ending with <|im_end|>
            assert task in T.KNOWN_TASKS and len(spans) == 1
            where = spans[0]
            assert ids[where[-1]].item() == tok.eos_token_id and where[-1] == real - 1
            answer = tok.decode(ids[where[:-1]])
            assert refs and all(ref in answer for ref in refs)
            if task.startswith("niah"):
                assert answer.strip() == ", ".join(refs) if len(refs) > 1 else answer == " " + refs[0]
    assert len(seen) >= 4


def test_recall_rows_ask_every_needle():
    """Hand check of one "recall" row: every needle's key is asked once, with its own value as the answer."""
    from kvbench.tasks.ruler_data import NEEDLE

    tok = tokenizer()
    ids, mask, refs = T.recall_row(random.Random(5), 400, tok)
    text = tok.decode(ids)
    context, _, questions = text.partition("\nThe special magic")
    asked = [line for line in ("The special magic" + questions).split("\n")]
    assert len(asked) == len(refs) == context.count("One of the special magic")
    for line, value in zip(asked, refs, strict=True):
        key = line.split(" for ", 1)[1].split(" mentioned", 1)[0]
        type_v = "uuids" if "-" in value else "numbers"
        assert NEEDLE.format(type_v=type_v, key=key, value=value) in context
        assert line.endswith(f" is {value}.")
    assert len(set(refs)) == len(refs)


def test_lookup_rows_answer_by_key_not_by_elimination():
    """Hand check of "lookup" rows: every question asks a key of the context, answered with that needle's
    value, and the supervised tokens are exactly the answers. Questions draw needles with replacement, so
    over a few rows some needle is asked twice and some never (no answering by elimination)."""
    from kvbench.tasks.ruler_data import NEEDLE

    tok = tokenizer()
    repeated = unasked = False
    for seed in range(6):
        ids, mask, refs = T.recall_row(random.Random(seed), 400, tok, draw="replace")
        assert len(ids) == len(mask) <= 400 and refs
        text = tok.decode(ids)
        context, _, questions = text.partition("\nThe special magic")
        asked = [line for line in ("The special magic" + questions).split("\n")]
        assert len(asked) == len(refs)
        keys = []
        for line, value in zip(asked, refs, strict=True):
            key = line.split(" for ", 1)[1].split(" mentioned", 1)[0]
            type_v = "uuids" if "-" in value else "numbers"
            assert NEEDLE.format(type_v=type_v, key=key, value=value) in context
            assert line.endswith(f" is {value}.")
            keys.append(key)
        supervised = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        assert supervised == "".join(f" {v}." for v in refs)
        repeated |= len(set(keys)) < len(keys)
        unasked |= context.count("One of the special magic") > len(set(keys))
    assert repeated and unasked


def test_chains_rows_follow_the_assignments():
    """Every answered chain is recomputed by following the ``VAR`` lines of the context."""
    tok = tokenizer()
    for seed in range(6):
        row = T.chains_row(random.Random(seed), 512, tok)
        assert row is not None
        ids, mask, refs = row
        text = tok.decode(ids)
        assigned: dict[str, str] = {}
        for line in text.split("\n"):
            if line.startswith("VAR "):
                name, _, rhs = line[4:].strip().partition(" = ")
                assigned[name] = assigned[rhs[4:]] if rhs.startswith("VAR ") else rhs
        for ref in refs:
            names = ref.split()
            assert len({assigned[n] for n in names}) == 1
            value = assigned[names[0]]
            assert sorted(names) == sorted(n for n, v in assigned.items() if v == value)
            assert f"the value {value}, they are: {ref}" in text


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


def test_lr_schedule_warmup_then_cosine_to_a_tenth():
    """Linear warm-up over ``warmup`` steps (default: a twentieth of the steps), then cosine from the peak to
    a tenth of it, checked against the formula written out by hand."""
    args = T.TrainArgs(steps=100, batch_size=1, lr=2e-3, seed=0, warmup=10)
    assert [T.lr_at(s, args) for s in (0, 4, 9)] == pytest.approx([2e-4, 1e-3, 2e-3])
    assert T.lr_at(10, args) == pytest.approx(2e-3)
    assert T.lr_at(55, args) == pytest.approx(2e-3 * (0.1 + 0.45))  # halfway through the cosine
    assert T.lr_at(100, args) == pytest.approx(2e-4)
    default = T.TrainArgs(steps=100, batch_size=1, lr=2e-3, seed=0)
    assert T.lr_at(4, default) == pytest.approx(2e-3) and T.lr_at(3, default) == pytest.approx(1.6e-3)


def test_train_rejects_bad_warmup(tmp_path):
    for bad in (-1, 5):
        with pytest.raises(KvbenchError, match="--warmup"):
            train_small(tmp_path / "w", warmup=bad)
    assert not (tmp_path / "w").exists()


def train_small(out, **kw):
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
    return train_with(out, **args)


def train_with(out, **kw):
    """``T.train`` with its ``TrainArgs`` and ``RunOptions`` fields given as one set of keywords."""
    run_fields = {f.name for f in dataclasses.fields(T.RunOptions)}
    options = T.RunOptions(**{k: v for k, v in kw.items() if k in run_fields})
    return T.train(out, T.TrainArgs(**{k: v for k, v in kw.items() if k not in run_fields}), options)


def test_train_resume_exact(tmp_path, one_thread):
    from safetensors.torch import load_file

    from kvbench.models import load_model

    stop = train_small(tmp_path / "a", stop_after=3)
    assert stop.name == "checkpoint-3" and (stop / "trainer_state.pt").exists()
    assert (stop / "model.safetensors").exists() and (stop / "tokenizer.json").exists()
    resumed = train_small(tmp_path / "a")
    straight = train_small(tmp_path / "b")
    wa, wb = load_file(resumed / "model.safetensors"), load_file(straight / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    lm = load_model(str(straight))
    assert lm.random_weights is False and lm.context_length == 256
    assert lm.model.config.tie_word_embeddings is False
    log = json.loads((straight / "training_log.json").read_text())
    assert [e["step"] for e in log] == [1, 2, 3, 4, 5] and all("tasks" in e for e in log)

    # the shipped copy: bf16 weights equal to the float32 ones rounded, same tokenizer, a model card
    note = "Measured with --eval-limit 3."
    shipped = T.export_builtin(straight, tmp_path / "ship", evaluation={"niah_single_1": 12.5}, note=note)
    ws = load_file(shipped / "model.safetensors")
    assert ws.keys() == wb.keys()
    for k in ws:
        assert ws[k].dtype == torch.bfloat16 and torch.equal(ws[k], wb[k].to(torch.bfloat16)), k
    card = (shipped / "MODEL_CARD.md").read_text()
    assert "| niah_single_1 | 12.5 |" in card and "not for" in card and "256 tokens" in card
    assert card.index("| niah_single_1 | 12.5 |") < card.index(note) < card.index("What it is for")
    lm2 = load_model(str(shipped))
    assert lm2.random_weights is False and lm2.context_length == 256
    assert lm2.model.dtype == torch.float32  # loaded as float32 on CPU
    assert lm2.tokenizer.get_vocab() == lm.tokenizer.get_vocab()
    assert lm2.model.config.max_position_embeddings == T.SHIPPED_MAX_POSITIONS


def test_a_finished_stage_is_reused_from_its_final_alone(tmp_path, one_thread):
    """A stage's final/ without its checkpoints (what a run carries to another machine) is returned as it is,
    not trained again; a final/ written with other arguments is an error naming the fix."""
    import shutil

    first = train_small(tmp_path / "s1", steps=2)
    second = train_small(tmp_path / "s2", steps=2, seed=2, init=first, tokenizer=None)
    for ckpt in (tmp_path / "s2").glob("checkpoint-*"):
        shutil.rmtree(ckpt)
    shutil.rmtree(tmp_path / "s1")  # its weights are not needed once the stage after it has finished
    weights = (second / "model.safetensors").read_bytes()
    assert train_small(tmp_path / "s2", steps=2, seed=2, init=first, tokenizer=None) == second
    assert (second / "model.safetensors").read_bytes() == weights and not list((tmp_path / "s2").glob("checkpoint-*"))
    with pytest.raises(KvbenchError, match="different training arguments.*remove that directory"):
        train_small(tmp_path / "s2", steps=3, seed=2, init=first, tokenizer=None)
    (second / "training_args.json").unlink()  # a final/ cut before its last file: not a finished run
    with pytest.raises(KvbenchError, match="no trained model"):
        train_small(tmp_path / "s2", steps=2, seed=2, init=first, tokenizer=None)


def test_calibration_corpus_deterministic(tmp_path):
    from kvbench.corpus import read_corpus

    a = T.write_calibration_corpus(tmp_path / "a", n_docs=2, n_chars=500)
    b = T.write_calibration_corpus(tmp_path / "b", n_docs=2, n_chars=500)
    docs_a, docs_b = read_corpus(a), read_corpus(b)
    assert [(d.corpus, d.text) for d in docs_a] == [(d.corpus, d.text) for d in docs_b]
    assert sorted({d.corpus for d in docs_a}) == sorted(T.CALIBRATION_KINDS) and len(docs_a) == 6
    assert all(len(d.text) >= 500 for d in docs_a)
    text = " ".join(d.text for d in docs_a)
    assert "Question" not in text and "mentioned in the provided text" not in text


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


def test_batch_loss_against_explicit_loop():
    """Weighted loss and per-row supervised loss, recomputed token by token with log-softmax."""

    class Fixed(torch.nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, input_ids, use_cache=False):
            return type("Out", (), {"logits": self.logits})

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g)
    ids = torch.tensor([[3, 4, 5, 6, 0], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 0, 0]])
    loss, row_ce = T.batch_loss(Fixed(logits), ids, mask, pad_id=0, lm_weight=0.5, autocast=False)
    num = den = 0.0
    rows = []
    for b in range(2):
        sup = []
        for t in range(1, 5):
            nll = -torch.log_softmax(logits[b, t - 1], -1)[ids[b, t]].item()
            w = 0.0 if ids[b, t] == 0 else (1.0 if mask[b, t] else 0.5)
            num, den = num + w * nll, den + w
            if mask[b, t]:
                sup.append(nll)
        rows.append(sum(sup) / len(sup))
    assert loss.item() == pytest.approx(num / den, rel=1e-5)
    assert row_ce.tolist() == pytest.approx(rows, rel=1e-5)
    assert T.task_losses(["a", "a"], torch.tensor([1.0, 3.0])) == {"a": 2.0}
    assert T.task_losses(["a", "b"], torch.tensor([1.0, float("nan")])) == {"a": 1.0}


def test_parse_mix():
    from kvbench.errors import KvbenchError

    assert T.parse_mix("niah_multikey_2=0.25,recall=0.75") == (("niah_multikey_2", 0.25), ("recall", 0.75))
    for bad in ("recall=0.5", "nope=1", "recall=1.2,repeat=-0.2", "recall"):
        with pytest.raises(KvbenchError, match="--mix"):
            T.parse_mix(bad)


def test_batch_follows_mix():
    """A one-task mix yields only that task; the default mix covers several (counted over many rows)."""
    tok = tokenizer()
    _, mask, tasks = T.make_batch(tok, seed=0, step=0, batch_size=6, length=256, mix=(("niah_single_1", 1.0),))
    assert tasks == ["niah_single_1"] * 6 and bool((mask.sum(1) > 0).all())
    rng = random.Random(0)
    counts = {}
    for _ in range(4000):
        t = T.choose_task(rng, (("recall", 0.25), ("repeat", 0.75)))
        counts[t] = counts.get(t, 0) + 1
    assert abs(counts["recall"] / 4000 - 0.25) < 0.03 and set(counts) == {"recall", "repeat"}


def test_second_stage_starts_from_init_and_carries_history(tmp_path, one_thread):
    """--init: stage 2 starts from stage 1's weights (its first step's loss equals stage 1's model's loss
    on that batch), and its final/ carries both stages' arguments and logs into the model card."""
    from safetensors.torch import load_file

    first = train_small(tmp_path / "s1", steps=3)
    mix = (("recall", 0.5), ("repeat", 0.5))
    second = train_small(tmp_path / "s2", steps=2, seed=2, mix=mix, init=first, tokenizer=None, lr=0.0)
    # lr 0 on both steps (warm-up starts at lr*(1/warm) = 0): weights unchanged from stage 1
    w1, w2 = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    args = json.loads((second / "training_args.json").read_text())
    assert args["init"] == str(first) and args["mix"] == [list(m) for m in mix]
    stages = T.training_stages(args)
    assert [s["steps"] for s in stages] == [3, 2] and [s["seed"] for s in stages] == [1, 2]
    log = json.loads((second / "training_log.json").read_text())
    assert [(e["stage"], e["step"]) for e in log] == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2)]
    card = (T.export_builtin(second, tmp_path / "ship") / "MODEL_CARD.md").read_text()
    assert "Stage 1 (from scratch, seed 1)" in card and "Stage 2 (from the previous stage's weights" in card
    assert "recall 50%, repeat 50%" in card and "5 steps in all" in card
    with pytest.raises(Exception, match="no trained model"):
        train_small(tmp_path / "s3", init=tmp_path / "missing", tokenizer=None)


def test_lookup_mix_falls_back_to_lookup():
    """A mix naming "lookup": a RULER row that cannot fit (vt at 256 tokens) becomes a lookup row (questions
    drawn with replacement), not an every-needle "recall" row; without "lookup" the fallback stays "recall"."""
    tok = tokenizer()
    mix = T.parse_mix("vt=0.5,lookup=0.5")
    _, mask, tasks = T.make_batch(tok, seed=0, step=0, batch_size=8, length=256, mix=mix)
    assert set(tasks) == {"lookup"} and bool((mask.sum(1) > 0).all())
    _, _, tasks = T.make_batch(tok, seed=0, step=0, batch_size=8, length=256, mix=(("vt", 1.0),))
    assert set(tasks) == {"recall"}


def test_echo_rows_repeat_the_needle_wording():
    """Hand check of "echo" rows: each question is its needle's own line up to the value, answered with that
    needle's value; over a few rows some needle is asked twice (drawn with replacement, like "lookup")."""
    tok = tokenizer()
    repeated = False
    for seed in range(6):
        ids, mask, refs = T.recall_row(random.Random(seed), 400, tok, draw="echo")
        lines = tok.decode(ids).split("\n")[1:]  # after the header line: needle/noise lines, then the questions
        context, asked = lines[: len(lines) - len(refs)], lines[len(lines) - len(refs) :]
        for line, value in zip(asked, refs, strict=True):
            assert line.startswith("One of the special magic") and line.endswith(f" is: {value}.")
            assert line in context  # question + answer spell the needle line exactly
        assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "".join(f" {v}." for v in refs)
        repeated |= len(set(asked)) < len(asked)
    assert repeated


def test_stage_compute_seconds_from_the_log():
    """Hand-worked: stage 1 has 8 rows of 128 tokens at 1,024 tok/s (1 s a step), stage 2 4 rows of 1,024 at
    2,048 tok/s (2 s a step); a log entry without ``stage`` belongs to stage 1 (a first stage's own log)."""
    args = {"batch_size": 4, "steps": 2, "previous": {"batch_size": 8, "steps": 3}}
    log = [{"len": 128, "tok_s": 1024}] * 2 + [{"stage": 1, "len": 128, "tok_s": 1024}]
    log += [{"stage": 2, "len": 1024, "tok_s": 2048}] * 2
    assert T.stage_compute_seconds(args, log) == [3.0, 4.0]
    sentence = T.compute_sentence(args, log)
    assert "0.0 hours (minutes per stage: 0, 0)" in sentence
    assert T.compute_sentence(args, log * 900).endswith("1.8 hours (minutes per stage: 45, 60).")


def test_the_card_describes_scbench_rows_only_when_a_stage_trained_on_them():
    from kvbench_training.card import _scbench_sentence

    ruler_only = [{"mix": [["niah_single_1", 1.0]]}, {}]  # {}: the default mix, RULER's tasks and dense rows
    assert _scbench_sentence(ruler_only) == ""
    with_scbench = [*ruler_only, {"mix": [["vt", 0.5], ["scbench_kv", 0.5]]}]
    assert '"scbench_*" rows are SCBench\'s offline-generated tasks' in _scbench_sentence(with_scbench)


@pytest.mark.parametrize("task", T.SCBENCH_TASKS)
def test_scbench_rows_are_the_evaluation_prompt_then_every_answered_question(task):
    """A generated SCBench row as training sees it: the context prompt exactly as evaluation renders it, then
    each of the row's five questions (as evaluation renders it) with its reference answer and ``<|im_end|>``,
    supervised; the supervised tokens spell the references (checked against the row's own context)."""
    from kvbench.prompt import encode, render
    from kvbench.tasks.scbench import build_context
    from kvbench.tasks.scbench_generate import generate_row

    tok = tokenizer()
    ex = T.training_example(random.Random(5), 1536, tok, mix=((task, 1.0),))
    assert ex.task == task and len(ex.references) == 5
    ids = ex.input_ids.tolist()
    mask = ex.loss_mask.tolist()
    # rebuild the row independently: same generator seed as training_example draws
    rng = random.Random(5)
    rng.random()  # _choose_task
    ex_seed = rng.randrange(T.TRAIN_SEED_BASE, 2**31)
    target = rng.randint(1536 // 2, 1536)
    name = task.removeprefix("scbench_")
    eos = tok.eos_token_id

    def need(row):
        ctx = build_context(name, 0, row, {}, source="generated")
        r = render(tok, ctx)
        answers = [encode(tok, T.scbench_answer(name, q.references)) + [eos] for q in ctx.questions]
        return len(r.context_ids) + sum(len(q) + len(a) for q, a in zip(r.question_ids, answers, strict=True))

    row = generate_row(name, 0, length=target, seed=ex_seed, measure=need)
    ctx = build_context(name, 0, row, {}, source="generated")
    r = render(tok, ctx)
    n = len(r.context_ids)
    assert ids[:n] == r.context_ids and not any(mask[:n])
    at = n
    for q_ids, spec in zip(r.question_ids, ctx.questions, strict=True):
        assert ids[at : at + len(q_ids)] == q_ids and not any(mask[at : at + len(q_ids)])
        at += len(q_ids)
        answer = encode(tok, T.scbench_answer(name, spec.references)) + [eos]
        assert ids[at : at + len(answer)] == answer and all(mask[at : at + len(answer)])
        at += len(answer)
    assert not any(mask[at:]) and at <= 1536
    assert ex.references == tuple(T.scbench_answer(name, q.references) for q in ctx.questions)


def test_trimming_trailing_padding_leaves_loss_and_gradients_unchanged(one_thread):
    from kvbench_training.loop import trim_padding

    tok = tokenizer()
    cfg = T.tiny_trained_config(len(tok), **SMALL)
    torch.manual_seed(0)
    from kvbench_training.model import build_model, set_special_ids

    set_special_ids(cfg, tok)
    model = build_model(cfg)
    ids, mask, _ = T.make_batch(tok, seed=5, step=0, batch_size=3, length=256)
    ids[:, 200:] = tok.pad_token_id  # at least 56 pad columns to cut
    mask[:, 200:] = 0
    short_ids, short_mask = trim_padding(ids, mask, tok.pad_token_id)
    assert short_ids.shape[1] <= 200 and (short_ids != tok.pad_token_id).any(0)[-1]
    grads = []
    for a, m in ((ids, mask), (short_ids, short_mask)):
        model.zero_grad()
        loss, row_ce = T.batch_loss(model, a, m, tok.pad_token_id, 0.02, False)
        loss.backward()
        grads.append((float(loss), row_ce, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-6)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-6, equal_nan=True)
    assert all(torch.allclose(g, h, atol=1e-6) for g, h in zip(grads[0][2], grads[1][2], strict=True))


def _train_tiny_up_to_training(monkeypatch, argv: list[str]):
    """``kvbench train-tiny ARGV`` run through its checks and stopped where it would train: ``(result, the
    TrainArgs handed to train(), or None when the checks refused first)``."""
    from typer.testing import CliRunner

    from kvbench_training.cli import app

    seen = {}

    def stop_at_training(out, args, options):
        seen["args"] = args
        raise SystemExit(0)  # before any training, export or evaluation

    monkeypatch.setattr(T, "train", stop_at_training)
    result = CliRunner().invoke(app, argv)
    return result, seen.get("args")


@pytest.mark.parametrize("flag, expected", [((), False), (("--autocast",), True)])
def test_train_tiny_autocast_flag_reaches_the_run_arguments(tmp_path, monkeypatch, flag, expected):
    """`--autocast` reaches the run's TrainArgs (which the training step reads and training_args.json records), off
    by default."""
    argv = ["--out", str(tmp_path / "run"), "--steps", "2", "--eval-limit", "0", *flag]
    result, args = _train_tiny_up_to_training(monkeypatch, argv)
    assert result.exit_code == 0, result.output
    assert args.autocast is expected


def test_a_finished_stage_needs_no_init_on_this_machine(tmp_path, monkeypatch):
    """train_tiny.sh hands a finished stage to train-tiny (so its export runs); its --init, the stage before, may be
    gone on a fresh machine: the missing --init is refused only when the stage has not finished."""
    out, gone = tmp_path / "stage2", tmp_path / "stage1" / "final"
    argv = ["--out", str(out), "--init", str(gone), "--steps", "2", "--eval-limit", "0"]
    refused, args = _train_tiny_up_to_training(monkeypatch, argv)
    assert refused.exit_code != 0 and "no trained model there" in str(refused.exception or refused.output)
    assert args is None
    (out / "final").mkdir(parents=True)
    (out / "final" / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    (out / "final" / "training_args.json").write_text("{}")
    result, args = _train_tiny_up_to_training(monkeypatch, argv)
    assert result.exit_code == 0 and args is not None


def test_autocast_is_a_run_option_not_part_of_the_run():
    """A stage trained with --autocast is reused (or resumed) without it and the other way round, as with the
    thread count: only rounding differs."""
    a = dataclasses.asdict(T.TrainArgs(steps=4, batch_size=1, lr=1e-3, seed=0, autocast=True))
    b = dataclasses.asdict(T.TrainArgs(steps=4, batch_size=1, lr=1e-3, seed=0, autocast=False))
    c = dataclasses.asdict(T.TrainArgs(steps=5, batch_size=1, lr=1e-3, seed=0, autocast=False))
    from kvbench_training.loop import _comparable_args

    assert _comparable_args(a) == _comparable_args(b) != _comparable_args(c)
