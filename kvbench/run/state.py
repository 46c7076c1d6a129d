"""What the contexts of one run share and pass around: the run's state (:class:`RunState`: configuration, model,
engine, plan, artifacts, results store, summary and the progress bar its steps are shown on), a prefilled
context (:class:`ParentContext`), a method's scores (:class:`Scored`), a forked child (:class:`Child`), one child
to fork and the questions it answers (:class:`Unit`), and the rows still to make (:data:`Pending`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from rich.markup import escape
from rich.progress import Progress, TaskID

from kvbench.engines.base import ChildSession, EngineBase, ParentSession
from kvbench.logs import LineProgress
from kvbench.methods import EvictionMethod
from kvbench.models import LoadedModel
from kvbench.prompt import Rendered
from kvbench.results.store import ResultsStore
from kvbench.rows import RowKey
from kvbench.run.plan import PlanEntry, RunConfig, RunSummary
from kvbench.tasks import Context


@dataclass(frozen=True)
class ParentContext:
    """One context as the engine sees it: ``ctx``, its token ids (``rendered``: context and question ids, their
    SHA-256, the length before truncation) and, once prefilled, ``session``, the parent every child forks from
    (its ``n``, ``prot`` and ``prefill_seconds`` go into the rows; None before the prefill)."""

    ctx: Context
    rendered: Rendered
    session: ParentSession | None = None


@dataclass(frozen=True)
class Scored:
    """``method``'s scores over a parent: ``scores`` one ``[n_kv_heads, n]`` tensor per attention layer,
    ``seconds`` the wall time of scoring (a query-aware method's: of its one question)."""

    method: EvictionMethod
    scores: Sequence[torch.Tensor]
    seconds: float


@dataclass(frozen=True)
class Child:
    """A fork of the parent for one ``allocation`` and kept fraction ``p``: ``session`` holds the entries the
    method kept (its ``stats`` and ``fork_seconds`` go into the rows)."""

    allocation: str
    p: float
    session: ChildSession


@dataclass(frozen=True)
class Unit:
    """One child to fork and what it answers: ``scored``'s selection at (``allocation``, ``p``), and the indices of
    the context's questions whose rows are pending for it."""

    scored: Scored
    allocation: str
    p: float
    questions: list[int]


@dataclass(frozen=True)
class RunState:
    """What every context of one run shares: ``config`` (defaults resolved), the model ``lm`` and its
    ``engine``, the ``plan``, each method label's ``artifacts`` digest, the results ``store``, the ``summary``
    counted as rows go, and the progress bar (``progress``, ``bar``)."""

    config: RunConfig
    lm: LoadedModel
    engine: EngineBase
    plan: list[PlanEntry]
    artifacts: dict[str, str | None]
    store: ResultsStore
    summary: RunSummary
    progress: Progress | LineProgress
    bar: TaskID

    @property
    def query_window(self) -> int:
        """The most trailing context tokens any method of the plan reads queries of (at least 1)."""
        return max([m.query_window for m, _, _ in self.plan] + [1])

    def say(self, text: str) -> None:
        """Show ``text`` as the progress bar's description."""
        self.progress.update(self.bar, description=escape(text))

    def key(self, parent: ParentContext, method: EvictionMethod, allocation: str, p: float, qid: str) -> RowKey:
        """The identity of the row of question ``qid`` of ``parent``, answered by ``method`` at (``allocation``,
        ``p``)."""
        config, lm, ctx = self.config, self.lm, parent.ctx
        return RowKey(
            model=lm.name,
            engine=config.engine,
            method=method.label,
            allocation=allocation,
            p=p,
            bench=ctx.bench,
            task=ctx.task,
            item=ctx.item,
            question=qid,
            length=config.length,
            seed=config.seed,
            context_sha256=parent.rendered.sha256,
            model_fingerprint=lm.fingerprint,
            artifact_sha256=self.artifacts[method.label],
            source=ctx.source,
        )


#: Per method label, per (allocation, p): indices of the context's questions whose rows are not stored yet.
Pending = dict[str, dict[tuple[str, float], list[int]]]
