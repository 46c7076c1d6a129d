"""The run's progress display (:class:`ContextsBar`): one bar over the shard's contexts, its description the
context or step running now, its total the shard's contexts as far as known (:attr:`ShardContexts.total`). The
steps inside a context describe themselves through :meth:`kvbench.run.state.RunState.say`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rich.markup import escape
from rich.progress import Progress, TaskID

from kvbench.logs import LineProgress
from kvbench.run.plan import RunSummary
from kvbench.run.shards import ShardContexts
from kvbench.tasks import Context


@dataclass
class ContextsBar:
    """The bar ``task`` of ``progress`` over ``contexts``: :meth:`show` a context as it starts, :meth:`finished` when
    contexts' rows are all written (counted in ``summary.contexts``, told to ``on_progress(summary, total)`` when
    given), :meth:`end` when the shard is done."""

    progress: Progress | LineProgress
    task: TaskID
    contexts: ShardContexts
    summary: RunSummary
    on_progress: Callable[[RunSummary, int], None] | None = None

    def show(self, ctx: Context) -> None:
        """Describe the bar by ``ctx`` (its task and item), with the total as known now."""
        self.progress.update(self.task, description=escape(f"{ctx.task} #{ctx.item}"), total=self.contexts.total)

    def finished(self, n: int) -> None:
        """``n`` contexts' rows are all written."""
        self.summary.contexts += n
        self.progress.advance(self.task, n)
        if self.on_progress:
            self.on_progress(self.summary, self.contexts.total)

    def end(self) -> None:
        """The shard is done: the total is final."""
        self.progress.update(self.task, total=self.contexts.total)
