"""KV-cache and FLOPs calculators (interp.flops) and their figures, against independent references:
the issue's worked example by hand, the bytes a real KVCache allocates, and torch's FlopCounterMode."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import interp
from interp import viz
from interp.flops import (
    dtype_bytes,
    flops_per_layer,
    format_bytes,
    format_flops,
    kv_cache_bytes,
    kv_cache_table,
    kv_variants,
    worked_example_config,
)

# --- the worked example ------------------------------------------------------------------------------------


def test_worked_example_mha_per_token():
    cfg = worked_example_config()
    # Hand count: layers x (K and V) x heads x d_head x 2 bytes.
    assert cfg.kv_cache_bytes_per_token(2) == 80 * 2 * 64 * 128 * 2
    assert format_bytes(cfg.kv_cache_bytes_per_token(2)) == "2.62 MB"


def test_worked_example_batch_total_is_about_343_gb():
    total = kv_cache_bytes(worked_example_config(), batch=32, tokens=4096, dtype="fp16")
    assert total == 80 * 2 * 64 * 128 * 2 * 32 * 4096
    assert 343e9 < total < 344e9
    assert format_bytes(total) == "343.6 GB"


def test_eight_kv_groups_cut_the_cache_eight_times():
    table = kv_cache_table(worked_example_config(), batch=32, tokens=4096, dtype="fp16", n_kv_groups=8)
    by_kind = table.set_index("kind")
    assert by_kind.loc["gqa", "n_kv_heads"] == 8
    assert by_kind.loc["mha", "total_bytes"] == 8 * by_kind.loc["gqa", "total_bytes"]
    assert by_kind.loc["gqa", "vs_mha"] == pytest.approx(1 / 8)
    assert by_kind.loc["mqa", "total_bytes"] * 64 == by_kind.loc["mha", "total_bytes"]
    # MLA caches the latent (4 * 128) and the decoupled rotary key (64) per layer.
    assert by_kind.loc["mla", "bytes_per_token"] == 80 * (512 + 64) * 2
    assert list(table["this_model"]) == [True, False, False, False]


def test_default_gqa_groups_is_eight_for_sixty_four_heads():
    assert kv_variants(worked_example_config())["gqa"].n_kv_heads == 8


def test_a_gqa_config_keeps_its_own_groups():
    cfg = worked_example_config(n_kv_heads=16)
    table = kv_cache_table(cfg).set_index("kind")
    assert table.loc["gqa", "n_kv_heads"] == 16 and bool(table.loc["gqa", "this_model"])


# --- against what a KVCache really allocates -------------------------------------------------------------


@pytest.mark.parametrize("dtype,nbytes", [(torch.float16, 2), (torch.float32, 4)])
def test_table_matches_allocated_kv_cache(dtype, nbytes):
    base = interp.ModelConfig(n_layers=3, d_model=48, n_heads=6, d_vocab=20, n_ctx=32, positional="rotary")
    table = kv_cache_table(base, dtype=nbytes, kv_latent_dim=20, rope_dim=4).set_index("kind")
    for kind, cfg in kv_variants(base, kv_latent_dim=20, rope_dim=4).items():
        assert cfg.kind == kind
        cache = interp.KVCache(cfg, batch_size=1, max_len=32, dtype=dtype)
        assert table.loc[kind, "bytes_per_token"] == cache.nbytes_per_token, kind


def test_mla_variant_of_a_model_without_rotary_positions_has_no_rope_key():
    cfg = interp.ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=20, n_ctx=16)  # learned positions
    mla = kv_variants(cfg)["mla"]
    assert (mla.kv_latent_dim, mla.rope_dim) == (4 * 8, 0)


def test_prime_head_count_has_no_gqa_row():
    cfg = interp.ModelConfig(n_layers=1, d_model=28, n_heads=7, d_vocab=10, n_ctx=8)
    assert list(kv_cache_table(cfg)["kind"]) == ["mha", "mqa", "mla"]


def test_bad_calculator_input():
    cfg = worked_example_config()
    with pytest.raises(ValueError, match="n_kv_groups=5"):
        kv_variants(cfg, n_kv_groups=5)
    with pytest.raises(ValueError, match="batch=0"):
        kv_cache_bytes(cfg, batch=0)
    with pytest.raises(ValueError, match="unknown dtype 'fp12'"):
        dtype_bytes("fp12")
    with pytest.raises(ValueError, match="kv_len=3 must be >= seq_len=4"):
        flops_per_layer(cfg, seq_len=4, kv_len=3)


# --- FLOPs against torch's own counter -----------------------------------------------------------------------

_CONFIGS = {
    "mha": dict(),
    "gqa_swiglu": dict(n_kv_heads=2, activation="swiglu"),
    "mqa_attn_only": dict(n_kv_heads=1, attn_only=True),
    "mla_q_latent": dict(attention="latent", kv_latent_dim=12, q_latent_dim=10, rope_dim=4, positional="rotary"),
    "mla_direct_q": dict(attention="latent", kv_latent_dim=12),
}


def _counted_block_flops(model, tokens, **kwargs):
    """FLOPs torch counts inside blocks.0 (matrix products, as our calculator)."""
    with FlopCounterMode(display=False) as counter:
        model(tokens, **kwargs)
    counts = counter.get_flop_counts()
    return sum(counts["Transformer.blocks.0"].values())


@pytest.mark.parametrize("name", sorted(_CONFIGS))
def test_flops_per_layer_match_flop_counter(name):
    torch.manual_seed(0)
    # use_sdpa=False: the explicit path's matmuls are what FlopCounterMode sees on every torch build.
    cfg = interp.ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=50, n_ctx=24, use_sdpa=False,
                             **_CONFIGS[name])
    model = interp.Transformer(cfg).eval()
    tokens = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        prefill = _counted_block_flops(model, tokens)
        assert flops_per_layer(cfg, seq_len=9, batch=2)["flops"].sum() == prefill
        # One decoding step with 9 cached tokens: 1 query against 10 keys.
        cache = model.make_cache(2, 24)
        model(tokens, kv_cache=cache)
        step = _counted_block_flops(model, tokens[:, :1], kv_cache=cache)
        assert flops_per_layer(cfg, seq_len=1, batch=2, kv_len=10)["flops"].sum() == step


def test_flops_table_shape_and_shares():
    cfg = worked_example_config()
    table = flops_per_layer(cfg, seq_len=4096)
    assert list(table["operation"][:3]) == ["q_proj", "k_proj", "v_proj"]
    assert table["share"].sum() == pytest.approx(1.0)
    # Hand count for the output projection: 2 * T * (H * D) * M.
    assert table.set_index("operation").loc["out_proj", "flops"] == 2 * 4096 * 64 * 128 * 8192
    assert format_flops(2e12) == "2.00 TFLOP"


# --- figures ------------------------------------------------------------------------------------------------


def test_kv_cache_figure_draws_the_table():
    cfg = worked_example_config()
    table = kv_cache_table(cfg, batch=32, tokens=4096)
    fig = viz.kv_cache_figure(cfg, batch=32, tokens=4096, per_token=False)
    bar = fig.data[0]
    assert list(bar.y) == list(table["total_bytes"])
    assert "343.6 GB" in bar.text[0] and "12.5% of MHA" in bar.text[1]
    per_token = viz.kv_cache_figure(table)
    assert list(per_token.data[0].y) == list(table["bytes_per_token"])


def test_flops_figure_draws_every_operation():
    cfg = interp.ModelConfig(n_layers=1, d_model=32, n_heads=4, d_vocab=10, n_ctx=8, activation="swiglu")
    table = flops_per_layer(cfg, seq_len=8)
    fig = viz.flops_figure(cfg, seq_len=8)
    assert list(fig.data[0].y) == list(table["operation"])
    assert list(fig.data[0].x) == list(table["flops"])
    assert "mlp_gate" in list(fig.data[0].y)


def test_a_model_with_heads_removed_per_layer():
    pruning = pytest.importorskip("interp.pruning")
    torch.manual_seed(1)
    cfg = interp.ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=50, n_ctx=24, use_sdpa=False)
    # Layer 0 loses a whole K/V group, layer 1 half of one (a partial group keeps its K/V head).
    small = pruning.remove_heads(interp.Transformer(cfg).eval(), {0: [0, 1], 1: [1]})
    scfg = small.cfg
    tokens = torch.randint(0, 50, (2, 7))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        small(tokens)
    counts = counter.get_flop_counts()
    for layer in range(2):
        expected = flops_per_layer(scfg, seq_len=7, batch=2, layer=layer)["flops"].sum()
        assert expected == sum(counts[f"Transformer.blocks.{layer}"].values()), layer
    with pytest.raises(ValueError, match="pass layer="):
        flops_per_layer(scfg, seq_len=7)
    table = kv_cache_table(scfg, dtype=4).set_index("kind")
    cache = interp.KVCache(scfg, batch_size=1, max_len=24, dtype=torch.float32)
    assert table.loc["gqa (pruned)", "bytes_per_token"] == cache.nbytes_per_token == 4 * 2 * (1 + 2) * 8
    assert bool(table.loc["gqa (pruned)", "this_model"]) and not table.loc["mha", "this_model"]
    # The uniform what-ifs ignore the pruning: MHA is the full 2 layers x 4 heads.
    assert table.loc["mha", "bytes_per_token"] == 4 * 2 * 2 * 4 * 8
