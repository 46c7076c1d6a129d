"""The answer pool (:class:`AnswerPool`): the children of several contexts answer together in one batched decode,
so the few long answers that end each context's decode share their steps with other contexts'.
"""

from __future__ import annotations

from typing import Callable, Sequence

from kvbench.engines.base import EngineBase
from kvbench.run.answer import Asked, asked_of, fork_children, memory_limit, write_rows
from kvbench.run.plan import ANSWER_CONTEXTS, RunConfig
from kvbench.run.state import Child, ParentContext, RunState, Unit


def pool_size(config: RunConfig, engine: EngineBase) -> int:
    """How many contexts an :class:`AnswerPool` of this run holds: ``--answer-contexts`` (default
    :data:`ANSWER_CONTEXTS`); 1 (none pooled) with ``--answer-batch`` or an engine without a batched decode."""
    if config.answer_batch is not None or not engine.batches_children:
        return 1
    return ANSWER_CONTEXTS if config.answer_contexts is None else config.answer_contexts


class AnswerPool:
    """Contexts whose children wait to answer together: every question of up to ``size`` contexts (each context's
    children forked, its parent live) in one :meth:`EngineBase.answer_groups` decode, so the few long answers
    that end each context's decode share their steps with other contexts'. ``add`` flushes first when the pool is
    full or the new rows would pass what memory holds; ``flush`` answers, writes every row, releases children and
    parents and tells ``finished`` how many contexts it completed. Leaving the ``with`` block releases whatever is
    still held (an error: those rows were never written; a rerun makes them)."""

    def __init__(self, run: RunState, size: int, finished: Callable[[int], None]) -> None:
        self.run, self.size, self.finished = run, size, finished
        self.held: list[tuple[ParentContext, list[Child], list[Asked]]] = []

    @property
    def enabled(self) -> bool:
        """Whether contexts are pooled at all (size > 1)."""
        return self.size > 1

    @property
    def rows(self) -> int:
        """Rows waiting: a child answering two questions counts twice (two rows of the decode)."""
        return sum(len(a.answering) for _, _, asked in self.held for a in asked)

    def add(self, parent: ParentContext, units: Sequence[Unit]) -> None:
        """Fork ``parent``'s children for ``units`` and hold them (and the parent) until the pool flushes: first
        when it holds ``size`` contexts, or when the new rows would pass what memory holds (then the held
        contexts are answered before this one joins)."""
        if len(self.held) >= self.size:
            self.flush()
        try:
            children = fork_children(self.run, parent, units)
        except BaseException:
            parent.session.release()
            raise
        rows = sum(len(u.questions) for u in units)
        if self.held and self.rows + rows > memory_limit(parent, forked=True):  # the rows' batch buffers, GDN states
            self.flush()
        self.held.append((parent, children, asked_of(parent, units, children)))

    def flush(self) -> None:
        """Answer every held question in one decode, write the rows, release what the pool holds."""
        if not self.held:
            return
        run = self.run
        try:
            asked = [a for _, _, context_asked in self.held for a in context_asked]
            where = ", ".join(f"{p.ctx.task} #{p.ctx.item}" for p, _, _ in self.held)
            run.say(f"{where}: {self.rows} answers")
            answers = run.engine.answer_groups([a.group() for a in asked])
            for a, group_answers in zip(asked, answers, strict=True):
                write_rows(run, a, group_answers)
            done = len(self.held)
        finally:
            self.release()
        self.finished(done)

    def release(self) -> None:
        """Release every held child and parent, answered or not."""
        held, self.held = self.held, []
        for parent, children, _ in held:
            for child in children:
                child.session.release()
            parent.session.release()

    def __enter__(self) -> AnswerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
