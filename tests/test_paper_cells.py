"""The ``cells`` stage of ``kvbench paper`` (Figures 6-7, Table 5's oracle row, Figure 2c) on a label set built by
hand: one cell's effective write equals U, so every number is known in advance."""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.methods.gatesight.labels import LabelledDoc, LabelSet
from kvbench.methods.gatesight.paper import cells as C
from kvbench.methods.gatesight.paper import measure
from kvbench.methods.gatesight.paper.numbers import spec_key

N = 40  # body entries: k = 4 at 10 %, a chance rate of exactly 0.1


def _doc(tmp_path, i: int) -> LabelledDoc:
    """GDN layers 0, 1 (two value heads each) before attention layer 2 (one KV head). Cell (GDN 1, head 0) writes
    β‖v‖ = U and decays slowly (half-life ~6,900 tokens); GDN 0's cells are noise; cell (1, 1) is constant."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(i)
    u = torch.rand(N, generator=gen) + 0.01
    beta = torch.ones(2, N, 2)
    vnorm = torch.rand(2, N, 2, generator=gen)
    vnorm[1, :, 0] = u
    vnorm[1, :, 1] = 1.0
    g = torch.full((2, N, 2), -1.0)
    g[1, :, 0] = -1e-4
    path = tmp_path / f"d{i}.safetensors"
    tensors = {"utility": u.reshape(1, 1, N), "beta": beta, "g": g, "vnorm": vnorm, "gate_head_mean": torch.ones(1, 1)}
    save_file(tensors, str(path))
    return LabelledDoc("c", f"d{i}", path, N, 0)


@pytest.fixture
def labels(tmp_path):
    manifest = {"attn_layer_ids": [2], "gdn_layer_ids": [0, 1], "n_kv_heads": 1, "fingerprint": "f"}
    return LabelSet(tmp_path, manifest, [_doc(tmp_path, i) for i in range(3)])


def test_rank_corr_and_decile_lift_by_hand():
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    rho = C.rank_corr(a, a[:1])
    assert rho[:, 0].tolist() == pytest.approx([1.0, -1.0, 0.0])
    u = torch.arange(N, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    assert C.decile_lift(u, u, gen) == pytest.approx((10.0, 10.0))  # k = 4 of 40: all hit, chance 0.1
    assert C.decile_lift(-u, u, gen) == pytest.approx((0.0, 0.0))


def test_cell_analysis_finds_the_cell_that_writes_u(labels):
    r = C.cell_analysis(labels, window=6)
    assert r["windows"] == [[0, 1]] and r["slow_heads"] == 1 and r["n_documents"] == 3
    assert r["cell_rho"][0][1][0] == pytest.approx(1.0) and r["cell_rho"][0][1][1] == 0.0  # constant: 0
    assert r["best_layer"] == [1] and r["layer_rho"][0][1] == pytest.approx(1.0)  # head mean: U + a constant
    assert r["oracle"]["cells"] == [[[1, 0]]]
    best = r["oracle"]["layer_mean"]
    assert best["rho"] == pytest.approx(1.0) and best["ov@10"] == 1.0 and best["cov@10"] == pytest.approx(1.0)
    assert r["decile_lift"][C.DECILE_SIGNALS[0]] == pytest.approx({"top": 10.0, "bottom": 10.0})
    assert set(r["decile_lift"]) == set(C.DECILE_SIGNALS)


def test_cell_values_feed_the_paper_specs(labels):
    assert measure.ORACLE == C.ORACLE
    values = measure.cell_values(C.cell_analysis(labels, window=6), "main", "short", 6)
    oracle = {"kind": "predictor", "model": "main", "set": "short", "window": 6, "predictor": C.ORACLE}
    assert values[spec_key({**oracle, "metric": "ov@10"})] == 100.0
    cells = {"kind": "cells", "model": "main"}
    # 4 window cells: (1, 0) at ρ 1; the constant (1, 1) at 0; GDN 0's noise cells decide the rest
    share = values[spec_key({**cells, "layer": 0, "metric": "share_cells_rho_above_0.1"})]
    assert 25.0 <= share <= 75.0 and math.isclose(share % 25.0, 0.0, abs_tol=1e-9)
    assert values[spec_key({**cells, "metric": "max_cell_rho"})] == pytest.approx(1.0)
    assert values[spec_key({**cells, "layer": 0, "metric": "best_gdn_layer"})] == 1.0
    assert values[spec_key({**cells, "layer": 0, "metric": "best_layer_outside_window"})] == 0.0
