"""The manifest entry of a run (:func:`manifest_entry`): what ``manifest.json`` records of each run and model,
the model's shape for the report's memory view, the versions and the command line.
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict

import torch

import kvbench
from kvbench.models import LoadedModel
from kvbench.run.plan import RunConfig, planned_methods


def model_shape(model: torch.nn.Module) -> dict:
    """What the report's memory view needs: attention-layer count, KV heads, head dim, bytes per K/V element
    (the loaded dtype) and the weights' bytes."""
    text = model.config.get_text_config()
    params = list(model.parameters())
    return {
        "n_attn_layers": sum(1 for t in text.layer_types if t == "full_attention"),
        "n_kv_heads": int(text.num_key_value_heads),
        "head_dim": int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads),
        "dtype_bytes": params[0].element_size(),
        "weight_bytes": sum(p.numel() * p.element_size() for p in params),
    }


def manifest_entry(config: RunConfig, lm: LoadedModel) -> dict:
    import transformers

    cfg = asdict(config)
    cfg["out"] = str(config.out)
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": lm.name,
        "model_source": lm.source,
        "model_fingerprint": lm.fingerprint,
        "random_weights": lm.random_weights,
        "model_shape": model_shape(lm.model),
        "engine": config.engine,
        "decode_kernels": _decode_kernels(config),
        "seed": config.seed,
        "methods": planned_methods(config),  # with the no-prune reference when the run added it
        "config": cfg,
        "command": sys.argv,
        "versions": {
            "kvbench": kvbench.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }


def _decode_kernels(config: RunConfig) -> str:
    """What the run's decoding steps run on, as its engine says (``EngineBase.decode_path``; the torch engine:
    kvbench's decode kernels or PyTorch for float32 on CPU)."""
    from kvbench.engines import ENGINES

    return ENGINES.get(config.engine).decode_path()
