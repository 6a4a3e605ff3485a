"""A model with heads physically removed (per-layer head counts) is classified head by head, and agrees with
the same model whose removed heads are only gated off."""

import math

import torch

import interp
from interp.pruning import remove_heads


def _rows(df, key_cols):
    return {tuple(r[c] for c in key_cols): r for r in df.to_dict("records")}


def test_classify_heads_of_a_pruned_model_matches_the_gated_model():
    model = interp.load("induction-2l")
    removed = {0: [0, 3], 1: [1]}
    small = remove_heads(model, removed)
    assert [small.cfg.layer(layer).n_heads for layer in range(2)] == [2, 3]
    gates = [torch.ones(4) for _ in range(2)]
    for layer, heads in removed.items():
        gates[layer][heads] = 0.0
    model.set_head_gates(gates)
    try:
        gated = interp.classify_heads(model, n_seqs=16)
    finally:
        model.set_head_gates(None)
    pruned = interp.classify_heads(small, n_seqs=16)
    assert pruned.layer_heads == [2, 3] and pruned.n_heads == 3
    # Kept heads keep their order: new index -> original index, per layer.
    kept = {layer: [h for h in range(4) if h not in removed.get(layer, [])] for layer in range(2)}
    for name in ("positional", "induction"):
        got, want = pruned.details[name], gated.details[name]
        assert len(got) == 5
        want = _rows(want, ["layer", "head"])
        for r in got.to_dict("records"):
            ref = want[(r["layer"], kept[r["layer"]][r["head"]])]
            for col, v in r.items():
                if col == "head":
                    continue
                w = ref[col]
                assert (isinstance(v, float) and math.isnan(v) and math.isnan(w)) or abs(v - w) <= 1e-5, (name, col)
    want_kinds = {(layer, kept[layer].index(h), k) for layer, h, k in gated.df[["layer", "head", "kind"]].values
                  if h in kept[layer]}
    assert set(map(tuple, pruned.df[["layer", "head", "kind"]].values)) == want_kinds
    assert "induction" in set(pruned.df.kind)  # layer 1 keeps induction heads
    fig = pruned.figure()
    assert len(fig.data[0].z) == 2


def test_head_map_of_a_pruned_report_leaves_removed_cells_empty():
    small = remove_heads(interp.load("induction-2l"), {0: [0, 3]})
    report = interp.classify_heads(small, n_seqs=8)
    fig = report.figure()
    z, hover = fig.data[0].z, fig.data[0].customdata  # a stripe per kind: S columns per head
    S = len(z[0]) // 4
    assert all(math.isnan(v) for v in z[0][2 * S:]) and not any(math.isnan(v) for v in z[0][:2 * S])
    assert [(int(h), text) for h, text in hover[0][2 * S:]] == [(2, "removed")] * S + [(3, "removed")] * S
    assert not any(math.isnan(v) for v in z[1])
