"""Future KV utility (paper §2, Eq. 2; Appendix B): the training label of GateSight.

Eq. 2 itself (the leave-one-out change ``Δr`` of an attention layer's ungated output, its closed form and its
brute-force reference) lives in :mod:`kvbench.methods.kv_utility`, shared with the query-aware ``oracle``. This
module labels documents with it: :func:`label_document` evaluates the closed form in float64 for every sampled
continuation and checks it against brute-force deletion on every document, plus the reconstruction of the
module's output and the coverage of every position (Appendix B).

Continuations are sampled by :func:`sample_continuations`, the harness's own loop (explicit position ids, a
fresh cache, no ``generate()``), all ``M`` of a document in one batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from kvbench.errors import KvbenchError
from kvbench.methods.kv_utility import (
    delta_r_brute_force,
    delta_r_closed_form,
    head_output_weights,
    recompute_attention,
    utility_from_delta,
)

__all__ = [
    "DocumentLabel",
    "LabelCheckError",
    "LabelConfig",
    "doc_seed",
    "label_document",
    "sample_continuations",
    "sample_next",
]


class LabelCheckError(KvbenchError):
    """One of the per-document label checks (Appendix B) failed."""


# ----------------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------------


def sample_next(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator
) -> torch.Tensor:
    """One token per row of ``logits`` ``[B, V]``: temperature, then top-k, then top-p (the smallest set of
    most likely tokens whose probability reaches ``top_p``; at least one), then a draw from ``generator``."""
    x = logits.float().cpu() / max(temperature, 1e-6)
    kk = x.shape[-1] if top_k <= 0 else min(top_k, x.shape[-1])
    vals, idx = torch.topk(x, kk, dim=-1)  # descending
    probs = torch.softmax(vals, dim=-1)
    before = probs.cumsum(-1) - probs
    probs = probs * (before < top_p)
    choice = torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, generator=generator)
    return idx.gather(-1, choice).squeeze(-1)


@torch.no_grad()
def sample_continuations(
    model: torch.nn.Module,
    context_ids: Sequence[int],
    *,
    m: int = 4,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_p: float = 0.95,
    top_k: int = 20,
    seed: int = 0,
    stop_ids: Sequence[int] = (),
) -> list[list[int]]:
    """``m`` sampled continuations of ``context_ids`` (stop token excluded), decoded as one batch with explicit
    position ids on a fresh cache. Deterministic for a given seed and model."""
    device = next(model.parameters()).device
    n = len(context_ids)
    ids = torch.tensor([list(context_ids)] * m, device=device)
    out = model(
        input_ids=ids, use_cache=True, logits_to_keep=1, position_ids=torch.arange(n, device=device)[None].expand(m, n)
    )
    cache = out.cache
    gen = torch.Generator().manual_seed(int(seed))
    stops = set(int(s) for s in stop_ids)
    seqs: list[list[int]] = [[] for _ in range(m)]
    done = [False] * m
    for step in range(max_new_tokens):
        tok = sample_next(out.logits[:, -1], temperature, top_k, top_p, gen)
        for r in range(m):
            if not done[r]:
                if int(tok[r]) in stops:
                    done[r] = True
                else:
                    seqs[r].append(int(tok[r]))
        if all(done) or step == max_new_tokens - 1:
            break
        out = model(
            input_ids=tok[:, None].to(device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            position_ids=torch.full((m, 1), n + step, device=device),
        )
    return seqs


def doc_seed(seed: int, corpus: str, doc_id: str) -> int:
    """A per-document sampling seed independent of corpus order."""
    digest = hashlib.sha256(f"{seed}\x00{corpus}\x00{doc_id}".encode()).hexdigest()
    return int(digest[:15], 16)


# ----------------------------------------------------------------------------------------------------
# One document
# ----------------------------------------------------------------------------------------------------


@dataclass
class LabelConfig:
    """Labelling recipe (Appendix B defaults)."""

    m: int = 4
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 20
    seed: int = 0
    check: bool = True
    check_entries: int = 16
    closed_form_tol: float = 1.4e-5
    output_tol: float | None = None  # relative L2; default 1e-3 (float32 model) or 5e-2 (half precision)
    max_doc_tokens: int = 1250
    min_doc_tokens: int = 16

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class DocumentLabel:
    """Utility ``[L_attn, H_kv, n]`` (raw, not normalised) and the native signals of one context.

    beta / g / vnorm: per GDN ordinal ``[n, Hv]``; gate_head_mean ``[L_attn, H]``: the output gate averaged over
    the context tokens and the head dim; checks: the measured errors of the three Appendix B checks.
    """

    utility: torch.Tensor
    beta: list[torch.Tensor]
    g: list[torch.Tensor]
    vnorm: list[torch.Tensor]
    gate_head_mean: torch.Tensor
    n: int
    prot: int
    continuation_lengths: list[int]
    checks: dict = field(default_factory=dict)


class _OutputCapture:
    """Forward hooks: the last ``T`` rows of each attention module's output and of its sigmoid gate."""

    def __init__(self, modules: Sequence[torch.nn.Module], T: int) -> None:
        self.T = T
        self.out: list[torch.Tensor | None] = [None] * len(modules)
        self.gate: list[torch.Tensor | None] = [None] * len(modules)
        self.handles = []
        for f, mod in enumerate(modules):
            hd = mod.head_dim
            self.handles.append(mod.register_forward_hook(lambda m_, i_, o_, f=f: self._out(f, o_)))
            self.handles.append(mod.q_proj.register_forward_hook(lambda m_, i_, o_, f=f, hd=hd: self._gate(f, o_, hd)))

    def _out(self, f, output) -> None:
        self.out[f] = output[0].detach()[0, -self.T :].float()

    def _gate(self, f, output, hd) -> None:
        rows = output.detach()[0, -self.T :]
        self.gate[f] = torch.sigmoid(rows.view(rows.shape[0], -1, 2 * hd)[..., hd:].float())

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _check_entries(delta: torch.Tensor, prot: int, n_ctx: int, count: int, gen: torch.Generator) -> list[int]:
    """Body entries for the brute-force check: the top ``count/2`` by max Δr, the rest random."""
    lo = prot if n_ctx - prot > 0 else 0
    top = delta[..., lo:].amax(dim=(0, 1))
    k = min(count // 2 + count % 2, top.numel())
    picked = set((torch.topk(top, k).indices + lo).tolist())
    perm = (torch.randperm(n_ctx - lo, generator=gen) + lo).tolist()
    for i in perm:
        if len(picked) >= min(count, n_ctx - lo):
            break
        picked.add(i)
    return sorted(picked)


@torch.no_grad()
def label_document(
    engine,
    context_ids: Sequence[int],
    prot: int,
    config: LabelConfig | None = None,
    *,
    seed: int | None = None,
    continuations: Sequence[Sequence[int]] | None = None,
) -> DocumentLabel:
    """Utility of every KV entry of ``context_ids`` (Appendix B).

    engine: a :class:`~kvbench.engines.torch_engine.TorchEngine`. The continuations are sampled (unless given),
    then for each of them ``context + continuation`` is prefilled with ``query_window = len(continuation)``: the
    continuation rows' post-RoPE queries come from that prefill, keys/values from the parent, and Eq. 2 is
    evaluated in float64 per attention layer (``a / (1 - a)`` is ill-conditioned in float32 where ``a -> 1``).
    With ``config.check`` every continuation is checked: closed form
    against brute-force deletion (max error / max Δr of the (layer, head) <= ``closed_form_tol``), the
    reconstructed module output against the module's (relative L2 <= ``output_tol``), every context position
    covered. A failed check raises :class:`LabelCheckError`.
    """
    config = config or LabelConfig()
    context_ids = [int(t) for t in context_ids]
    n = len(context_ids)
    model = engine.model
    seed = config.seed if seed is None else seed
    if continuations is None:
        continuations = sample_continuations(
            model,
            context_ids,
            m=config.m,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            seed=seed,
            stop_ids=engine.stop_ids,
        )
    continuations = [list(c) for c in continuations if len(c) > 0]
    if not continuations:
        raise KvbenchError("every sampled continuation was empty (the model stopped at once); no utility label")
    attn = engine.adapter.attn
    L, H, H_kv = len(attn), engine.n_heads, engine.n_kv_heads
    model_dtype = next(model.parameters()).dtype
    output_tol = config.output_tol or (1e-3 if model_dtype == torch.float32 else 5e-2)
    w_heads = [head_output_weights(mod.o_proj.weight.detach().float(), H) for mod in attn]
    utility = torch.zeros(L, H_kv, n, device=engine.device)
    signals = gate_mean = None
    checks = {"closed_form_max_err": 0.0, "output_max_rel_err": 0.0, "covered": True, "check_entries": 0}
    gen = torch.Generator().manual_seed(seed)
    for cont in continuations:
        T = len(cont)
        capture = _OutputCapture(attn, T) if config.check else None
        try:
            parent = engine.prefill(context_ids + cont, prot, query_window=T)
        finally:
            if capture is not None:
                capture.remove()
        try:
            if signals is None:
                s = parent.signals()
                signals = tuple([x[:n].float().cpu().clone() for x in xs] for xs in (s.beta, s.g, s.vnorm))
                gate_mean = torch.stack([parent.gate(f)[:n].float().mean(0).cpu() for f in range(L)])
            N = n + T
            for f, mod in enumerate(attn):
                q = parent.queries(f, range(n, N)).float()
                k, v = parent.keys(f).float(), parent.values(f).float()
                # float64: Eq. 2's a / (1 - a) is ill-conditioned where attention is peaked (a -> 1); in float32
                # a trained retrieval head put the closed form 2e-4 of the max Δr off brute-force deletion
                a, o = recompute_attention(q, k, v, mod.scaling, dtype=torch.float64)
                delta = delta_r_closed_form(a, o, v, w_heads[f], n)  # [H_kv, T, n]
                utility[f] = torch.maximum(utility[f], utility_from_delta(delta))
                if config.check:
                    tensors = {"q": q, "k": k, "v": v, "a": a, "o": o, "delta": delta, "w_heads": w_heads[f]}
                    _run_checks(
                        checks, f, mod, **tensors, n=n, prot=prot, capture=capture, config=config,
                        output_tol=output_tol, gen=gen,
                    )  # fmt: skip
        finally:
            parent.release()
    return DocumentLabel(
        utility=utility.cpu(),
        beta=signals[0],
        g=signals[1],
        vnorm=signals[2],
        gate_head_mean=gate_mean,
        n=n,
        prot=prot,
        continuation_lengths=[len(c) for c in continuations],
        checks=checks,
    )


def _run_checks(
    checks: dict,
    f: int,
    mod: torch.nn.Module,
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    o: torch.Tensor,
    delta: torch.Tensor,
    w_heads: torch.Tensor,
    n: int,
    prot: int,
    capture: _OutputCapture,
    config: LabelConfig,
    output_tol: float,
    gen: torch.Generator,
) -> None:
    """Check attention layer ``f``'s labels (closed form vs brute force, output reconstruction, coverage).

    ``a`` is the attention ``[H_kv, G, T, N]``, ``delta`` the Δr ``[H_kv, T, n]`` of the ``n`` context positions,
    ``prot`` the protected prefix length (positions); the tensors after ``mod`` are keyword-only. Updates
    ``checks`` in place and raises :class:`LabelCheckError` on a failed check.
    """
    H_kv, G, T, N = a.shape
    # (1) closed form against brute-force deletion (float64), on the scale of the max-normalised label
    entries = _check_entries(delta, prot, n, config.check_entries, gen)
    brute = delta_r_brute_force(q, k, v, w_heads, mod.scaling, entries).to(delta.dtype)
    lo = prot if n > prot else 0
    scale = delta[..., lo:].amax(dim=(1, 2)).clamp_min(torch.finfo(delta.dtype).tiny)  # [H_kv]
    err = ((delta[:, :, entries] - brute).abs().amax(dim=(1, 2)) / scale).max().item()
    checks["closed_form_max_err"] = max(checks["closed_form_max_err"], err)
    checks["check_entries"] += len(entries)
    if not err <= config.closed_form_tol:
        raise LabelCheckError(
            f"attention layer {mod.layer_idx}: the closed form of Eq. 2 differs from brute-force deletion by "
            f"{err:.3g} of the max Δr (tolerance {config.closed_form_tol})"
        )
    # (2) the reconstructed module output matches the module's
    gate = capture.gate[f]
    heads = o.float().reshape(H_kv * G, T, -1).transpose(0, 1)  # [T, H, D]
    recon = (heads * gate).reshape(T, -1) @ mod.o_proj.weight.detach().float().T
    if mod.o_proj.bias is not None:
        recon = recon + mod.o_proj.bias.detach().float()
    ref = capture.out[f]
    rel = ((recon - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    checks["output_max_rel_err"] = max(checks["output_max_rel_err"], rel)
    if not rel <= output_tol:
        raise LabelCheckError(
            f"attention layer {mod.layer_idx}: the recomputed attention output differs from the module's by "
            f"{rel:.3g} (relative L2, tolerance {output_tol}); the recorded queries/keys/values do not reproduce "
            "the layer"
        )
    # (3) every context position is covered: inside the causal window of every row, with a finite Δr
    visible = torch.ones(T, N, dtype=torch.bool, device=a.device).tril(N - T)[:, :n]
    covered = delta.shape[-1] == n and bool(visible.all()) and bool(torch.isfinite(delta).all())
    checks["covered"] = checks["covered"] and covered
    if not covered:
        raise LabelCheckError(f"attention layer {mod.layer_idx}: some context positions have no utility")


# ----------------------------------------------------------------------------------------------------
# Corpora
# ----------------------------------------------------------------------------------------------------
