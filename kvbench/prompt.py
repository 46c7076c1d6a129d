"""Render a :class:`~kvbench.tasks.Context` into token ids through the model's chat template.

The full prompt of question ``j`` is the chat template applied to one user message
``instruction + "\\n" + body + "\\n" + question_j`` with the generation prompt, followed by the question's
answer prefix. It is split the query-agnostic way into three token-id pieces, tokenized separately
(no special tokens added):

* ``prefix_ids``: template header + instruction + "\\n" (the protected prefix, at most 256 protected);
* ``body_ids``: the body (middle-truncated when the whole would exceed the model limit);
* ``question_ids[j]``: "\\n" + question + template tail (end of turn, assistant header) + answer prefix.

Context = prefix + body; every question is appended to the same context. A tokenizer without a chat
template gets the plain concatenation (RULER's "base" template).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.budgets import protected_length
from kvbench.engines.base import context_sha256
from kvbench.errors import KvbenchError
from kvbench.tasks import Context

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


def render(tokenizer, context: Context, max_length: int | None = None) -> Rendered:
    """Tokenize ``context`` as described in the module docstring.

    max_length: the model/engine limit in tokens. If context + the longest question + its
    ``max_new_tokens`` would exceed it, the body's token ids are middle-truncated (first and last halves
    kept, as SCBench does) and ``truncated_from`` records the original context length.
    """
    head, tail = template_parts(tokenizer)
    prefix_ids = encode(tokenizer, head + context.instruction + "\n")
    body_ids = encode(tokenizer, context.body)
    question_ids = [encode(tokenizer, "\n" + q.text + tail + q.answer_prefix) for q in context.questions]
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
    """A ``PromptLength`` for generators: prefix + body + first question tokens, as :func:`render` counts."""

    def length(context: Context) -> int:
        r = render(tokenizer, context)
        return len(r.context_ids) + (len(r.question_ids[0]) if r.question_ids else 0)

    return length
