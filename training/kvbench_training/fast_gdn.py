"""A training-speed variant of the Gated DeltaNet chunk kernel (transformers' torch fallback, used without fla).

The math is the chunked gated delta rule that transformers' ``torch_chunk_gated_delta_rule`` computes (per chunk
of ``C`` tokens: the lower-triangular system ``(I + tril(K_beta K^T * D, -1)) X = [V_beta, K_beta * e^G]`` solved
once for all chunks, then a sequential scan that reads and updates the ``[Dk, Dv]`` state). What differs is
how autograd sees the scan: the fallback reads chunk ``i`` of five tensors by indexing (``x[:, :, i]``) and
writes each chunk's output into a preallocated tensor in place. Each index's backward then allocates a zero
tensor of the whole sequence and adds it into the gradient, and each in-place write's backward copies the whole
gradient, so the backward does O(chunks^2) memory traffic (at 4,096 tokens, 64 chunks x 9 GDN layers). Here
the chunks are read with one ``unbind`` (whose backward stacks the chunk gradients once) and the outputs are
stacked at the end, and the two triangular solves share one call: the same values, to rounding (checked
in tests/test_fast_gdn.py against the fallback, outputs and gradients) and the backward does O(chunks)
traffic. ``install()`` puts it in place of the fallback in both architectures' modules (qwen3_next, qwen3_5)
for the process; benchmarks/train_step.py measures what it buys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: transformers modules whose GDN layers call a module-level ``torch_chunk_gated_delta_rule``
MODULES = (
    "transformers.models.qwen3_next.modeling_qwen3_next",
    "transformers.models.qwen3_5.modeling_qwen3_5",
)


def _unit_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x`` over the root of its squared last dimension plus ``eps`` (fla's and transformers' l2norm)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule over a whole sequence, chunk by chunk; the call and return of transformers'
    ``torch_chunk_gated_delta_rule``. ``query`` / ``key`` ``[B, T, Hk, Dk]``, ``value`` ``[B, T, Hv, Dv]``, ``g``
    (log decay, <= 0) and ``beta`` ``[B, T, Hv]``; returns the output ``[B, T, Hv, Dv]`` in ``query``'s dtype and
    the final state ``[B, Hv, Dk, Dv]`` when ``output_final_state``."""
    dtype = query.dtype
    batch, length, k_heads, k_dim = key.shape
    v_heads, v_dim = value.shape[-2:]
    if k_heads != v_heads:  # each key head serves v_heads // k_heads value heads
        query = query.repeat_interleave(v_heads // k_heads, dim=2)
        key = key.repeat_interleave(v_heads // k_heads, dim=2)
    # [B, H, T, ...] in float32
    q, k, v, b, decay = (x.transpose(1, 2).contiguous().float() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q, k = _unit_norm(q), _unit_norm(k)
    q = q * k_dim**-0.5
    pad = -length % chunk_size
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        b, decay = F.pad(b, (0, pad)), F.pad(decay, (0, pad))
    n = (length + pad) // chunk_size

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [B, H, T, D] -> [B, H, n, C, D]
        return x.reshape(batch, v_heads, n, chunk_size, x.shape[-1])

    k_beta, v_beta = chunks(k * b.unsqueeze(-1)), chunks(v * b.unsqueeze(-1))
    q, k = chunks(q), chunks(k)
    cum = decay.reshape(batch, v_heads, n, chunk_size).cumsum(-1)  # log decay from the chunk's start
    above = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    between = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(above, float("-inf")).exp()  # e^(G_i - G_j), j <= i
    system = (k_beta @ k.transpose(-1, -2)) * between  # only its strict lower triangle is read (unit diagonal)
    # both right-hand sides in one solve: the new values, and the decayed keys that read the chunk's initial state
    both = torch.cat([v_beta, k_beta * cum.exp().unsqueeze(-1)], -1)
    solved = torch.linalg.solve_triangular(system, both, upper=False, unitriangular=True)
    values, reads = solved.split([v_dim, k_dim], -1)
    local = (q @ k.transpose(-1, -2)) * between  # within-chunk attention, diagonal included
    q_in = q * cum.exp().unsqueeze(-1)  # the state as it stood at the chunk's start, decayed to each position
    k_out = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)  # each position's write, decayed to the chunk's end
    keep = cum[..., -1].exp()[..., None, None]  # the state's decay over a whole chunk
    if initial_state is None:
        state = torch.zeros(batch, v_heads, k_dim, v_dim, dtype=torch.float32, device=q.device)
    else:
        state = initial_state.float()
    outs = []
    per_chunk = zip(*(x.unbind(2) for x in (values, reads, local, q_in, k_out, keep)), strict=True)
    for values_i, reads_i, local_i, q_i, k_i, keep_i in per_chunk:
        v_new = values_i - reads_i @ state
        outs.append(q_i @ state + local_i @ v_new)
        state = state * keep_i + k_i.transpose(-1, -2) @ v_new
    out = torch.stack(outs, 2).reshape(batch, v_heads, n * chunk_size, v_dim)[:, :, :length]
    return out.transpose(1, 2).contiguous().to(dtype), (state if output_final_state else None)


def install() -> dict[str, object]:
    """Put :func:`chunk_gated_delta_rule` in place of transformers' fallback in every module of
    :data:`MODULES` (for this process); returns the replaced functions by module name (for :func:`restore`)."""
    import importlib

    replaced = {}
    for name in MODULES:
        module = importlib.import_module(name)
        replaced[name] = module.torch_chunk_gated_delta_rule
        module.torch_chunk_gated_delta_rule = chunk_gated_delta_rule
    return replaced


def restore(replaced: dict[str, object]) -> None:
    """Undo :func:`install`."""
    import importlib

    for name, function in replaced.items():
        importlib.import_module(name).torch_chunk_gated_delta_rule = function
