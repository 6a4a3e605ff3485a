"""The family layer (interp.families): one registry, and the strict table driver every table family maps through.

References are independent of the code under test: hand-built tensors whose mapped values are known, the
naive per-head loop for the fused-QKV reorder, and the HF driver's own refusal for a tensor nothing consumed.
"""

import pytest
import torch

from interp.config import ModelConfig
from interp.families import BY_MODEL_TYPE, FAMILIES, HEADLINE, family_for
from interp.families._mapping import LLAMA_ATTENTION, Rule, concat, halves, map_tensors, per_head_qkv, transpose
from interp.zoo.hf import CONVERTERS, convert
from interp.zoo.hf import FAMILIES as HELP_TEXT

CFG = ModelConfig(n_layers=2, d_model=8, n_heads=2, n_kv_heads=1, d_head=4, d_mlp=6, d_vocab=11, n_ctx=16,
                  attn_bias=False, out_bias=False)


def test_each_model_type_belongs_to_one_family_and_the_zoo_reads_the_registry():
    claimed = [t for fam in FAMILIES for t in fam.model_types]
    assert len(claimed) == len(set(claimed)) == len(BY_MODEL_TYPE)
    assert sorted(CONVERTERS) == sorted(BY_MODEL_TYPE)
    assert HELP_TEXT == HEADLINE and HEADLINE.startswith("BERT, GPT-2, Llama, Qwen")
    assert family_for("qwen3").name == "qwen3" and family_for("mistral").name == "llama"
    with pytest.raises(ValueError, match=r"model_type='t5' is not supported; supported: \[.*'qwen3'"):
        family_for("t5")


def test_each_test_config_lives_in_the_family_that_converts_it_and_compat_reads_them_all():
    """A family's test configs sit in its own file (``Family.tests``); compat's table is exactly their union, in
    the table's order, split into family tests and table-only rows by the configs' own flag."""
    from interp.families.registry import COMPAT_CONFIGS
    from interp.zoo import compat

    for fam in FAMILIES:
        for row, test in fam.tests.items():
            assert BY_MODEL_TYPE[test.model_type] is fam, (row, test.model_type, fam.name)
    assert list(compat.TABLE)[:len(compat.ROW_ORDER)] == list(compat.ROW_ORDER)
    assert compat.TABLE == {row: (t.model_type, dict(t.config)) for row, t in COMPAT_CONFIGS.items()}
    assert {row for row, t in COMPAT_CONFIGS.items() if t.table_only} == set(compat.TABLE_ONLY)
    assert compat.FAMILIES["qwen3"] == ("qwen3", dict(family_for("qwen3").tests["qwen3"].config))
    # each config is one family's: qwen2 / qwen3 are Llama's record with their own values, not Llama's tests
    assert "llama3" not in family_for("qwen2").tests and "qwen2" not in family_for("llama").tests


def test_qwen3_is_llama_with_per_head_qk_norm():
    hf = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 3,
          "intermediate_size": 96, "vocab_size": 50, "max_position_embeddings": 64, "sliding_window": 8,
          "use_sliding_window": True, "max_window_layers": 1, "attention_bias": True}
    cfg = family_for("qwen3").config(hf)
    base = family_for("llama").config({**hf, "model_type": "llama"})
    # Llama's mapping never slides and reads attention_bias; Qwen3 slides from max_window_layers and norms heads.
    assert (cfg.qk_norm, cfg.sliding_window, cfg.attn_bias) == ("head", [None, 8, 8], True)
    assert (base.qk_norm, base.sliding_window, base.attn_bias) == ("none", None, True)
    assert family_for("qwen3").config({**hf, "use_sliding_window": False}).sliding_window is None


def _llama_sd(prefix: str = "model.") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(CFG.n_layers):
        for n, rows in (("q", 8), ("k", 4), ("v", 4)):
            sd[f"{prefix}layers.{i}.self_attn.{n}_proj.weight"] = torch.randn(rows, 8, generator=g)
        sd[f"{prefix}layers.{i}.self_attn.o_proj.weight"] = torch.randn(8, 8, generator=g)
    return sd


def test_table_maps_every_layer_and_reports_what_it_consumed():
    sd = {**_llama_sd(), "model.unused.weight": torch.zeros(1)}
    out, used = map_tensors(LLAMA_ATTENTION, sd, CFG, prefixes=("model.",), arch="toy")
    for i in range(2):
        want = torch.cat([sd[f"model.layers.{i}.self_attn.{n}_proj.weight"] for n in "qkv"])  # [q | k | v] rows
        assert torch.equal(out[f"blocks.{i}.attn.W_qkv.weight"], want)
        assert out[f"blocks.{i}.attn.W_O.weight"] is sd[f"model.layers.{i}.self_attn.o_proj.weight"]
    assert sorted(out) == sorted(f"blocks.{i}.attn.{w}.weight" for i in range(2) for w in ("W_qkv", "W_O"))
    assert set(sd) - used == {"model.unused.weight"}


def test_table_refuses_missing_twice_consumed_and_misshaped_sources_by_name():
    sd = _llama_sd()
    del sd["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match=r"toy state dict has no tensor 'model.layers.1.self_attn.k_proj.weight'"):
        map_tensors(LLAMA_ATTENTION, sd, CFG, prefixes=("model.",), arch="toy")
    twice = (Rule("blocks.{i}.attn.W_O", "layers.{i}.self_attn.o_proj"), Rule("blocks.{i}.x", "layers.{i}.self_attn.o_proj"))
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.o_proj.weight' is consumed twice"):
        map_tensors(twice, _llama_sd(), CFG, prefixes=("model.",), arch="toy")
    shaped = (Rule("blocks.{i}.attn.W_O", "layers.{i}.self_attn.o_proj", shape=lambda cfg, kind: (cfg.d_model, 4)),)
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.o_proj.weight' has shape \(8, 8\), the config "
                                         r"implies \(8, 4\)"):
        map_tensors(shaped, _llama_sd(), CFG, prefixes=("model.",), arch="toy")


def test_transforms_against_naive_references():
    w = torch.arange(24.0).reshape(4, 6)
    assert torch.equal(transpose([w], CFG), w.t()) and transpose([w[0]], CFG) is not None
    assert torch.equal(concat([w[:1], w[1:]], CFG), w)
    gate, up = halves([w], CFG)
    assert torch.equal(gate, w[:2]) and torch.equal(up, w[2:])
    mha = ModelConfig(n_layers=1, d_model=6, n_heads=3, d_head=2, d_mlp=4, d_vocab=5, n_ctx=8)
    fused = torch.randn(3 * 3 * 2, 6, generator=torch.Generator().manual_seed(1))  # rows [q_h, k_h, v_h] per head
    naive = torch.cat([fused[h * 6 + part * 2: h * 6 + part * 2 + 2] for part in range(3) for h in range(3)])
    assert torch.equal(per_head_qkv([fused], mha), naive)


def test_the_driver_refuses_a_tensor_no_rule_consumed():
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.Olmo2Config(hidden_size=16, intermediate_size=24, num_attention_heads=2, num_hidden_layers=1,
                                      vocab_size=20, max_position_embeddings=16)
    torch.manual_seed(0)
    sd = transformers.Olmo2ForCausalLM(hf_cfg).state_dict()
    assert convert(hf_cfg.to_dict(), sd).cfg.sublayer_norm == "output"
    with pytest.raises(ValueError, match=r"model.layers.0.stray.weight"):
        convert(hf_cfg.to_dict(), {**sd, "model.layers.0.stray.weight": torch.zeros(3)})
