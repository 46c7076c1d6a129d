"""Shape twins: ``--model shape:<hub id>[@<layers>]`` builds, in code, a random-weight checkpoint with the published
config's widths, heads, head dimensions, rotary fraction and expert layout, and one or two 3 GDN : 1 attention
layer cycles (``@4``, the default, or ``@8``; ``kvbench run --shape-layers 8``).

The configs of ``Qwen/Qwen3.5-27B`` (its text model) and ``Qwen/Qwen3-Next-80B-A3B-Instruct`` ship in
``published/`` with where each value was read; any other hub id's config is read from the hub (online only).

What a twin does not keep, and why (recorded in its ``kvbench_builtin.json`` and its model card line):

* the vocabulary: kvbench's byte tokenizer (384 ids) replaces the model's (151,936 / 248,320 ids), which is not
  available offline; at 248,320 x 5,120 the embedding and head alone would take 10 GB in float32.
* the expert count, only where the float32 expert weights of the twin's layers would pass
  :data:`EXPERT_BUDGET_BYTES` (a 24 GiB machine shared with other work): halved until they fit, never below the
  routed count. Qwen3-Next-80B-A3B's 512 experts of 3 x 2,048 x 512 weights are 6.4 GB per layer in float32, so its
  4-layer twin keeps 64 and its 8-layer twin 32; routing (10 of them plus the shared expert) is unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.errors import ModelError

SHAPE_PREFIX = "shape:"
PUBLISHED_DIR = Path(__file__).resolve().parent / "published"
LAYER_CHOICES = (4, 8)  # one or two cycles of 3 GDN : 1 attention
DEFAULT_LAYERS = 4
EXPERT_BUDGET_BYTES = 4 * 2**30  # float32 expert weights of all the twin's layers together
TWIN_VERSION = "v1"


def is_shape(name: str | None) -> bool:
    return bool(name) and name.startswith(SHAPE_PREFIX)


def parse(name: str) -> tuple[str, int]:
    """``shape:<hub id>[@<layers>]`` -> (hub id, layers); a one-line error naming the fix otherwise."""
    spec = name[len(SHAPE_PREFIX) :]
    hub_id, _, layers = spec.partition("@")
    if not hub_id or "/" not in hub_id:
        raise ModelError(f"--model {name}: give a hub id after shape:, e.g. shape:Qwen/Qwen3.5-27B")
    try:
        n = int(layers) if layers else DEFAULT_LAYERS
    except ValueError:
        n = -1
    if n not in LAYER_CHOICES:
        raise ModelError(f"--model {name}: a shape twin has 4 or 8 layers (one or two 3:1 cycles): use @4 or @8")
    return hub_id, n


def with_layers(models: str | None, layers: int | None) -> str | None:
    """``--model`` with ``--shape-layers`` applied to each ``shape:`` entry that names no layer count itself."""
    if layers is None or not models:
        return models
    if layers not in LAYER_CHOICES:
        raise ModelError(f"--shape-layers {layers}: a shape twin has 4 or 8 layers (one or two 3:1 cycles)")
    out = []
    for m in models.split(","):
        m = m.strip()
        out.append(f"{m}@{layers}" if is_shape(m) and "@" not in m else m)
    return ",".join(out)


def published_file(hub_id: str) -> Path:
    return PUBLISHED_DIR / (hub_id.replace("/", "--") + ".json")


def published_config(hub_id: str) -> dict:
    """The text model's published config as a dict: shipped with kvbench, else read from the hub (online)."""
    shipped = published_file(hub_id)
    if shipped.is_file():
        return dict(json.loads(shipped.read_text())["config"])
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(hub_id)
    except (OSError, ValueError) as exc:
        known = ", ".join(sorted(p.stem.replace("--", "/") for p in PUBLISHED_DIR.glob("*.json")))
        raise ModelError(
            f"--model shape:{hub_id}: its config is not shipped with kvbench ({known}) and the hub cannot be read "
            f"({type(exc).__name__}); go online or use one of those"
        ) from None
    return config.get_text_config().to_dict()


def twin_config(
    published: dict, layers: int, vocab_size: int, pad_id: int, eos_id: int, supported: tuple[str, ...]
):
    """The twin's transformers config and what was cut: ``(config, cuts)``; ``supported``: the model types
    kvbench loads (:data:`kvbench.models.SUPPORTED_MODEL_TYPES`)."""
    from transformers import AutoConfig

    kw = {k: v for k, v in published.items() if k not in ("architectures", "transformers_version", "_name_or_path")}
    model_type = kw.pop("model_type", None)
    if model_type == "qwen3_5":
        model_type = "qwen3_5_text"
    if model_type not in supported:
        raise ModelError(f"a shape twin needs a hybrid of {', '.join(supported)}; got {model_type!r}")
    cuts = {"vocab_size": [kw.get("vocab_size"), vocab_size]}
    cuts["num_hidden_layers"] = [kw.get("num_hidden_layers"), layers]
    kw.update(
        vocab_size=vocab_size,
        num_hidden_layers=layers,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
        pad_token_id=pad_id,
        bos_token_id=None,
        eos_token_id=eos_id,
        tie_word_embeddings=False,
    )
    kw.pop("full_attention_interval", None)
    experts = int(kw.get("num_experts") or 0)
    if experts:
        per_expert = 3 * int(kw["hidden_size"]) * int(kw["moe_intermediate_size"]) * 4  # float32 bytes
        keep, routed = experts, int(kw["num_experts_per_tok"])
        while keep * per_expert * layers > EXPERT_BUDGET_BYTES and keep // 2 >= routed:
            keep //= 2
        if keep != experts:
            cuts["num_experts"] = [experts, keep]
            kw["num_experts"] = keep
    return AutoConfig.for_model(model_type, **kw), cuts
