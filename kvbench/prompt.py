"""Render a :class:`~kvbench.tasks.Context` into token ids through the model's chat template.

The full prompt of question ``j`` is the chat template applied to one user message
``instruction + glue + body + "\\n" + question_j`` with the generation prompt, followed by the question's
answer prefix (``glue`` is the context's, ``"\\n"`` unless the bench says otherwise). It is split the
query-agnostic way into three token-id pieces, tokenized separately (no special tokens added):

* ``prefix_ids``: template header + instruction + glue (the protected prefix, at most 256 protected);
* ``body_ids``: the body (middle-truncated when the whole would exceed the model limit);
* ``question_ids[j]``: "\\n" + question + template tail (end of turn, assistant header) + answer prefix.

Context = prefix + body; every question is appended to the same context. A tokenizer without a chat
template gets the plain concatenation (RULER's "base" template), with one space between the question
and a non-empty answer prefix, as RULER writes ``"...text? The special magic..."``.

:func:`prompt_length` counts the whole prompt text tokenized in one piece, as RULER's scripts count
``input + answer_prefix``; with a BPE tokenizer that can differ by a token or two from the sum of the
three pieces above (a byte-level tokenizer gives the same count either way).

**A bench's own assembly**: a context whose ``assembly`` is not ``"kvbench"`` is rendered, counted and written
out by the :class:`~kvbench.tasks.Assembly` its bench declares under that name (:attr:`kvbench.tasks.Bench.assemblies`,
found by :func:`kvbench.tasks.context_assembly`); SCBench's reproduces the official shared-context prompt
(:mod:`kvbench.tasks.scbench_prompt`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.budgets import protected_length
from kvbench.engines.base import context_sha256
from kvbench.errors import KvbenchError
from kvbench.tasks import Context, context_assembly

_BODY = "\x00KVBENCH_BODY\x00"
_QUESTION = "\x00KVBENCH_QUESTION\x00"


@dataclass(frozen=True)
class Rendered:
    """Token ids of one context and its questions, and how the context was cut."""

    prefix_ids: list[int]
    body_ids: list[int]
    question_ids: list[list[int]]
    truncated_from: int | None  # context length before middle truncation, None if not truncated

    @property
    def context_ids(self) -> list[int]:
        return self.prefix_ids + self.body_ids

    @property
    def prot(self) -> int:
        return protected_length(len(self.prefix_ids), len(self.context_ids))

    @property
    def sha256(self) -> str:
        return context_sha256(self.context_ids)


def template_parts(tokenizer) -> tuple[str, str]:
    """(head, tail) of the chat template around the user content: head + content + tail."""
    if not getattr(tokenizer, "chat_template", None):
        return "", ""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _BODY}], tokenize=False, add_generation_prompt=True
    )
    head, _, tail = text.partition(_BODY)
    if not _:
        raise KvbenchError("the tokenizer's chat template does not place the user content verbatim")
    return head, tail


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens added (``[]`` for empty text)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _question_text(question, tail: str) -> str:
    """What follows the body for one question: "\\n" + question + template tail + answer prefix, with a
    space before a non-empty answer prefix when there is no chat template (RULER's base template)."""
    sep = " " if not tail and question.answer_prefix else ""
    return "\n" + question.text + tail + sep + question.answer_prefix


def prompt_text(tokenizer, context: Context, j: int = 0) -> str:
    """The whole prompt of question ``j`` as one string: what :func:`render`'s pieces encode, joined."""
    own = context_assembly(context)
    if own is not None:
        return own.prompt_text(tokenizer, context, j)
    head, tail = template_parts(tokenizer)
    return head + context.instruction + context.glue + context.body + _question_text(context.questions[j], tail)


def render(tokenizer, context: Context, max_length: int | None = None) -> Rendered:
    """Tokenize ``context`` as described in the module docstring (its bench's own assembly when
    ``context.assembly`` is not ``"kvbench"``).

    max_length: the model/engine limit in tokens. If context + the longest question + its
    ``max_new_tokens`` would exceed it, the body's token ids are middle-truncated (first and last halves
    kept, as SCBench does) and ``truncated_from`` records the original context length.
    """
    own = context_assembly(context)
    if own is not None:
        return own.render(tokenizer, context, max_length)
    head, tail = template_parts(tokenizer)
    prefix_ids = encode(tokenizer, head + context.instruction + context.glue)
    body_ids = encode(tokenizer, context.body)
    question_ids = [encode(tokenizer, _question_text(q, tail)) for q in context.questions]
    if not body_ids:
        raise KvbenchError(f"empty context body in {context.bench}/{context.task} item {context.item}")
    truncated_from = None
    if max_length is not None:
        need = max(
            (len(q) + spec.max_new_tokens for q, spec in zip(question_ids, context.questions, strict=False)), default=0
        )
        room = max_length - len(prefix_ids) - need
        if room < 2:
            raise KvbenchError(
                f"{context.bench}/{context.task} item {context.item}: the instruction and questions alone need "
                f"{max_length - room} of the {max_length} tokens the model allows"
            )
        if len(body_ids) > room:
            truncated_from = len(prefix_ids) + len(body_ids)
            body_ids = body_ids[: room // 2] + body_ids[len(body_ids) - (room - room // 2) :]
    return Rendered(prefix_ids, body_ids, question_ids, truncated_from)


def prompt_length(tokenizer):
    """A ``PromptLength`` for generators: tokens of the whole prompt of the first question
    (:func:`prompt_text`, tokenized in one piece as RULER counts). The returned callable also has
    ``text_tokens(text) -> int``, the token count of raw text (RULER counts its one-shot examples so), and
    ``tokenizer``. A context in its bench's own assembly counts as that assembly's
    :meth:`~kvbench.tasks.Assembly.prompt_length` says (SCBench's: its context prompt and first query as
    :func:`render` encodes them)."""

    def length(context: Context) -> int:
        own = context_assembly(context)
        if own is not None:
            return own.prompt_length(tokenizer, context)
        if not context.questions:
            head, _ = template_parts(tokenizer)
            return len(encode(tokenizer, head + context.instruction + context.glue + context.body))
        return len(encode(tokenizer, prompt_text(tokenizer, context)))

    length.text_tokens = lambda text: len(encode(tokenizer, text))
    length.tokenizer = tokenizer
    return length
