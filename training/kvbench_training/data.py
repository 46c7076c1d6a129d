"""Training rows: the task mix, the length curriculum, one row per task kind, and the batch of a step.

Every training row draws its own generator seed from ``random.Random(f"kvbench-train:{seed}:{step}:{row}")``
(:func:`row_rng`) in ``[TRAIN_SEED_BASE, 2**31)``, so training contexts never come from the evaluation seed
(:data:`EVAL_SEED`), and the batch of step ``s`` is a pure function of ``(seed, s)``: resuming needs no data
replay. RULER rows use the RULER tasks that need no external data (niah_single_1, niah_multikey_2,
niah_multikey_3, vt, fwe and cwe; a RULER task that cannot fit the row falls back to a recall row).

Rows are ``[prompt | answer | <|im_end|> | pad...]`` with a ``loss_mask`` of 1 on the supervised tokens;
rows are right-padded and the model is causal, so padding never influences real tokens.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Sequence
from typing import NamedTuple

import torch

from kvbench.errors import KvbenchError
from kvbench.prompt import encode
from kvbench.tasks.calibration_corpus import synthetic_text

TRAIN_SEED_BASE = 10_000  # training generator seeds are >= this; evaluation uses seed 42
EVAL_SEED = 42
#: The seeds evaluation uses by default: ``kvbench run``'s and ``scbench generate``'s default (42) and the
#: second seed the model-card targets are measured at (43). Every one is below :data:`TRAIN_SEED_BASE`, so no
#: training row is an evaluation item (``tests/test_train_seeds.py`` checks the seeds the data code uses).
EVAL_SEEDS: tuple[int, ...] = (EVAL_SEED, 43)

#: A training mix: ``(task, weight)`` pairs, weights summing to 1 (lists ``[task, weight]`` work alike).
Mix = Sequence[tuple[str, float]]
#: A length curriculum: ``(start fraction of the steps, row length in tokens)`` pairs, starts increasing.
Curriculum = Sequence[tuple[float, int]]
#: The pieces of one unpadded row: token ids, loss mask (1 = supervised, same length) and the references the
#: supervised tokens spell.
RowParts = tuple[list[int], list[int], tuple]

#: (task, weight) of the training mix. RULER task names are RULER rows rendered as for evaluation; the
#: two dense rows teach the circuits the RULER rows need with many more supervised tokens per row:
#: "recall" is needles followed by many answered questions in RULER's surface form (associative recall),
#: "chains" is vt without its one-shot example (several chains, every one asked), "repeat" is a synthetic
#: text segment written twice (copying; the loss is on the second copy). "recall" asks every needle once, so
#: its last answers can be had by elimination; "lookup" (not in this first-stage mix) asks needles drawn
#: with replacement, so only matching the key answers it; "echo" is "lookup" with each question in the
#: needle's own wording (``... for KEY is:``), which a copying (induction) head can answer: a stepping stone
#: to key matching in RULER's wording.
TASK_MIX: tuple[tuple[str, float], ...] = (
    ("niah_single_1", 0.15),
    ("niah_multikey_2", 0.10),
    ("niah_multikey_3", 0.10),
    ("vt", 0.15),
    ("fwe", 0.10),
    ("cwe", 0.05),
    ("recall", 0.20),
    ("chains", 0.10),
    ("repeat", 0.05),
)
#: The needle-question rows and how each draws its questions (see :func:`recall_row`).
RECALL_DRAWS = {"recall": "every", "lookup": "replace", "echo": "echo"}
DENSE_TASKS = (*RECALL_DRAWS, "chains", "repeat")  # rows built here, not RULER items
#: SCBench's offline-generated tasks as training rows (``scbench_<task>``, see :func:`scbench_row`).
SCBENCH_TASKS = ("scbench_kv", "scbench_mf", "scbench_prefix_suffix", "scbench_vt")
#: The key-matching curriculum's kv rows (see :func:`kv_curriculum_row`): task -> (fewest, most) key-value
#: pairs in the context. The full 4,096-token context (about 51 pairs) is ``scbench_kv``.
KV_CURRICULUM: dict[str, tuple[int, int]] = {
    "scbench_kv8": (4, 8),
    "scbench_kv16": (9, 16),
    "scbench_kv32": (17, 32),
    "scbench_kv8_echo": (4, 8),  # the answer first repeats the pair's own text up to its value (see kv_curriculum_row)
    # keys cut to their first 4-8 hex characters (one to a few tokens instead of a 36-character UUID; see
    # shorten_kv_keys): the step between copying a value and matching a multi-token key
    "scbench_kv8_short": (4, 8),
    "scbench_kv8_short_echo": (4, 8),
    # the answer is the pair's own text, "KEY": "VALUE, all of it supervised (the model quotes the asked pair; the
    # kv scorer counts the value as a substring, so the quote scores as the bare value does)
    "scbench_kv8_short_say": (4, 8),
    "scbench_kv8_say": (4, 8),
    "scbench_kv16_say": (9, 16),
    "scbench_kv32_say": (17, 32),
    # up to the full 4,096-token context: a count drawn in 33-64 is cut to what fits (about 51 pairs at 4,096)
    "scbench_kv64_say": (33, 64),
}
#: the range of key lengths (hex characters) of the ``*_short`` curriculum rows
SHORT_KEY_CHARS = (4, 8)
#: Training-only SCBench rows smaller than the generator's smallest (see :func:`short_scbench_row`): task ->
#: (SCBench task, fewest distractors per target, most). The generator's smallest prefix_suffix row (5 targets,
#: 25 strings) and vt row (5 chains of 5 variables) need about 690 and 935 tokens; these ask 1-5 questions.
SCBENCH_SHORT: dict[str, tuple[str, int, int]] = {
    "scbench_ps_short": ("prefix_suffix", 0, 2),  # 0 distractors: the prefix alone names the string (copying)
    "scbench_ps_hard": ("prefix_suffix", 2, 2),  # SCBench's 2 + 2 distractors per target, fewer targets
    "scbench_vt_short": ("vt", 0, 0),  # 1-5 chains of 4 hops (vt has no distractors)
}
#: Every task a mix may name.
KNOWN_TASKS = tuple(t for t, _ in TASK_MIX) + ("lookup", "echo", *SCBENCH_TASKS, *KV_CURRICULUM, *SCBENCH_SHORT)
FALLBACK_TASK = "recall"  # "lookup" instead when the mix has it (see training_example)

#: (start fraction, row length) of the shipped model's run: 128-token rows first (associative recall is
#: learned there within a few hundred steps), then 256, 512 and a short 1,024 stage.
DEFAULT_CURRICULUM: tuple[tuple[float, int], ...] = ((0.0, 128), (0.156, 256), (0.779, 512), (0.961, 1024))


class Example(NamedTuple):
    input_ids: torch.Tensor  # [length] long, right-padded with the pad id
    loss_mask: torch.Tensor  # [length] long, 1 on the supervised tokens (see training_example)
    task: str
    references: tuple  # the answers the supervised tokens spell (empty for "repeat")


# --------------------------------------------------------------------------------------------------
# Mix and curriculum


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``"niah_multikey_2=0.3,recall=0.7"`` -> ``(("niah_multikey_2", 0.3), ("recall", 0.7))``: a training
    mix (weights must be positive and sum to 1; tasks from :data:`KNOWN_TASKS`)."""
    try:
        mix = tuple((t.strip(), float(w)) for t, _, w in (part.partition("=") for part in text.split(",")))
    except ValueError:
        raise KvbenchError(f"--mix {text!r}: expected TASK=WEIGHT,... e.g. niah_multikey_2=0.5,recall=0.5") from None
    unknown = [t for t, _ in mix if t not in KNOWN_TASKS]
    if unknown:
        raise KvbenchError(f"--mix: unknown task(s) {unknown}; choose from {sorted(KNOWN_TASKS)}")
    if any(w <= 0 for _, w in mix) or abs(sum(w for _, w in mix) - 1.0) > 1e-6:
        raise KvbenchError(f"--mix {text!r}: weights must be positive and sum to 1")
    return mix


def choose_task(rng: random.Random, mix: Mix = TASK_MIX) -> str:
    """A task of ``mix`` drawn with its weight (one ``rng.random()`` draw)."""
    x, acc = rng.random(), 0.0
    for task, w in mix:
        acc += w
        if x < acc:
            return task
    return mix[-1][0]


def parse_curriculum(text: str) -> tuple[tuple[float, int], ...]:
    """``"256@0,512@0.3,1024@0.6"`` -> ``((0.0, 256), (0.3, 512), (0.6, 1024))`` (row length @ start fraction)."""
    try:
        stages = tuple(
            (float(start), int(n)) for n, _, start in (part.strip().partition("@") for part in text.split(","))
        )
    except ValueError:
        raise KvbenchError(f"--curriculum {text!r}: expected LENGTH@FRACTION,... e.g. 256@0,512@0.3") from None
    if not stages or stages[0][0] != 0.0 or any(b[0] <= a[0] for a, b in zip(stages, stages[1:], strict=False)):
        raise KvbenchError(f"--curriculum {text!r}: the first stage must start at 0 and starts must increase")
    return stages


def curriculum_length(curriculum: Curriculum, step: int, steps: int) -> int:
    """Row length (tokens) at ``step`` of ``steps``: the last ``(start_fraction, length)`` whose start is reached."""
    length = curriculum[0][1]
    for start, n in curriculum:
        if step >= int(start * steps):
            length = n
    return length


# --------------------------------------------------------------------------------------------------
# Text shared with the tokenizer corpus (the haystack text itself: kvbench.tasks.calibration_corpus.synthetic_text)


def ruler_bench():
    """The RULER bench training data is drawn from: ``per_item`` sampling (one seeded draw per example, the
    draws the shipped model was trained on; ``official`` RULER sampling is for evaluation)."""
    from kvbench.tasks.ruler import RulerBench

    bench = RulerBench()
    bench.sampling = "per_item"
    return bench


def answer_text(task: str, question) -> str:
    """The reference answer as the model should write it after the answer prefix (string_match_all
    only needs every reference present; the format follows RULER's one-shot examples)."""
    refs = list(question.references)
    if task == "cwe":
        return " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(refs))
    if task == "vt":
        return " ".join(refs)  # vt's prefix already ends with a space
    if len(refs) == 1:
        return " " + refs[0]
    return " " + ", ".join(refs[:-1]) + ", and " + refs[-1] if task.startswith("niah") else " " + " ".join(refs)


# --------------------------------------------------------------------------------------------------
# Rows of RULER and SCBench items


def ruler_row(task: str, ex_seed: int, length: int, tokenizer) -> RowParts | None:
    """(ids, answer mask, references) of one RULER item sized so that prompt + answer + eos <= ``length``
    tokens, or None when the task cannot fit ``length``."""
    from kvbench.prompt import render

    eos = tokenizer.eos_token_id

    def measure(ctx) -> int:  # the bench checks measure + max_new_tokens <= length
        r = render(tokenizer, ctx)
        q = ctx.questions[0]
        answer = encode(tokenizer, answer_text(ctx.task, q))
        return len(r.context_ids) + len(r.question_ids[0]) + len(answer) + 1 - q.max_new_tokens

    try:
        ctx = next(iter(ruler_bench().contexts(task, length=length, limit=1, seed=ex_seed, prompt_length=measure)))
    except KvbenchError:
        return None
    r = render(tokenizer, ctx)
    q = ctx.questions[0]
    answer = encode(tokenizer, answer_text(ctx.task, q)) + [eos]
    prompt = r.context_ids + r.question_ids[0]
    return prompt + answer, [0] * len(prompt) + [1] * len(answer), tuple(q.references)


def scbench_answer(task: str, references: tuple[str, ...]) -> str:
    """What the model should write for a generated SCBench question: the value (kv), the number (mf), the
    string (prefix_suffix) or the chain's variables in order (vt, after its answer prefix's space)."""
    return " ".join(references) if task == "vt" else references[0]


def _scbench_pieces(name: str, row: dict, tokenizer):
    """(rendered, answer ids per question, context) of a generated SCBench hub row ``row`` of task ``name``,
    rendered as evaluation renders it; each answer is :func:`scbench_answer`'s text then ``<|im_end|>``."""
    from kvbench.prompt import render
    from kvbench.tasks.scbench import build_context

    ctx = build_context(name, 0, row, {}, source="generated")
    rendered = render(tokenizer, ctx)
    eos = tokenizer.eos_token_id
    answers = [encode(tokenizer, scbench_answer(name, q.references)) + [eos] for q in ctx.questions]
    return rendered, answers, ctx


def _scbench_size(name: str, row: dict, tokenizer) -> int:
    """Tokens of the training row of ``row``: the context prompt, then every question and its answer."""
    rendered, answers, _ = _scbench_pieces(name, row, tokenizer)
    return len(rendered.context_ids) + sum(len(q) + len(a) for q, a in zip(rendered.question_ids, answers, strict=True))


def _scbench_parts(name: str, row: dict, tokenizer) -> RowParts:
    """The training row of a generated SCBench hub row: the context prompt, then each question followed by
    its supervised answer and ``<|im_end|>``."""
    rendered, answers, ctx = _scbench_pieces(name, row, tokenizer)
    ids = list(rendered.context_ids)
    mask = [0] * len(ids)
    for question, answer in zip(rendered.question_ids, answers, strict=True):
        ids += question + answer
        mask += [0] * len(question) + [1] * len(answer)
    return ids, mask, tuple(scbench_answer(name, q.references) for q in ctx.questions)


def scbench_row(task: str, ex_seed: int, length: int, tokenizer) -> RowParts | None:
    """(ids, answer mask, references) of one generated SCBench row (``task`` is ``scbench_<task>``) rendered
    as evaluation renders it (SCBench's assembly: the context prompt, each query appended directly), then
    every question of the row with its answer and ``<|im_end|>``, one after another, all supervised. (At
    evaluation each question follows the context alone; here the later questions also see the earlier
    answered ones, which packs five targets into one context.) Sized so the whole row fits ``length``
    tokens; None when even the smallest row does not."""
    from kvbench.tasks.scbench_generate import generate_row

    name = task.removeprefix("scbench_")
    try:
        row = generate_row(name, 0, length=length, seed=ex_seed, measure=lambda r: _scbench_size(name, r, tokenizer))
    except KvbenchError:  # too short for even the smallest row
        return None
    return _scbench_parts(name, row, tokenizer)


def short_scbench_row(task: str, ex_seed: int, length: int, tokenizer) -> RowParts | None:
    """(ids, answer mask, references) of a training-only small SCBench row (``task`` a key of
    :data:`SCBENCH_SHORT`): the generator's own row for seed ``ex_seed`` (row 0) with a number of questions
    drawn in 1..TURNS and, for prefix_suffix, of distractors per target drawn in the task's range, filled (list
    strings, noise lines) to ``length`` tokens and rendered as :func:`scbench_row` renders it. Answers are the
    generator's: the one string (prefix_suffix; never a list of candidates, whose substrings the official
    scorer would count), the chain's variables (vt). Fewer questions are tried when the drawn number does not
    fit; None when one question does not."""
    from kvbench.tasks.scbench_generate import TURNS, generate_row

    name, fewest, most = SCBENCH_SHORT[task]
    rng = random.Random(f"kvbench-scbench-short:{ex_seed}")
    turns, distractors = rng.randint(1, TURNS), rng.randint(fewest, most)
    extra = {"distractors": distractors} if name == "prefix_suffix" else {}
    for n in range(turns, 0, -1):
        try:
            row = generate_row(
                name, 0, length=length, seed=ex_seed, measure=lambda r: _scbench_size(name, r, tokenizer),
                turns=n, **extra,
            )  # fmt: skip
        except KvbenchError:  # too short for this many questions
            continue
        return _scbench_parts(name, row, tokenizer)
    return None


def kv_curriculum_row(task: str, ex_seed: int, length: int, tokenizer) -> RowParts | None:
    """(ids, answer mask, references) of a key-matching curriculum row (``task`` a key of
    :data:`KV_CURRICULUM`): an SCBench kv context (``"JSON data:"`` and UUID pairs, the generator's own pairs
    for seed ``ex_seed``, row 0) with a pair count drawn uniformly from the task's range, rendered as
    evaluation renders it, then up to :data:`~kvbench.tasks.scbench_generate.TURNS` questions in the
    generator's wording, each asking a distinct key drawn anywhere in the context and followed by its
    supervised value and ``<|im_end|>``. At most ``pairs - 1`` keys are asked, so no answer can be had by
    elimination. Sized to ``length`` tokens: questions are dropped from the end, then pairs, down to one
    question over the task's fewest pairs; None when even that does not fit.

    ``*_echo`` tasks (a stepping stone, as "echo" rows were for RULER's needles): each answer first repeats
    the asked pair's own context text up to its value, ``"KEY": "`` (unsupervised), then the value, so a
    copying (induction) head that finds those tokens in the context can answer; the question is unchanged.
    ``*_say`` tasks give the same answer text with the echo supervised too: the model learns to quote the asked
    pair (copy the key from the question, then what follows it in the context), an answer the kv scorer counts
    as the value's (it looks for the value as a substring).
    ``*_short*`` tasks cut every key to its first :data:`SHORT_KEY_CHARS` hex characters (a length drawn
    per row, see :func:`shorten_kv_keys`); values stay full UUIDs."""
    from kvbench.tasks.scbench_generate import TURNS, kv_row

    lo, hi = KV_CURRICULUM[task]
    say = task.endswith("_say")
    echo = say or task.endswith("_echo")
    rng = random.Random(f"kvbench-kv-curriculum:{ex_seed}")
    order = list(range(hi))
    rng.shuffle(order)
    key_chars = rng.randint(*SHORT_KEY_CHARS) if "_short" in task else None
    for pairs in range(rng.randint(lo, hi), lo - 1, -1):
        ask = [j for j in order if j < pairs][: min(TURNS, max(1, pairs - 1))]
        for n in range(len(ask), 0, -1):
            row = kv_row(ex_seed, 0, pairs, ask[:n])
            if key_chars is not None:
                row = shorten_kv_keys(row, key_chars)
            if echo:
                parts = _kv_echo_parts("kv", row, tokenizer, supervise_echo=say)
                if len(parts[0]) <= length:
                    return parts
            elif _scbench_size("kv", row, tokenizer) <= length:
                return _scbench_parts("kv", row, tokenizer)
    return None


def shorten_kv_keys(row: dict, chars: int) -> dict:
    """A kv row (hub schema) with every key cut to its first ``chars`` characters, in the context and in the
    questions; where two cut keys would coincide, all keys keep as many more characters as make them
    distinct. Values and the wording are unchanged. Used by the ``*_short`` curriculum rows and by
    ``scripts/probe_kv.py --key-chars``."""
    from kvbench.tasks.scbench_generate import KV_INPUT

    if chars < 1:
        raise ValueError(f"chars must be at least 1, not {chars}")
    items = list(json.loads(row["context"].removeprefix("JSON data:\n")).items())
    keys = [k for k, _ in items]
    while len({k[:chars] for k in keys}) < len(keys):
        chars += 1
    short = {k: k[:chars] for k in keys}
    turns = []
    for turn in row["multi_turns"]:
        key = turn["input"].split('"')[1]
        turns.append({**turn, "input": KV_INPUT.format(key=short[key])})
    context = "JSON data:\n" + json.dumps({short[k]: v for k, v in items})
    return {**row, "context": context, "multi_turns": turns}


def _kv_echo_parts(name: str, row: dict, tokenizer, supervise_echo: bool = False) -> RowParts:
    """:func:`_scbench_parts` of a kv row with each answer preceded by ``"KEY": "`` (loss mask 0, or 1 when
    ``supervise_echo``: the ``*_say`` rows)."""
    rendered, answers, ctx = _scbench_pieces(name, row, tokenizer)
    ids = list(rendered.context_ids)
    mask = [0] * len(ids)
    for turn, question, answer in zip(row["multi_turns"], rendered.question_ids, answers, strict=True):
        key = turn["input"].split('"')[1]
        echo = encode(tokenizer, f'"{key}": "')
        ids += question + echo + answer
        mask += [0] * len(question) + [int(supervise_echo)] * len(echo) + [1] * len(answer)
    return ids, mask, tuple(scbench_answer(name, q.references) for q in ctx.questions)


# --------------------------------------------------------------------------------------------------
# Dense rows built here: recall / lookup / echo, chains, repeat

#: (question ids, answer ids, value) of one needle
_QA = tuple[list[int], list[int], str]


def _needles(rng: random.Random, target: int, tokenizer, draw: str) -> tuple[list[int], list[_QA]]:
    """The context of a recall row (header, then needle and noise lines while the needles' questions still
    fit ``target`` tokens) and each needle's question and answer. Draws from ``rng`` in this order: key kind,
    value kind, noise share, then per line."""
    from kvbench.tasks.ruler_data import NEEDLE, NOISE
    from kvbench.tasks.ruler_tasks import draw_needle_part

    type_k = "words" if rng.random() < 0.7 or target < 320 else "uuids"
    type_v = "numbers" if rng.random() < 0.7 or target < 320 else "uuids"
    noise_share = rng.choice((0.0, 0.3, 0.6, 0.85))
    nl = encode(tokenizer, "\n")
    ids: list[int] = encode(tokenizer, f"Some special magic {type_v} are hidden within the following text.")
    qas: list[_QA] = []
    while True:
        if qas and rng.random() < noise_share:
            line, qa = encode(tokenizer, NOISE), None
        else:
            key, value = draw_needle_part(rng, type_k), draw_needle_part(rng, type_v)
            line = encode(tokenizer, NEEDLE.format(type_v=type_v, key=key, value=value))
            if draw == "echo":
                wording = f"One of the special magic {type_v} for {key} is:"
            else:
                wording = f"The special magic {type_v[:-1]} for {key} mentioned in the provided text is"
            question = encode(tokenizer, wording)
            qa = (nl + question, encode(tokenizer, f" {value}."), value)
        pending = qas + [qa] if qa else qas
        if len(ids) + len(nl) + len(line) + sum(len(q) + len(a) for q, a, _ in pending) > target:
            break
        ids += nl + line
        qas = pending
    return ids, qas


def _asked(rng: random.Random, qas: list[_QA], room: int, draw: str) -> list[_QA]:
    """The questions a recall row asks, in order: every needle once, shuffled (``every``), or needles drawn
    with replacement while they fit ``room`` tokens (``replace``, ``echo``)."""
    if draw == "every":
        rng.shuffle(qas)
        return qas
    if draw not in ("replace", "echo"):
        raise ValueError(f"draw must be 'every', 'replace' or 'echo', not {draw!r}")
    asked = []
    for _ in range(len(qas)):
        qa = rng.choice(qas)
        if len(qa[0]) + len(qa[1]) > room:
            break
        asked.append(qa)
        room -= len(qa[0]) + len(qa[1])
    return asked


def recall_row(rng: random.Random, target: int, tokenizer, draw: str = "every") -> RowParts | None:
    """Dense associative recall in RULER's surface form: needle lines (``NEEDLE``) mixed with noise lines
    (``NOISE``), then questions, each the niah answer prefix for one needle's key followed by its value.
    ``draw="every"`` ("recall" rows): every needle is asked once, in random order, so the last answers can
    be found by elimination (answering a needle not yet asked). ``draw="replace"`` ("lookup" rows): each
    question draws its needle uniformly with replacement (as many questions as needles, as many as fit), so
    a needle may be asked twice or never and only matching the key answers it. ``draw="echo"`` ("echo"
    rows): drawn as "replace", but each question repeats its needle's wording up to the value
    (``One of the special magic numbers for KEY is:``). Keys are words or uuids,
    values numbers or uuids (the kinds of niah_single_1 / niah_multikey_2 / niah_multikey_3; uuids only
    where one fits). ``target``: the row's length in tokens.
    Supervised: the value tokens. None when not even one needle and its question fit ``target``."""
    ids, qas = _needles(rng, target, tokenizer, draw)
    if not qas:
        return None
    asked = _asked(rng, qas, target - len(ids), draw)  # the needle loop left room for one question per needle
    mask = [0] * len(ids)
    refs = []
    for question, answer, value in asked:
        ids += question + answer
        mask += [0] * len(question) + [1] * len(answer)
        refs.append(value)
    return ids, mask, tuple(refs)


def _chain_lines(rng: random.Random, n_chains: int) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """``n_chains`` chains ``(value, variable names)`` of 2-5 variables and their assignment lines, the chains
    interleaved, each in its own order."""
    chains = []
    for _ in range(n_chains):
        names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(rng.randint(2, 5))]
        chains.append((str(rng.randint(10000, 99999)), names))
    owners = [c for c, (_, names) in enumerate(chains) for _ in names]  # one slot per assignment
    order = sorted(range(len(owners)), key=lambda _: rng.random())
    # chain c's j-th slot in the shuffle gets its j-th assignment
    done = [0] * n_chains
    lines = []
    for k in order:
        c = owners[k]
        i, done[c] = done[c], done[c] + 1
        value, names = chains[c]
        lines.append(f"VAR {names[i]} = {value}" if i == 0 else f"VAR {names[i]} = VAR {names[i - 1]} ")
    return chains, lines


def chains_row(rng: random.Random, target: int, tokenizer) -> RowParts | None:
    """Dense variable tracking in vt's surface form, without vt's one-shot example (which does not fit
    short rows): 1-3 interleaved chains ``VAR A = 12345``, ``VAR B = VAR A``, ... (2-5 variables each)
    among noise lines, then, for every chain, vt's question and answer prefix followed by the chain's
    variables in order. Supervised: the variable names. None when nothing fits ``target`` tokens."""
    from kvbench.tasks.ruler_data import NOISE, VT

    nl = encode(tokenizer, "\n")
    for n_chains in range(rng.randint(1, 3), 0, -1):
        chains, lines = _chain_lines(rng, n_chains)
        qa_text = []
        for value, names in chains:
            question = VT.question_text().format(query=value) + "\n"
            prefix = VT.answer_prefix.format(num_v=len(names), query=value)
            qa_text.append((question + prefix, " ".join(names)))
        head = encode(tokenizer, VT.instruction_text())
        qa = [(nl + encode(tokenizer, q), encode(tokenizer, a)) for q, a in qa_text]
        body = [encode(tokenizer, line) for line in lines]
        fixed = len(head) + sum(len(nl) + len(b) for b in body) + sum(len(q) + len(a) for q, a in qa)
        if fixed > target:
            continue
        noise = encode(tokenizer, NOISE)
        n_noise = rng.randint(0, (target - fixed) // (len(noise) + len(nl)))
        where = sorted(rng.sample(range(len(body) + n_noise), len(body)))
        ids, it = list(head), iter(body)
        for slot in range(len(body) + n_noise):
            ids += nl + (next(it) if slot in where else noise)
        mask = [0] * len(ids)
        for q, a in qa:
            ids += q + a
            mask += [0] * len(q) + [1] * len(a)
        return ids, mask, tuple(" ".join(names) for _, names in chains)
    return None


def repeat_row(rng: random.Random, target: int, tokenizer) -> RowParts:
    """A synthetic text segment of ``target // 2`` tokens written twice; supervised: the second copy."""
    half = max(1, target // 2)
    seg = encode(tokenizer, synthetic_text(rng, 6 * half))[:half]
    return seg + seg, [0] * len(seg) + [1] * len(seg), ()


# --------------------------------------------------------------------------------------------------
# Rows and batches


def _task_row(task: str, ex_seed: int, target: int, length: int, tokenizer) -> RowParts | None:
    """The row of a task that is not a recall task, sized to ``target`` tokens (RULER and SCBench rows retry
    at ``length``; key-matching curriculum rows are sized by their pair count and fit ``length``); None when
    it cannot fit."""
    if task == "repeat":
        return repeat_row(random.Random(ex_seed), target, tokenizer)
    if task == "chains":
        return chains_row(random.Random(ex_seed), target, tokenizer)
    if task in KV_CURRICULUM:
        return kv_curriculum_row(task, ex_seed, length, tokenizer)
    if task in SCBENCH_SHORT:
        return short_scbench_row(task, ex_seed, target, tokenizer) or short_scbench_row(
            task, ex_seed, length, tokenizer
        )
    if task in SCBENCH_TASKS:
        return scbench_row(task, ex_seed, target, tokenizer) or scbench_row(task, ex_seed, length, tokenizer)
    return ruler_row(task, ex_seed, target, tokenizer) or ruler_row(task, ex_seed, length, tokenizer)


def training_example(rng: random.Random, length: int, tokenizer, mix: Mix = TASK_MIX) -> Example:
    """One fixed-length row: ``Example(input_ids [length], loss_mask [length], task, references)``.

    RULER rows (a task of ``mix``, default :data:`TASK_MIX`, rendered exactly as evaluation renders it):
    ``loss_mask`` is 1 on the answer tokens and the closing ``<|im_end|>``. "recall", "lookup", "echo" rows: 1 on
    every answered value (:func:`recall_row`). "repeat" rows: 1 on the second copy (:func:`repeat_row`).
    ``scbench_*`` rows: 1 on every question's answer and ``<|im_end|>`` (:func:`scbench_row`,
    :func:`kv_curriculum_row`).
    Padding is always 0. The row is sized to a target drawn uniformly from ``[length // 2, length]`` so rows
    vary in length, then right-padded with the pad id. The RULER seed is drawn from ``rng`` in
    ``[TRAIN_SEED_BASE, 2**31)``; a RULER task that cannot fit ``length`` (vt's or cwe's one-shot example, uuid
    needles in short rows) falls back to "lookup" when the mix has it, else to ``FALLBACK_TASK`` ("recall").
    """
    task = choose_task(rng, mix)
    ex_seed = rng.randrange(TRAIN_SEED_BASE, 2**31)
    target = rng.randint(length // 2, length)
    row = None if task in RECALL_DRAWS else _task_row(task, ex_seed, target, length, tokenizer)
    if row is None and task not in RECALL_DRAWS:
        task = "lookup" if any(t == "lookup" for t, _ in mix) else FALLBACK_TASK
    if row is None:
        draw = RECALL_DRAWS[task]
        row = recall_row(random.Random(ex_seed), target, tokenizer, draw) or recall_row(
            random.Random(ex_seed), length, tokenizer, draw
        )
    if row is None:
        raise KvbenchError(f"row length {length} is too short for a training row; use a longer curriculum")
    ids, mask, refs = row
    ids, mask = ids[:length], mask[:length]
    n_pad = length - len(ids)
    return Example(
        torch.tensor(ids + [tokenizer.pad_token_id] * n_pad, dtype=torch.long),
        torch.tensor(mask + [0] * n_pad, dtype=torch.long),
        task,
        refs,
    )


def row_rng(seed: int, step: int, row: int) -> random.Random:
    """The generator of row ``row`` of step ``step`` of a run seeded ``seed`` (independent of every other)."""
    return random.Random(f"kvbench-train:{seed}:{step}:{row}")


def make_batch(
    tokenizer, *, seed: int, step: int, batch_size: int, length: int, mix: Mix = TASK_MIX
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The batch of ``step``: a pure function of ``(seed, step)`` (plus size, length and mix).
    Returns ``(input_ids [B,T], loss_mask [B,T], tasks)`` with ``B = batch_size`` and ``T = length``."""
    rows = [training_example(row_rng(seed, step, i), length, tokenizer, mix) for i in range(batch_size)]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]), [r[2] for r in rows]
