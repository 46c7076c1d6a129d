"""Budgets, allocations and selection: pure functions with exact integer totals.

Terms (DESIGN.md, "Budget"):

* ``n``    — context length in tokens (after any middle truncation).
* ``prot`` — protected prefix (chat header + instruction tokens, at most 256), kept by every method on
  top of the budget; eviction only chooses among the ``m = n - prot`` body positions.
* ``k``    — flat per-(layer, head) budget ``round(p * m)`` (round half up, computed exactly in decimal).
* ``B``    — model-wide budget ``L_attn * H_kv * k`` entries.

An *allocation* (an :class:`Allocation` in :data:`ALLOCATIONS`) owns the selection. The per-layer ones
(:class:`LayerAllocation`: ``flat``, ``pyramid``, ``gate``) turn ``k`` into per-attention-layer counts ``K_l``
(each KV head of layer ``l`` keeps ``K_l`` body entries) with ``sum_l K_l * H_kv == B`` exactly. ``global``
(:class:`GlobalAllocation`) selects the top ``B`` (layer, head, token) scores directly, so counts may differ
per head.

Kept index sets are returned as ``kept[f][h]``: a sorted 1-D ``LongTensor`` of context positions for
attention-layer ordinal ``f`` and KV head ``h`` (protected positions included).

Ties: entries with equal scores at the budget boundary are decided by one rule in every selection path
(per-head top-``K_l`` for ``flat``/``pyramid``/``gate``, top-``B`` for ``global``): **the later position
wins**; in ``global``, equal scores at the same position go to the later layer, then the later KV head.
It is computed by a stable sort (:func:`top_later_wins`), so it is the same on CPU and GPU and on every
engine (selection runs on the method's scores, not inside an engine).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

import torch

from kvbench.errors import KvbenchError
from kvbench.registry import Registry, RegistryError

PROTECTED_CAP = 256
ALL_P: tuple[float, ...] = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
PYRAMID_BETA = 20
PYRAMID_MIN = 4

Kept = list[list[torch.Tensor]]


def validate_p(p: float) -> float:
    """Return ``p`` as a float if it is a kept fraction in (0, 1]; raise otherwise."""
    try:
        value = float(p)
    except (TypeError, ValueError):
        raise KvbenchError(f"kept fraction p={p!r} is not a number; use a value in (0, 1], e.g. 0.1") from None
    if not (0.0 < value <= 1.0) or math.isnan(value):
        raise KvbenchError(f"kept fraction p={p} is outside (0, 1]; use e.g. --p 0.5 or --p all")
    return value


def protected_length(prefix_tokens: int, n: int, cap: int = PROTECTED_CAP) -> int:
    """Tokens protected from eviction: the instruction prefix, at most ``cap`` and at most ``n``."""
    return max(0, min(prefix_tokens, cap, n))


def per_head_budget(n: int, prot: int, p: float) -> int:
    """Flat per-(layer, head) budget ``round(p * (n - prot))``, rounding half up exactly.

    ``p`` is read through its shortest decimal repr, so ``0.1 * 4075`` is 407.5 -> 408, not a float
    artefact.
    """
    validate_p(p)
    m = n - prot
    if m < 0:
        raise ValueError(f"protected prefix {prot} exceeds context length {n}")
    return int((Decimal(repr(float(p))) * m).to_integral_value(rounding=ROUND_HALF_UP))


def smallest_p(m: int, decimals: int = 4) -> float:
    """The smallest p of ``decimals`` decimals whose :func:`per_head_budget` keeps one of ``m`` >= 1 body entries:
    ``p * m >= 0.5`` (half up), rounded up to ``decimals`` decimals."""
    p = float((Decimal(1) / (2 * m)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_CEILING))
    return min(p, 1.0)


def total_budget(n: int, prot: int, p: float, n_layers: int, n_kv_heads: int) -> int:
    """Model-wide budget ``B = L_attn * H_kv * round(p * (n - prot))`` in entries."""
    return n_layers * n_kv_heads * per_head_budget(n, prot, p)


def apportion(weights: Sequence[float], total: int, lo: int, hi: int) -> list[int]:
    """Integer counts proportional to ``weights`` with ``lo <= c_i <= hi`` and ``sum(c) == total``.

    Layers whose proportional share falls outside ``[lo, hi]`` are pinned to the bound and the rest is
    re-shared among the others (water filling); the free layers are then integerised by largest
    remainder (ties go to the lower index).
    """
    L = len(weights)
    if L == 0:
        raise ValueError("no layers to allocate")
    if any(w < 0 or math.isnan(w) for w in weights):
        raise ValueError(f"allocation weights must be non-negative, got {list(weights)}")
    if not (L * lo <= total <= L * hi):
        raise ValueError(f"cannot place {total} entries in {L} layers with bounds [{lo}, {hi}]")
    counts: list[int | None] = [None] * L
    while True:
        free = [i for i in range(L) if counts[i] is None]
        remaining = total - sum(c for c in counts if c is not None)
        wsum = sum(weights[i] for i in free)
        share = {i: (remaining * weights[i] / wsum if wsum > 0 else remaining / len(free)) for i in free}
        low = [i for i in free if share[i] < lo]
        high = [i for i in free if share[i] > hi]
        if not low and not high:
            break
        # Pin the side whose violation is largest first; pinning both at once can overshoot.
        if sum(lo - share[i] for i in low) >= sum(share[i] - hi for i in high):
            for i in low:
                counts[i] = lo
        else:
            for i in high:
                counts[i] = hi
    floors = {i: math.floor(share[i]) for i in free}
    left = remaining - sum(floors.values())
    order = sorted(free, key=lambda i: (-(share[i] - floors[i]), i))
    for i in order[:left]:
        floors[i] += 1
    for i in free:
        counts[i] = floors[i]
    result = [int(c) for c in counts]  # type: ignore[arg-type]
    assert sum(result) == total and all(lo <= c <= hi for c in result), (result, total, lo, hi)
    return result


def flat(k: int, n_layers: int) -> list[int]:
    """Every attention layer keeps ``k`` entries per KV head."""
    return [k] * n_layers


def pyramid(k: int, n_layers: int, capacity: int, beta: float = PYRAMID_BETA, floor: int = PYRAMID_MIN) -> list[int]:
    """PyramidKV: linearly decreasing budgets over the attention-layer ordinal ``f``.

    ``k_min = k / beta``, ``k_max = 2k - k_min``, ``k_f = k_max - f (k_max - k_min) / (L - 1)``; the
    arithmetic series sums to ``L * k``. When ``k_max`` exceeds ``capacity`` (the body length; from about
    ``p >= 0.52``), PyramidKV's own rule applies (``pyramidkv_utils.py`` and kvpress's press): ``k_max =
    capacity`` and ``k_min = 2k - capacity``, still linear in between, so the series still sums to ``L * k``
    (e.g. 3 layers, ``k = 700``, capacity 1,000: 1,000, 700, 400). Integerised by largest remainder (exact
    total, unlike the reference's integer step); no layer below ``min(floor, k)`` nor above ``capacity``.
    """
    if n_layers == 1:
        return [k]
    k_min = k / beta
    k_max = 2 * k - k_min
    if k_max > capacity:
        k_max, k_min = capacity, 2 * k - capacity
    raw = [k_max - f * (k_max - k_min) / (n_layers - 1) for f in range(n_layers)]
    return apportion(raw, n_layers * k, lo=min(floor, k), hi=capacity)


def gate(k: int, gate_means: Sequence[float], capacity: int) -> list[int]:
    """GateSight: ``K_l`` proportional to the mean attention output gate ``w_l`` of layer ``l``.

    Largest remainder so that ``sum K_l == L * k`` (i.e. the total is exactly ``B``); no layer above
    ``capacity``.
    """
    return apportion(list(gate_means), len(gate_means) * k, lo=0, hi=capacity)


#: An allocation's per-layer counts: ``(k, n_layers, capacity, gate_means) -> [K_0, …, K_{L-1}]`` with
#: ``sum == n_layers * k`` and every ``K_l`` in ``[0, capacity]`` (``gate_means``: one weight per attention layer,
#: or None when the allocation does not ask for them). A plugin may register such a plain function: it is wrapped
#: in a :class:`CountsAllocation` (a function attribute ``needs_gate_means = True`` asks for the gate means).
LayerCounts = Callable[[int, int, int, Sequence[float] | None], list[int]]


class Allocation(ABC):
    """An allocation (``--allocation``): turns scores and a kept fraction into kept positions ``kept[f][h]``.

    The :data:`ALLOCATIONS` registry holds instances. ``needs_gate_means``: True if :meth:`select` needs one
    weight per attention layer (a method's :meth:`~kvbench.methods.EvictionMethod.gate_means`); otherwise it is
    given None. Per-layer allocations subclass :class:`LayerAllocation` and only compute counts.
    """

    needs_gate_means: bool = False

    @abstractmethod
    def select(
        self, scores: Sequence[torch.Tensor], n: int, prot: int, p: float, gate_means: Sequence[float] | None = None
    ) -> Kept:
        """Kept positions ``kept[f][h]`` (sorted, protected prefix included) at kept fraction ``p``.

        ``scores[f]``: ``[H_kv, n]`` per attention layer ordinal ``f`` (higher = keep); ``n`` the context
        length and ``prot`` the protected prefix, in tokens. The kept body entries total exactly the budget
        ``B`` (:func:`total_budget`), ties broken by the module's rule (the later position wins).
        """


class LayerAllocation(Allocation):
    """An allocation that gives every KV head of attention layer ``f`` the same count ``K_f``: implement
    :meth:`counts`; :meth:`select` checks them and keeps each head's top ``K_f`` (:func:`select_per_head`).
    Calling the object is calling :meth:`counts` (it is a :data:`LayerCounts`)."""

    @abstractmethod
    def counts(self, k: int, n_layers: int, capacity: int, gate_means: Sequence[float] | None = None) -> list[int]:
        """Per-layer per-head counts (:data:`LayerCounts`): ``n_layers`` counts in ``[0, capacity]`` summing to
        ``n_layers * k``, where ``k`` is the flat per-head budget and ``capacity`` the body length, in entries."""

    def __call__(self, k: int, n_layers: int, capacity: int, gate_means: Sequence[float] | None = None) -> list[int]:
        return self.counts(k, n_layers, capacity, gate_means)

    def describe(self) -> str:
        """Who gave the counts, in the error for counts that break the budget."""
        return f"allocation {type(self).__module__}.{type(self).__qualname__}"

    def select(
        self, scores: Sequence[torch.Tensor], n: int, prot: int, p: float, gate_means: Sequence[float] | None = None
    ) -> Kept:
        k = per_head_budget(n, prot, p)
        counts = self.counts(k, len(scores), n - prot, gate_means)
        return select_per_head(scores, check_counts(counts, k, len(scores), n - prot, self.describe()), prot)


@dataclass(frozen=True)
class CountsAllocation(LayerAllocation):
    """A :class:`LayerAllocation` made of a :data:`LayerCounts` function ``fn`` (``about``: how errors name it)."""

    fn: LayerCounts
    needs_gate_means: bool = False
    about: str = ""

    def counts(self, k: int, n_layers: int, capacity: int, gate_means: Sequence[float] | None = None) -> list[int]:
        return self.fn(k, n_layers, capacity, gate_means)

    def describe(self) -> str:
        return self.about or f"allocation {self.fn.__module__}.{self.fn.__qualname__}"


class GlobalAllocation(Allocation):
    """The ``global`` allocation (KVzip): one top-``B`` over every (layer, head, body token) score
    (:func:`select_global`), so heads may keep different counts; it has no per-layer counts."""

    def select(
        self, scores: Sequence[torch.Tensor], n: int, prot: int, p: float, gate_means: Sequence[float] | None = None
    ) -> Kept:
        n_kv_heads = scores[0].shape[0] if scores else 0
        return select_global(scores, total_budget(n, prot, p, len(scores), n_kv_heads), prot)


def flat_counts(k: int, n_layers: int, capacity: int, gate_means: Sequence[float] | None = None) -> list[int]:
    """The ``flat`` allocation (:func:`flat`)."""
    return flat(k, n_layers)


def pyramid_counts(k: int, n_layers: int, capacity: int, gate_means: Sequence[float] | None = None) -> list[int]:
    """The ``pyramid`` allocation (:func:`pyramid`)."""
    return pyramid(k, n_layers, capacity)


def gate_counts(k: int, n_layers: int, capacity: int, gate_means: Sequence[float] | None = None) -> list[int]:
    """The ``gate`` allocation (:func:`gate`); needs one gate mean per attention layer."""
    if gate_means is None or len(gate_means) != n_layers:
        raise KvbenchError("the gate allocation needs one gate mean per attention layer")
    return gate(k, gate_means, capacity)


def global_counts(k: int, n_layers: int, capacity: int, gate_means: Sequence[float] | None = None) -> list[int]:
    """The ``global`` allocation has no per-layer counts: it selects with :func:`select_global`
    (:class:`GlobalAllocation`). Always raises ValueError."""
    raise ValueError("the global allocation has no per-layer counts; use select_global")


FLAT = CountsAllocation(flat_counts)
PYRAMID = CountsAllocation(pyramid_counts)
GATE = CountsAllocation(gate_counts, needs_gate_means=True)
GLOBAL = GlobalAllocation()


def _check_allocation(name: str, obj: object) -> None:
    """The allocation registry's check: an :class:`Allocation` instance or a plain :data:`LayerCounts` function."""
    if isinstance(obj, type) or not (isinstance(obj, Allocation) or callable(obj)):
        raise RegistryError(
            f"allocation {name!r}: {obj!r} is neither an Allocation instance nor a counts function "
            "fn(k, n_layers, capacity, gate_means) -> list[int]"
        )


#: Every allocation (``--allocation``): built-ins and ``kvbench.allocations`` entry points, name -> its
#: :class:`Allocation` (or a plugin's plain :data:`LayerCounts` function; :func:`allocation` wraps it). Also the
#: collection of their names (``"gate" in ALLOCATIONS``, ``list(ALLOCATIONS)``).
ALLOCATIONS: Registry[Allocation | LayerCounts] = Registry(
    "allocation",
    "kvbench.allocations",
    {
        "flat": "kvbench.budgets:FLAT",
        "pyramid": "kvbench.budgets:PYRAMID",
        "gate": "kvbench.budgets:GATE",
        "global": "kvbench.budgets:GLOBAL",
    },
    check=_check_allocation,
)


def _about(name: str) -> str:
    return f"allocation {name!r} ({ALLOCATIONS.source(name)})"


def get_allocation(name: str) -> Allocation:
    """The allocation registered under ``name``; a plain counts function is wrapped in a :class:`CountsAllocation`
    (asking for gate means when the function has ``needs_gate_means = True``). An unknown name is a
    KvbenchError listing the valid ones."""
    obj = ALLOCATIONS.get(name)
    if isinstance(obj, Allocation):
        return obj
    return CountsAllocation(obj, bool(getattr(obj, "needs_gate_means", False)), _about(name))


def check_counts(counts: list[int], k: int, n_layers: int, capacity: int, about: str) -> list[int]:
    """``counts`` if they are ``n_layers`` counts in ``[0, capacity]`` summing to ``n_layers * k`` (an allocation's
    total is exactly the budget ``B``); else a KvbenchError naming the allocation (``about``)."""
    if len(counts) != n_layers or sum(counts) != n_layers * k or not all(0 <= c <= capacity for c in counts):
        raise KvbenchError(
            f"{about} gave per-layer counts {counts} for k={k}, {n_layers} layers, capacity {capacity}: expected "
            f"{n_layers} counts in [0, {capacity}] summing to {n_layers * k}"
        )
    return counts


def layer_counts(
    allocation: str, k: int, n_layers: int, capacity: int, gate_means: Sequence[float] | None = None
) -> list[int]:
    """Per-layer per-head counts of ``allocation``, checked (:func:`check_counts`); an allocation with no
    per-layer counts (``global``) is a ValueError."""
    chosen = get_allocation(allocation)
    if not isinstance(chosen, LayerAllocation):
        raise ValueError(f"the {allocation} allocation has no per-layer counts; it selects with its own select()")
    return check_counts(chosen.counts(k, n_layers, capacity, gate_means), k, n_layers, capacity, _about(allocation))


def _with_protected(body_idx: torch.Tensor, prot: int) -> torch.Tensor:
    """Body indices (relative to ``prot``) -> sorted absolute positions with ``0..prot-1`` prepended."""
    absolute = torch.sort(body_idx + prot).values
    return torch.cat([torch.arange(prot, dtype=torch.long, device=absolute.device), absolute])


def top_later_wins(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` largest entries along the last dim of ``scores`` ``[..., N]``, best first;
    equal scores are ordered by index, the larger (later) index first. A stable descending sort of the
    reversed row, so the result is the same on every device."""
    N = scores.shape[-1]
    order = torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices[..., :count]
    return (N - 1) - order


def select_per_head(scores: Sequence[torch.Tensor], counts: Sequence[int], prot: int) -> Kept:
    """Per layer and KV head, keep the protected prefix plus the top ``counts[f]`` body scores.

    scores[f]: ``[H_kv, n]`` (higher = keep); positions ``< prot`` are ignored. Ties: the later position
    wins (module doc).
    """
    kept: Kept = []
    for s, c in zip(scores, counts, strict=True):
        body = s[:, prot:].float()
        if c > body.shape[1]:
            raise ValueError(f"budget {c} exceeds the {body.shape[1]} body entries")
        idx = top_later_wins(body, c)
        kept.append([_with_protected(idx[h], prot) for h in range(body.shape[0])])
    return kept


def select_global(scores: Sequence[torch.Tensor], total: int, prot: int) -> Kept:
    """KVzip-style: one top-``total`` over every (layer, head, body token) score; counts may differ.

    scores[f]: ``[H_kv, n]`` on a common scale across layers. Ties: the later position wins, then the later
    layer, then the later head (module doc).
    """
    stacked = torch.stack([s[:, prot:].float() for s in scores])  # [L, H_kv, m]
    L, H, m = stacked.shape
    if total > stacked.numel():
        raise ValueError(f"budget {total} exceeds the {stacked.numel()} body entries")
    # position-major order (position, layer, head), so that a later flat index is a later position
    by_position = stacked.permute(2, 0, 1).reshape(-1)
    chosen = torch.zeros(by_position.numel(), dtype=torch.bool, device=by_position.device)
    chosen[top_later_wins(by_position, total)] = True
    mask = chosen.view(m, L, H).permute(1, 2, 0)  # [L, H_kv, m]
    return [[_with_protected(mask[f, h].nonzero().squeeze(1), prot) for h in range(H)] for f in range(L)]


def keep_all(n: int, n_layers: int, n_kv_heads: int) -> Kept:
    """Every position for every layer and head (the ``full`` method's child)."""
    return [[torch.arange(n, dtype=torch.long) for _ in range(n_kv_heads)] for _ in range(n_layers)]
