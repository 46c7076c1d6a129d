"""``kvbench run --engine vllm`` end to end on each shipped trained model (bfloat16: the MoE Qwen3-Next default
and its dense Qwen3.5 twin), offline, with the shipped bfloat16 calibration artifacts (vLLM
environment only)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: these tests run in .venv-vllm (scripts/setup_vllm.sh)")

from kvbench import models  # noqa: E402
from kvbench.engines import engines_for  # noqa: E402
from kvbench.methods import list_methods, method_class  # noqa: E402
from tests.test_cli import kvbench, read_rows  # noqa: E402

#: every built-in model with shipped (trained) weights; computed here, not imported from
#: tests/test_builtin_model.py, which needs the training package that .venv-vllm does not install
TRAINED = sorted(name for name, m in models.BUILTIN_MODELS.items() if m.shipped is not None)


@pytest.mark.parametrize("model", TRAINED)
def test_every_method_runs_on_the_vllm_engine(model, tmp_path, capsys):
    """Every built-in method that does not name its engines runs under --engine vllm with its default
    allocation (KVzip's ``global`` keeps different counts per KV head: head pages), and with a per-head-uniform
    one (--allocation flat). A method that requires a capability the vllm engine does not declare (``oracle``
    requires ``model_weights``: it reads ``W_O`` from the model) is refused before any model loads, exit 2, and
    writes nothing."""
    builtin = [m for m in list_methods() if not m.startswith("test-")]
    methods = [m for m in builtin if "vllm" in (engines_for(method_class(m)) or ("vllm",))]
    torch_only = sorted(set(builtin) - set(methods))
    assert "oracle" in torch_only and "kvzip" in methods and "gatesight" in methods
    common = ["--model", model, "--engine", "vllm", "--bench", "ruler", "--task", "niah_single_1", "--limit", "1",
              "--p", "0.5"]  # fmt: skip
    out = tmp_path / "run"
    for name in torch_only:
        assert kvbench("run", "--method", f"full,{name}", *common, "--out", str(out)) == 2
        assert "--engine torch" in capsys.readouterr().err
        assert not out.exists()
    assert kvbench("run", "--method", ",".join(methods), *common, "--out", str(out)) == 0, capsys.readouterr().err
    rows = read_rows(out)
    assert {r["method"] for r in rows} == set(methods)
    agnostic = [r for r in rows if not r["query_aware"]]  # batched by default: every such child of the context at once
    assert len(agnostic) > 1 and all(r["answer_batch"] == len(agnostic) for r in agnostic)
    serial = tmp_path / "serial"  # --answer-batch 1: each child alone, the same predictions
    assert kvbench("run", "--method", ",".join(methods), *common, "--answer-batch", "1", "--out", str(serial)) == 0
    alone = {(r["method"], r["allocation"], r["p"]): r for r in read_rows(serial)}
    assert all(r["answer_batch"] == 1 for r in alone.values())
    assert {k: r["prediction"] for k, r in alone.items()} == {
        (r["method"], r["allocation"], r["p"]): r["prediction"] for r in rows
    }
    assert all(r["engine"] == "vllm" and r["model"] == model and r["real_fork"] for r in rows)
    full = next(r for r in rows if r["method"] == "full")
    half = [r for r in rows if r["p"] == 0.5]
    assert all(r["stored_bytes"] < full["stored_bytes"] for r in half)  # fewer pool blocks than the parent's
    assert kvbench("run", "--method", "kvzip", "--allocation", "flat", *common, "--out", str(out)) == 0
    report_dir = tmp_path / "report"
    assert kvbench("report", "--results", str(out), "--out", str(report_dir)) == 0  # vLLM renders reports too
    report = (report_dir / "report.md").read_text()
    assert "kvzip [flat]" in report and "kvzip" in report.replace("kvzip [flat]", "")
