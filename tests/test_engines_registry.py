"""Engines registered as classes: the declared interface (constructor ``(lm, length, device)``, ``torch_weights``,
``capabilities``), the registry's check of it, and a method's ``requires`` checked against the engines' declared
capabilities before any model loads."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kvbench.engines import CAPABILITIES, ENGINES, engines_for
from kvbench.engines.base import ChildSession, EngineBase, ParentSession
from kvbench.engines.torch_engine import TorchEngine, TorchRunEngine
from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod, method_class
from kvbench.models import load_model
from kvbench.registry import Registry, RegistryError
from kvbench.run.loop import make_engine
from kvbench.run.plan import RunConfig, validate


def test_the_builtin_engines_are_classes_declaring_the_interface():
    torch_cls, vllm_cls = ENGINES.get("torch"), ENGINES.get("vllm")  # vllm's module imports no vllm
    for name, cls in (("torch", torch_cls), ("vllm", vllm_cls)):
        assert issubclass(cls, EngineBase) and cls.name == name
        assert list(inspect.signature(cls).parameters)[:3] == ["lm", "length", "device"]
        assert cls.capabilities <= CAPABILITIES.keys()
    assert torch_cls.torch_weights and not vllm_cls.torch_weights
    assert "model_weights" in torch_cls.capabilities and "model_weights" not in vllm_cls.capabilities
    for abstract in ("prefill",):
        assert abstract in EngineBase.__abstractmethods__
    assert {"fork", "answer"} <= ParentSession.__abstractmethods__ and "answer" in ChildSession.__abstractmethods__


def test_the_torch_engine_is_built_from_a_loaded_model():
    lm = load_model("tiny-random")
    engine = make_engine("torch", lm, 256)
    assert type(engine) is TorchRunEngine and isinstance(engine, TorchEngine)
    assert engine.tokenizer is lm.tokenizer and engine.fingerprint == lm.fingerprint
    parent = engine.prefill(list(range(10, 60)), prot=4)
    assert parent.n == 50 and parent.engine is engine
    engine.close()


class _Plain(EngineBase):
    """An engine constructed ``(lm, length, device)`` that prefills nothing (the registry check needs no more)."""

    name = "plain"
    capabilities = frozenset({"ragged_heads"})

    def __init__(self, lm, length: int, device: str = "cpu") -> None:
        self.tokenizer, self.max_context, self._sessions = None, length, {}

    def prefill(self, token_ids, prot, *, query_window=64):
        raise KvbenchError("plain prefills nothing")


class _TwoArgs(_Plain):
    name = "two"

    def __init__(self, lm, length: int) -> None:
        super().__init__(lm, length)


class _Unknown(_Plain):
    name = "unknown"
    capabilities = frozenset({"telepathy"})


class _NotASet(_Plain):
    name = "tuple"
    capabilities = ("ragged_heads",)  # type: ignore[assignment]


@pytest.fixture
def engines(monkeypatch) -> Registry:
    """ENGINES with its built-ins, open to objects added by a test (no entry points of its own group)."""
    import kvbench.engines as module

    fresh = Registry("engine", "kvbench.test-engines", dict(module.BUILTIN_ENGINES), check=module._check_engine)
    monkeypatch.setattr(module, "ENGINES", fresh)
    return fresh


def test_the_registry_refuses_what_is_not_an_engine_class(engines):
    engines.add("plain", _Plain, "a test")
    assert engines.get("plain") is _Plain
    with pytest.raises(RegistryError, match="not an EngineBase subclass"):
        engines.add("factory", lambda lm, length, device: None, "a test")
    with pytest.raises(RegistryError, match=r"not constructed \(lm, length, device\)"):
        engines.add("two", _TwoArgs, "a test")  # named like the class, as the registry checks first
    with pytest.raises(RegistryError, match="capabilities must be a frozenset of model_weights, ragged_heads"):
        engines.add("unknown", _Unknown, "a test")
    with pytest.raises(RegistryError, match="capabilities must be a frozenset"):
        engines.add("tuple", _NotASet, "a test")


class _NeedsRagged(EvictionMethod):
    name = "needs-ragged"
    requires = frozenset({"ragged_heads"})

    def score(self, parent):
        return []


class _NeedsMind(_NeedsRagged):
    name = "needs-mind"
    requires = frozenset({"telepathy"})


def test_a_methods_engines_follow_from_its_required_capabilities(engines):
    engines.add("plain", _Plain, "a test")
    assert engines_for(method_class("snapkv")) is None  # requires nothing: every engine
    assert engines_for(method_class("oracle")) == ("torch",)  # model_weights: the torch engine's only
    assert engines_for(_NeedsRagged) == ("torch", "vllm", "plain")

    class OnlyVllm(_NeedsRagged):
        engines = ("vllm",)

    assert engines_for(OnlyVllm) == ("vllm",)
    with pytest.raises(KvbenchError, match="requires telepathy, which no engine offers"):
        engines_for(_NeedsMind)


def test_the_runner_refuses_an_engine_without_a_required_capability(tmp_path):
    config = RunConfig(methods=["oracle"], bench="needle", ps=[0.5], out=tmp_path / "x", engine="vllm")
    refused = "method oracle runs on the torch engine only; drop it or use --engine torch"
    with pytest.raises(KvbenchError, match=refused):
        validate(config)
    validate(RunConfig(methods=["oracle"], bench="needle", ps=[0.5], out=tmp_path / "x", engine="torch"))


def test_engine_dtypes_decide_the_load_dtype_and_refuse_others() -> None:
    """run_plan.engine_dtype reads the engine class's ``dtypes``: vllm's only dtype is its default, torch keeps
    whatever --dtype says, and a dtype outside an engine's list names the fix."""
    from kvbench.run.plan import engine_dtype

    def config(**kw: object) -> RunConfig:
        return RunConfig(methods=["full"], bench="ruler", ps=[1.0], out=Path("unused"), **kw)

    assert ENGINES.get("vllm").dtypes == ("bfloat16",)
    assert ENGINES.get("torch").dtypes is None
    assert engine_dtype(config(engine="vllm")) == "bfloat16"
    assert engine_dtype(config(engine="torch")) is None
    assert engine_dtype(config(engine="torch", dtype="bfloat16")) == "bfloat16"
    with pytest.raises(KvbenchError, match=r"--engine vllm runs bfloat16 only; drop --dtype float32"):
        engine_dtype(config(engine="vllm", dtype="float32"))


def test_decode_path_is_the_engines_word() -> None:
    """The manifest's decode_kernels entry is what the engine class says: the torch engine reports its decode
    kernel status, the vllm engine its pinned model runner, an engine without its own word says "engine's own"."""
    from kvbench.engines import decode_kernel
    from kvbench.engines.base import EngineBase

    assert ENGINES.get("torch").decode_path() == decode_kernel.status()
    assert ENGINES.get("vllm").decode_path().startswith("vLLM model runner V1 (pinned), batched children")
    assert EngineBase.decode_path() == "engine's own"
