"""Weight views (interp/weights.py): stacked W_Q/W_K/W_V/W_O reproduce the hooked q/k/v and head writes, on
MHA, GQA and MLA; FactoredMatrix norms and SVD equal the materialised matrix's."""

import pytest
import torch
from helpers import tiny_model

from interp.weights import FactoredMatrix, layer_weights, stacked

CONFIGS = {
    "mha": dict(),
    "gqa": dict(n_kv_heads=2, normalization="rms"),
    "mqa": dict(n_kv_heads=1),
    "mla": dict(attention="latent", kv_latent_dim=12, rope_dim=0),
}


def _model(kind, **extra):
    return tiny_model(d_vocab=40, n_ctx=16, attn_only=True, **{**CONFIGS[kind], **extra})


@pytest.mark.parametrize("kind", ["mha", "gqa", "mqa"])
def test_stacked_weights_reproduce_q_k_v_and_head_writes(kind):
    model = _model(kind)
    toks = torch.randint(0, 40, (2, 6))
    _, tr = model.run_with_cache(toks, names_filter=["*hook_q", "*hook_k", "*hook_v", "*hook_z", "*hook_result",
                                                     "*hook_resid_pre"])
    L, H, M, D = 2, 4, 32, 8
    assert model.W_Q.shape == model.W_K.shape == model.W_V.shape == (L, H, M, D)
    assert model.W_O.shape == (L, H, D, M)
    G = H // model.cfg.n_kv_heads
    for layer in range(L):
        x = model.blocks[layer].ln1(tr["resid_pre", layer])  # the views act on the normalised residual
        q = torch.einsum("btm,hmd->bthd", x, model.W_Q[layer]) + stacked(model, "b_Q")[layer]
        k = torch.einsum("btm,hmd->bthd", x, model.W_K[layer]) + stacked(model, "b_K")[layer]
        v = torch.einsum("btm,hmd->bthd", x, model.W_V[layer]) + stacked(model, "b_V")[layer]
        torch.testing.assert_close(q, tr["q", layer], rtol=0, atol=1e-5)
        # K/V are per query head: query head h reads K/V head h // G.
        torch.testing.assert_close(k, tr["k", layer].repeat_interleave(G, dim=2), rtol=0, atol=1e-5)
        torch.testing.assert_close(v, tr["v", layer].repeat_interleave(G, dim=2), rtol=0, atol=1e-5)
        writes = torch.einsum("bthd,hdm->bthm", tr["z", layer], model.W_O[layer])
        torch.testing.assert_close(writes, tr["result", layer], rtol=0, atol=1e-5)


def test_latent_attention_effective_weights_match_up_to_the_latent_norm_scale():
    model = _model("mla")
    toks = torch.randint(0, 40, (2, 6))
    _, tr = model.run_with_cache(toks, names_filter=["*hook_k", "*hook_v", "*hook_q", "*hook_resid_pre"])
    attn = model.blocks[1].attn
    x = model.blocks[1].ln1(tr["resid_pre", 1])
    c = attn.W_dkv(x)[..., :attn.kv_latent_dim]
    # The RMSNorm on the latent divides by a per-token scale that no matrix can hold: put it back by hand.
    rms = (c.pow(2).mean(-1, keepdim=True) + attn.kv_norm.eps).sqrt()  # [B, T, 1]
    k = torch.einsum("btm,hmd->bthd", x, model.W_K[1]) / rms[..., None]
    v = torch.einsum("btm,hmd->bthd", x, model.W_V[1]) / rms[..., None]
    torch.testing.assert_close(k, tr["k", 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(v, tr["v", 1], rtol=0, atol=1e-5)
    q = torch.einsum("btm,hmd->bthd", x, model.W_Q[1]) + layer_weights(model, 1)["b_Q"]
    torch.testing.assert_close(q, tr["q", 1], rtol=0, atol=1e-5)


def test_qk_ov_are_factored_and_agree_with_the_materialised_product():
    model = _model("gqa")
    qk, ov = model.QK, model.OV
    assert isinstance(qk, FactoredMatrix) and qk.shape == (2, 4, 32, 32) and qk.rank == 8
    full = model.W_Q[1, 2] @ model.W_K[1, 2].T  # [M, M], the naive formula
    torch.testing.assert_close(qk[1, 2].full(), full, rtol=0, atol=1e-6)
    torch.testing.assert_close(qk.norm()[1, 2], torch.linalg.matrix_norm(full), rtol=1e-5, atol=0)
    full_ov = model.W_V[0, 3] @ model.W_O[0, 3]
    s_ref = torch.linalg.svdvals(full_ov)[:8]
    torch.testing.assert_close(ov[0, 3].S, s_ref, rtol=1e-4, atol=1e-6)
    u, s, vh = ov[0, 3].svd()
    torch.testing.assert_close(u @ torch.diag(s) @ vh, full_ov, rtol=0, atol=1e-5)
    prod = ov[0, 3] @ qk[1, 2]
    torch.testing.assert_close(prod.full(), full_ov @ full, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(qk.T[1, 2].full(), full.T, rtol=0, atol=1e-6)


def test_errors():
    model = _model("mha")
    with pytest.raises(ValueError, match="unknown weight 'W_X'"):
        stacked(model, "W_X")
    with pytest.raises(ValueError, match="layer 5 out of range"):
        layer_weights(model, 5)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        FactoredMatrix(torch.randn(4, 3), torch.randn(2, 4))
    pruned = _model("mha", layer_n_heads=[4, 2])
    with pytest.raises(ValueError, match="different head counts"):
        _ = pruned.W_Q
    assert layer_weights(pruned, 1)["W_Q"].shape == (2, 32, 8)


def test_latent_attention_with_query_latent_and_decoupled_rope_at_position_zero():
    # At position 0 RoPE is the identity, so the unrotated views give q and k exactly (up to the latent norms'
    # per-token scales, put back by hand).
    model = _model("mla", q_latent_dim=10, rope_dim=4, positional="rotary")
    toks = torch.randint(0, 40, (2, 5))
    _, tr = model.run_with_cache(toks, names_filter=["*hook_q", "*hook_k", "*hook_resid_pre"])
    attn = model.blocks[0].attn
    x = model.blocks[0].ln1(tr["resid_pre", 0])[:, :1]  # [B, 1, M]
    c_q = attn.W_dq(x)
    rms_q = (c_q.pow(2).mean(-1, keepdim=True) + attn.q_norm.eps).sqrt()
    c_kv = attn.W_dkv(x)[..., :attn.kv_latent_dim]
    rms_kv = (c_kv.pow(2).mean(-1, keepdim=True) + attn.kv_norm.eps).sqrt()
    assert model.W_Q.shape == model.W_K.shape == (2, 4, 32, 12)
    q = torch.einsum("btm,hmd->bthd", x, model.W_Q[0]) / rms_q[..., None]
    torch.testing.assert_close(q, tr["q", 0][:, :1], rtol=0, atol=1e-5)
    k = torch.einsum("btm,hmd->bthd", x, model.W_K[0])
    torch.testing.assert_close(k[..., :8] / rms_kv[..., None], tr["k", 0][:, :1, :, :8], rtol=0, atol=1e-5)
    torch.testing.assert_close(k[..., 8:], tr["k", 0][:, :1, :, 8:], rtol=0, atol=1e-5)  # shared rotary key
