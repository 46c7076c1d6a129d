"""The GDN signal capture with the fast kernels a GPU install has (flash-linear-attention, causal-conv1d).

transformers 5.24 binds those packages' functions inside its module-level GDN functions when the modeling module is
imported, if they import. The test installs stand-ins with the real packages' import paths and call signatures
(``fla.ops.gated_delta_rule.chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, …)``,
``causal_conv1d.causal_conv1d_fn(x, weight, bias=None, …, activation=None)``) that count their calls and delegate
to transformers' torch reference, imports transformers afresh in a child process, and checks that β, g, ‖v‖, the
attention gates and the keys captured during a prefill are bit for bit those of the torch path, with the stand-ins
really called. A kernel bound on the layer when it is built is captured through the bound attribute; a capture
that sees no kernel call raises.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest
import torch

from kvbench.engines.hf_adapters import HybridAdapter
from kvbench.errors import ModelError
from kvbench.models import build_random, tiny_qwen3_5_config, tiny_qwen3_next_config

CHILD = r"""
import sys, types, torch
mode, out = sys.argv[1], sys.argv[2]
calls = {"chunk": 0, "recurrent": 0, "conv": 0, "conv_update": 0}
REF = {}  # the torch reference functions, set once transformers is imported

def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None):
    assert scale is None and cu_seqlens is None
    calls["chunk"] += 1
    return REF["chunk"](q, k, v, g=g, beta=beta, initial_state=initial_state,
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                                     allow_neg_eigval=False, state_v_first=False, cu_seqlens=None):
    calls["recurrent"] += 1
    return REF["recurrent"](q, k, v, g=g, beta=beta, initial_state=initial_state,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    calls["conv"] += 1
    return REF["conv"](x, weight, bias, activation=activation)

def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    calls["conv_update"] += 1
    return REF["conv_update"](x, conv_state, weight, bias, activation)

if mode == "standin":
    for name in ("fla", "fla.ops", "fla.ops.gated_delta_rule", "causal_conv1d"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["fla"].ops = sys.modules["fla.ops"]
    sys.modules["fla.ops"].gated_delta_rule = gdr = sys.modules["fla.ops.gated_delta_rule"]
    gdr.chunk_gated_delta_rule = chunk_gated_delta_rule
    gdr.fused_recurrent_gated_delta_rule = fused_recurrent_gated_delta_rule
    sys.modules["causal_conv1d"].causal_conv1d_fn = causal_conv1d_fn
    sys.modules["causal_conv1d"].causal_conv1d_update = causal_conv1d_update

from kvbench.engines.torch_engine import TorchEngine
from kvbench.models import build_random, byte_tokenizer, tiny_qwen3_5_config, tiny_qwen3_next_config

torch.set_num_threads(1)
result = {}
for family, config in (("qwen3_next", tiny_qwen3_next_config(moe=True)), ("qwen3_5", tiny_qwen3_5_config())):
    model = build_random(config, seed=3)
    mod = sys.modules[type(model).__module__]
    REF.update(chunk=mod.torch_chunk_gated_delta_rule.__wrapped__,
               recurrent=mod.torch_recurrent_gated_delta_rule.__wrapped__,
               conv=mod.causal_conv1d_fn.__wrapped__, conv_update=mod.causal_conv1d_update.__wrapped__)
    engine = TorchEngine(model, byte_tokenizer())
    ids = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    parent = engine.prefill(ids, prot=4, query_window=8)
    sig = parent.signals()
    answer = parent.answer([5, 6, 7], max_new_tokens=4, context_sha256=parent.sha256, stop_ids=[])
    result[family] = {"beta": sig.beta, "g": sig.g, "vnorm": sig.vnorm,
                      "gate": [parent.gate(f).clone() for f in range(parent.n_attn_layers)],
                      "keys": [parent.keys(f).clone() for f in range(parent.n_attn_layers)],
                      "answer": answer.token_ids, "calls": dict(calls)}
    for k in calls:
        calls[k] = 0
torch.save(result, out)
"""


def _capture(mode: str, tmp_path) -> dict:
    out = tmp_path / f"{mode}.pt"
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=False)


def test_fast_kernel_standins_capture_the_same_signals_bit_for_bit(tmp_path):
    torch_path, fast_path = _capture("torch", tmp_path), _capture("standin", tmp_path)
    for family in ("qwen3_next", "qwen3_5"):
        ref, fast = torch_path[family], fast_path[family]
        assert ref["calls"] == {"chunk": 0, "recurrent": 0, "conv": 0, "conv_update": 0}
        # the prefill ran the fast chunk kernel and the fast conv on every GDN layer (9 of the 12 layers)
        assert fast["calls"]["chunk"] >= 9 and fast["calls"]["conv"] >= 9, fast["calls"]
        for name in ("beta", "g", "vnorm", "gate", "keys"):
            assert len(ref[name]) == len(fast[name]) > 0
            for a, b in zip(ref[name], fast[name], strict=True):
                assert a.shape == b.shape and torch.equal(a, b), (family, name)
        assert ref["answer"] == fast["answer"]


def _running_layer_dispatch(model, monkeypatch, bound_name: str):
    """Make every GDN layer call its kernel through ``layer.<bound_name>`` (bound when the layer was built), as a
    transformers that binds kernels on the layer would: the forward's module-level name is not called at all."""
    adapter = HybridAdapter(model)
    mod = sys.modules[adapter.kernel_modules[0]]
    running: list = [None]
    for layer in adapter.gdn:
        object.__setattr__(layer, bound_name, mod.torch_chunk_gated_delta_rule)  # what the layer build binds
        layer.register_forward_pre_hook(lambda m, args: running.__setitem__(0, m))
    forward = inspect.unwrap(type(adapter.gdn[0]).forward)
    own_globals = dict(forward.__globals__)  # the forward's own namespace: kvbench's module-level patch is not seen
    own_globals["torch_chunk_gated_delta_rule"] = lambda *a, **k: getattr(running[0], bound_name)(*a, **k)
    rebound = types.FunctionType(forward.__code__, own_globals, None, forward.__defaults__, forward.__closure__)
    rebound.__kwdefaults__ = forward.__kwdefaults__
    monkeypatch.setattr(type(adapter.gdn[0]), "forward", rebound)
    return adapter


def _prefill_signals(model, n: int = 96):
    from kvbench.engines.torch_engine import TorchEngine
    from kvbench.models import byte_tokenizer

    ids = torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(2)).tolist()
    return TorchEngine(model, byte_tokenizer()).prefill(ids, prot=2, query_window=4).signals()


@pytest.mark.parametrize("config", [tiny_qwen3_next_config, tiny_qwen3_5_config], ids=["qwen3_next", "qwen3_5"])
def test_a_kernel_bound_on_the_layer_is_captured_through_the_bound_attribute(config, monkeypatch):
    want = _prefill_signals(build_random(config(), seed=4))
    model = build_random(config(), seed=4)
    _running_layer_dispatch(model, monkeypatch, "chunk_gated_delta_rule")
    got = _prefill_signals(model)
    for name in ("beta", "g", "vnorm"):
        for a, b in zip(getattr(want, name), getattr(got, name), strict=True):
            assert torch.equal(a, b), name


def test_a_capture_that_sees_no_kernel_call_raises(monkeypatch):
    model = build_random(tiny_qwen3_next_config(), seed=4)
    _running_layer_dispatch(model, monkeypatch, "some_kernel_kvbench_does_not_know")
    with pytest.raises(ModelError, match=r"GDN layer 0 recorded 0 of 96 tokens: the GDN kernels kvbench wraps"):
        _prefill_signals(model)
