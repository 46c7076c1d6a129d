"""The ``ruler`` bench: templates, sizing, needles and answers, determinism, external data, cache.

Every property is checked from the generated text itself (parsing the body, counting words, following
assignments, reading the fixture files), not from the generator's own bookkeeping.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.errors import KvbenchError
from kvbench.scorers import get_scorer
from kvbench.tasks import Context, get_bench, list_benches, ruler, ruler_tasks
from kvbench.tasks.ruler import MissingDataError, RulerBench

from .conftest import missing_data

FIXTURES = Path(__file__).parent / "fixtures" / "ruler"
REAL_ESSAY = Path(__file__).resolve().parents[2] / "shared" / "data" / "ruler" / "PaulGrahamEssays.json"
TASKS = [
    "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
    "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2",
]  # fmt: skip
NIAH = TASKS[:8]
ESSAY_TASKS = ["niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery"]
NO_DATA_TASKS = [t for t in TASKS if t not in ESSAY_TASKS and not t.startswith("qa")]
GEN = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# (haystack, key kind, value kind, keys, values per key, queries) from RULER's synthetic.yaml
NIAH_SPEC = {
    "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 4, 1, 4),
}
# RULER's templates + answer prefixes (constants.py), written out independently of the generator.
NIAH_PLURAL = (
    "Some special magic {v} are hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the {v} afterwards.\n{context}\nWhat are all the special magic {v} for {query} mentioned in the "
    "provided text? The special magic {v} for {query} mentioned in the provided text are"
)
NIAH_SINGULAR = (
    "A special magic {v} is hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the {v} afterwards.\n{context}\nWhat is the special magic {v} for {query} mentioned in the "
    "provided text? The special magic {v} for {query} mentioned in the provided text is"
)
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above. Answer: According "
    "to the chain(s) of variable assignment in the text above, 5 variables are assigned the value {query}, "
    "they are: "
)
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
    "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above "
    "list? Answer: The top 10 words that appear most often in the list are:"
)
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
    "the dots '....'. What are the three most frequently appeared words in the above coded text? Answer: "
    "According to the coded text above, the three most frequently appeared words are:"
)
QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query} Answer:"
)
NEEDLE_RE = re.compile(r"One of the special magic (numbers|uuids) for (.+?) is: ([0-9a-f-]+)\.")
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def gen_tokens(task: str) -> int:
    return GEN["niah" if task.startswith("niah") else task.split("_")[0]]


def words(ctx: Context) -> int:
    """A fake PromptLength: whitespace words of every piece, plus 7 for a chat template."""
    q = ctx.questions[0]
    return 7 + sum(len(s.split()) for s in (ctx.instruction, ctx.body, q.text, q.answer_prefix))


@pytest.fixture(scope="module")
def byte_length():
    """The core's PromptLength with its byte-level tokenizer (one token per byte, ChatML template)."""
    pytest.importorskip("transformers")
    from kvbench.models import byte_tokenizer
    from kvbench.prompt import prompt_length

    return prompt_length(byte_tokenizer())


def synthetic_essay(n_words: int = 9000, seed: int = 0) -> str:
    """Essay-like text: sentences of 4-24 words, some abbreviations, ragged whitespace."""
    rng = random.Random(seed)
    vocab = (
        "time people way year work thing life hand world day company startup idea founder money "
        "investor program language user problem school reason essay question kind point fact".split()
    )
    out, count = [], 0
    while count < n_words:
        k = rng.randint(4, 24)
        sent = [rng.choice(vocab) for _ in range(k)]
        sent[0] = sent[0].capitalize()
        if rng.random() < 0.1:
            sent.insert(1, "Dr.")
        if rng.random() < 0.1:
            sent.insert(2, "e.g.")
        out.append(" ".join(sent) + rng.choice([".", ".", ".", "?", "!"]))
        out.append(rng.choice([" ", " ", " ", "  ", "\n\n", "\n"]))
        count += len(sent)
    return "".join(out)


ESSAY = synthetic_essay()


def essay_words(text: str) -> list[str]:
    return re.sub(r"\s+", " ", text).split(" ")


@pytest.fixture
def data_dir(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("data")
    (root / "ruler").mkdir()
    shutil.copy(FIXTURES / "squad.json", root / "ruler" / "squad.json")
    shutil.copy(FIXTURES / "hotpotqa.json", root / "ruler" / "hotpotqa.json")
    (root / "ruler" / "PaulGrahamEssays.json").write_text(json.dumps({"text": ESSAY}), encoding="utf-8")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(root))
    return root


def generate(task, length=4096, limit=3, seed=42, prompt_length=words, bench="ruler", sampling="official"):
    b = get_bench(bench)
    b.sampling = sampling
    return list(b.contexts(task, length=length, limit=limit, seed=seed, prompt_length=prompt_length))


def rendered(ctx: Context, glue: str = "\n") -> str:
    """RULER's input + answer prefix as kvbench's pieces give it (``glue`` after the instruction)."""
    q = ctx.questions[0]
    return ctx.instruction + glue + ctx.body + "\n" + q.text + " " + q.answer_prefix


def joined(queries: list[str]) -> str:
    return ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]


# ---------------------------------------------------------------------------------------------------


def test_registered():
    assert {"ruler", "needle"} <= set(list_benches())
    bench = get_bench("ruler")
    assert isinstance(bench, RulerBench) and bench.name == "ruler"
    assert bench.tasks() == TASKS
    assert bench.description and "\n" not in bench.description
    assert bench.cache_dir is None  # caching is opt-in, set by the core


def test_unknown_task_raises_at_call():
    with pytest.raises(KvbenchError, match="valid tasks: niah_single_1"):
        get_bench("ruler").contexts("niah_single_9", length=4096, limit=1, seed=0, prompt_length=words)


@pytest.mark.parametrize("task", TASKS)
def test_template_matches_ruler(task, data_dir):
    for ctx in generate(task, limit=2):
        q = ctx.questions[0]
        assert q.max_new_tokens == gen_tokens(task) and q.qid == "0"
        assert q.scorers == (("string_match_part",) if task.startswith("qa") else ("string_match_all",))
        if task in NIAH:
            _, _, kind, _, nv, nq = NIAH_SPEC[task]
            template, v = (NIAH_SINGULAR, kind[:-1]) if nv * nq == 1 else (NIAH_PLURAL, kind)
            expected = template.format(v=v, context=ctx.body, query=joined(ctx.meta["queries"]))
            assert rendered(ctx) == expected
            assert not ctx.instruction.endswith("\n")
        elif task == "vt":
            value = ctx.meta["value"]
            main = VT_TEMPLATE.format(context=ctx.body, query=value)
            text = rendered(ctx)
            assert text.endswith("\n\n" + main)
            icl = text[: -len("\n\n" + main)]  # the one-shot example: a full prompt and its answer
            m = re.fullmatch(
                re.escape(VT_TEMPLATE).replace(r"\{context\}", "(.*)").replace(r"\{query\}", r"(\d{5})")
                + r" ([A-Z]{3}) ([A-Z]{3}) ([A-Z]{3}) ([A-Z]{3}) ([A-Z]{3})",
                icl,
                re.S,
            )
            assert m, icl[-300:]
            assert m.group(2) == m.group(3)
        elif task == "cwe":
            text = rendered(ctx)
            main = CWE_TEMPLATE.format(context=ctx.body)
            assert text.endswith("\n" + main)
            icl = text[: -len("\n" + main)]
            m = re.fullmatch(re.escape(CWE_TEMPLATE).replace(r"\{context\}", "(.*)") + r" ((?:\d+\. .+ ?){10})", icl)
            assert m
        elif task == "fwe":
            assert rendered(ctx, glue=" ") == FWE_TEMPLATE.format(context=ctx.body)  # RULER: a space; kvbench: "\n"
        else:
            assert rendered(ctx) == QA_TEMPLATE.format(context=ctx.body, query=ctx.meta["query"])


def check_niah(ctx: Context, task: str) -> None:
    haystack, kind_k, kind_v, nk, nv, nq = NIAH_SPEC[task]
    q = ctx.questions[0]
    m = re.fullmatch(r"What (?:is|are all) the special magic \w+ for (.+) mentioned in the provided text\?", q.text)
    assert m
    queried = re.split(r", and |, ", m.group(1))
    assert len(queried) == nq
    needles = NEEDLE_RE.findall(ctx.body)
    assert all(t == kind_v for t, _, _ in needles)
    by_key = collections.defaultdict(list)
    for _, key, value in needles:
        by_key[key].append(value)
    # every reference sits in the body next to a queried key, and the queried keys hold nothing else
    assert sorted(v for k in queried for v in by_key[k]) == sorted(q.references)
    assert len(q.references) == nq * nv == len(set(q.references))
    for ref in q.references:
        assert re.fullmatch(r"\d{7}", ref) if kind_v == "numbers" else UUID_RE.fullmatch(ref)
        assert any(f"for {k} is: {ref}." in ctx.body for k in queried)
    for key in queried:
        assert UUID_RE.fullmatch(key) if kind_k == "uuids" else re.fullmatch(r"[^-]+(-[^-]+)*-[^-]+", key)
    n = ctx.meta["n_haystack"]
    if haystack == "essay":
        assert len(needles) == nk * nv
        stripped = ctx.body
        for _, key, value in needles:
            sentence = f"One of the special magic {kind_v} for {key} is: {value}."
            at = stripped.index(sentence)
            before, after = stripped[:at].rstrip(), NEEDLE_RE.sub("", stripped[at + len(sentence) :]).strip()
            assert before == "" or before[-1] in ".?!" or after == ""  # between sentences, or at the end
            stripped = stripped.replace(sentence, " ")
        assert " ".join(stripped.split()) == " ".join(" ".join(essay_words(ESSAY)[:n]).split())
    else:
        lines = ctx.body.split("\n")
        assert len(lines) == n + nk * nv
        if haystack == "noise":
            assert lines.count(NOISE) == n and len(needles) == nk * nv
        else:
            assert len(needles) == n + nk * nv  # every distractor line is a needle too
            assert all(NEEDLE_RE.fullmatch(line) for line in lines)


@pytest.mark.parametrize("task", NIAH)
def test_niah_needles_in_body(task, data_dir):
    for length in (1500, 4096):
        for ctx in generate(task, length=length, limit=4, seed=3):
            check_niah(ctx, task)


def resolve(text: str) -> dict[str, int]:
    """Every variable of ``VAR X = ...`` assignments in ``text``, followed to its number."""
    assign = {}
    for m in re.finditer(r"VAR ([A-Z]+) = (?:VAR ([A-Z]+)|(\d+))", text):
        assign[m.group(1)] = m.group(2) or int(m.group(3))
    out = {}
    for var in assign:
        seen, x = set(), var
        while isinstance(x, str) and x not in seen:
            seen.add(x)
            x = assign.get(x)
        out[var] = x
    return out


def test_vt_chain_resolves_to_answer():
    for length in (1000, 4096):
        for ctx in generate("vt", length=length, limit=4, seed=5):
            q = ctx.questions[0]
            value = int(re.search(r"assigned the value (\d+) in the text above\.$", q.text).group(1))
            assert {v for v, x in resolve(ctx.body).items() if x == value} == set(q.references)
            assert len(q.references) == 5 and all(re.fullmatch(r"[A-Z]{5}", r) for r in q.references)
            assert f"VAR {q.references[0]} = {value}" in ctx.body  # the chain starts at the number
            assigned = [m.group(1) for m in re.finditer(r"^VAR ([A-Z]+) = ", ctx.body, re.M)]
            assert assigned == list(q.references)  # in chain order, each hop after the one it reads
            assert q.answer_prefix.endswith(f"5 variables are assigned the value {value}, they are: ")
            lines = ctx.body.split("\n")
            n = ctx.meta["n_haystack"]
            assert sum(line == NOISE for line in lines) == n and len(lines) == n + 5
            # the one-shot example answers its own chain
            example_value = int(re.search(r"assigned the value (\d+), they are:  ", ctx.instruction).group(1))
            example_answer = ctx.instruction.split("they are:  ")[1].split("\n")[0].split()
            assert {v for v, x in resolve(ctx.instruction).items() if x == example_value} == set(example_answer)
            assert len(example_answer) == 5


def numbered(text: str) -> list[str]:
    parts = re.split(r"(?:^| )(\d+)\. ", text)
    assert parts[0] == ""
    assert parts[1::2] == [str(i + 1) for i in range(len(parts) // 2)]
    return parts[2::2]


def test_cwe_answer_is_the_ten_most_common(byte_length):
    for length, pl in ((4096, words), (2000, words), (8192, byte_length)):
        for ctx in generate("cwe", length=length, limit=3, seed=9, prompt_length=pl):
            counts = collections.Counter(numbered(ctx.body)).most_common()
            top = {w for w, _ in counts[:10]}
            assert top == set(ctx.questions[0].references) and len(ctx.questions[0].references) == 10
            assert len(counts) == 10 or counts[9][1] > counts[10][1]
            assert counts[0][1] == (30 if length >= 4096 else 6)
            # the one-shot example's answer is its own list's top 10
            icl = ctx.instruction.split("\nQuestion: What are the 10 most common words in the above list?")[0]
            example = collections.Counter(numbered(icl.split("often.\n", 1)[1])).most_common()
            answer = numbered(ctx.instruction.split("appear most often in the list are: ")[1].split("\n")[0])
            assert {w for w, _ in example[:10]} == set(answer) and example[9][1] > example[10][1]


def test_fwe_answer_is_the_three_most_frequent():
    for length in (1000, 4096):
        for ctx in generate("fwe", length=length, limit=3, seed=11):
            tokens = ctx.body.split(" ")
            counts = collections.Counter(t for t in tokens if t != "...").most_common()
            refs = ctx.questions[0].references
            assert {w for w, _ in counts[:3]} == set(refs) and counts[2][1] > counts[3][1]
            assert all(re.fullmatch(r"[a-z]{6}", w) for w in refs)
            assert tokens.count("...") > counts[0][1]  # rank 1 is the noise
            n = ctx.meta["n_haystack"]
            assert [c for _, c in counts[:3]] == [int(n * k**-2.0 / 1.6449340668482264) for k in (2, 3, 4)]


def squad_answerable() -> list[tuple[str, list[str], str]]:
    data = json.loads((FIXTURES / "squad.json").read_text())
    return [
        (q["question"], [a["text"] for a in q["answers"]], p["context"])
        for art in data["data"]
        for p in art["paragraphs"]
        for q in p["qas"]
        if not q["is_impossible"]
    ]


def docs_of(body: str) -> list[str]:
    parts = re.split(r"(?:^|\n\n)Document (\d+):\n", body)
    assert parts[0] == "" and parts[1::2] == [str(i + 1) for i in range(len(parts) // 2)]
    return parts[2::2]


@pytest.mark.parametrize("length", [200, 300, 4096])
def test_qa_squad_answers_come_from_the_file(length, data_dir):
    expected = squad_answerable()
    paragraphs = {c for _, _, c in expected} | {
        p["context"] for a in json.loads((FIXTURES / "squad.json").read_text())["data"] for p in a["paragraphs"]
    }
    ctxs = generate("qa_1", length=length, limit=50)
    assert len(ctxs) == len(expected) == 8  # one item per answerable question, in file order
    for ctx, (question, answers, gold) in zip(ctxs, expected, strict=True):
        q = ctx.questions[0]
        assert q.text.endswith(f"\n\nQuestion: {question}") and q.answer_prefix == "Answer:"
        assert q.references == tuple(answers)
        docs = docs_of(ctx.body)
        assert gold in docs and set(docs) <= paragraphs and len(docs) == ctx.meta["n_haystack"]
        assert get_scorer(q.scorers[0])(f"Answer: {answers[0]}", q.references) == 100.0


def test_qa_squad_documents_gold_then_same_article_then_others(data_dir):
    data = json.loads((FIXTURES / "squad.json").read_text())["data"]
    article_of = {p["context"]: a["title"] for a in data for p in a["paragraphs"]}
    total = len(article_of)
    gen = ruler_tasks.make_task("ruler", "qa_1", 42, 4096)
    for item, (_, _, gold) in enumerate(squad_answerable()):
        same = sum(article_of[c] == article_of[gold] for c in article_of)
        for n in range(1, total + 3):
            docs = docs_of(gen.build(item, n).body)
            assert len(docs) == n and gold in docs
            if n < total:
                assert len(set(docs)) == n
                from_article = sum(article_of[d] == article_of[gold] for d in docs)
                assert from_article == min(n, same)  # the article's other paragraphs come first
            else:  # RULER repeats the whole list
                assert set(docs) == set(article_of)


def test_qa_hotpot_answers_come_from_the_file(data_dir):
    data = json.loads((FIXTURES / "hotpotqa.json").read_text())
    for length in (400, 700, 4096):
        ctxs = generate("qa_2", length=length, limit=10)
        assert len(ctxs) == len(data)
        for ctx, row in zip(ctxs, data, strict=True):
            q = ctx.questions[0]
            assert q.text.endswith(f"Question: {row['question']}") and q.references == (row["answer"],)
            docs = docs_of(ctx.body)
            for title, sents in row["context"]:  # all ten of the question's paragraphs are kept
                assert f"{title}\n{''.join(sents)}" in docs
            assert len(docs) >= 10


@pytest.mark.parametrize("task", TASKS)
def test_within_budget_fake_and_byte_tokenizer(task, data_dir, byte_length):
    for length, pl in ((4096, words), (1500, words), (8192 if task == "cwe" else 4096, byte_length)):
        budget = length - gen_tokens(task)
        ctxs = generate(task, length=length, limit=3, seed=1, prompt_length=pl)
        assert ctxs
        for ctx in ctxs:
            assert pl(ctx) <= budget
            assert ctx.meta["prompt_tokens"] == pl(ctx)


@pytest.mark.parametrize("task", ["niah_single_1", "niah_single_2", "niah_multikey_2", "vt", "cwe", "fwe", "qa_1"])
def test_probe_is_maximal_and_items_step_down_by_rulers_increment(task, data_dir):
    length = 4096
    gen = ruler_tasks.make_task("ruler", task, 42, length)
    gen.prepare(words)  # vt sizes its one-shot example with the tokenizer
    inc = gen.incremental()
    assert (
        inc
        == {
            "niah_single_1": 25,
            "niah_single_2": 500,
            "niah_multikey_2": 25,
            "vt": 10,
            "cwe": 10,
            "fwe": 4096 // 32,
            "qa_1": 10,
        }[task]
    )
    pl = words
    ctxs = generate(task, length=length, limit=6, prompt_length=pl, sampling="per_item")
    budget = length - gen_tokens(task)
    size = ctxs[0].meta["n_haystack"]  # item 0 is the probe of the binary search: one more unit overflows
    assert pl(gen.build(0, size + 1)) > budget
    for i, ctx in enumerate(ctxs):
        n = ctx.meta["n_haystack"]
        assert n <= size and (size - n) % inc == 0
        if n < size:
            assert pl(gen.build(i, n + inc)) > budget


def test_small_lengths_use_step_five():
    assert ruler_tasks.make_task("ruler", "niah_single_1", 0, 4095).incremental() == 5
    assert ruler_tasks.make_task("ruler", "vt", 0, 2048).incremental() == 5
    assert ruler_tasks.make_task("ruler", "vt", 0, 4096).incremental() == 10


@pytest.mark.parametrize("task", TASKS)
def test_deterministic_and_independent_of_limit(task, data_dir):
    a = generate(task, length=2000, limit=4, seed=7)
    assert a == generate(task, length=2000, limit=4, seed=7)
    assert generate(task, length=2000, limit=2, seed=7) == a[:2]
    assert [c.item for c in a] == ["0", "1", "2", "3"][: 3 if task == "qa_2" else 4]  # hotpot fixture: 3 rows
    if not task.startswith("qa"):  # qa item i is question i whatever the seed
        other = generate(task, length=2000, limit=4, seed=8)
        assert [c.questions[0].references for c in other] != [c.questions[0].references for c in a]
        assert len({c.questions[0].references for c in a}) > 1
    else:
        assert len({c.questions[0].text for c in a}) == len(a)


def test_needle_alias_is_ruler_niah_single_1():
    a = generate("niah_single_1", bench="needle", limit=3, length=3000)
    b = generate("niah_single_1", bench="ruler", limit=3, length=3000)
    assert all(c.bench == "needle" for c in a)
    assert [dataclasses.replace(c, bench="ruler") for c in a] == b


@pytest.mark.parametrize("task", ESSAY_TASKS + ["qa_1", "qa_2"])
def test_missing_data_raises(task, monkeypatch, tmp_path):
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    name = {"qa_1": "squad.json", "qa_2": "hotpotqa.json"}.get(task, "PaulGrahamEssays.json")
    with pytest.raises(MissingDataError) as err:  # at call time, before iterating
        get_bench("ruler").contexts(task, length=4096, limit=1, seed=0, prompt_length=words)
    assert f"ruler/{name}" in str(err.value) and "KVBENCH_DATA_DIR" in str(err.value)
    assert "--data-dir" in str(err.value)
    assert isinstance(err.value, KvbenchError)
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    with pytest.raises(MissingDataError) as err:
        generate(task)
    assert str(tmp_path / "ruler" / name) in str(err.value)


def test_missing_data_error_is_the_shared_class_where_it_exists():
    import kvbench.errors

    shared = getattr(kvbench.errors, "MissingDataError", None)
    assert issubclass(MissingDataError, shared or KvbenchError)


@pytest.mark.parametrize("task", NO_DATA_TASKS)
def test_tasks_without_files_need_no_data_dir(task, monkeypatch):
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    assert len(generate(task, limit=2)) == 2


def test_corrupt_data_file_is_a_clear_error(data_dir):
    (data_dir / "ruler" / "squad.json").write_text("{not json")
    with pytest.raises(KvbenchError, match="squad.json") as err:
        generate("qa_1")
    assert not isinstance(err.value, MissingDataError)
    (data_dir / "ruler" / "hotpotqa.json").write_text(json.dumps({"data": []}))
    with pytest.raises(KvbenchError, match="not a HotpotQA json"):
        generate("qa_2")


@pytest.mark.parametrize("task", TASKS)
def test_too_short_names_a_length_that_works(task, data_dir):
    with pytest.raises(KvbenchError, match=rf"--length 60 is too short for ruler/{task}") as err:
        generate(task, length=60, limit=1, sampling="per_item")
    need = int(re.search(r"use --length >= (\d+)", str(err.value)).group(1))
    (ctx,) = generate(task, length=need, limit=1, sampling="per_item")
    assert words(ctx) + gen_tokens(task) <= need
    with pytest.raises(KvbenchError, match="too short"):
        generate(task, length=need - 1, limit=1, sampling="per_item")
    with pytest.raises(KvbenchError, match=rf"--length 60 is too short for ruler/{task}"):
        generate(task, length=60, limit=1)  # official sampling: the same error


def test_terminates_when_prompt_length_ignores_the_haystack():
    for task in ("niah_single_1", "vt", "fwe"):
        (ctx,) = generate(task, length=300, limit=1, prompt_length=lambda ctx: 10, sampling="per_item")
        assert ctx.meta["n_haystack"] == 300  # capped: every unit is at least one token


def test_search_is_cheap_after_the_probe():
    calls = []

    def counting(ctx: Context) -> int:
        calls.append(ctx.item)
        return words(ctx)

    bench = get_bench("ruler")
    bench.sampling = "per_item"
    gen = bench.contexts("niah_single_1", length=50_000, limit=10, seed=0, prompt_length=counting)
    next(gen)
    assert len(calls) <= 2 * (50_000).bit_length() + 4
    calls.clear()
    assert len(list(gen)) == 9 and len(calls) == 9  # one measurement per later item


@pytest.mark.parametrize("task", TASKS)
def test_references_score_with_declared_scorer(task, data_dir):
    for ctx in generate(task, limit=2):
        q = ctx.questions[0]
        scorer = get_scorer(q.scorers[0])
        assert scorer(f"{q.answer_prefix} {', '.join(q.references)}.", q.references) == 100.0
        assert scorer("-", q.references) == 0.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    task=st.sampled_from(TASKS),
    length=st.integers(min_value=0, max_value=6000),
    seed=st.integers(0, 10**6),
)
def test_sizes_never_exceed_the_budget(data_dir, task, length, seed):
    for sampling in ("official", "per_item"):
        try:
            ctxs = generate(task, length=length, limit=2, seed=seed, sampling=sampling)
        except KvbenchError as exc:
            # RULER's own vt script crashes on some seeds (a repeated name while sizing): official says so
            assert "too short" in str(exc) or (sampling == "official" and "use another --seed" in str(exc))
            continue
        for ctx in ctxs:
            assert words(ctx) + gen_tokens(task) <= length


# --- cache ----------------------------------------------------------------------------------------


def test_cache_roundtrip_corruption_and_fingerprint(tmp_path):
    bench = RulerBench()
    bench.cache_dir = tmp_path / "cache"
    calls = []

    def counting(ctx: Context) -> int:
        calls.append(1)
        return words(ctx)

    def run(pl=counting):
        calls.clear()
        return list(bench.contexts("vt", length=3000, limit=3, seed=4, prompt_length=pl))

    fresh = generate("vt", length=3000, limit=3, seed=4)
    assert run() == fresh
    first_calls = len(calls)
    (path,) = bench.cache_dir.iterdir()
    assert json.loads(path.read_text())["key"]["task"] == "vt"
    assert run() == fresh and len(calls) == len(ruler._PROBES) + 3 < first_calls  # probes + re-measure

    path.write_text('{"key": {"truncated')  # corrupt: regenerated and rewritten
    assert run() == fresh and len(calls) == first_calls
    assert json.loads(path.read_text())["key"]["task"] == "vt"

    data = json.loads(path.read_text())  # an entry whose items no longer measure the same is stale
    data["contexts"][1]["meta"]["prompt_tokens"] += 1
    path.write_text(json.dumps(data))
    assert run() == fresh and len(calls) > len(ruler._PROBES) + 3  # regenerated

    other = run(lambda ctx: words(ctx) + 1)  # another tokenizer: another entry
    assert len(list(bench.cache_dir.iterdir())) == 2 and other != fresh


def test_cache_dir_unwritable_still_yields(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    bench = RulerBench()
    bench.cache_dir = blocker / "sub"
    with pytest.warns(UserWarning, match="could not write the RULER cache"):
        got = list(bench.contexts("fwe", length=2000, limit=2, seed=0, prompt_length=words))
    assert got == generate("fwe", length=2000, limit=2, seed=0)


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    assert ruler.default_cache_dir() == tmp_path / "ruler"
    monkeypatch.delenv("KVBENCH_CACHE")
    assert ruler.default_cache_dir() == Path.home() / ".cache" / "kvbench" / "ruler"


# --- the real Paul Graham essays ------------------------------------------------------------------


@pytest.fixture
def real_essay(monkeypatch):
    if not REAL_ESSAY.is_file():
        missing_data(f"real essay file absent ({REAL_ESSAY}); the synthetic essay covers the logic")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(REAL_ESSAY.parent.parent))
    return json.loads(REAL_ESSAY.read_text(encoding="utf-8"))["text"]


def test_real_essay_haystack(real_essay, byte_length):
    prefix = essay_words(real_essay)
    assert prefix[:2] == ["July", "2010What"]
    for task in ESSAY_TASKS:
        for ctx in generate(task, length=4096, limit=2, prompt_length=byte_length):
            assert byte_length(ctx) + 128 <= 4096
            body = ctx.body
            for m in NEEDLE_RE.finditer(ctx.body):
                body = body.replace(m.group(0), " ")
            assert " ".join(body.split()) == " ".join(" ".join(prefix[: ctx.meta["n_haystack"]]).split())


@pytest.mark.slow
def test_all_tasks_real_data_byte_tokenizer(real_essay, byte_length, data_dir):
    shutil.copy(REAL_ESSAY, data_dir / "ruler" / "PaulGrahamEssays.json")
    for length in (4096, 16384):
        for task in TASKS:
            if task == "cwe" and length == 4096:
                continue  # the byte tokenizer cannot fit cwe's one-shot example plus list in 4096
            ctxs = generate(task, length=length, limit=20, prompt_length=byte_length)
            assert all(byte_length(c) + gen_tokens(task) <= length for c in ctxs)
            for c in ctxs:
                assert all(ref in c.body for ref in c.questions[0].references)
