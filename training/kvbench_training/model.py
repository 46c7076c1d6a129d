"""The tiny trained model's architecture: its config, its names, and loading it in float32 for training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvbench.errors import KvbenchError

MODEL_NAME = "tiny-trained"
#: ``--arch`` -> the model name written into a trained model's ``kvbench_builtin.json``
ARCHS = {"qwen3_next": MODEL_NAME, "qwen3_5": "tiny-trained-dense"}
#: dense MLP width of the ``qwen3_5`` twin: the MoE's 4 experts x 128 + the shared expert's 128, so both
#: architectures hold about the same parameters (4.58M against 4.59M at the shipped 1,873-token vocabulary)
DENSE_INTERMEDIATE = 4 * 128 + 128
#: Position limit written into the shipped config: RoPE is defined at any position, and a large limit lets
#: the cost benchmarks (``kvbench cost``, ``benchmarks/protocol_cost.py``) time 16K-64K contexts on the
#: default model; accuracy beyond the trained context length is not claimed (the model card says so).
SHIPPED_MAX_POSITIONS = 131072


def check_arch(arch: str) -> None:
    """Raise a KvbenchError naming the valid architectures unless ``arch`` is a key of :data:`ARCHS`."""
    if arch not in ARCHS:
        raise KvbenchError(f"--arch {arch!r}: valid architectures are {', '.join(ARCHS)}")


def tiny_trained_config(vocab_size: int, arch: str = "qwen3_next", **over: Any):
    """``qwen3_next`` (the shipped ``tiny-trained``): Qwen3-Next, 12 layers (3 GDN : 1 gated attention -> 3
    attention layers), hidden 128, MoE MLP (4 experts, top-2, plus a shared expert), linear key/value head dims
    64, untied, partial RoPE 0.25, 8,192 positions. About 3M parameters at vocab 2,048. ``qwen3_5``: its dense
    twin, a ``qwen3_5_text`` model with the same layer pattern, attention, GDN and RoPE and a dense MLP of
    :data:`DENSE_INTERMEDIATE` (about the same parameter count). ``over``: config fields to override."""
    from kvbench.models import tiny_qwen3_5_config, tiny_qwen3_next_config

    check_arch(arch)
    kw: dict[str, Any] = dict(
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_value_heads=2,
        max_position_embeddings=8192,
        initializer_range=0.02,
    )
    if arch == "qwen3_5":
        kw.update(intermediate_size=DENSE_INTERMEDIATE)
        kw.update(over)
        return tiny_qwen3_5_config(vocab_size, **kw)
    kw.update(moe_intermediate_size=128, shared_expert_intermediate_size=128)
    kw.update(over)
    return tiny_qwen3_next_config(vocab_size, moe=True, **kw)


def set_special_ids(config, tokenizer) -> None:
    """Copy the tokenizer's pad and eos ids into ``config`` (no bos token)."""
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = None


def arch_of(config) -> str:
    """The :data:`ARCHS` key of a model config (``qwen3_5_text`` -> ``qwen3_5``)."""
    return "qwen3_5" if config.model_type.startswith("qwen3_5") else config.model_type


def build_model(config) -> torch.nn.Module:
    """A freshly initialised float32 causal LM of ``config`` (initialised from torch's global RNG)."""
    from transformers import AutoModelForCausalLM

    from kvbench.engines.attention import register_attention

    return AutoModelForCausalLM.from_config(config, attn_implementation=register_attention(), dtype=torch.float32)


def load_trained(path: str | Path) -> torch.nn.Module:
    """The causal LM saved in directory ``path`` (a checkpoint or a ``final/``), loaded in float32."""
    from transformers import AutoModelForCausalLM

    from kvbench.engines.attention import register_attention

    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=register_attention(), dtype=torch.float32)
