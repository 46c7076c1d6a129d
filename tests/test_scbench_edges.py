"""Edges of SCBench's loader, bench and prompt assembly, and of :mod:`kvbench.prompt`'s own render: exact
error messages, truncation boundaries, tokenizers that add special tokens or have no chat template, a strict
chat template, the repoqa needle pool's filters, and the generated rows' cache cadence."""

from __future__ import annotations

import builtins
import itertools
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tokenizers import processors

from kvbench.errors import KvbenchError
from kvbench.models import byte_tokenizer
from kvbench.prompt import prompt_length, prompt_text, render
from kvbench.scorers.scbench_repoqa import parse_repoqa_references
from kvbench.tasks import Context, Question
from kvbench.tasks import scbench as sb
from kvbench.tasks.scbench_prompt import ASSEMBLY

FIXTURES = Path(__file__).parent / "fixtures"
HEAD = "<|im_start|>user\n"  # byte_tokenizer's chat head: 1 special token + 5 bytes
TAIL = "<|im_end|>\n<|im_start|>assistant\n"  # 1 + 1 + 1 + 10 tokens


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    monkeypatch.delenv(sb.HUB_ENV, raising=False)
    monkeypatch.delenv(sb.MAX_TURNS_ENV, raising=False)


def fixture_rows(task: str) -> list[dict]:
    return pq.read_table(FIXTURES / "scbench" / f"scbench_{task}" / "test-00000-of-00001.parquet").to_pylist()


def write_jsonl(path: Path, items: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items), encoding="utf-8")
    return path


def bos_tokenizer():
    """byte_tokenizer whose default encoding prepends a BOS (``<|endoftext|>``, id 256), as Llama's does."""
    tok = byte_tokenizer()
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    assert tok("ab")["input_ids"] == [bos, *tok("ab", add_special_tokens=False)["input_ids"]]
    return tok, bos


class PlainTokenizer:
    """A tokenizer object with no ``chat_template`` attribute at all (byte-level underneath)."""

    def __init__(self) -> None:
        self._tok = byte_tokenizer()

    def __call__(self, text, **kw):
        return self._tok(text, **kw)

    def encode(self, text, **kw):
        return self._tok.encode(text, **kw)

    def decode(self, ids):
        return self._tok.decode(ids)


# --- kvbench's own assembly: truncation boundaries -----------------------------------------------------------


def _kv_ctx(body: str, questions=None) -> Context:
    if questions is None:
        questions = (Question("0", "What is x?", "Answer:", 16, ("1",), ("string_match_all",)),)
    return Context("b", "t", "0", "Read this.", body, tuple(questions))


def test_kvbench_render_truncation_boundaries():
    """Byte tokenizer, hand-counted: prefix = head + "Read this.\\n" = 1 + 5 + 11 = 17 tokens; the question
    "\\nWhat is x?" + tail + "Answer:" = 11 + 13 + 7 = 31 tokens, plus its 16 new tokens: 47 reserved. A
    6-token body fits a limit of 17 + 47 + 6 = 70 exactly (not cut); room 2 keeps its first and last token;
    room 1 (a limit of 65) is refused, naming the 17 + 47 = 64 tokens the instruction and question need."""
    tok = byte_tokenizer()
    ctx = _kv_ctx("abcdef")
    whole = render(tok, ctx)
    assert (len(whole.prefix_ids), len(whole.question_ids[0]), len(whole.body_ids)) == (17, 31, 6)
    exact = render(tok, ctx, max_length=70)
    assert exact == whole and exact.truncated_from is None
    cut = render(tok, ctx, max_length=17 + 47 + 2)
    assert tok.decode(cut.body_ids) == "af" and cut.truncated_from == 23
    with pytest.raises(KvbenchError) as err:
        render(tok, ctx, max_length=17 + 47 + 1)
    assert str(err.value) == "b/t item 0: the instruction and questions alone need 64 of the 65 tokens the model allows"


def test_kvbench_render_without_questions_reserves_nothing():
    """No question: nothing is reserved, so the 17-token prefix + 6-token body fit a limit of 23 exactly and a
    limit of 22 cuts the body to 5 tokens (first 2, last 3)."""
    tok = byte_tokenizer()
    ctx = _kv_ctx("abcdef", questions=())
    exact = render(tok, ctx, max_length=23)
    assert exact == render(tok, ctx) and exact.truncated_from is None
    cut = render(tok, ctx, max_length=22)
    assert tok.decode(cut.body_ids) == "abdef" and cut.truncated_from == 23 and cut.question_ids == []


def test_pieces_carry_no_special_tokens_but_the_scbench_context_does():
    """kvbench's pieces are encoded without special tokens (a BOS-adding tokenizer adds none); SCBench's
    context prompt is encoded as the official ``tok.encode`` (default special tokens: the BOS first), its
    queries without."""
    tok, bos = bos_tokenizer()
    r = render(tok, _kv_ctx("body"))
    full = prompt_text(tok, _kv_ctx("body"))
    assert r.prefix_ids + r.body_ids + r.question_ids[0] == tok(full, add_special_tokens=False)["input_ids"]
    assert bos not in r.prefix_ids + r.body_ids + r.question_ids[0]
    sc = render(tok, _sc("body"))
    assert sc.context_ids == [bos] + tok(HEAD + "Read.\n\nbody", add_special_tokens=False)["input_ids"]
    assert sc.prefix_ids == [bos] + tok(HEAD + "Read.\n\n", add_special_tokens=False)["input_ids"]
    assert [tok.decode(q) for q in sc.question_ids] == ["Q one?" + TAIL, "Q two?" + TAIL]


def test_prompt_length_counts_a_questionless_context_with_its_chat_head():
    """No question: the chat head, instruction, glue and body, as one text (6 + 10 + 6 byte tokens here)."""
    ctx = _kv_ctx("abcdef", questions=())
    assert prompt_length(byte_tokenizer())(ctx) == 6 + len(("Read this." + ctx.glue + "abcdef").encode())


# --- SCBench's assembly -----------------------------------------------------------------------------------


def _sc(body: str, reserve: int = 0) -> Context:
    questions = (
        Question("0", "Q one?", "", 4, ("a",), ("string_match_all",)),
        Question("1", "Q two?", "", 8, ("b",), ("string_match_all",)),
    )
    return Context(
        "scbench", "t", "0", "Read.\n\n", body, questions, glue="", assembly="scbench", reserve_tokens=reserve
    )


def test_scbench_truncation_boundaries():
    """The context prompt head + "Read.\\n\\nabcdef" is 1 + 5 + 7 + 6 = 19 tokens. L = limit - reserve: 19 is
    kept whole (not cut), 2 keeps the first and last id (L // 2 each), 0 is refused like 1."""
    tok = byte_tokenizer()
    whole = render(tok, _sc("abcdef"))
    assert len(whole.context_ids) == 19
    exact = render(tok, _sc("abcdef", reserve=100), max_length=119)
    assert exact == whole and exact.truncated_from is None
    two = render(tok, _sc("abcdef", reserve=100), max_length=102)
    assert two.context_ids == [whole.context_ids[0], whole.context_ids[-1]] and two.truncated_from == 19
    assert two.prefix_ids == [whole.context_ids[0]]
    with pytest.raises(KvbenchError, match="the model limit of 100 tokens less the 100 the official runner reserves"):
        render(tok, _sc("abcdef", reserve=100), max_length=100)


def test_scbench_empty_body_names_the_item():
    with pytest.raises(KvbenchError) as err:
        render(byte_tokenizer(), _sc(""))
    assert str(err.value) == "empty context body in scbench/t item 0"


def test_scbench_tokenizer_without_a_chat_template_attribute_gets_the_plain_texts():
    """A tokenizer object that has no ``chat_template`` attribute at all is a tokenizer without a template."""
    tok = PlainTokenizer()
    r = render(tok, _sc("body"))
    assert tok.decode(r.context_ids) == "Read.\n\nbody"
    assert [tok.decode(q) for q in r.question_ids] == ["Q one?", "Q two?"]
    assert prompt_text(tok, _sc("body"), 1) == "Read.\n\nbodyQ two?"


def test_scbench_prompt_text_defaults_to_the_first_question():
    tok = byte_tokenizer()
    assert ASSEMBLY.prompt_text(tok, _sc("body")) == HEAD + "Read.\n\nbodyQ one?" + TAIL


#: A Llama-2-style template: an optional leading system message, then the roles must alternate user /
#: assistant starting with user, or the template raises.
STRICT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + '</s>' }}{% endif %}{% endfor %}"
)


def test_scbench_assembly_with_a_strict_llama2_style_template():
    """The official query conversation is ``[system "", user]``; a template that accepts only a leading
    system message then user renders it. Hand-worked: context "[INST] Read.\\n\\nbody" (cut before the
    delimiter), queries "<question> [/INST]" (after it)."""
    tok = byte_tokenizer()
    tok.chat_template = STRICT_TEMPLATE
    r = render(tok, _sc("body"))
    assert tok.decode(r.context_ids) == "[INST] Read.\n\nbody"
    assert tok.decode(r.prefix_ids) == "[INST] Read.\n\n"
    assert [tok.decode(q) for q in r.question_ids] == ["Q one? [/INST]", "Q two? [/INST]"]


# --- rows: messages, parquet columns, jsonl -------------------------------------------------------------------


def test_mf_row_errors_name_the_task_row_and_what_is_wrong():
    row = fixture_rows("mf")[0]
    row["multi_turns"][0]["answer"] = "88"
    with pytest.raises(sb.SCBenchDataError) as err:
        sb.build_context("mf", 3, row)
    assert str(err.value) == "scbench/mf row 3: mf answer must be an int, got str"
    long_input = "Which one of these numbers would you pick from the list below, if you had to pick one now?"
    assert len(long_input) > 80
    row = fixture_rows("mf")[0]
    row["multi_turns"][0]["input"] = long_input
    with pytest.raises(sb.SCBenchDataError) as err:
        sb.build_context("mf", 2, row)
    assert str(err.value) == f"scbench/mf row 2: mf input has no 'The ... is' target: {long_input[:80]!r}"
    row = fixture_rows("mf")[0]
    row["context"] = [1, "2"]
    with pytest.raises(sb.SCBenchDataError) as err:
        sb.build_context("mf", 1, row)
    assert str(err.value) == "scbench/mf row 1: mf context must be a list of ints"


@pytest.mark.parametrize(
    "task, mutate, message",
    [
        ("mf", lambda r: r["multi_turns"][0].update(input=None), "input must be a string, got NoneType"),
        ("kv", lambda r: r["multi_turns"][1].update(input=None), "turn 1 input must be a string, got NoneType"),
        (
            "summary_with_needles",
            lambda r: r["multi_turns"][1].update(task="x"),
            "turn 1 task must be one of scbench_summary, scbench_passkey, got 'x'",
        ),
        (
            "choice_eng",
            lambda r: r["multi_turns"][0].update(options=["a", "b"]),
            "turn 0 options must be a list of 4 strings, got ['a', 'b']",
        ),
        (
            "choice_eng",
            lambda r: r["multi_turns"][0].update(answer=None),
            "turn 0 answer must be a string, got NoneType",
        ),
        ("choice_eng", lambda r: r["multi_turns"][1].update(answer="x"), "turn 1 answer 'x' is not one of its options"),
        (
            "vt",
            lambda r: r["multi_turns"][0].update(answer=["A", None]),
            "turn 0 answer item must be a string, got NoneType",
        ),
        ("vt", lambda r: r["multi_turns"][1].update(answer=[]), "turn 1 answer is an empty list"),
        ("repoqa", lambda r: r["multi_turns"][1].update(name=None), "turn 1 name must be a string, got NoneType"),
        ("repoqa", lambda r: r["multi_turns"][0].update(answer=None), "turn 0 answer must be a string, got NoneType"),
        (
            "qa_eng",
            lambda r: r["multi_turns"][1].update(answer=["Paris", 2.5]),
            "turn 1 answer item must be a string, got float",
        ),
        ("qa_eng", lambda r: r["multi_turns"][0].update(answer=[]), "turn 0 answer is an empty list"),
        ("kv", lambda r: r["multi_turns"][1].update(answer=None), "turn 1 answer must be a string, got NoneType"),
        ("kv", lambda r: r.update(context=7), "context must be a string, got int"),
        ("kv", lambda r: r.update(context=[1, 2]), "context must be a string, got list"),
        ("kv", lambda r: r.update(multi_turns=[]), "multi_turns must be a non-empty list of {input, answer} objects"),
        ("repoqa", lambda r: r.update(repo=3), "repo must be a string, got int"),
        (
            "repoqa",
            lambda r: r.update(lang="cobol"),
            "lang must be one of python, java, typescript, rust, cpp, go, got 'cobol'",
        ),
    ],
)
def test_row_errors_name_task_row_and_field(task, mutate, message):
    row = fixture_rows(task)[0]
    mutate(row)
    with pytest.raises(sb.SCBenchDataError) as err:
        sb.build_context(task, 4, row, needles={})
    assert str(err.value) == f"scbench/{task} row 4: {message}"


def test_qa_eng_list_answers_are_every_reference_in_order():
    row = fixture_rows("qa_eng")[0]
    row["multi_turns"][1]["answer"] = ["the Seine", "Seine", 1889]
    ctx = sb.build_context("qa_eng", 0, row)
    assert ctx.questions[1].references == ("the Seine", "Seine", "1889")
    assert ctx.questions[0].references == (row["multi_turns"][0]["answer"],)


def test_repoqa_repo_missing_from_the_pool_has_no_needles():
    row = fixture_rows("repoqa")[0]
    ctx = sb.build_context("repoqa", 0, row, needles={"someone/else": [("f", "def f(): pass")]})
    turn = row["multi_turns"][0]
    assert ctx.questions[0].references == (turn["answer"], row["lang"], turn["name"])
    assert parse_repoqa_references(ctx.questions[0].references)[3] == []


def test_parquet_reads_only_the_columns_asked_for():
    path = FIXTURES / "scbench" / "scbench_repoqa" / "test-00000-of-00001.parquet"
    (row,) = sb.iter_rows([path], ["repo", "multi_turns", "not_a_column"])
    assert set(row) == {"repo", "multi_turns"}
    assert row["multi_turns"] == fixture_rows("repoqa")[0]["multi_turns"]
    (whole,) = sb.iter_rows([path])
    assert whole == fixture_rows("repoqa")[0]


def test_bad_json_line_is_named_by_its_line_number(tmp_path):
    """Line 1 is blank, line 2 good, line 3 broken: the error names line 3 (counted from 1, blanks included)."""
    path = tmp_path / "t.jsonl"
    path.write_text('\n{"a": 1}\n{broken\n', encoding="utf-8")
    with pytest.raises(sb.SCBenchDataError) as err:
        list(sb.iter_rows([path]))
    assert str(err.value).startswith(f"{path}:3: not a JSON line (")


def test_jsonl_is_read_as_utf8_whatever_the_default_encoding(tmp_path, monkeypatch):
    """qa_chn's Chinese text read back intact where ``open``'s default encoding is latin-1 (as on a
    non-UTF-8 locale)."""
    real_open = builtins.open

    def latin1_default(file, mode="r", *args, encoding=None, **kw):
        if "b" not in mode:
            encoding = encoding or "latin-1"
        return real_open(file, mode, *args, encoding=encoding, **kw)

    path = write_jsonl(tmp_path / "scbench_qa_chn.jsonl", fixture_rows("qa_chn"))
    monkeypatch.setattr(sb, "open", latin1_default, raising=False)
    assert list(sb.iter_rows([path])) == fixture_rows("qa_chn")


# --- the repoqa needle pool ------------------------------------------------------------------------------------


def test_needle_pool_keeps_only_well_typed_repoqa_turns():
    """repoqa_and_kv: only ``scbench_repoqa`` turns give needles (a kv turn carrying a name too, and one
    before a repoqa turn, is skipped, not the end of the row); a turn without a string name, answer or repo
    gives none."""
    mixed = {
        "repo": "r",
        "multi_turns": [
            {"task": "scbench_kv", "name": "k", "answer": "v"},
            {"task": "scbench_repoqa", "name": "f", "answer": "def f(): pass"},
        ],
    }
    assert sb.needle_pool("repoqa_and_kv", [mixed]) == {"r": [("f", "def f(): pass")]}
    rows = [
        {"repo": "r", "multi_turns": [{"name": None, "answer": "def g(): pass"}, {"name": "h", "answer": None}]},
        {"repo": None, "multi_turns": [{"name": "i", "answer": "def i(): pass"}]},
        {"repo": "r", "multi_turns": [{"name": "j", "answer": "def j(): pass"}]},
    ]
    assert sb.needle_pool("repoqa", rows) == {"r": [("j", "def j(): pass")]}


def _needles(ctx: Context, j: int = 0) -> list[str]:
    return [name for name, _ in parse_repoqa_references(ctx.questions[j].references)[3]]


def test_one_bench_keeps_one_needle_pool_per_task():
    """repoqa's fixture pool is clamp and running_mean, repoqa_and_kv's running_mean alone, whichever is
    loaded first on the same bench."""
    bench = sb.SCBenchBench(data_dir=FIXTURES)
    (rq,) = bench.contexts("repoqa", length=0, limit=1, seed=0, prompt_length=None)
    (rkv,) = bench.contexts("repoqa_and_kv", length=0, limit=1, seed=0, prompt_length=None)
    assert _needles(rq) == ["clamp", "running_mean"] and _needles(rkv) == ["running_mean"]


def test_repoqa_and_kv_pool_from_files_skips_kv_turns_with_a_name(tmp_path):
    row = fixture_rows("repoqa_and_kv")[0]
    row["multi_turns"][1]["name"] = "kv_lookup"  # a kv turn: never a needle
    write_jsonl(tmp_path / "scbench" / "scbench_repoqa_and_kv" / "t.jsonl", [row])
    bench = sb.SCBenchBench(data_dir=tmp_path)
    (ctx,) = bench.contexts("repoqa_and_kv", length=0, limit=1, seed=0, prompt_length=None)
    assert _needles(ctx) == ["running_mean"]


def test_max_turns_caps_the_questions_and_the_needle_pool_of_file_rows():
    """The official run with ``--max_turns 1`` asks only each row's first turn and pools only the needles of
    the turns it asked: clamp (turn 0), not running_mean (turn 1)."""
    bench = sb.SCBenchBench(data_dir=FIXTURES, max_turns=1)
    (ctx,) = bench.contexts("repoqa", length=0, limit=1, seed=0, prompt_length=None)
    assert [q.qid for q in ctx.questions] == ["0"] and ctx.meta["n_turns"] == 2
    assert _needles(ctx) == ["clamp"]


def test_rows_past_the_limit_are_not_read(tmp_path):
    """Rows stream: a broken line after the rows asked for is never parsed (kv: the pool is repoqa's only;
    repoqa with limit 0 builds no pool)."""
    good = fixture_rows("kv")[0]
    path = write_jsonl(tmp_path / "scbench" / "scbench_kv" / "t.jsonl", [good, good])
    path.write_text(path.read_text(encoding="utf-8") + "{broken\n", encoding="utf-8")
    bench = sb.SCBenchBench(data_dir=tmp_path)
    assert len(list(bench.contexts("kv", length=0, limit=1, seed=0, prompt_length=None))) == 1
    rq = write_jsonl(tmp_path / "scbench" / "scbench_repoqa" / "t.jsonl", fixture_rows("repoqa") * 2)
    rq.write_text(rq.read_text(encoding="utf-8") + "{broken\n", encoding="utf-8")
    assert list(bench.contexts("repoqa", length=0, limit=0, seed=0, prompt_length=None)) == []


def test_a_bad_line_right_after_the_rows_asked_for_is_not_read(tmp_path):
    """The line just past ``limit`` is not read either (it was: a corrupt line 2 failed a run asking for 1 row)."""
    path = write_jsonl(tmp_path / "scbench" / "scbench_kv" / "t.jsonl", [fixture_rows("kv")[0]])
    path.write_text(path.read_text(encoding="utf-8") + "{broken\n", encoding="utf-8")
    bench = sb.SCBenchBench(data_dir=tmp_path)
    assert len(list(bench.contexts("kv", length=0, limit=1, seed=0, prompt_length=None))) == 1
    with pytest.raises(sb.SCBenchDataError, match=r"t\.jsonl:2: not a JSON line"):
        list(bench.contexts("kv", length=0, limit=2, seed=0, prompt_length=None))


def test_row_measure_of_a_repoqa_row():
    """Byte tokenizer, hand-counted: context prompt head + instruction + "ctx" = 1 + 5 + len(instruction) + 3,
    the longer query "find g" + tail = 6 + 13, plus repoqa's 1024 new tokens. A measure needs no needle pool."""
    row = {"lang": "python", "repo": "r", "context": "ctx", "multi_turns": [
        {"input": "f", "name": "f", "answer": "def f(): pass"},
        {"input": "find g", "name": "g", "answer": "def g(): pass"},
    ]}  # fmt: skip
    instruction = sb.INSTRUCTIONS["repoqa"]
    assert sb.row_measure(byte_tokenizer(), "repoqa")(row) == 1 + 5 + len(instruction.encode()) + 3 + 6 + 13 + 1024


# --- generated rows -------------------------------------------------------------------------------------------


def test_generating_needs_a_prompt_length_with_its_tokenizer():
    with pytest.raises(KvbenchError) as err:
        list(sb.SCBenchBench().contexts("mf", length=400, limit=1, seed=0, prompt_length=lambda c: 0))
    assert str(err.value) == ("generating SCBench rows needs kvbench.prompt.prompt_length(tokenizer) (its tokenizer)")


def _cache_rows(directory: Path) -> list[dict]:
    files = list(directory.iterdir()) if directory.is_dir() else []
    assert len(files) <= 1
    return [json.loads(line) for line in files[0].read_text(encoding="utf-8").splitlines()] if files else []


def test_generated_rows_are_saved_every_eight_and_at_the_end(tmp_path):
    """Without a cache, 8 rows generate; with one, a generation interrupted after its 8th row has those 8 rows
    on disk, the finished one all 9, and a rerun that draws nothing new leaves the file as it was. Each
    context is its row's, numbered from 0."""
    measure = prompt_length(byte_tokenizer())
    plain = list(sb.SCBenchBench().contexts("mf", length=400, limit=8, seed=3, prompt_length=measure))
    assert [c.item for c in plain] == [str(i) for i in range(8)]
    bench = sb.SCBenchBench()
    bench.cache_dir = tmp_path / "cache"
    gen = bench.contexts("mf", length=400, limit=9, seed=3, prompt_length=measure)
    first = list(itertools.islice(gen, 8))
    assert first == plain
    saved = _cache_rows(bench.cache_dir)
    assert len(saved) == 8
    assert [sb.build_context("mf", i, r, {}, source="generated") for i, r in enumerate(saved)] == first
    last = next(gen)
    assert next(gen, None) is None and last.item == "8"
    assert len(_cache_rows(bench.cache_dir)) == 9
    (path,) = bench.cache_dir.iterdir()
    before = path.stat()
    assert list(bench.contexts("mf", length=400, limit=9, seed=3, prompt_length=measure)) == [*first, last]
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


class _Renamed(sb.SCBenchBench):
    name = "scbench_copy"


def test_a_subclass_labels_its_contexts_with_its_own_name():
    (hub,) = _Renamed(data_dir=FIXTURES).contexts("kv", length=0, limit=1, seed=0, prompt_length=None)
    assert hub.bench == "scbench_copy"
    measure = prompt_length(byte_tokenizer())
    (generated,) = _Renamed().contexts("mf", length=400, limit=1, seed=0, prompt_length=measure)
    assert generated.bench == "scbench_copy" and generated.source == "generated"


# --- settings and sources: the errors a user reads -----------------------------------------------------------


def test_max_turns_of_one_is_a_cap_and_zero_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv(sb.MAX_TURNS_ENV, "1")
    assert sb.max_turns_setting() == 1
    monkeypatch.setenv(sb.MAX_TURNS_ENV, " 0 ")
    with pytest.raises(KvbenchError) as err:
        sb.max_turns_setting()
    assert str(err.value) == (
        "KVBENCH_SCBENCH_MAX_TURNS='0': give a positive number of turns (5 is the official cap), "
        "or unset it to ask every turn"
    )


def test_a_data_dir_without_scbench_data_is_named_where_only_the_generated_tasks_run(tmp_path):
    with pytest.raises(sb.MissingDataError) as err:
        sb.SCBenchBench(data_dir=tmp_path).contexts("qa_eng", length=0, limit=1, seed=0, prompt_length=None)
    assert err.value.reason == (
        f"needs SCBench's hub data (no SCBench data under {tmp_path / 'scbench'}; kvbench generates only "
        "kv, mf, prefix_suffix, vt offline)"
    )


def test_an_unknown_task_lists_the_valid_ones():
    with pytest.raises(ValueError) as err:
        sb.SCBenchBench().contexts("kvv", length=0, limit=1, seed=0, prompt_length=None)
    assert str(err.value) == f"unknown scbench task 'kvv'; valid tasks: {', '.join(sb.TASKS)}"
    assert "kv, prefix_suffix, vt, repoqa" in str(err.value)


def test_prompt_length_of_an_scbench_context_is_its_assembly_count_bos_included():
    """SCBench's context prompt is encoded with the tokenizer's special tokens (the BOS): the length counts it, as
    the assembly renders it, where a count of the whole prompt text without special tokens would not."""
    tok, bos = bos_tokenizer()
    r = render(tok, _sc("body"))
    assert r.context_ids[0] == bos
    assert prompt_length(tok)(_sc("body")) == len(r.context_ids) + len(r.question_ids[0])


# --- build_context: what a row becomes, and the refusals that are not row errors ----------------------------


def test_build_context_refuses_an_unknown_task_and_a_repoqa_row_without_its_pool():
    with pytest.raises(ValueError) as err:
        sb.build_context("kvv", 0, fixture_rows("kv")[0])
    assert str(err.value) == f"unknown scbench task 'kvv'; valid tasks: {', '.join(sb.TASKS)}"
    with pytest.raises(ValueError) as err:
        sb.build_context("repoqa", 0, fixture_rows("repoqa")[0])
    assert str(err.value) == "scbench/repoqa needs the repo's needle pool"


def test_a_vt_row_with_a_context_uses_it_not_its_input():
    row = fixture_rows("vt")[0]
    row.update(context="the real context", input="not the context")
    assert sb.build_context("vt", 0, row).body == "the real context"


def test_meta_and_source_of_a_built_context():
    row = fixture_rows("kv")[0]
    row["id"], row["task"] = 3.0, "not a subtask of kv"
    ctx = sb.build_context("kv", 2, row, max_turns=1)
    assert ctx.source == "hub" and len(ctx.questions) == 1
    # the reserve is sized for the turns asked: 150 new tokens x 1 turn + 1000, not x 2 turns
    assert ctx.reserve_tokens == ctx.meta["reserve_tokens"] == 1150 == sb.reserve_tokens("kv", 2, 1)
    assert ctx.meta == {"row": 2, "n_turns": 2, "reserve_tokens": 1150, "id": "3.0"}
