"""Allocations (``--allocation``): how a kept fraction's budget is shared among the attention layers and heads.

An allocation is an :class:`Allocation` in the :data:`ALLOCATIONS` registry. The per-layer ones
(:class:`LayerAllocation`: ``flat``, ``pyramid``, ``gate``) turn the flat per-head budget ``k``
(:func:`kvbench.budgets.per_head_budget`) into per-attention-layer counts ``K_l`` (each KV head of layer ``l``
keeps ``K_l`` body entries) with ``sum_l K_l * H_kv == B`` exactly. ``global`` (:class:`GlobalAllocation`) selects
the top ``B`` (layer, head, token) scores directly, so counts may differ per head: it declares itself
:attr:`Allocation.ragged`. The arithmetic is :mod:`kvbench.budgets`', the selections :mod:`kvbench.selection`'s;
this module imports no torch (``kvbench run --help`` lists the allocations from :data:`ALLOCATIONS`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbench.budgets import apportion, per_head_budget, total_budget
from kvbench.errors import KvbenchError
from kvbench.registry import Registry, RegistryError

if TYPE_CHECKING:
    import torch

    from kvbench.selection import Kept

PYRAMID_BETA = 20
PYRAMID_MIN = 4


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
    given None. Per-layer allocations subclass :class:`LayerAllocation` and only compute counts. ``ragged``: True
    if the KV heads of one layer may keep different counts (``global``): a child of it is stored padded or paged
    (``kvbench cost`` measures its storage).
    """

    needs_gate_means: bool = False
    ragged: bool = False

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
        from kvbench.selection import select_per_head  # torch: imported when an allocation selects, not to list

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
    (:func:`kvbench.selection.select_global`), so heads may keep different counts; it has no per-layer counts."""

    ragged = True

    def select(
        self, scores: Sequence[torch.Tensor], n: int, prot: int, p: float, gate_means: Sequence[float] | None = None
    ) -> Kept:
        n_kv_heads = scores[0].shape[0] if scores else 0
        from kvbench.selection import select_global

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
        "flat": "kvbench.allocations:FLAT",
        "pyramid": "kvbench.allocations:PYRAMID",
        "gate": "kvbench.allocations:GATE",
        "global": "kvbench.allocations:GLOBAL",
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

