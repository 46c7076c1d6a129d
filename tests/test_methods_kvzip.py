"""KVzip against attention weights recorded from an explicit reconstruction forward (stock eager attention)."""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM

from kvbench.engines.torch_engine import TorchEngine
from kvbench.methods import get_method
from kvbench.methods.kvzip import FIRST_PROMPT, NEXT_PROMPT, chunk_attention_max
from kvbench.models import byte_tokenizer
from tests.conftest import tiny_model


def test_chunk_attention_max_against_explicit_softmax():
    g = torch.Generator().manual_seed(0)
    H, H_kv, n, T, D = 4, 2, 7, 3, 5
    q, kc, kp = (
        torch.randn(H, T, D, generator=g),
        torch.randn(H_kv, n, D, generator=g),
        torch.randn(H_kv, T, D, generator=g),
    )
    got = chunk_attention_max(q, kc, kp, 0.3, block_elems=H * (n + T))  # one query row per block
    expected = torch.zeros(H_kv, n)
    for h in range(H):
        kvh = h // 2
        for t in range(T):
            keys = torch.cat([kc[kvh], kp[kvh, : t + 1]])
            w = torch.softmax(keys @ q[h, t] * 0.3, 0)
            expected[kvh] = torch.maximum(expected[kvh], w[:n])
    torch.testing.assert_close(got, expected)


def test_probes_follow_the_reference_prompts():
    tok = byte_tokenizer()
    engine = TorchEngine(tiny_model("qwen3_next"), tok)
    ids = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    parent = engine.prefill(ids, prot=10)
    method = get_method("kvzip")
    method.chunk_size = 20
    probes = method.probes(parent)
    assert [(s, e) for s, e, _ in probes] == [(10, 30), (30, 50), (50, 60)]
    tail = tok("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert probes[0][2] == tok(FIRST_PROMPT, add_special_tokens=False)["input_ids"] + tail + ids[10:30]
    assert probes[1][2] == tok(NEXT_PROMPT, add_special_tokens=False)["input_ids"] + ids[22:30] + tail + ids[30:50]


def test_kvzip_scores_equal_eager_attention_of_the_reconstruction_forward():
    model = tiny_model("qwen3_next")
    tok = byte_tokenizer()
    engine = TorchEngine(model, tok)
    ids = torch.randint(0, 256, (90,), generator=torch.Generator().manual_seed(2)).tolist()
    parent = engine.prefill(ids, prot=6)
    method = get_method("kvzip")
    method.chunk_size = 40
    scores = method.score(parent)

    eager = AutoModelForCausalLM.from_config(copy.deepcopy(model.config), attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    eager.eval()
    with torch.no_grad():
        ctx_cache = eager(input_ids=torch.tensor([ids]), use_cache=True).cache
        attn_ids = [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]
        expected = [torch.zeros(parent.n_kv_heads, parent.n) for _ in attn_ids]
        for start, end, probe in method.probes(parent):
            out = eager(
                input_ids=torch.tensor([probe]),
                cache=copy.deepcopy(ctx_cache),
                use_cache=True,
                output_attentions=True,
                position_ids=torch.arange(90, 90 + len(probe))[None],
            )
            for f in range(len(attn_ids)):
                weights = out.attentions[f][0]  # [H, T, n + T]; one entry per attention layer
                per_kv = weights[:, :, :90].amax(1).view(parent.n_kv_heads, -1, 90).amax(1)
                expected[f][:, start:end] = per_kv[:, start:end]
    for f in range(len(attn_ids)):
        torch.testing.assert_close(scores[f][:, 6:], expected[f][:, 6:], atol=2e-5, rtol=1e-4)
        assert bool((scores[f][:, :6] == 0).all())
