"""Adapters for the HF transformers hybrid families (Qwen3-Next, Qwen3.5 text).

Each family is one :class:`kvbench.models.Family` row: which ``model_type`` values it covers, the class names of its
GDN and attention modules, and the modeling module whose GDN kernels we wrap. During the single prefill
:class:`Recorder` captures, without changing any computed value:

* GDN signals per GDN layer ``[n, Hv]``: ``beta``, ``g`` (log decay) and ``||v||`` of the value written
  into the state (after the short conv + SiLU). They are read from the arguments of the module-level
  kernels ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule``, which the GDN forward
  looks up at call time; a forward pre-hook tells the wrapper which layer is running. With
  flash-linear-attention / causal-conv1d installed, transformers 5.24 binds their kernels inside those same
  module-level functions at import, so the wrapper still sees every call, with the same arguments. A kernel bound
  as an attribute of the GDN layer when it is built (:data:`BOUND_KERNELS`, e.g. by the ``kernels`` package) is
  wrapped on the layer too; nested wrapped calls record once.
* the attention output gate per attention layer ``[n, H]``: the second half of ``q_proj``'s output
  (``[.., H, 2*D]``), ``sigmoid`` and mean over the head dim.
* post-RoPE queries of the last ``query_window`` positions per attention layer ``[H, W, D]``: recorded
  by the kvbench attention function from the tensor the layer actually attends with.

If a transformers upgrade moves what is hooked, :meth:`Recorder.check` raises instead of returning
partial signals.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from kvbench.engines import decode_kernel
from kvbench.errors import ModelError
from kvbench.kernel_warnings import (  # noqa: F401 (torch-free for the command line; re-exported here)
    FALLBACK_SUMMARY,
    KernelWarningFilter,
    quiet_kernel_warnings,
)
from kvbench.models import FAMILIES, SUPPORTED_MODEL_TYPES, Family

GDN_KERNELS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
#: attribute names under which a GDN kernel may be bound on the layer itself when it is built (the ``kernels``
#: package's ``use_kernelized_func`` binds transformers' functions so; flash-linear-attention's own names)
BOUND_KERNELS = GDN_KERNELS + (
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "recurrent_gated_delta_rule",
)




def family_of(model: nn.Module) -> Family:
    model_type = getattr(model.config, "model_type", None)
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    raise ModelError(
        f"model_type {model_type!r} is not a supported hybrid; kvbench supports {', '.join(SUPPORTED_MODEL_TYPES)}"
    )


class HybridAdapter:
    """Finds a hybrid model's GDN and attention modules and records the prefill signals."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.family = family_of(model)
        self.gdn: list[nn.Module] = []
        self.attn: list[nn.Module] = []
        for module in model.modules():
            cls = type(module).__name__
            if cls == self.family.gdn_class:
                self.gdn.append(module)
            elif cls == self.family.attn_class:
                self.attn.append(module)
        self.gdn.sort(key=lambda m: m.layer_idx)
        self.attn.sort(key=lambda m: m.layer_idx)
        if not self.attn or not self.gdn:
            raise ModelError(
                f"found {len(self.gdn)} {self.family.gdn_class} and {len(self.attn)} {self.family.attn_class} "
                "modules; this transformers version does not lay the model out as kvbench expects "
                "(kvbench is validated on transformers 5.24)"
            )
        mixers = {id(m): m.layer_idx for m in self.gdn + self.attn}
        #: layer index -> its decoder layer (the module whose child is that layer's GDN or attention module)
        self.decoder_layers: dict[int, nn.Module] = {
            mixers[id(child)]: module
            for module in model.modules()
            for child in module.children()
            if id(child) in mixers
        }
        self.kernel_modules = sorted({type(m).__module__ for m in self.gdn})
        for mod_name in self.kernel_modules:
            missing = [k for k in GDN_KERNELS if not hasattr(sys.modules[mod_name], k)]
            if missing:
                raise ModelError(f"{mod_name} has no {missing}; the GDN signal capture needs transformers 5.24")

    @property
    def attn_layer_ids(self) -> list[int]:
        return [m.layer_idx for m in self.attn]

    @property
    def gdn_layer_ids(self) -> list[int]:
        return [m.layer_idx for m in self.gdn]

    @property
    def leading_gdn_layer_ids(self) -> list[int]:
        """The GDN layers before the first attention layer (0, 1, 2 in a 3 GDN : 1 attention pattern): their output
        for a row depends only on the tokens fed to it, not on any attention cache."""
        first = min(self.attn_layer_ids)
        return [i for i in self.gdn_layer_ids if i < first]

    def recorder(self, query_window: int) -> Recorder:
        return Recorder(self, query_window)

    @contextmanager
    def decode_kernels(self) -> Iterator[None]:
        """While active, this family's one-token GDN recurrence (transformers' ``torch_recurrent_gated_delta_rule``,
        which the GDN forward looks up at call time) runs kvbench's GDN step kernel
        (:func:`kvbench.engines.decode_kernel.gdn_step`) on float32 CPU inputs when the kernel is built; any other
        call goes to transformers' function unchanged. The torch engine holds it while children answer, alone and
        batched alike, so both take the same arithmetic."""
        patched = []
        for mod_name in self.kernel_modules:
            mod = sys.modules[mod_name]
            original = getattr(mod, GDN_KERNELS[1])
            if getattr(original, "kvbench_decode_step", False):
                continue  # already installed by an enclosing use

            def rule(query, key, value, *args, original=original, **kwargs):
                state = kwargs.get("initial_state")
                if (
                    not args
                    and query.shape[1] == 1
                    and state is not None
                    and kwargs.get("cu_seqlens") is None
                    and query.dtype == state.dtype == torch.float32
                    and query.device.type == "cpu"
                    and decode_kernel.available()
                ):
                    l2norm = kwargs.get("use_qk_l2norm_in_kernel", False)
                    g, beta = kwargs["g"], kwargs["beta"]
                    out, new_state = decode_kernel.gdn_step(query, key, value, g, beta, state, l2norm)
                    return out, new_state if kwargs.get("output_final_state", False) else None
                return original(query, key, value, *args, **kwargs)

            rule.kvbench_decode_step = True
            setattr(mod, GDN_KERNELS[1], rule)
            patched.append((mod, original))
        try:
            yield
        finally:
            for mod, original in patched:
                setattr(mod, GDN_KERNELS[1], original)


class Recorder:
    """Context manager active during one prefill; see the module docstring for what it records."""

    def __init__(self, adapter: HybridAdapter, query_window: int) -> None:
        self.adapter = adapter
        self.query_window = query_window
        gdn_ordinal = {m.layer_idx: i for i, m in enumerate(adapter.gdn)}
        self._gdn_ordinal = gdn_ordinal
        self.beta: list[list[torch.Tensor]] = [[] for _ in adapter.gdn]
        self.g: list[list[torch.Tensor]] = [[] for _ in adapter.gdn]
        self.vnorm: list[list[torch.Tensor]] = [[] for _ in adapter.gdn]
        self.gate: list[list[torch.Tensor]] = [[] for _ in adapter.attn]
        self.queries: list[torch.Tensor | None] = [None for _ in adapter.attn]
        self._current: int | None = None
        self._inside = False  # a wrapped kernel is running (one wrapped kernel calling another records once)
        self._handles: list = []
        self._patched: list = []

    def _wrap(self, kernel):
        def wrapped(query, key, value, *args, **kwargs):
            if self._inside:
                return kernel(query, key, value, *args, **kwargs)
            f = self._current
            if f is None:
                raise ModelError("a GDN kernel ran outside a GDN module forward; the capture hooks are stale")
            # transformers passes g and beta by name; flash-linear-attention's signature is (q, k, v, g, beta, ...)
            g = kwargs["g"] if "g" in kwargs else args[0]
            beta = kwargs["beta"] if "beta" in kwargs else args[1]
            self.beta[f].append(beta.detach()[0].float())
            self.g[f].append(g.detach()[0].float())
            self.vnorm[f].append(value.detach()[0].float().norm(dim=-1))
            self._inside = True
            try:
                return kernel(query, key, value, *args, **kwargs)
            finally:
                self._inside = False

        wrapped.__wrapped__ = kernel  # inspect.unwrap reaches transformers' own function through the capture
        return wrapped

    def __enter__(self) -> Recorder:
        for module in self.adapter.gdn:
            f = self._gdn_ordinal[module.layer_idx]
            self._handles.append(module.register_forward_pre_hook(lambda mod, args, f=f: setattr(self, "_current", f)))
        for f, module in enumerate(self.adapter.attn):
            hd = module.head_dim

            def gate_hook(mod, inputs, out, f=f, hd=hd):
                T = out.shape[1]
                gate = out.detach()[0].view(T, -1, 2 * hd)[..., hd:]
                self.gate[f].append(torch.sigmoid(gate.float()).mean(-1))

            self._handles.append(module.q_proj.register_forward_hook(gate_hook))
            module.kvbench_query_sink = (self, f)
        for mod_name in self.adapter.kernel_modules:
            mod = sys.modules[mod_name]
            for name in GDN_KERNELS:
                original = getattr(mod, name)
                setattr(mod, name, self._wrap(original))
                self._patched.append((mod, name, original))
        for module in self.adapter.gdn:  # kernels bound on the layer when it was built
            for name in BOUND_KERNELS:
                original = module.__dict__.get(name)
                if callable(original) and not isinstance(original, nn.Module):
                    setattr(module, name, self._wrap(original))
                    self._patched.append((module, name, original))
        return self

    def record_queries(self, f: int, query: torch.Tensor) -> None:
        """Called by the attention function with ``query[1, H, T, D]`` (post q_norm and RoPE)."""
        self.queries[f] = query.detach()[0, :, -self.query_window :].clone() if self.query_window > 0 else None

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        for mod, name, original in self._patched:
            setattr(mod, name, original)
        for module in self.adapter.attn:
            module.kvbench_query_sink = None
        self._handles, self._patched = [], []

    def check(self, n: int) -> None:
        """Raise unless every GDN and attention layer recorded exactly ``n`` tokens."""
        for f, chunks in enumerate(self.beta):
            got = sum(c.shape[0] for c in chunks)
            if got != n:
                raise ModelError(
                    f"GDN layer {self.adapter.gdn[f].layer_idx} recorded {got} of {n} tokens: the GDN kernels kvbench "
                    f"wraps ({', '.join(BOUND_KERNELS)}) were not called (a GDN forward replaced, e.g. by the "
                    "`kernels` package's kernelize, or a transformers change); use transformers 5.24 without "
                    "`kernels` (flash-linear-attention and causal-conv1d are fine)"
                )
        for f, chunks in enumerate(self.gate):
            if sum(c.shape[0] for c in chunks) != n:
                raise ModelError(f"attention layer {self.adapter.attn[f].layer_idx} did not record its gate")

    @staticmethod
    def _cat(chunks: list[torch.Tensor]) -> torch.Tensor:
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks, 0)

    def result(self) -> dict:
        return {
            "beta": [self._cat(c) for c in self.beta],
            "g": [self._cat(c) for c in self.g],
            "vnorm": [self._cat(c) for c in self.vnorm],
            "gate": [self._cat(c) for c in self.gate],
            "queries": self.queries,
        }
