"""Edge cases of kvbench's RULER bench (``tasks/ruler.py``) and its jsonl export (``tasks/ruler_jsonl.py``):
the generated-data cache (what makes an entry stale, per-item sampling, fwe's glue), the too-short message,
and RULER's jsonl schema checked against hand-worked rows and RULER's base-template prompt."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from kvbench.errors import KvbenchError
from kvbench.tasks import Context, Question, ruler, ruler_tasks
from kvbench.tasks.ruler import RulerBench
from kvbench.tasks.ruler_jsonl import ruler_row, write_ruler_jsonl

from .test_ruler import FIXTURES, NEEDLE_RE, generate, rendered, synthetic_essay, words

VT_GEN, NIAH_GEN = 30, 128  # RULER's tokens_to_generate
RULER_KEYS = ["index", "input", "outputs", "length", "length_w_model_temp", "answer_prefix"]


def cached_bench(tmp_path, sampling: str = "official") -> RulerBench:
    bench = RulerBench()
    bench.cache_dir = tmp_path / "cache"
    bench.sampling = sampling
    return bench


def counting(calls: list, measure=words):
    def pl(ctx: Context) -> int:
        calls.append(1)
        return measure(ctx)

    return pl


# --- too short ------------------------------------------------------------------------------------


def test_too_short_message_counts_prompt_and_generation_apart():
    """A prompt of 1000 tokens whatever the haystack: 1000 for the prompt, +128 for niah, 1128 needed."""
    bench = RulerBench()
    bench.sampling = "per_item"
    with pytest.raises(KvbenchError) as err:
        list(bench.contexts("niah_single_1", length=500, limit=1, seed=0, prompt_length=lambda ctx: 1000))
    assert re.match(
        r"^--length 500 is too short for ruler/niah_single_1: with the smallest haystack \(\d+ lines\) item 0's "
        r"prompt already takes 1000 tokens \(\+128 to generate\); use --length >= 1128$",
        str(err.value),
    )


# --- cache ----------------------------------------------------------------------------------------


def test_cache_file_is_named_by_bench_task_length_and_digest(tmp_path):
    """``TaskDataCache``'s ``{stem}-{digest}{suffix}``: ``ruler-<task>-<length>-<24 hex>.json``."""
    bench = cached_bench(tmp_path)
    list(bench.contexts("vt", length=3000, limit=1, seed=4, prompt_length=words))
    (path,) = bench.cache_dir.iterdir()
    assert re.match(r"^ruler-vt-3000-[0-9a-f]{24}\.json$", path.name)


def test_cache_per_item_sampling_roundtrip(tmp_path):
    """A cached per_item generation is per_item's (sizes to ``length``), apart from the official entry."""
    fresh = generate("vt", length=3000, limit=2, seed=4, sampling="per_item")
    assert [c.meta["sampling"] for c in fresh] == ["per_item", "per_item"]
    bench = cached_bench(tmp_path, "per_item")
    calls: list = []
    assert list(bench.contexts("vt", length=3000, limit=2, seed=4, prompt_length=counting(calls))) == fresh
    calls.clear()
    assert list(bench.contexts("vt", length=3000, limit=2, seed=4, prompt_length=counting(calls))) == fresh
    assert len(calls) == len(ruler._PROBES) + 2  # loaded: probes + re-measure only
    official = cached_bench(tmp_path, "official")
    got = list(official.contexts("vt", length=3000, limit=2, seed=4, prompt_length=words))
    assert got == generate("vt", length=3000, limit=2, seed=4) and got != fresh
    assert len(list(bench.cache_dir.iterdir())) == 2


def test_cache_keeps_fwe_space_glue(tmp_path):
    """fwe joins instruction and text with a space (RULER): a cached fwe item keeps it."""
    fresh = generate("fwe", length=2000, limit=2, seed=0)
    assert [c.glue for c in fresh] == [" ", " "]
    per_item = generate("fwe", length=2000, limit=2, seed=0, sampling="per_item")
    assert [c.glue for c in per_item] == [" ", " "]
    bench = cached_bench(tmp_path)
    list(bench.contexts("fwe", length=2000, limit=2, seed=0, prompt_length=words))
    calls: list = []
    loaded = list(bench.contexts("fwe", length=2000, limit=2, seed=0, prompt_length=counting(calls)))
    assert len(calls) == len(ruler._PROBES) + 2  # really loaded, not regenerated
    assert [c.glue for c in loaded] == [" ", " "] and loaded == fresh


def cached_vt(tmp_path):
    """vt at 3,000 tokens, seed 4, two items: ``(those contexts freshly generated, a bench that has cached them,
    its one cache file)``."""
    fresh = generate("vt", length=3000, limit=2, seed=4)
    bench = cached_bench(tmp_path)
    list(bench.contexts("vt", length=3000, limit=2, seed=4, prompt_length=words))
    (path,) = bench.cache_dir.iterdir()
    return fresh, bench, path


def test_cache_entry_without_glue_loads_with_newline_glue(tmp_path):
    """An entry written before contexts had ``glue`` (no such field) loads with the default ``"\\n"``."""
    fresh, bench, path = cached_vt(tmp_path)
    data = json.loads(path.read_text())
    for c in data["contexts"]:
        del c["glue"]
    path.write_text(json.dumps(data))
    calls: list = []
    loaded = list(bench.contexts("vt", length=3000, limit=2, seed=4, prompt_length=counting(calls)))
    assert len(calls) == len(ruler._PROBES) + 2  # loaded, not regenerated
    assert [c.glue for c in loaded] == ["\n", "\n"] and loaded == fresh


def test_cache_file_of_another_key_is_regenerated(tmp_path):
    """A file whose stored key is not this generation's (here seed 4's contexts under seed 5's name) is
    foreign: regenerated and rewritten, even though its items measure the same and fit."""
    bench = cached_bench(tmp_path)
    list(bench.contexts("vt", length=3000, limit=2, seed=4, prompt_length=words))
    (seed4,) = bench.cache_dir.iterdir()
    list(bench.contexts("vt", length=3000, limit=2, seed=5, prompt_length=words))
    (seed5,) = set(bench.cache_dir.iterdir()) - {seed4}
    seed5.write_text(seed4.read_text())
    got = list(bench.contexts("vt", length=3000, limit=2, seed=5, prompt_length=words))
    assert got == generate("vt", length=3000, limit=2, seed=5) != generate("vt", length=3000, limit=2, seed=4)
    assert seed5.read_text() != seed4.read_text()  # rewritten


def test_cache_data_file_of_another_size_is_regenerated(tmp_path, monkeypatch):
    """The key holds the data file's size and mtime: an essay replaced by a longer one, its mtime kept
    (as ``cp -p`` or ``rsync -t`` may leave it), is another entry; the old one would still measure the same."""
    root = tmp_path / "data"
    (root / "ruler").mkdir(parents=True)
    path = root / "ruler" / "PaulGrahamEssays.json"
    path.write_text(json.dumps({"text": synthetic_essay(3000, seed=1)}), encoding="utf-8")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(root))
    bench = cached_bench(tmp_path)
    before = list(bench.contexts("niah_single_2", length=1500, limit=2, seed=0, prompt_length=words))
    mtime = path.stat().st_mtime_ns
    path.write_text(json.dumps({"text": synthetic_essay(3500, seed=2)}), encoding="utf-8")
    os.utime(path, ns=(mtime, mtime))
    fresh = generate("niah_single_2", length=1500, limit=2, seed=0)
    assert fresh != before
    assert list(bench.contexts("niah_single_2", length=1500, limit=2, seed=0, prompt_length=words)) == fresh


def test_cache_item_that_no_longer_fits_is_regenerated(tmp_path):
    """An entry whose item measures as recorded but, with its 30 tokens to generate, exceeds ``length``."""
    fresh, bench, path = cached_vt(tmp_path)
    data = json.loads(path.read_text())
    item = data["contexts"][1]
    pad = 3000 - item["meta"]["prompt_tokens"]  # the prompt alone now takes 3000 tokens
    item["body"] += " pad" * pad
    item["meta"]["prompt_tokens"] += pad
    path.write_text(json.dumps(data))
    assert list(bench.contexts("vt", length=3000, limit=2, seed=4, prompt_length=words)) == fresh
    assert json.loads(path.read_text())["contexts"][1]["meta"]["prompt_tokens"] < 3000 - VT_GEN + 1


def test_cache_item_exactly_at_length_is_a_hit(tmp_path):
    """prompt + tokens to generate == length fits (``<= length``): such an entry is loaded, not regenerated."""
    length = 100 + NIAH_GEN
    bench = cached_bench(tmp_path, "per_item")
    first = list(bench.contexts("niah_single_1", length=length, limit=2, seed=0, prompt_length=lambda ctx: 100))
    assert [c.meta["prompt_tokens"] for c in first] == [100, 100]
    calls: list = []
    again = list(
        bench.contexts("niah_single_1", length=length, limit=2, seed=0, prompt_length=counting(calls, lambda c: 100))
    )
    assert again == first and len(calls) == len(ruler._PROBES) + 2


# --- ruler_row: hand-worked rows ------------------------------------------------------------------


def ctx_of(task: str, prefix: str, refs: tuple[str, ...], gen: int, prompt_tokens: int) -> Context:
    q = Question("0", "Q?", prefix, gen, refs, ("string_match_all",))
    return Context("ruler", task, "0", "I", "B", (q,), {"prompt_tokens": prompt_tokens})


def test_ruler_row_niah_base_template():
    """Base template: RULER's answer prefix keeps its leading space; ``index`` is the answer's offset and
    ``token_position_answer`` the tokens before it (here: whitespace words)."""
    head = "Noise here. One of the special magic numbers for able-apple is: "
    full = head + "1234567.\nMore noise.\nWhat is the number? The number is"
    ctx = ctx_of("niah_single_1", "The number is", ("1234567",), NIAH_GEN, 40)
    row = ruler_row(7, ctx, full, lambda s: len(s.split()))
    assert row == {
        "index": 64,
        "input": "Noise here. One of the special magic numbers for able-apple is: 1234567."
        "\nMore noise.\nWhat is the number?",
        "outputs": ["1234567"],
        "length": 40 + NIAH_GEN,
        "length_w_model_temp": 40 + NIAH_GEN,
        "answer_prefix": " The number is",
        "token_position_answer": 11,
    }
    assert list(row) == [*RULER_KEYS, "token_position_answer"] and len(head) == 64


def test_ruler_row_chat_template_last_prefix_occurrence():
    """vt's one-shot example holds the answer prefix too: the cut is at its last occurrence; with a chat
    template no space precedes it, so nothing moves into the prefix."""
    full = "Example: x? Answer: A\n\nTask: y?<|im_end|>\n<|im_start|>assistant\nAnswer:"
    ctx = ctx_of("vt", "Answer:", ("B", "C"), VT_GEN, 25)
    row = ruler_row(3, ctx, full, lambda s: pytest.fail("non-niah rows count no tokens"))
    assert row == {
        "index": 3,
        "input": "Example: x? Answer: A\n\nTask: y?<|im_end|>\n<|im_start|>assistant\n",
        "outputs": ["B", "C"],
        "length": 25 + VT_GEN,
        "length_w_model_temp": 25 + VT_GEN,
        "answer_prefix": "Answer:",
    }
    assert list(row) == RULER_KEYS


def test_ruler_row_empty_answer_prefix():
    """No answer prefix: the whole text is the input, the prefix is empty."""
    ctx = ctx_of("qa_1", "", ("x",), 32, 9)
    row = ruler_row(0, ctx, "Docs.\nQuestion: who?", len)
    assert (row["input"], row["answer_prefix"]) == ("Docs.\nQuestion: who?", "")


def test_ruler_row_prefix_right_after_a_leading_space():
    """The prefix at offset 1 after a space: the space joins the prefix (``cut`` may reach 0)."""
    ctx = ctx_of("cwe", "Answer:", ("x",), 120, 3)
    row = ruler_row(0, ctx, " Answer:", len)
    assert (row["input"], row["answer_prefix"]) == ("", " Answer:")


def test_ruler_row_prompt_that_is_only_its_prefix():
    """The prefix at offset 0 has nothing before it, not even when it ends in a space: the input is empty."""
    ctx = ctx_of("qa_1", "Answer: ", ("x",), 32, 2)
    row = ruler_row(0, ctx, "Answer: ", len)
    assert (row["input"], row["answer_prefix"]) == ("", "Answer: ")


def test_ruler_row_niah_index_is_the_first_occurrence_of_the_answer():
    """RULER's niah.py: ``index = input_text.find(answer[0])``; the value repeated later in the text (here in
    the noise) does not move it: offset 6 of "A is: ", 2 words before it."""
    full = "A is: 1234567.\nB is: 7654321.\nnoise 1234567 noise\nWhat are they? The numbers are"
    ctx = ctx_of("niah_multivalue", "The numbers are", ("1234567", "7654321"), NIAH_GEN, 20)
    row = ruler_row(0, ctx, full, lambda s: len(s.split()))
    assert (row["index"], row["token_position_answer"]) == (6, 2)
    assert row["input"] == full[: -len(" The numbers are")]


# --- write_ruler_jsonl ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_tok():
    """The byte-level tokenizer (one token per UTF-8 byte) under RULER's base template (no chat template)."""
    pytest.importorskip("transformers")
    from kvbench.models import byte_tokenizer

    tok = byte_tokenizer()
    tok.chat_template = None
    return tok


def test_write_unknown_task(tmp_path, base_tok):
    with pytest.raises(KvbenchError, match=r"^unknown RULER task 'nope'; valid tasks: niah_single_1, .*, qa_2$"):
        write_ruler_jsonl(base_tok, "nope", length=1000, limit=1, seed=0, out=tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


def read_rows(path) -> list[dict]:
    raw = path.read_bytes()
    assert raw.isascii() and raw.endswith(b"\n")
    return [json.loads(line) for line in raw.decode().split("\n")[:-1]]


@pytest.mark.parametrize("sampling", ["official", "per_item"])
def test_write_vt_rows_are_rulers_base_prompt(tmp_path, base_tok, sampling):
    """RULER's base template: ``input + answer_prefix`` is instruction, glue, body, "\\n", question, " ",
    answer prefix; ``length`` counts its bytes plus vt's 30; ``index`` is the row number."""
    from kvbench.prompt import prompt_length

    out = tmp_path / "vt.jsonl"
    n = write_ruler_jsonl(base_tok, "vt", length=2500, limit=3, seed=1, out=str(out), sampling=sampling)
    rows = read_rows(out)
    ctxs = generate("vt", length=2500, limit=3, seed=1, prompt_length=prompt_length(base_tok), sampling=sampling)
    assert n == len(rows) == len(ctxs) == 3
    for i, (row, ctx) in enumerate(zip(rows, ctxs, strict=True)):
        q = ctx.questions[0]
        assert list(row) == RULER_KEYS and row["index"] == i
        assert row["answer_prefix"] == " " + q.answer_prefix
        assert row["input"] + row["answer_prefix"] == rendered(ctx, ctx.glue)
        assert row["outputs"] == list(q.references)
        assert row["length"] == row["length_w_model_temp"] == len(rendered(ctx, ctx.glue).encode()) + VT_GEN <= 2500
        assert ctx.meta["sampling"] == sampling


def test_write_niah_rows_locate_the_needle_in_ascii_json(tmp_path, base_tok, monkeypatch):
    """niah rows: ``index`` is the needle value's character offset, ``token_position_answer`` the bytes
    before it; non-ASCII essay text is written as JSON escapes (``ensure_ascii``)."""
    from kvbench.prompt import prompt_length

    root = tmp_path / "data"
    (root / "ruler").mkdir(parents=True)
    essay = synthetic_essay(3000).replace("idea", "idée")
    (root / "ruler" / "PaulGrahamEssays.json").write_text(json.dumps({"text": essay}), encoding="utf-8")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(root))
    out = tmp_path / "niah.jsonl"
    assert write_ruler_jsonl(base_tok, "niah_single_2", length=1200, limit=2, seed=3, out=out) == 2
    rows = read_rows(out)
    assert "\\u00e9" in out.read_text()
    ctxs = generate("niah_single_2", length=1200, limit=2, seed=3, prompt_length=prompt_length(base_tok))
    for row, ctx in zip(rows, ctxs, strict=True):
        assert list(row) == [*RULER_KEYS, "token_position_answer"]
        assert "idée" in row["input"] and row["input"] + row["answer_prefix"] == rendered(ctx, ctx.glue)
        (needle,) = NEEDLE_RE.finditer(row["input"])
        assert row["outputs"] == [needle.group(3)] and row["index"] == needle.start(3)
        assert row["token_position_answer"] == len(row["input"][: needle.start(3)].encode("utf-8"))
        assert row["length"] == len(rendered(ctx, ctx.glue).encode()) + NIAH_GEN <= 1200


@pytest.mark.parametrize("sampling", ["official", "per_item"])
@pytest.mark.parametrize("limit", [0, -2])
def test_no_items_asked_measures_and_caches_nothing(tmp_path, sampling, limit):
    """``limit <= 0``: nothing to generate, so no prompt is measured and no cache entry is written."""
    calls: list = []
    bench = cached_bench(tmp_path, sampling)
    assert list(bench.contexts("vt", length=3000, limit=limit, seed=0, prompt_length=counting(calls))) == []
    gen = ruler.generate(
        "ruler", "vt", length=3000, limit=limit, seed=0, prompt_length=counting(calls), sampling=sampling
    )
    assert list(gen) == [] and calls == [] and not bench.cache_dir.exists()


def test_generate_defaults_to_official_sampling():
    """``generate`` without ``sampling`` gives RULER's own items, as the bench does by default."""
    got = list(ruler.generate("ruler", "vt", length=3000, limit=2, seed=4, prompt_length=words))
    assert got == generate("vt", length=3000, limit=2, seed=4)
    assert [c.meta["sampling"] for c in got] == ["official", "official"]


@pytest.mark.parametrize("sampling", ["official", "per_item"])
def test_generate_stops_at_the_questions_of_the_qa_file(tmp_path, monkeypatch, sampling):
    """``generate`` asked for more qa items than the file has questions gives one per question (the HotpotQA
    fixture holds 3), the bench's items."""
    (tmp_path / "ruler").mkdir()
    shutil.copy(FIXTURES / "hotpotqa.json", tmp_path / "ruler" / "hotpotqa.json")
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp_path))
    n_questions = len(json.loads((FIXTURES / "hotpotqa.json").read_text()))
    got = list(ruler.generate("ruler", "qa_2", length=3000, limit=5, seed=0, prompt_length=words, sampling=sampling))
    assert [c.item for c in got] == [str(i) for i in range(n_questions)] == ["0", "1", "2"]
    assert got == generate("qa_2", length=3000, limit=5, seed=0, sampling=sampling)


def test_bench_unknown_task_names_every_task():
    """The 13 tasks in report order, comma-separated."""
    with pytest.raises(KvbenchError) as err:
        RulerBench().contexts("nope", length=3000, limit=1, seed=0, prompt_length=words)
    assert str(err.value) == "unknown ruler task 'nope'; valid tasks: " + ", ".join(ruler.TASKS)
    assert len(ruler.TASKS) == 13


def test_unknown_sampling_names_the_choices():
    with pytest.raises(KvbenchError, match=r"^unknown RULER sampling 'best'; use one of: official, per_item$"):
        ruler.generate("ruler", "vt", length=3000, limit=1, seed=0, prompt_length=words, sampling="best")


# --- per_item sizing ------------------------------------------------------------------------------


def per_item_sized(task: str, length: int, largest: dict[int, int], limit: int, seen=None) -> list[Context]:
    """per_item items under a tokenizer that makes item ``i`` fit exactly up to ``largest[i]`` haystack
    units (0: not even one): its prompt is counted as ``words`` plus a per-item surcharge (items not named: none).
    ``seen`` (a list) collects the (item, haystack size) of every prompt measured."""
    gen = ruler_tasks.make_task("ruler", task, 0, length)
    budget = length - gen.gen
    extra = {str(i): budget - words(gen.build(i, max(n, 1))) + (n < 1) for i, n in largest.items()}  # 0: none fits

    def measure(ctx: Context) -> int:
        if seen is not None:
            seen.append((ctx.item, ctx.meta["n_haystack"]))
        return words(ctx) + extra.get(ctx.item, 0)

    got = generate(task, length=length, limit=limit, seed=0, prompt_length=measure, sampling="per_item")
    for i, ctx in enumerate(got):  # every item is recorded as measured, and fits
        assert (ctx.bench, ctx.task, ctx.item, ctx.meta["sampling"]) == ("ruler", task, str(i), "per_item")
        assert ctx.meta["prompt_tokens"] == measure(ctx) <= budget
    return got


def test_per_item_steps_down_by_rulers_increment():
    """niah_single_1 at 4096: floor 1 line, increment 25. The probe (item 0) fits up to 101 lines, so items
    start at 101 and step down 76, 51, 26, 1 until they fit, as RULER does."""
    largest = {0: 101, 1: 55, 2: 4, 3: 500}
    got = per_item_sized("niah_single_1", 4096, largest, 5)
    assert [c.meta["n_haystack"] for c in got] == [101, 51, 1, 101, 101]


def test_per_item_bisects_below_the_last_increment():
    """The probe fits up to 111 lines: the steps are 111, 86, ..., 11; an item that does not fit at 11
    bisects over [1, 10] (RULER would loop forever) and gets the largest that fits."""
    largest = {0: 111, 1: 10, 2: 4, 3: 1}
    seen = []
    got = per_item_sized("niah_single_1", 4096, largest, 4, seen)
    assert [c.meta["n_haystack"] for c in got] == [111, 10, 4, 1]
    # the bisection measures the item being sized (item 3: 111 down to 11 by 25, then [1, 10] searched in
    # fewer draws than the 10 of a walk down one line at a time)
    assert {item for item, _ in seen} == {"0", "1", "2", "3"}
    item3 = [n for item, n in seen if item == "3"]
    assert item3[:5] == [111, 86, 61, 36, 11] and len(item3) < 5 + 10


def test_per_item_item_that_fits_no_haystack_is_too_short():
    """Item 2 does not fit even with one line (its floor): the error names item 2 and one line."""
    with pytest.raises(KvbenchError) as err:
        per_item_sized("niah_single_1", 4096, {0: 111, 2: 0}, 3)
    assert re.match(
        r"^--length 4096 is too short for ruler/niah_single_1: with the smallest haystack \(1 lines\) item 2's "
        r"prompt already takes (\d+) tokens \(\+128 to generate\); use --length >= (\d+)$",
        str(err.value),
    )


def test_per_item_probe_estimate_is_exact_for_a_linear_measure():
    """niah_single_1 at 4096 under ``words``: noise lines cost the same words each, so the prompt is linear in
    lines and the estimate from the floor and one increment above (1 and 26 lines) is the largest size that
    fits; the probe is then measured there and one line above only (the search gallops from the estimate)."""
    gen = ruler_tasks.make_task("ruler", "niah_single_1", 0, 4096)
    budget = 4096 - NIAH_GEN
    cost = [words(gen.build(0, n)) for n in range(1, 301)]
    assert len({cost[i + 1] - cost[i] for i in range(len(cost) - 1)}) == 1  # linear
    largest = max(n for n, c in enumerate(cost, start=1) if c <= budget)  # brute force
    seen = []

    def measure(ctx: Context) -> int:
        seen.append((ctx.item, ctx.meta["n_haystack"]))
        return words(ctx)

    (got,) = generate("niah_single_1", length=4096, limit=1, seed=0, prompt_length=measure, sampling="per_item")
    assert got.meta["n_haystack"] == largest
    assert seen == [("0", 1), ("0", 26), ("0", largest), ("0", largest + 1)]


# --- write_ruler_jsonl: chat template, too short --------------------------------------------------


def test_write_vt_rows_under_a_chat_template(tmp_path):
    """The byte tokenizer's ChatML template wraps the prompt: ``input`` runs from the user header to the
    assistant header and the answer prefix follows it without a space; ``length`` counts the template's
    tokens too (its three markers are special tokens)."""
    pytest.importorskip("transformers")
    from kvbench.models import byte_tokenizer
    from kvbench.prompt import prompt_length

    tok = byte_tokenizer()
    out = tmp_path / "vt.jsonl"
    assert write_ruler_jsonl(tok, "vt", length=2500, limit=2, seed=1, out=out, sampling="per_item") == 2
    ctxs = generate("vt", length=2500, limit=2, seed=1, prompt_length=prompt_length(tok), sampling="per_item")
    for row, ctx in zip(read_rows(out), ctxs, strict=True):
        q = ctx.questions[0]
        user = ctx.instruction + ctx.glue + ctx.body + "\n" + q.text
        assert row["input"] == "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"
        assert row["answer_prefix"] == q.answer_prefix
        markers = ("<|im_start|>", "<|im_end|>", "<|im_start|>")  # one token each, every other byte one
        full = (row["input"] + row["answer_prefix"]).encode()
        assert row["length"] == len(full) - sum(len(m) - 1 for m in markers) + VT_GEN <= 2500


def test_write_too_short_names_ruler_and_keeps_the_old_file(tmp_path, base_tok):
    """A length that cannot hold the smallest haystack: the error names ``ruler/<task>`` and the file
    already there is left as it was (nothing is written before every row is generated)."""
    out = tmp_path / "niah.jsonl"
    out.write_text("old\n")
    with pytest.raises(KvbenchError, match=r"^--length 200 is too short for ruler/niah_single_1: "):
        write_ruler_jsonl(base_tok, "niah_single_1", length=200, limit=2, seed=0, out=out)
    assert out.read_text() == "old\n"
