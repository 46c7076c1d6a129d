"""Forking and answering: a method scores a prefilled context (:func:`score_parent`), one child is forked per unit
(:func:`fork_children`), each question is answered by every child that has it pending, in one batched call
(:class:`Asked`, :func:`fork_and_answer`), and each answer is scored into one row (:func:`_answer_row`). A
query-aware method scores and forks per question (:func:`run_query_aware`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from kvbench.engines.base import Answer, AnswerGroup
from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod, QuestionInput
from kvbench.rows import Row
from kvbench.run.state import Child, ParentContext, RunState, Scored, Unit
from kvbench.scorers import score as run_scorer


def memory_limit(parent: ParentContext, *, forked: bool = False) -> int:
    """The engine's estimate of how many children of ``parent`` fit in memory answering its longest question with
    its largest answer budget (:meth:`ParentSession.answer_batch_limit`; ``forked``: the children exist already)."""
    question_tokens = max(len(ids) for ids in parent.rendered.question_ids)
    max_new = max(q.max_new_tokens for q in parent.ctx.questions)
    return parent.session.answer_batch_limit(question_tokens, max_new, forked=forked)


def score_parent(parent: ParentContext, method: EvictionMethod, question: QuestionInput | None = None) -> Scored:
    """``method``'s scores over ``parent``'s session, timed and checked; for ``question`` (a query-aware method)
    when given."""
    start = time.perf_counter()
    if question is None:
        scores = method.score(parent.session)
    else:
        scores = method.score_question(parent.session, question)
    seconds = time.perf_counter() - start
    _check_scores(method, scores, parent.session)
    return Scored(method, scores, seconds)


def fork_children(run: RunState, parent: ParentContext, units: Sequence[Unit]) -> list[Child]:
    """One child of ``parent`` per unit, keeping what its method selects at its allocation and p (released again if a
    later fork fails)."""
    ctx, session = parent.ctx, parent.session
    children: list[Child] = []
    try:
        for unit in units:
            run.say(f"{ctx.task} #{ctx.item} {unit.scored.method.name} [{unit.allocation}] p={unit.p}: fork")
            kept = unit.scored.method.select(session, unit.scored.scores, unit.p, unit.allocation)
            children.append(Child(unit.allocation, unit.p, session.fork(kept)))
    except BaseException:
        for child in children:
            child.session.release()
        raise
    return children


@dataclass(frozen=True)
class Asked:
    """One question of ``parent``'s context (index ``qi``) for the children that have it pending: ``answering``
    pairs each unit with its child."""

    parent: ParentContext
    qi: int
    answering: list[tuple[Unit, Child]]

    def group(self) -> AnswerGroup:
        """What the engine answers."""
        rendered, q = self.parent.rendered, self.parent.ctx.questions[self.qi]
        return AnswerGroup(
            self.parent.session,
            [c.session for _, c in self.answering],
            rendered.question_ids[self.qi],
            q.max_new_tokens,
            rendered.sha256,
        )


def asked_of(parent: ParentContext, units: Sequence[Unit], children: Sequence[Child]) -> list[Asked]:
    """Per question with pending rows, in order, the children answering it."""
    return [
        Asked(parent, qi, [(u, c) for u, c in zip(units, children, strict=True) if qi in u.questions])
        for qi in sorted({qi for unit in units for qi in unit.questions})
    ]


def write_rows(run: RunState, asked: Asked, answers: Sequence[Answer]) -> None:
    """Append the rows of ``asked``'s answers."""
    for (unit, child), ans in zip(asked.answering, answers, strict=True):
        run.store.append(_answer_row(run, asked.parent, unit.scored, child, asked.qi, ans).to_dict())
        run.summary.rows_written += 1


def fork_and_answer(run: RunState, parent: ParentContext, units: Sequence[Unit]) -> None:
    """Fork ``parent`` once per unit, then per question answer it from every child that has it pending, all of them
    in one :meth:`EngineBase.answer_groups` call of one group (its parent's ``answer_children``: one batched decode
    on an engine that batches), and append their rows; release the children."""
    ctx = parent.ctx
    children = fork_children(run, parent, units)
    try:
        for asked in asked_of(parent, units, children):
            q, (unit, child) = ctx.questions[asked.qi], asked.answering[0]
            alone = f"{unit.scored.method.name} [{child.allocation}] p={child.p}"
            who = alone if len(asked.answering) == 1 else f"{len(asked.answering)} children"
            run.say(f"{ctx.task} #{ctx.item} q={q.qid}: {who}")
            write_rows(run, asked, run.engine.answer_groups([asked.group()])[0])
    finally:
        for child in children:
            child.session.release()


def run_query_aware(
    run: RunState,
    parent: ParentContext,
    method: EvictionMethod,
    todo: dict[tuple[str, float], list[int]],
    batch: int,
) -> None:
    """The per-question path of a query-aware method: for each question with pending rows (``todo``, as
    :data:`Pending` holds it for ``method``), score once (it sees the question's token ids and answer budget,
    never its references), then per (allocation, p) fork a child and answer that question alone, up to ``batch``
    children together. ``score_s`` of a row is that question's scoring time."""
    ctx, rendered = parent.ctx, parent.rendered
    for qi, q in enumerate(ctx.questions):
        settings = [(alloc, p) for (alloc, p), questions in todo.items() if qi in questions]
        if not settings:
            continue
        run.say(f"{ctx.task} #{ctx.item} {method.name} q={q.qid}: scoring")
        scored = score_parent(parent, method, QuestionInput(tuple(rendered.question_ids[qi]), q.max_new_tokens))
        units = [Unit(scored, alloc, p, [qi]) for alloc, p in settings]
        for start in range(0, len(units), batch):
            fork_and_answer(run, parent, units[start : start + batch])


def _check_scores(method: EvictionMethod, scores: Sequence[torch.Tensor], parent) -> None:
    want = (parent.n_kv_heads, parent.n)
    if len(scores) != parent.n_attn_layers or any(tuple(s.shape) != want for s in scores):
        got = [tuple(s.shape) for s in scores]
        raise KvbenchError(
            f"method {method.name} returned scores of shapes {got}; expected {parent.n_attn_layers} tensors of {want}"
        )
    if any(not torch.isfinite(s[:, parent.prot :]).all() for s in scores):
        raise KvbenchError(f"method {method.name} returned NaN or infinite scores")


def _answer_row(run: RunState, parent: ParentContext, scored: Scored, child: Child, qi: int, ans: Answer) -> Row:
    """The result row of ``child``'s answer ``ans`` to question ``qi`` of ``parent``'s context, scored."""
    ctx, rendered, method = parent.ctx, parent.rendered, scored.method
    q = ctx.questions[qi]
    scores = {name: run_scorer(name, ans.text, q.references) for name in q.scorers}
    stats = child.session.stats
    return Row.of(
        run.key(parent, method, child.allocation, child.p, q.qid),
        prediction=ans.text,
        references=list(q.references),
        score=scores[q.scorers[0]],
        scorer=q.scorers[0],
        scores=scores,
        real_fork=stats.real_fork,
        query_aware=method.query_aware,
        default_allocation=method.default_allocation,
        kept_entries=stats.kept_entries,
        full_entries=stats.full_entries,
        stored_bytes=stats.stored_bytes,
        full_bytes=stats.full_bytes,
        padded=stats.padded,
        n_context=parent.session.n,
        prot=parent.session.prot,
        truncated_from=rendered.truncated_from,
        prefill_s=parent.session.prefill_seconds,
        score_s=scored.seconds,
        fork_s=child.session.fork_seconds,
        answer_s=ans.seconds,
        answer_batch=ans.batch,
        new_tokens=len(ans.token_ids),
        stopped=ans.stopped,
        random_weights=run.lm.random_weights,
        meta=ctx.meta,
        method_options=method.method_options(),
    )
