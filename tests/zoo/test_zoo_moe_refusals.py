"""Bad MoE / MLA input is refused with the names and values, in every converted family: a router top-k larger
than the number of experts, an expert count that disagrees with the weights (or with itself), and MLA ranks
that do not match the tensors (with and without a query latent)."""

import pytest
import torch

tf = pytest.importorskip("transformers")

from interp import ModelConfig  # noqa: E402
from interp.zoo.hf import convert  # noqa: E402

BASE = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, moe_intermediate_size=16,
           intermediate_size=32, n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=1,
           first_k_dense_replace=1, num_key_value_heads=4)
FAMILIES = {
    "mixtral": lambda: tf.MixtralConfig(**BASE, intermediate_size=32, num_key_value_heads=2, num_local_experts=6,
                                        num_experts_per_tok=2),
    "qwen2_moe": lambda: tf.Qwen2MoeConfig(**BASE, intermediate_size=32, moe_intermediate_size=16,
                                           shared_expert_intermediate_size=24, num_key_value_heads=2, num_experts=6,
                                           num_experts_per_tok=2),
    "qwen3_moe": lambda: tf.Qwen3MoeConfig(**BASE, intermediate_size=32, moe_intermediate_size=16, head_dim=8,
                                           num_key_value_heads=2, num_experts=6, num_experts_per_tok=2),
    "olmoe": lambda: tf.OlmoeConfig(**BASE, intermediate_size=16, num_key_value_heads=2, num_experts=6,
                                    num_experts_per_tok=2, pad_token_id=0, eos_token_id=0),
    "deepseek_v2": lambda: tf.DeepseekV2Config(**BASE, **MLA, q_lora_rank=None),
    "deepseek_v3": lambda: tf.DeepseekV3Config(**BASE, **MLA, q_lora_rank=12, n_group=2, topk_group=1),
}
EXPERT_KEY = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_local_experts",
              "olmoe": "num_experts", "deepseek_v2": "n_routed_experts", "deepseek_v3": "n_routed_experts"}


@pytest.fixture(scope="module")
def hf_models():
    """``{family: (config dict, state dict)}`` of random tiny models (6 experts, top-2)."""
    out = {}
    for family, make in FAMILIES.items():
        torch.manual_seed(0)
        hf = tf.AutoModelForCausalLM.from_config(make())
        out[family] = (hf.config.to_dict(), hf.state_dict())
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_router_top_k_larger_than_the_experts_is_refused(hf_models, family):
    cfg, sd = hf_models[family]
    with pytest.raises(ValueError, match=r"router top-k n_experts_per_token=7 is larger than the number of experts "
                                         r"n_experts=6"):
        convert({**cfg, "num_experts_per_tok": 7}, sd)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_expert_count_disagreeing_with_the_weights_is_refused(hf_models, family):
    cfg, sd = hf_models[family]
    layer = 1 if "deepseek" in family else 0  # the first MoE layer (DeepSeek's layer 0 is dense)
    with pytest.raises(ValueError, match=rf"n_experts=4, but 'model\.layers\.{layer}\.mlp\.gate\.weight' has shape "
                                         r"\(6, 32\) \(6 along axis 0\)"):
        convert({**cfg, EXPERT_KEY[family]: 4, **({"n_group": 1, "topk_group": 1} if "deepseek" in family else {})},
                sd)


def test_two_expert_counts_that_disagree_are_refused(hf_models):
    cfg, sd = hf_models["qwen3_moe"]  # its config dict says num_local_experts; config.json files say num_experts
    with pytest.raises(ValueError, match=r"two expert counts that disagree: num_local_experts=6 and num_experts=4"):
        convert({**cfg, "num_experts": 4}, sd)


@pytest.mark.parametrize("change, message", [
    (dict(qk_rope_head_dim=2), r"'model\.layers\.0\.self_attn\.q_proj\.weight' has shape \(48, 32\), but the "
                               r"config's num_attention_heads=4 x \(qk_nope_head_dim=8 \+ qk_rope_head_dim=2\)"),
    (dict(qk_nope_head_dim=6), r"q_proj\.weight' has shape \(48, 32\).*qk_nope_head_dim=6"),
    (dict(kv_lora_rank=12), r"'model\.layers\.0\.self_attn\.kv_a_proj_with_mqa\.weight' has shape \(20, 32\), but "
                            r"the config's kv_lora_rank=12 \+ qk_rope_head_dim=4"),
    (dict(v_head_dim=8), r"kv_b_proj\.weight' has shape \(56, 16\).*v_head_dim=8"),
])
def test_mla_ranks_not_matching_the_tensors_are_refused_without_a_query_latent(hf_models, change, message):
    cfg, sd = hf_models["deepseek_v2"]
    with pytest.raises(ValueError, match=message):
        convert({**cfg, **change}, sd)


def test_native_moe_config_with_top_k_beyond_the_experts_is_refused():
    with pytest.raises(ValueError, match=r"n_experts_per_token=5 is larger than the number of experts n_experts=4"):
        ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu", n_experts=4,
                    n_experts_per_token=5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_refusals_name_the_model_type_the_setting_and_the_value(hf_models, family):
    # The MoE families reuse the Llama converter (and DeepSeek's covers two types): each message must still
    # start with the model_type it was given, not "Llama" or "DeepSeek".
    cfg, sd = hf_models[family]
    with pytest.raises(ValueError, match=rf"^{family} hidden_act='gelu' is not supported"):
        convert({**cfg, "hidden_act": "gelu"}, sd)
    with pytest.raises(ValueError, match=rf"^{family} config has no 'hidden_size'"):
        convert({**cfg, "hidden_size": None}, sd)
    with pytest.raises(ValueError, match=rf"^{family} state dict has no tensor "
                                         r"'model\.layers\.1\.self_attn\.o_proj\.weight'"):
        convert(cfg, {k: v for k, v in sd.items() if not k.startswith("model.layers.1.self_attn.o_proj")})
    with pytest.raises(ValueError, match=rf"^{family} state dict has no 'lm_head\.weight' and "
                                         r"tie_word_embeddings is False"):
        convert({**cfg, "tie_word_embeddings": False}, {k: v for k, v in sd.items() if k != "lm_head.weight"})
    with pytest.raises(ValueError, match=rf"^{family}: the config says n_experts=4"):
        convert({**cfg, EXPERT_KEY[family]: 4, **({"n_group": 1, "topk_group": 1} if "deepseek" in family else {})},
                sd)


@pytest.mark.parametrize("family, make", [
    ("mistral", lambda: tf.MistralConfig(**BASE, intermediate_size=32, num_key_value_heads=2)),
    ("qwen2", lambda: tf.Qwen2Config(**BASE, intermediate_size=32, num_key_value_heads=2)),
])
def test_dense_llama_style_refusals_name_their_model_type(family, make):
    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(make())
    cfg, sd = hf.config.to_dict(), hf.state_dict()
    with pytest.raises(ValueError, match=rf"^{family} config has no 'intermediate_size'"):
        convert({**cfg, "intermediate_size": None}, sd)
    with pytest.raises(ValueError, match=rf"^{family} state dict has no tensor 'model\.layers\.0\.input_layernorm"):
        convert(cfg, {k: v for k, v in sd.items() if k != "model.layers.0.input_layernorm.weight"})
