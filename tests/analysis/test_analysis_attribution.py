"""Direct logit attribution: the parts sum to the model's logit difference (MHA, GQA, MLA), and a head's part is
the naive formula on a norm-free model."""

import pytest
import torch
from helpers import tiny_model

from interp.analysis import direct_logit_attribution

CONFIGS = {
    "mha-ln": dict(),
    "gqa-rms-swiglu": dict(n_kv_heads=2, positional="rotary", normalization="rms", activation="swiglu"),
    "mla": dict(attention="latent", kv_latent_dim=12, q_latent_dim=16, rope_dim=4, positional="rotary",
                normalization="rms"),
    "mqa-untied-bias": dict(n_kv_heads=1, out_bias=True),
}


def _model(**kw):
    model = tiny_model(d_vocab=50, n_ctx=16, **kw)
    with torch.no_grad():  # random biases and norm weights, so every part is non-zero
        for p_name, p in model.named_parameters():
            if p_name.endswith("bias") or "ln" in p_name or "norm" in p_name:
                p.normal_(0.3 if "weight" in p_name else 0.0, 0.2).add_(1.0 if "weight" in p_name else 0.0)
    return model


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_parts_sum_to_the_logit_difference(kind):
    model = _model(**CONFIGS[kind])
    toks = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    answers = torch.tensor([[1, 2], [3, 4], [5, 6]])
    df = direct_logit_attribution(model, toks, answers)
    with torch.no_grad():
        logits = model(toks)[:, -1]
    want = (logits[torch.arange(3), answers[:, 0]] - logits[torch.arange(3), answers[:, 1]])
    assert abs(df["attribution"].sum() - float(want.mean())) < 1e-4
    torch.testing.assert_close(df.attrs["per_sequence"].sum(0), want, rtol=0, atol=1e-4)
    assert set(df["kind"]) >= {"embed", "head", "mlp"} and (df["kind"] == "head").sum() == 8
    assert df.attrs["logit_diff"] == pytest.approx(float(want.mean()), abs=1e-5)


def test_per_sequence_positions_and_a_norm_free_head_equals_the_naive_dot_product():
    model = _model(normalization="none", attn_only=True)
    toks = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(2))
    answers = torch.tensor([7, 9])
    pos = torch.tensor([3, 5])
    df = direct_logit_attribution(model, toks, answers, pos=pos)
    _, tr = model.run_with_cache(toks, names_filter="*hook_result")
    direction = (model.unembed.weight[7] - model.unembed.weight[9]).detach()
    naive = (tr["result", 1][torch.arange(2), pos, 2] @ direction).mean()
    assert float(df.set_index("component").loc["L1H2", "attribution"]) == pytest.approx(float(naive), abs=1e-5)
    with torch.no_grad():
        logits = model(toks)[torch.arange(2), pos]
    assert df["attribution"].sum() == pytest.approx(float((logits[:, 7] - logits[:, 9]).mean()), abs=1e-4)


def test_errors():
    with pytest.raises(ValueError, match="post-norm"):
        direct_logit_attribution(_model(normalization="post"), torch.tensor([[1, 2]]), torch.tensor([1, 2]))
    model = _model()
    with pytest.raises(ValueError, match=r"answer_tokens must be \[batch, 2\]"):
        direct_logit_attribution(model, torch.tensor([[1, 2]]), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"answer_tokens must be in \[0, 50\)"):
        direct_logit_attribution(model, torch.tensor([[1, 2]]), torch.tensor([1, 99]))
    with pytest.raises(ValueError, match="pos 9 out of range"):
        direct_logit_attribution(model, torch.tensor([[1, 2]]), torch.tensor([1, 2]), pos=9)
