"""The analyses on converted families: a parallel-block MQA model (Falcon), a windowed GQA model (Mistral), a
windowed sandwich-norm soft-capped one (Gemma 2) and an OLMo 2 (norms on outputs, QK-norm over all heads), then
every analysis on every family test config of :mod:`interp.zoo.compat`. What cannot apply is refused by name."""

import pytest
import torch

from interp.analysis import (
    ablate_heads,
    activation_patching,
    classify_heads,
    composition_scores,
    direct_logit_attribution,
)
from interp.pruning import remove_heads
from interp.pruning.importance import head_importance
from interp.pruning.objectives import LanguageModelObjective
from interp.zoo.hf import from_hf

pytest.importorskip("transformers")
V = 97


def hf_model(name):
    from interp.zoo.compat import hf_test_model

    return hf_test_model(name)


@pytest.fixture(scope="module")
def models():
    return {name: from_hf(hf_model(name)) for name in ("falcon", "mistral", "gemma2", "olmo2")}


def test_recording_patterns_and_heads(models):
    ids = torch.randint(1, V, (2, 20))
    for model in models.values():
        logits, trace = model.run_with_cache(ids, names_filter=["*hook_pattern", "*hook_z", "*hook_resid_post"])
        assert trace.pattern(0).shape == (2, model.cfg.n_heads, 20, 20)
        window = model.cfg.window(0)
        if window is not None:  # a windowed layer puts no weight beyond its window
            far = torch.ones(20, 20).tril(-window).bool()
            assert float(trace.pattern(0)[..., far].abs().max()) == 0.0
        report = classify_heads(model, tokens=ids)
        assert (report.n_layers, report.n_heads) == (model.cfg.n_layers, model.cfg.n_heads)
        assert "positional" in report.details and len(report.details["positional"])


def test_patching_ablation_importance(models):
    torch.manual_seed(0)
    clean = torch.randint(1, V, (2, 12))
    corrupted = torch.randint(1, V, (2, 12))
    answers = torch.tensor([[3, 5], [7, 9]])
    for model in models.values():
        df = activation_patching(model, clean, corrupted, act="z", by="head", answer_tokens=answers)
        assert len(df) == model.cfg.n_layers * model.cfg.n_heads
        with torch.no_grad():
            base = model(clean)
            with ablate_heads(model, [(0, 0), (0, 2)], method="zero"):
                ablated = model(clean)
        assert (ablated - base).abs().max() > 0
        scores = head_importance(model, [clean], LanguageModelObjective())
        assert scores.shape == (model.cfg.n_layers, model.cfg.n_heads) and bool(torch.isfinite(scores).all())


def test_dla_sums_to_the_logit_difference_on_a_parallel_block(models):
    model = models["falcon"]
    ids = torch.randint(1, V, (2, 10))
    df = direct_logit_attribution(model, ids, torch.tensor([4, 6]))
    assert abs(df["attribution"].sum() - df.attrs["logit_diff"]) < 1e-3


def test_remove_heads_keeps_what_gating_computes_with_mqa_and_gqa(models):
    ids = torch.randint(1, V, (1, 16))
    for name in ("falcon", "mistral", "gemma2"):
        model = models[name]
        heads = {0: [1, 3], 1: list(range(model.cfg.n_heads))[:model.cfg.group_size]}  # a whole K/V group in 1
        gates = torch.ones(model.cfg.n_layers, model.cfg.n_heads)
        for layer, hs in heads.items():
            gates[layer, hs] = 0
        with torch.no_grad():
            model.set_head_gates(gates)
            want = model(ids)
            model.set_head_gates(None)
            small = remove_heads(model, heads)
            torch.testing.assert_close(small(ids), want, rtol=0, atol=1e-4)


def test_what_cannot_apply_is_refused_by_name(models):
    ids = torch.randint(1, V, (1, 10))
    with pytest.raises(ValueError, match="act='resid_mid' does not exist in a parallel block"):
        activation_patching(models["falcon"], ids, ids.flip(1), act="resid_mid", by="layer",
                            answer_tokens=torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="sublayer_norm='sandwich'"):
        direct_logit_attribution(models["gemma2"], ids, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="qk_norm='full'"):
        composition_scores(models["olmo2"])
    with pytest.raises(ValueError, match="remove_heads: qk_norm='full'"):
        remove_heads(models["olmo2"], {0: [0]})
    assert composition_scores(models["falcon"]).shape[0] == 2  # parallel blocks still compose across layers


def _family_names():
    from interp.zoo.compat import FAMILIES

    return sorted(FAMILIES)


@pytest.mark.parametrize("name", _family_names())
def test_every_analysis_runs_or_is_refused_by_name_on_every_family(name):
    """Each family's test config: what applies gives a checked answer, what cannot apply names the setting."""
    from interp.pruning import train_l0_gates

    model = from_hf(hf_model(name))
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    torch.manual_seed(0)
    clean, corrupted = torch.randint(1, V, (2, 12)), torch.randint(1, V, (2, 12))
    answers = torch.tensor([[3, 5], [7, 9]])
    _, trace = model.run_with_cache(clean, names_filter=["*hook_pattern", "*hook_result"])
    assert trace.pattern(0).shape == (2, H, 12, 12)
    assert classify_heads(model, tokens=clean, progress=False).n_heads == H
    df = activation_patching(model, clean, corrupted, act="z", by="head", answer_tokens=answers)
    assert len(df) == L * H
    with torch.no_grad():
        base = model(clean)
        with ablate_heads(model, [(0, 0)], method="zero"):
            assert (model(clean) - base).abs().max() > 0
    scores = head_importance(model, [clean], LanguageModelObjective())
    assert scores.shape == (L, H) and bool(torch.isfinite(scores).all())
    for level, units in (("head", H), ("group", cfg.n_kv_heads)):
        res = train_l0_gates(model, [clean], LanguageModelObjective(), target=0.5, steps=2, level=level)
        assert res.gates.shape == (L, H) and res.pruned_units.shape == (L, units)
    grouped = res.gates.view(L, cfg.n_kv_heads, cfg.group_size)  # [L, K, G]: one gate per K/V group
    assert torch.equal(grouped, grouped[..., :1].expand_as(grouped))

    if cfg.parallel_block != "none":
        with pytest.raises(ValueError, match=f"in a parallel block \\(parallel_block='{cfg.parallel_block}'"):
            activation_patching(model, clean, corrupted, act="resid_mid", by="layer", answer_tokens=answers)
    else:
        assert len(activation_patching(model, clean, corrupted, act="resid_mid", by="layer",
                                       answer_tokens=answers)) == L
    if cfg.sublayer_norm != "input":
        with pytest.raises(ValueError, match=f"sublayer_norm='{cfg.sublayer_norm}'"):
            direct_logit_attribution(model, clean, torch.tensor([4, 6]))
    else:  # the parts sum to the logit difference (parallel blocks included)
        dla = direct_logit_attribution(model, clean, torch.tensor([4, 6]))
        assert abs(dla["attribution"].sum() - dla.attrs["logit_diff"]) < 1e-3
    inside = [f"{k}={v!r}" for k, v in (("sublayer_norm", cfg.sublayer_norm), ("qk_norm", cfg.qk_norm))
              if v not in ("input", "none")]
    if inside:
        with pytest.raises(ValueError, match="puts a norm inside those circuits") as refused:
            composition_scores(model)
        assert any(setting in str(refused.value) for setting in inside)
    else:
        assert composition_scores(model).shape[0] == 2  # across layers, parallel blocks included
    heads = {0: [0], 1: list(range(cfg.group_size))}  # one head, and the whole first K/V group of layer 1
    if cfg.qk_norm == "full":
        with pytest.raises(ValueError, match="remove_heads: qk_norm='full'"):
            remove_heads(model, heads)
        return
    gates = torch.ones(L, H)
    for layer, hs in heads.items():
        gates[layer, hs] = 0
    with torch.no_grad():
        model.set_head_gates(gates)
        want = model(clean)
        model.set_head_gates(None)
        torch.testing.assert_close(remove_heads(model, heads)(clean), want, rtol=0, atol=1e-4)
