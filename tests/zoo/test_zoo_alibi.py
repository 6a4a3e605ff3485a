"""ALiBi (BLOOM, MPT) in the core, and the settings inside claimed families that used to be refused.

The slopes against a naive transcription of the ALiBi paper's rule and against transformers' own BLOOM and MPT
code; the bias against a hand-written score formula; both attention paths, query chunks, the KV cache and head
removal on an ALiBi model; GPT-2's ``scale_attn_by_inverse_layer_idx`` / ``reorder_and_upcast_attn`` / ``silu``,
Llama-style GELU MLPs and GPT-NeoX's ``gelu_pytorch_tanh`` against transformers; refusals by name.
"""

import math

import pytest
import torch

from interp import ModelConfig, Transformer
from interp.config import alibi_slopes
from interp.zoo.compat import SEQ, V, hf_test_model
from interp.zoo.hf import from_hf

transformers = pytest.importorskip("transformers")


def naive_slopes(n: int) -> list[float]:
    """The ALiBi paper's rule, written out: for a power of two n the geometric sequence that starts at
    2^(-8/n) with that ratio; otherwise the closest smaller power of two's sequence, then every other element
    of the sequence for twice that power."""
    def geometric(m: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(m) - 3)))
        return [start * start ** i for i in range(m)]

    if math.log2(n).is_integer():
        return geometric(n)
    p = 2 ** math.floor(math.log2(n))
    return geometric(p) + geometric(2 * p)[0::2][: n - p]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 8, 12, 16, 20, 32, 40])
def test_slopes_match_the_paper_and_transformers(n):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    ours = torch.tensor(alibi_slopes(n), dtype=torch.float64)
    torch.testing.assert_close(ours, torch.tensor(naive_slopes(n), dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(ours.float(), _get_alibi_slopes(n, torch.device("cpu")), rtol=1e-6, atol=0)
    mpt = build_mpt_alibi_tensor(n, 2)[:, 0, 0]  # [H]: the bias of the key one place back is -slope
    torch.testing.assert_close(ours.float(), -mpt, rtol=1e-6, atol=0)
    assert sorted(set(ours.tolist()), reverse=True) == sorted(ours.tolist(), reverse=True)  # all distinct


def _alibi_model(n_heads=6, **over):
    cfg = ModelConfig(n_layers=2, d_model=48, n_heads=n_heads, d_vocab=V, n_ctx=64, positional="none",
                      alibi_slopes=alibi_slopes(n_heads), **over)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def test_scores_are_the_hand_written_formula():
    """hook_attn_scores equals q.k / sqrt(d) + slope_h (k - q) below the diagonal, computed here by hand."""
    model = _alibi_model()
    ids = torch.randint(1, V, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, trace = model.run_with_cache(ids, names_filter=lambda n: n.endswith(("hook_q", "hook_k",
                                                                                 "hook_attn_scores")))
    q, k = trace["blocks.1.attn.hook_q"], trace["blocks.1.attn.hook_k"]  # [B, T, H, D]
    T, D = q.shape[1], q.shape[-1]
    want = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
    slopes = torch.tensor(alibi_slopes(6))
    pos = torch.arange(T)
    want = want + slopes[:, None, None] * (pos[None, :] - pos[:, None]).float()  # [H, T, T]
    got = trace["blocks.1.attn.hook_attn_scores"]
    below = torch.ones(T, T).tril().bool()
    torch.testing.assert_close(got[..., below], want[..., below], rtol=0, atol=1e-5)


def test_both_paths_query_chunks_and_cache_agree():
    model = _alibi_model(n_heads=12, d_head=4)
    ids = torch.randint(1, V, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        fused = model(ids)  # SDPA with the bias in its float mask
        explicit, _ = model.run_with_cache(ids, names_filter="*hook_pattern")
        torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-5)
        for block in model.blocks:
            block.attn.query_chunk = 7
        chunked, _ = model.run_with_cache(ids, names_filter="*hook_pattern")
        torch.testing.assert_close(chunked, explicit, rtol=0, atol=1e-5)
        for block in model.blocks:
            block.attn.query_chunk = None
        cache = model.make_cache(2, 30)
        steps = [model(ids[:, :11], kv_cache=cache)]
        steps += [model(ids[:, t:t + 1], kv_cache=cache) for t in range(11, 30)]
        torch.testing.assert_close(torch.cat(steps, dim=1), fused, rtol=0, atol=1e-4)


def test_slopes_change_the_logits():
    """ALiBi bites: the same weights with other slopes (or none) give other logits."""
    model = _alibi_model()
    ids = torch.randint(1, V, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        base = model(ids)
        for slopes in (None, alibi_slopes(6)[::-1]):
            other = Transformer(ModelConfig.from_dict({**model.cfg.to_dict(), "alibi_slopes": slopes})).eval()
            other.load_state_dict(model.state_dict())
            assert (other(ids) - base).abs().max() > 1e-2


def test_removing_heads_keeps_the_other_heads_slopes():
    from interp.pruning import remove_heads

    model = from_hf(hf_test_model("bloom"))
    ids = torch.randint(1, V, (2, 16), generator=torch.Generator().manual_seed(4))
    drop = {0: [0, 4], 1: [2]}
    small = remove_heads(model, drop)
    full = alibi_slopes(6)
    assert small.cfg.layer_alibi_slopes(0) == [full[h] for h in (1, 2, 3, 5)]
    assert small.cfg.layer_alibi_slopes(1) == [full[h] for h in (0, 1, 3, 4, 5)]
    for layer, heads in drop.items():
        gate = torch.ones(6)
        gate[heads] = 0
        model.blocks[layer].attn.set_gate(gate)
    with torch.no_grad():
        torch.testing.assert_close(small(ids), model(ids), rtol=0, atol=1e-4)
    reloaded = Transformer(ModelConfig.from_dict(small.cfg.to_dict())).eval()  # the slopes travel in the config
    reloaded.load_state_dict(small.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids), small(ids), rtol=0, atol=1e-6)


@pytest.mark.parametrize("slopes,message", [
    ([0.5] * 5, "alibi_slopes=.* must be 6 finite numbers"),
    ([0.5] * 5 + [float("nan")], "must be 6 finite numbers"),
    ([[0.5] * 6], "one per layer"),
])
def test_bad_slopes_are_refused_by_name(slopes, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(n_layers=2, d_model=48, n_heads=6, d_vocab=V, n_ctx=64, alibi_slopes=slopes)


def test_alibi_needs_a_causal_self_attention_decoder():
    with pytest.raises(ValueError, match="alibi_slopes needs a causal decoder"):
        ModelConfig(n_layers=1, d_model=48, n_heads=6, d_vocab=V, n_ctx=64, causal=False, unembed=False,
                    alibi_slopes=alibi_slopes(6))
    with pytest.raises(ValueError, match="alibi_slopes with sliding_window"):
        ModelConfig(n_layers=1, d_model=48, n_heads=6, d_vocab=V, n_ctx=64, sliding_window=4,
                    alibi_slopes=alibi_slopes(6))


# --- family settings against transformers ------------------------------------------------------------------
def _matches(hf, ids):
    model = from_hf(hf)
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
        logits, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
        torch.testing.assert_close(logits, ref.logits, rtol=0, atol=1e-4)
        torch.testing.assert_close(model(ids), ref.logits, rtol=0, atol=1e-4)
        for layer, pattern in enumerate(ref.attentions):
            torch.testing.assert_close(trace.pattern(layer), pattern, rtol=0, atol=1e-5)
    return model


def _gpt2(**over):
    cfg = transformers.GPT2Config(vocab_size=V, n_embd=48, n_head=6, n_layer=3, n_positions=64, **over)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    from interp.zoo.compat import _seed_init

    return _seed_init(transformers.GPT2LMHeadModel(cfg))


@pytest.mark.parametrize("over", [dict(scale_attn_by_inverse_layer_idx=True),
                                  dict(scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True),
                                  dict(activation_function="silu")])
def test_gpt2_settings_match_transformers(over):
    ids = torch.randint(1, V, (2, SEQ), generator=torch.Generator().manual_seed(5))
    hf = _gpt2(**over)
    model = _matches(hf, ids)
    plain = _gpt2(**{k: v for k, v in over.items() if k != "scale_attn_by_inverse_layer_idx"})
    with torch.no_grad():
        if "scale_attn_by_inverse_layer_idx" in over:  # the setting bites: the plain model's logits differ
            assert (plain(ids).logits - model(ids)).abs().max() > 1e-3


@pytest.mark.parametrize("name,key,act", [("llama3", "hidden_act", "gelu"),
                                          ("llama3", "hidden_act", "gelu_pytorch_tanh"),
                                          ("mistral", "hidden_act", "gelu_new"),
                                          ("gpt_neox", "hidden_act", "gelu_pytorch_tanh")])
def test_activations_that_used_to_be_refused_match_transformers(name, key, act):
    ids = torch.randint(1, V, (2, SEQ), generator=torch.Generator().manual_seed(6))
    _matches(hf_test_model(name, **{key: act}), ids)


@pytest.mark.parametrize("name,change,message", [
    ("mpt", dict(attn_config={"clip_qkv": 0.5}), "clip_qkv=0.5"),
    ("mpt", dict(attn_config={"qk_ln": True}), "qk_ln=True"),
    ("mpt", dict(attn_config={"alibi_bias_max": 16}), "alibi_bias_max=16"),
    ("mpt", dict(attn_config={"alibi": False}), "alibi=False"),
    ("mpt", dict(no_bias=False), "no_bias=False"),
    ("mpt", dict(expansion_ratio=2), "expansion_ratio=2"),
    ("bloom", dict(apply_residual_connection_post_layernorm=True), "apply_residual_connection_post_layernorm"),
    ("llama3", dict(hidden_act="relu"), "hidden_act='relu'"),
    ("mixtral", dict(hidden_act="gelu"), "mixtral hidden_act='gelu' is not supported"),
])
def test_unsupported_settings_are_refused_by_name(name, change, message):
    from interp.zoo.hf import convert

    hf = hf_test_model(name)
    cfg = {**hf.config.to_dict(), **change}
    if "attn_config" in change:
        cfg["attn_config"] = {**hf.config.attn_config.to_dict(), **change["attn_config"]}
    with pytest.raises(ValueError, match=message):
        convert(cfg, hf.state_dict())


@pytest.mark.parametrize("name, claims", [
    ("bloom", ["ALiBi", "embedding norm"]), ("mpt_12_heads", ["ALiBi"]), ("falcon_alibi", ["ALiBi"]),
    ("gpt_neo", ["window 8 (1/2 layers)", "learned positions", "unscaled scores"]),
])
def test_compat_rows_claim_what_the_configs_have(name, claims):
    from interp.zoo.compat import variants

    text = variants(from_hf(hf_test_model(name)).cfg)
    for claim in claims:
        assert claim in text
