"""remove_heads against the gated model and against zero-ablation of hook_z; per-layer head counts in the core;
KV-cache savings against hand-computed byte counts."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model

from interp import ModelConfig, Transformer
from interp.pruning import kv_cache_savings, n_parameters, remove_heads

VARIANTS = {
    "mha": dict(),
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "gqa-rotary": dict(n_kv_heads=2, positional="rotary", normalization="rms", attn_bias=False, out_bias=False),
    "mla": dict(attention="latent", kv_latent_dim=12, q_latent_dim=20, rope_dim=4, positional="rotary"),
    "mla-noq": dict(attention="latent", kv_latent_dim=12, positional="learned"),
}


pytestmark = pytest.mark.usefixtures("one_thread")


def make(variant: str, *, causal: bool = True, seed: int = 0, **over) -> Transformer:
    kw = dict(n_layers=2, d_model=32, n_heads=8, d_head=6, d_vocab=37, n_ctx=24, causal=causal)
    kw.update(VARIANTS[variant])
    kw.update(over)
    model = tiny_model(seed, **kw)
    with torch.no_grad():  # non-zero biases so that every term is exercised
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def zero_ablated(model: Transformer, tokens: torch.Tensor, mask: torch.Tensor, **kw) -> torch.Tensor:
    """Reference independent of the gate code: zero the removed heads' z with hooks."""
    def hook(layer):
        def fn(z, hook):
            z = z.clone()
            z[:, :, mask[layer]] = 0.0
            return z
        return fn
    fwd = [(f"blocks.{layer}.attn.hook_z", hook(layer)) for layer in range(model.cfg.n_layers)]
    return model.run_with_hooks(tokens, fwd_hooks=fwd, **kw)


# head masks [L=2, H=8]: (layer 0, layer 1) of heads to remove
MASKS = {
    "partial-groups": ([0, 5], [1, 2, 7]),            # GQA (G=4): no group emptied
    "whole-group": ([0, 1, 2, 3], [4, 5, 6, 7, 1]),   # GQA: group 0 of layer 0, group 1 of layer 1 emptied
    "mixed": ([1, 2, 3, 4], [0]),
}


def to_mask(spec) -> torch.Tensor:
    mask = torch.zeros(2, 8, dtype=torch.bool)
    for layer, heads in enumerate(spec):
        mask[layer, heads] = True
    return mask


CASES = [(v, w, True) for v in VARIANTS for w in MASKS] + [("gqa", w, False) for w in MASKS] + [("mha", "mixed", False)]


@pytest.mark.parametrize(("variant", "which", "causal"), CASES)
def test_remove_heads_matches_gated_and_ablated(variant, which, causal):
    model = make(variant, causal=causal)
    mask = to_mask(MASKS[which])
    tokens = torch.randint(0, 37, (3, 11), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones(3, 11, dtype=torch.long)
    attention_mask[1, 8:] = 0  # padding exercises the masked path
    model.set_head_gates((~mask).float())
    gated = model(tokens, attention_mask=attention_mask)
    model.set_head_gates(None)
    ablated = zero_ablated(model, tokens, mask, attention_mask=attention_mask)
    small = remove_heads(model, mask)
    out = small(tokens, attention_mask=attention_mask)
    torch.testing.assert_close(out, gated, atol=1e-5, rtol=0)
    torch.testing.assert_close(out, ablated, atol=1e-5, rtol=0)
    assert n_parameters(small) < n_parameters(model)
    assert small.cfg.layer_n_heads == [8 - len(h) for h in MASKS[which]]
    # the explicit (pattern) path agrees, and hook_pattern keeps [B, H_layer, T, S]
    _, trace = small.run_with_cache(tokens, attention_mask=attention_mask, names_filter="*hook_pattern")
    for layer in range(2):
        assert trace[f"blocks.{layer}.attn.hook_pattern"].shape == (3, small.cfg.layer_n_heads[layer], 11, 11)
    small.cfg.use_sdpa = False
    torch.testing.assert_close(small(tokens, attention_mask=attention_mask), gated, atol=1e-5, rtol=0)
    assert model.blocks[0].attn.gate is None  # the original is untouched


@pytest.mark.parametrize("variant", ["gqa", "mha", "mla"])
def test_pruned_model_decodes_with_cache(variant):
    model = make(variant)
    mask = to_mask(MASKS["partial-groups"])
    small = remove_heads(model, mask)
    prompt = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(3))
    full = small(torch.cat([prompt, torch.tensor([[4], [9]])], dim=1))
    cache = small.make_cache(batch_size=2, max_len=6)
    small(prompt, kv_cache=cache)
    step = small(torch.tensor([[4], [9]]), kv_cache=cache)
    torch.testing.assert_close(step[:, -1], full[:, -1], atol=1e-5, rtol=0)


def test_gqa_layout_and_kv_savings_by_hand():
    model = make("gqa")  # H=8, K=2, G=4, D=6, 2 layers
    D = 6
    partial = kv_cache_savings(model, to_mask(MASKS["partial-groups"]))
    assert partial["kv_heads_removed"] == 0 and partial["bytes_saved_per_token"] == 0
    whole = kv_cache_savings(model, to_mask(MASKS["whole-group"]))
    # one K/V head per layer leaves the cache: K and V, d_head values each, 2 bytes (fp16)
    assert whole["kv_heads_removed"] == 2
    assert whole["bytes_per_token_before"] == 2 * 2 * 2 * D * 2
    assert whole["bytes_saved_per_token"] == 2 * (2 * D * 2)
    assert whole["heads_pruned"] == 9 and whole["heads_total"] == 16
    small = remove_heads(model, to_mask(MASKS["whole-group"]))
    assert small.cfg.layer_n_kv_heads == [1, 1]
    assert small.cfg.layer_kv_map is None  # whole groups: the uniform grouped path stays
    # the smaller model's cache really is smaller by that much (fp32 here: 4 bytes)
    before, after = model.make_cache(1, 10).nbytes, small.make_cache(1, 10).nbytes
    assert before - after == 10 * 2 * (2 * D * 4)
    part = remove_heads(model, to_mask(MASKS["partial-groups"]))
    # layer 0 keeps 3 + 3 heads (equal groups: uniform path), layer 1 keeps 2 + 3 (needs the map)
    assert part.cfg.layer_kv_map == [None, [0, 0, 1, 1, 1]]
    assert part.blocks[0].attn.kv_index is None
    assert part.blocks[1].attn.kv_index.tolist() == [0, 0, 1, 1, 1]


def test_mqa_and_mla_savings():
    mqa = make("mqa")
    assert kv_cache_savings(mqa, {0: list(range(8))})["kv_heads_removed"] == 1
    assert kv_cache_savings(mqa, {0: list(range(7))})["kv_heads_removed"] == 0
    mla = make("mla")
    assert kv_cache_savings(mla, {0: [0, 1, 2]})["bytes_saved_per_token"] == 0  # the latent is shared
    # Emptying a whole MLA layer drops its latent and rotary key (12 + 4 fp16 values per token).
    with pytest.warns(UserWarning, match="every head of layer 0"):
        small = remove_heads(mla, {0: list(range(8))})
    assert kv_cache_savings(mla, {0: list(range(8))})["bytes_saved_per_token"] == (12 + 4) * 2
    assert small.cfg.kv_cache_bytes_per_token(2) == (12 + 4) * 2
    assert small.make_cache(1, 5).nbytes_per_token == (12 + 4) * 4  # fp32 buffers, layer 1 only
    tokens = torch.randint(0, 37, (2, 7))
    torch.testing.assert_close(small.generate(tokens[:, :3], 3), small.generate(tokens[:, :3], 3, use_cache=False))


def test_dict_and_mask_forms_agree():
    model = make("gqa")
    tokens = torch.randint(0, 37, (2, 7))
    a = remove_heads(model, {0: [0, 5], 1: [1, 2, 7]})
    b = remove_heads(model, to_mask(MASKS["partial-groups"]))
    torch.testing.assert_close(a(tokens), b(tokens))


def test_remove_every_head_of_a_layer_warns_and_adds_only_bias():
    model = make("mha")
    tokens = torch.randint(0, 37, (2, 7))
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[1] = True
    model.set_head_gates((~mask).float())
    gated = model(tokens)
    model.set_head_gates(None)
    with pytest.warns(UserWarning, match="every head of layer 1"):
        small = remove_heads(model, mask)
    torch.testing.assert_close(small(tokens), gated, atol=1e-5, rtol=0)
    _, trace = small.run_with_cache(tokens, names_filter="blocks.1.hook_attn_out")
    bias = model.blocks[1].attn.W_O.bias
    torch.testing.assert_close(trace["blocks.1.hook_attn_out"], bias.expand(2, 7, -1))
    assert small.make_cache(1, 4).layers[1].buffers[0].shape[1] == 0
    torch.testing.assert_close(small.generate(tokens[:, :3], 3), small.generate(tokens[:, :3], 3, use_cache=False))


def test_existing_gates_fold_into_w_o_and_pruned_model_prunes_again():
    model = make("gqa")
    tokens = torch.randint(0, 37, (2, 9))
    gates = torch.rand(2, 8, generator=torch.Generator().manual_seed(5))
    gates[0, 3] = 0.0
    model.set_head_gates(gates)
    ref = model(tokens)
    small = remove_heads(model, {0: [3]})
    assert small.blocks[0].attn.gate is None
    torch.testing.assert_close(small(tokens), ref, atol=1e-5, rtol=0)
    # a ragged model takes per-layer gate lists, and remove_heads again equals gating there
    g = [torch.ones(7), torch.ones(8)]
    g[0][[0, 4]] = 0.0
    small.set_head_gates(g)
    ref2 = small(tokens)
    small.set_head_gates(None)
    smaller = remove_heads(small, {0: [0, 4]})
    assert smaller.cfg.layer_n_heads == [5, 8]
    torch.testing.assert_close(smaller(tokens), ref2, atol=1e-5, rtol=0)


def test_bad_head_selections():
    model = make("mha")
    with pytest.raises(ValueError, match="head 8 of layer 0"):
        remove_heads(model, {0: [8]})
    with pytest.raises(ValueError, match="layer 2"):
        remove_heads(model, {2: [0]})
    with pytest.raises(ValueError, match="expected per-layer sizes"):
        remove_heads(model, torch.zeros(2, 7, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool tensor"):
        remove_heads(model, torch.zeros(2, 8))
    small = remove_heads(model, {0: [1]})
    with pytest.raises(ValueError, match="list of"):
        small.set_head_gates(torch.ones(2, 8))
    with pytest.raises(ValueError, match="one per layer"):
        small.set_head_gates([torch.ones(7)])
    with pytest.raises(ValueError, match="gate has shape"):
        small.set_head_gates([torch.ones(8), torch.ones(8)])


def test_config_validates_layer_head_fields():
    base = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=10, n_ctx=8)
    with pytest.raises(ValueError, match="layer_n_heads=\\[4\\]"):
        ModelConfig(**base, layer_n_heads=[4])
    with pytest.raises(ValueError, match="needs layer_n_kv_heads"):
        ModelConfig(**base | {"n_kv_heads": 2}, layer_n_heads=[4, 2])
    with pytest.raises(ValueError, match="not a multiple"):
        ModelConfig(**base | {"n_kv_heads": 2}, layer_n_heads=[3, 2], layer_n_kv_heads=[2, 1])
    with pytest.raises(ValueError, match="layer_kv_map\\[0\\]"):
        ModelConfig(**base | {"n_kv_heads": 2}, layer_n_heads=[3, 2], layer_n_kv_heads=[2, 1],
                    layer_kv_map=[[0, 0, 0], None])
    with pytest.raises(ValueError, match="needs layer_n_heads"):
        ModelConfig(**base, layer_n_kv_heads=[4, 4])
    cfg = ModelConfig(**base | {"n_kv_heads": 2}, layer_n_heads=[3, 0], layer_n_kv_heads=[2, 0],
                      layer_kv_map=[[0, 1, 1], None])
    assert cfg.kv_map(0) == [0, 1, 1] and cfg.kv_map(1) == [] and cfg.kv_heads_in_layer(1) == 0
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.kv_cache_bytes_per_token(2) == 2 * 2 * 8 * 2


def test_unpruned_model_unchanged_by_the_new_fields():
    """A config without per-layer fields builds the same modules (and names) as before."""
    model = make("gqa")
    assert all(b.attn.kv_index is None for b in model.blocks)
    assert model.cfg.kv_cache_bytes_per_token(2) == 2 * 2 * 2 * 6 * 2
