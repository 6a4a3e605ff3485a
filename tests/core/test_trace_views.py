"""Trace views without TransformerLens: short names, and residual stacks that add up to what the model computed."""

import pytest
import torch
from helpers import tiny_model


@pytest.fixture(scope="module")
def run():
    model = tiny_model(0, n_layers=3, d_model=24, n_heads=3, d_vocab=30, n_ctx=12)
    toks = torch.randint(0, 30, (2, 7))
    _, tr = model.run_with_cache(toks)
    return model, tr


def test_short_names_and_negative_layers(run):
    _, tr = run
    assert tr["pattern", 0] is tr["blocks.0.attn.hook_pattern"]
    assert tr["resid_post", -1] is tr["blocks.2.hook_resid_post"]
    assert tr["post", 1] is tr["blocks.1.mlp.hook_post"]
    assert tr["hook_z", -3] is tr["blocks.0.attn.hook_z"]
    assert tr["embed"] is tr["hook_embed"] and tr["pos_embed", None] is tr["hook_pos_embed"]
    with pytest.raises(ValueError, match="unknown short hook name 'bogus'"):
        tr["bogus", 0]
    with pytest.raises(ValueError, match="layer 3 out of range"):
        tr["z", 3]
    with pytest.raises(ValueError, match="'z' needs a layer"):
        tr["z",]


def test_stacks_add_up_to_the_residual_stream(run):
    model, tr = run
    parts = tr.decompose_resid()  # [C, B, T, M]: embed, pos_embed, then attn/mlp outputs
    torch.testing.assert_close(parts.sum(0), tr["resid_post", -1], rtol=0, atol=1e-5)
    mid = tr.decompose_resid(layer=1, mlp_input=True)
    torch.testing.assert_close(mid.sum(0), tr["resid_mid", 1], rtol=0, atol=1e-5)
    heads, labels = tr.stack_head_results(layer=2, return_labels=True)
    assert labels == [f"L{l}H{h}" for l in range(2) for h in range(3)]
    b_o = model.blocks[1].attn.W_O.bias
    torch.testing.assert_close(heads[3:].sum(0) + b_o, tr["attn_out", 1], rtol=0, atol=1e-5)
    acc, labels = tr.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "2_pre", "2_mid", "final_post"]


def test_apply_ln_to_stack_sums_to_the_final_norm(run):
    model, tr = run
    parts = tr.decompose_resid(pos_slice=-1)  # [C, B, M]
    scaled = tr.apply_ln_to_stack(parts, model, pos_slice=-1, weight=True)
    want = model.ln_final(tr["resid_post", -1][:, -1]) - model.ln_final.bias
    torch.testing.assert_close(scaled.sum(0), want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="apply_ln=True needs the model"):
        tr.decompose_resid(apply_ln=True)
    with pytest.raises(ValueError, match="stack ends in"):
        tr.apply_ln_to_stack(parts[:, :, :5], model, pos_slice=-1)


def test_post_norm_models_use_the_last_blocks_last_norm_as_the_final_norm():
    # BERT-style post-LN: resid_post of the last block is ln2(resid_mid + mlp_out), so that ln2 is the final norm.
    model = tiny_model(0, n_layers=2, d_model=24, n_heads=3, d_vocab=30, n_ctx=12, normalization="post", positional="learned", causal=False)
    _, tr = model.run_with_cache(torch.randint(0, 30, (2, 7)))
    ln = model.blocks[-1].ln2
    parts = torch.stack([tr["resid_mid", -1], tr["mlp_out", -1]])  # [2, B, T, M]: what the final norm reads
    scaled = tr.apply_ln_to_stack(parts, model, weight=True)
    torch.testing.assert_close(scaled.sum(0) + ln.bias, tr["resid_post", -1], rtol=0, atol=1e-5)
    lens, labels = tr.accumulated_resid(apply_ln=True, model=model, return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"]
    torch.testing.assert_close(lens[1], ln(tr["resid_pre", 1]), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="post-norm model .* has no norm reading layer 1's input"):
        tr.apply_ln_to_stack(parts, model, layer=1)


def test_parallel_block_mlp_input_norm_is_ln2_on_resid_pre():
    # A two-norm parallel block (GPT-NeoX) feeds its MLP ln2(resid_pre): the scaled stack of resid_pre's parts sums
    # to that norm's output less its bias.
    model = tiny_model(0, n_layers=2, d_model=24, n_heads=3, d_vocab=30, n_ctx=12, parallel_block="two_norms")
    for p in model.parameters():  # HF-style init leaves norms at 1 and biases at 0: draw them all
        torch.nn.init.normal_(p, std=0.5)
    _, tr = model.run_with_cache(torch.randint(0, 30, (2, 7)))
    parts = tr.decompose_resid(layer=1)  # [C, B, T, M], summing to resid_pre of layer 1
    scaled = tr.apply_ln_to_stack(parts, model, layer=1, mlp_input=True, weight=True)
    ln2 = model.blocks[1].ln2
    torch.testing.assert_close(scaled.sum(0), ln2(tr["resid_pre", 1]) - ln2.bias, rtol=0, atol=1e-4)
