"""The row schema (kvbench.rows): the JSON line a Row writes is the one kvbench has always written, the identity is
the results store's, and a line from an older kvbench reads by the rules the store applies."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from kvbench.results.keys import LEGACY_KEY, OPTIONAL_KEY, ROW_KEY, row_key
from kvbench.rows import IDENTITY, Absent, Row, RowKey, column_kind, defaults, identity_fields, normal_key

KEY = dict(model="tiny-trained", engine="torch", method="snapkv[window=8]", allocation="uniform", p=0.5,
           bench="ruler", task="niah_single_1", item="3", question="0", length=4096, seed=42,
           context_sha256="ab" * 32, model_fingerprint="cd" * 32, artifact_sha256=None, source=None)  # fmt: skip
MEASURED = dict(prediction="7 é", references=["7"], score=100.0, scorer="string_match_all",
                scores={"string_match_all": 100.0}, real_fork=True, query_aware=False, default_allocation="uniform",
                kept_entries=120, full_entries=240, stored_bytes=4096, full_bytes=8192, padded=False, n_context=40,
                prot=5, truncated_from=None, prefill_s=0.25, score_s=0.01, fork_s=0.002, answer_s=0.5, new_tokens=2,
                stopped=True, random_weights=False, meta={"depth": 0.5})  # fmt: skip
#: the line kvbench wrote for these values before Row existed (runner._answer_row's dict, json.dumps'd by the store)
LINE = (
    '{"model": "tiny-trained", "engine": "torch", "method": "snapkv[window=8]", "allocation": "uniform", "p": 0.5, '
    '"bench": "ruler", "task": "niah_single_1", "item": "3", "question": "0", "length": 4096, "seed": 42, '
    f'"context_sha256": "{"ab" * 32}", "model_fingerprint": "{"cd" * 32}", "artifact_sha256": null, "source": null, '
    '"prediction": "7 é", "references": ["7"], "score": 100.0, "scorer": "string_match_all", '
    '"scores": {"string_match_all": 100.0}, "real_fork": true, "query_aware": false, "default_allocation": "uniform", '
    '"kept_entries": 120, "full_entries": 240, "stored_bytes": 4096, "full_bytes": 8192, "padded": false, '
    '"n_context": 40, "prot": 5, "truncated_from": null, "prefill_s": 0.25, "score_s": 0.01, "fork_s": 0.002, '
    '"answer_s": 0.5, "new_tokens": 2, "stopped": true, "random_weights": false, "meta": {"depth": 0.5}'
)
#: the line written since batched answering: the same, with the answer's batch size after answer_s
LINE_BATCH = LINE.replace('"answer_s": 0.5, ', '"answer_s": 0.5, "answer_batch": 1, ')


def dumps(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False, allow_nan=False)


def test_a_row_writes_the_line_kvbench_always_wrote():
    row = Row.of(RowKey(**KEY), **MEASURED)
    assert dumps(row.to_dict()) == LINE_BATCH + "}"
    options = Row.of(RowKey(**KEY), **MEASURED, method_options={"window": 8})  # only non-default options appear
    assert dumps(options.to_dict()) == LINE_BATCH + ', "method_options": {"window": 8}}'


def test_identity_is_the_stores_key():
    row = Row.of(RowKey(**{**KEY, "p": 0.30000000000000004, "item": 7}), **MEASURED)
    assert IDENTITY == ROW_KEY == tuple(f.name for f in fields(RowKey))
    assert row.identity() == row_key(row.to_dict()) == normal_key([row.to_dict()[k] for k in IDENTITY])
    assert row.identity()[IDENTITY.index("p")] == 0.3 and row.identity()[IDENTITY.index("item")] == "7"
    assert [f.name for f in fields(Row)][: len(IDENTITY)] == list(IDENTITY)  # the key leads the line


def test_absent_rules_give_the_stores_key_lists():
    ever = ("model", "engine", "method", "allocation", "p", "bench", "task", "item", "question")
    assert LEGACY_KEY == identity_fields(Absent.NEVER) == ever
    assert OPTIONAL_KEY == ("source",)
    assert identity_fields(Absent.UPGRADE_TO_NULL) == ("artifact_sha256",)
    assert identity_fields(Absent.LEGACY) == ("length", "seed", "context_sha256", "model_fingerprint")
    assert defaults(f.name for f in fields(Row)) == {
        "source": None, "query_aware": False, "default_allocation": None, "answer_batch": 1, "method_options": {}
    }  # fmt: skip


def test_from_dict_reads_an_older_line_and_refuses_a_legacy_or_foreign_one():
    line = json.loads(LINE + "}")  # written before answer_batch existed: reads as answered alone
    assert Row.from_dict(line) == Row.of(RowKey(**KEY), **MEASURED) == Row.from_dict(json.loads(LINE_BATCH + "}"))
    assert Row.from_dict(line).answer_batch == 1
    old = {k: v for k, v in line.items() if k not in ("source", "query_aware", "default_allocation")}
    row = Row.from_dict(old)
    assert (row.source, row.query_aware, row.default_allocation, row.method_options) == (None, False, None, {})
    assert row.identity() == row_key(old)  # the store reads the missing source as null too
    assert RowKey.from_dict({k: line[k] for k in IDENTITY}).identity() == row.identity()
    with pytest.raises(ValueError, match="artifact_sha256"):
        Row.from_dict({k: v for k, v in line.items() if k != "artifact_sha256"})  # legacy: upgrade first
    with pytest.raises(ValueError, match="lacks seed"):
        Row.from_dict({k: v for k, v in line.items() if k != "seed"})
    with pytest.raises(ValueError, match="oops"):
        Row.from_dict({**line, "oops": 1})


def test_column_kinds():
    assert column_kind("p") == "float" and column_kind("length") == "str" and column_kind("artifact_sha256") == "str"
    assert column_kind("stored_bytes") == "float" and column_kind("truncated_from") == "float"
    assert column_kind("real_fork") == "bool" and column_kind("scorer") == "str"
    assert column_kind("default_allocation") == "str" and column_kind("scores") is None
    with pytest.raises(KeyError):
        column_kind("nope")


def test_a_row_is_frozen():
    row = Row.of(RowKey(**KEY), **MEASURED)
    with pytest.raises(AttributeError):
        row.p = 0.1  # type: ignore[misc]
