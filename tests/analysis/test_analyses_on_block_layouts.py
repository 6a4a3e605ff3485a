"""Every public analysis on every block layout (input norm, sandwich norm, output norm, parallel block, mixture of
experts), each against a naive reference written here from the block's definition, or a refusal by name.

The models are tiny and random with every parameter re-drawn (norm weights away from 1, biases away from 0), so a
norm weight an analysis forgets shows in its numbers. The layouts differ only in the config field that defines
them; the references read the trace and the weights directly, never the analysis' own helpers.
"""

import pytest
import torch
from helpers import tiny_model

from interp.analysis import (
    ablate_heads,
    activation_patching,
    attribution_patching,
    composition_scores,
    direct_logit_attribution,
    induction_scores,
)
from interp.data import repeated_sequences
from interp.weights import stacked

V = 24
LAYOUTS = {
    "input": dict(),
    "sandwich": dict(sublayer_norm="sandwich"),
    "output": dict(sublayer_norm="output"),
    "parallel": dict(parallel_block="two_norms"),
    "moe": dict(n_experts=4, n_experts_per_token=2),
}
POST_NORM = ("sandwich", "output")  # a norm between attention and the residual


def _model(layout: str):
    model = tiny_model(3, d_vocab=V, causal=True, normalization="rms", positional="rotary", activation="swiglu",
                       **LAYOUTS[layout])
    torch.manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name and name.endswith("weight"):
                p.copy_(1 + 0.5 * torch.randn_like(p))  # norms far from 1: a forgotten weight shows
            else:
                p.normal_(0, 0.4)
    return model


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request):
    return request.param, _model(request.param)


def _rms(x, eps):
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@torch.no_grad()
def naive_copying(model, toks):
    """The exact copying score ``[L, H]`` from the trace: each head's write as it reaches the residual
    (``w_post * z_h W_O[h] / rms(sum of heads)`` through a norm after attention, the normaliser from the same
    pass), through the final norm with its frozen scale, ranked against the whole vocabulary; and the same score
    of the bare ``z_h W_O[h]`` (what the score was before it read the output norm)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    names = ["*hook_pattern", "*hook_result", f"blocks.{L - 1}.hook_resid_post"]
    post = hasattr(model.blocks[0], "ln1_post")
    names += ["*hook_attn_out_pre_norm"] if post else []
    _, trace = model.run_with_cache(toks, names_filter=names)
    final = trace[f"blocks.{L - 1}.hook_resid_post"]  # [B, T, M]
    W_U, ln_f = model.unembed.weight, model.ln_final
    scores = {kind: torch.zeros(L, H, dtype=torch.float64) for kind in ("through_norm", "bare")}
    for layer, block in enumerate(model.blocks):
        for head in range(H):
            fracs: dict[str, list[float]] = {"through_norm": [], "bare": []}
            for b in range(toks.shape[0]):
                for q in range(toks.shape[1]):
                    if not any(toks[b, k - 1] == toks[b, q] for k in range(1, q)):
                        continue  # no induction target on this row
                    share = trace.head_out(layer)[b, q, head]  # [M] z_h W_O[h]
                    write = share
                    if post:
                        summed = trace[f"blocks.{layer}.hook_attn_out_pre_norm"][b, q]  # [M]
                        write = block.ln1_post.weight * share / _rms(summed, block.ln1_post.eps)
                    attended = toks[b, int(trace.pattern(layer)[b, head, q].argmax())]
                    scale = _rms(final[b, q], ln_f.eps)
                    for kind, w in (("through_norm", write), ("bare", share)):
                        logits = W_U @ (ln_f.weight * w / scale)  # [V]
                        fracs[kind].append(float((logits < logits[attended]).double().mean()))
            for kind, f in fracs.items():
                scores[kind][layer, head] = sum(f) / len(f)
    return scores


def _copying(model, toks):
    df = induction_scores(model, toks, copying_comparisons=None, progress=False)
    return torch.tensor(df.copying.tolist(), dtype=torch.float64).view(model.cfg.n_layers, model.cfg.n_heads)


def test_copying_equals_the_write_through_every_norm(layout):
    """The copying score ranks the attended token among a head's direct logits, its write taken as it reaches
    the residual (through a sandwich / output norm, then the final norm). Exact to 1e-5 on every layout; the bare
    ``z_h W_O[h]`` gives other scores on the post-norm layouts (the test bites)."""
    name, model = layout
    toks = repeated_sequences(3, 6, V, seed=1)  # [3, 13]: bos, then 6 tokens twice
    got, want = _copying(model, toks), naive_copying(model, toks)
    torch.testing.assert_close(got, want["through_norm"], atol=1e-5, rtol=0)
    if name in POST_NORM:
        assert float((got - want["bare"]).abs().max()) > 1e-2


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "olmo2"])
def test_copying_on_gemma2_gemma3_olmo2_reads_their_output_norms(family):
    """The converted random tiny Gemma 2 / Gemma 3 (sandwich norms) and OLMo 2 (output norms) models: the
    copying score equals the exact reference through the output norm within 1e-5 (it was off by 0.03-0.06)."""
    pytest.importorskip("transformers")
    from interp.zoo.compat import V as hf_vocab
    from interp.zoo.compat import hf_test_model
    from interp.zoo.hf import from_hf

    model = from_hf(hf_test_model(family))
    assert model.cfg.sublayer_norm in POST_NORM
    toks = repeated_sequences(2, 6, hf_vocab, seed=2)
    got, want = _copying(model, toks), naive_copying(model, toks)
    torch.testing.assert_close(got, want["through_norm"], atol=1e-5, rtol=0)


@torch.no_grad()
def test_dla_equals_the_naive_parts_or_is_refused(layout):
    """Pre-norm layouts: each head's part is its write through the frozen final norm onto the logit direction,
    and the parts sum to the logit difference. A norm after attention is refused by name."""
    name, model = layout
    torch.manual_seed(0)
    toks = torch.randint(1, V, (2, 9))
    answers = torch.tensor([3, 5])
    if name in POST_NORM:
        with pytest.raises(ValueError, match=f"sublayer_norm='{LAYOUTS[name]['sublayer_norm']}'"):
            direct_logit_attribution(model, toks, answers)
        return
    df = direct_logit_attribution(model, toks, answers).set_index("component")
    logits, trace = model.run_with_cache(toks, names_filter=["*hook_result", "*hook_resid_post"])
    diff = logits[:, -1, 3] - logits[:, -1, 5]  # [B]
    assert df["attribution"].sum() == pytest.approx(float(diff.mean()), abs=1e-4)
    resid = trace[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][:, -1]  # [B, M]
    direction = model.ln_final.weight * (model.unembed.weight[3] - model.unembed.weight[5])  # [M]
    part = (trace.head_out(1)[:, -1, 2] @ direction) / _rms(resid, model.ln_final.eps)[:, 0]  # [B]
    assert df.loc["L1H2", "attribution"] == pytest.approx(float(part.mean()), abs=1e-5)


def test_composition_equals_the_naive_formula_or_is_refused(layout):
    """Layer 0's OV against layer 1's QK (K-composition), with layer 1's input norm weight folded into W_Q, W_K and
    W_V: ||OV_1 QK_2^T|| / (||OV_1|| ||QK_2^T||). A norm inside the circuit is refused by name."""
    name, model = layout
    if name in POST_NORM:
        with pytest.raises(ValueError, match=f"sublayer_norm='{LAYOUTS[name]['sublayer_norm']}'"):
            composition_scores(model)
        return
    got = composition_scores(model, "K")
    W_Q, W_K, W_V, W_O = (stacked(model, w) for w in ("W_Q", "W_K", "W_V", "W_O"))  # [L, H, M, D] / [L, H, D, M]
    w0, w1 = (model.blocks[i].ln1.weight.detach()[:, None] for i in (0, 1))  # [M, 1]: attention reads ln1(x)
    for h1, h2 in ((0, 1), (2, 3)):
        ov = (w0 * W_V[0, h1]) @ W_O[0, h1]  # [M, M]
        qk = (w1 * W_Q[1, h2]) @ (w1 * W_K[1, h2]).T  # [M, M]
        want = torch.linalg.norm(ov @ qk.T) / (torch.linalg.norm(ov) * torch.linalg.norm(qk))
        assert float(got[0, h1, 1, h2]) == pytest.approx(float(want), rel=1e-4)


def test_head_outputs_and_residual_parts_sum_to_what_the_block_adds(layout):
    """``trace.head_out`` is each head's share ``z_h W_O[h]``: with ``b_O`` it sums to the attention output before
    any norm after it; ``decompose_resid``'s parts sum to the final residual on every layout."""
    name, model = layout
    toks = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(2))
    _, trace = model.run_with_cache(toks)
    for layer, block in enumerate(model.blocks):
        summed = trace.head_out(layer).sum(2)  # [B, T, M]
        if block.attn.W_O.bias is not None:
            summed = summed + block.attn.W_O.bias
        hook = "hook_attn_out_pre_norm" if name in POST_NORM else "hook_attn_out"
        torch.testing.assert_close(summed, trace[f"blocks.{layer}.{hook}"], atol=1e-5, rtol=1e-5)
    parts = trace.decompose_resid()  # [C, B, T, M]
    torch.testing.assert_close(parts.sum(0), trace[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"],
                               atol=1e-4, rtol=1e-5)


def _with_hook(model, name, fn, toks):
    with torch.no_grad(), model.hooks([(name, lambda t, hook: fn(t))]):
        return model(toks)


def test_patching_and_ablation_equal_hand_written_hooks(layout):
    """Patching one head's z from the corrupted run, and zero-ablating it, give the logits of a hand-written hook
    that does the same on ``hook_z`` (per layout: the norm after attention sees the patched sum)."""
    name, model = layout
    g = torch.Generator().manual_seed(5)
    clean, corrupted = torch.randint(1, V, (2, 8), generator=g), torch.randint(1, V, (2, 8), generator=g)
    answers = torch.tensor([[3, 5], [7, 9]])
    df = activation_patching(model, clean, corrupted, act="z", by="head", answer_tokens=answers,
                             progress=False).set_index(["layer", "head"])
    _, src = model.run_with_cache(corrupted, names_filter="*hook_z")
    for layer, head in ((0, 1), (1, 3)):
        def patch(z, layer=layer, head=head):
            z = z.clone()
            z[:, :, head] = src[f"blocks.{layer}.attn.hook_z"][:, :, head]
            return z

        logits = _with_hook(model, f"blocks.{layer}.attn.hook_z", patch, clean)[:, -1]  # [B, V]
        want = (logits[[0, 1], answers[:, 0]] - logits[[0, 1], answers[:, 1]]).mean()
        assert df.loc[(layer, head), "metric"] == pytest.approx(float(want), abs=1e-4)

        def zero(z, head=head):
            z = z.clone()
            z[:, :, head] = 0
            return z

        want_logits = _with_hook(model, f"blocks.{layer}.attn.hook_z", zero, clean)
        with torch.no_grad(), ablate_heads(model, [(layer, head)], method="zero"):
            torch.testing.assert_close(model(clean), want_logits, atol=1e-5, rtol=1e-5)


def test_attribution_patching_equals_the_hand_written_gradient(layout):
    """``metric_clean + sum((z_corrupted - z_clean) * d metric / d z)`` over one head's z, the total derivative
    (through every later layer) taken by hand: a zero leaf added to each ``hook_z`` (every layout: the gradient
    runs through its norms)."""
    name, model = layout
    g = torch.Generator().manual_seed(6)
    clean, corrupted = torch.randint(1, V, (2, 8), generator=g), torch.randint(1, V, (2, 8), generator=g)
    answers = torch.tensor([[3, 5], [7, 9]])
    est = attribution_patching(model, clean, corrupted, act="z", by="head", answer_tokens=answers,
                               progress=False).set_index(["layer", "head"])
    _, src = model.run_with_cache(corrupted, names_filter="*hook_z")
    zs, zeros = {}, {}

    def probe(t, hook):
        zs[hook.name], zeros[hook.name] = t.detach(), torch.zeros_like(t, requires_grad=True)
        return t + zeros[hook.name]

    with torch.enable_grad(), model.hooks([("*hook_z", probe)]):
        logits = model(clean)[:, -1]  # [B, V]
        metric = (logits[[0, 1], answers[:, 0]] - logits[[0, 1], answers[:, 1]]).mean()
        grad = dict(zip(zeros, torch.autograd.grad(metric, list(zeros.values()))))
    for layer, head in ((0, 2), (1, 1)):
        z = f"blocks.{layer}.attn.hook_z"
        want = float(metric.detach()) + float(((src[z] - zs[z]) * grad[z])[:, :, head].sum())
        assert est.loc[(layer, head), "metric"] == pytest.approx(want, abs=1e-4)


def test_induction_attention_scores_equal_the_naive_mass(layout):
    """The ``induction`` score: the mean attention mass on the token after an earlier occurrence of the current
    token, over the rows that have such a target (read off the trace's patterns, whatever the block layout)."""
    _, model = layout
    toks = repeated_sequences(2, 5, V, seed=3)  # [2, 11]
    df = induction_scores(model, toks, copying=False, progress=False).set_index(["layer", "head"])
    _, trace = model.run_with_cache(toks, names_filter="*hook_pattern")
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            masses = []
            for b in range(toks.shape[0]):
                for q in range(toks.shape[1]):
                    keys = [k for k in range(1, q + 1) if k != q and toks[b, k - 1] == toks[b, q]]
                    if keys:
                        masses.append(float(trace.pattern(layer)[b, head, q, keys].sum()))
            assert df.loc[(layer, head), "induction"] == pytest.approx(sum(masses) / len(masses), abs=1e-5)
