"""The precision policy (interp.precision): one ModelConfig field replaces the per-family rounding flags
``norm_weight_float32`` / ``rotary_float32``. Old configs (checkpoints store them as JSON) map onto it, families
set it, and the modules round as the policy says."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from interp import ModelConfig
from interp.norms import RMSNorm
from interp.placement import build
from interp.precision import PRECISIONS, Precision, precision_from
from interp.zoo import load_checkpoint, save_checkpoint

SIZES = dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=40, n_ctx=16, positional="rotary",
             normalization="rms", activation="swiglu", qk_norm="head")
TOKENS = torch.tensor([[1, 7, 3, 9, 2, 5]])
OLD_KEYS = [(False, False, "llama"), (True, False, "gemma"), (True, True, "olmo2"), (False, True, "cohere")]


@pytest.mark.parametrize("norm, rotary, name", OLD_KEYS)
def test_an_old_config_dict_maps_onto_the_policy(norm, rotary, name):
    old = {**SIZES, "norm_weight_float32": norm, "rotary_float32": rotary}
    cfg = ModelConfig.from_dict(old)
    assert cfg.precision == PRECISIONS[name] == Precision(norm_weight_float32=norm, rotary_float32=rotary)
    assert "norm_weight_float32" not in cfg.to_dict()
    # saved again, it round-trips through JSON as the new field
    again = ModelConfig.from_dict(json.loads(cfg.to_json()))
    assert again == cfg and again.precision is PRECISIONS[name]


def test_only_one_old_key_maps_too():
    assert ModelConfig.from_dict({**SIZES, "rotary_float32": True}).precision == Precision.named("cohere")


def test_old_and_new_keys_together_are_refused():
    with pytest.raises(ValueError, match=r"both 'precision' and the old key\(s\) \['rotary_float32'\]"):
        ModelConfig.from_dict({**SIZES, "precision": "olmo2", "rotary_float32": True})


def test_bad_policies_are_refused_by_name():
    with pytest.raises(ValueError, match=r"precision='bf16' is no known policy; known ones are \['cohere'"):
        ModelConfig(**SIZES, precision="bf16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['softmax_float32'\]"):
        precision_from({"softmax_float32": True})
    with pytest.raises(TypeError, match=r"Precision.rotary_float32=1 must be True or False"):
        Precision(rotary_float32=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"precision=True must be a Precision, a policy name"):
        ModelConfig(**SIZES, precision=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Precision.norm_weight_float32='yes' must be True or False, got str"):
        ModelConfig.from_dict({**SIZES, "norm_weight_float32": "yes"})


def test_a_name_or_a_dict_becomes_the_policy():
    assert ModelConfig(**SIZES, precision="olmo2").precision is PRECISIONS["olmo2"]  # type: ignore[arg-type]
    cfg = ModelConfig(**SIZES, precision={"norm_weight_float32": True})  # type: ignore[arg-type]
    assert cfg.precision == Precision.named("gemma")


def test_repr_shows_the_policy_only_when_it_is_not_the_default():
    assert "precision" not in repr(ModelConfig(**SIZES))
    assert "precision" not in repr(ModelConfig(**SIZES, precision=Precision()))
    cfg = ModelConfig(**SIZES, precision=Precision.named("olmo2"))
    assert "precision='olmo2'" in repr(cfg)
    assert "precision='llama'" in ModelConfig(**SIZES).full_repr()
    assert eval(repr(cfg), {"ModelConfig": ModelConfig}) == cfg  # the name rebuilds the policy


@pytest.mark.parametrize("norm, rotary, name", OLD_KEYS)
def test_modules_round_as_the_policy_says(norm, rotary, name):
    model = build(ModelConfig(**SIZES, precision=Precision.named(name)), seed=0)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * 2 + 2 * 2 + 1  # ln1, ln2, q_norm, k_norm per layer, ln_final
    assert {m.weight_float32 for m in norms} == {norm}
    assert {b.attn.rotary.float32 for b in model.blocks} == {rotary}


def test_the_gemma_policy_multiplies_the_norm_weight_in_float32_and_rounds_once():
    # A naive reference for each order, in bf16: Llama rounds the normalised input before the weight.
    torch.manual_seed(0)
    x = torch.randn(3, 32).bfloat16()
    w = (1 + torch.randn(32)).bfloat16()
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    for name, want in (("llama", w * normed.bfloat16()), ("gemma", (w.float() * normed).bfloat16())):
        cfg = ModelConfig(**{**SIZES, "norm_eps": 1e-6}, precision=Precision.named(name))
        model = build(cfg, seed=0, dtype=torch.bfloat16)
        with torch.no_grad():
            model.ln_final.weight.copy_(w)
            assert torch.equal(model.ln_final(x), want), name
    assert not torch.equal(w * normed.bfloat16(), (w.float() * normed).bfloat16())  # the two orders differ here


def test_an_old_checkpoint_loads_with_the_same_weights_and_logits(tmp_path):
    cfg = ModelConfig(**SIZES, precision=Precision.named("olmo2"))
    model = build(cfg, seed=0, dtype=torch.bfloat16)
    new_path = save_checkpoint(model, tmp_path / "new.safetensors")
    # The same file as it was written before the policy: the config JSON carries the two old keys instead.
    with safe_open(str(new_path), "pt") as f:
        header = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    stored = json.loads(header["config"])
    policy = stored.pop("precision")
    assert policy == {"norm_weight_float32": True, "rotary_float32": True}
    header["config"] = json.dumps({**stored, **policy}, sort_keys=True)
    old_path = tmp_path / "old.safetensors"
    save_file(tensors, str(old_path), metadata=header)

    old = load_checkpoint(old_path)
    assert old.cfg == cfg and old.cfg.precision == Precision.named("olmo2")
    assert old.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in old.state_dict().items())
    with torch.no_grad():
        assert torch.equal(old(TOKENS), model(TOKENS))


def _hf_config(model_type: str, kwargs: dict) -> dict:
    transformers = pytest.importorskip("transformers")
    from interp.zoo import compat

    return transformers.AutoConfig.for_model(model_type, **{**compat._COMMON, **kwargs}).to_dict()


@pytest.mark.parametrize("row, name", [
    ("llama3", "llama"), ("gemma", "gemma"), ("gemma2", "gemma"), ("gemma3_text", "gemma"), ("exaone4", "gemma"),
    ("gpt_oss", "gemma"), ("olmo2", "olmo2"), ("olmo3", "olmo2"), ("cohere", "cohere"), ("cohere2", "cohere"),
    ("ernie4_5", "cohere"),
])
def test_each_family_sets_its_policy(row, name):
    from interp.families import family_for
    from interp.zoo import compat

    model_type, kwargs = compat.TABLE[row]
    hf_cfg = _hf_config(model_type, dict(kwargs))
    assert family_for(model_type).config(hf_cfg).precision == Precision.named(name)


# --- the router policy (router_float32) and the experts' weighted sum ------------------------------------------
MOE = dict(SIZES, n_experts=4, n_experts_per_token=2, router_score="sigmoid", router_choice_bias=True)


def _moe_model(name: str) -> torch.nn.Module:
    model = build(ModelConfig(**MOE, precision=Precision.named(name)), seed=0, dtype=torch.bfloat16)
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.router_bias.copy_(0.01 * torch.randn(4))  # a choice bias that bf16 would round
    return model


def test_the_router_policy_keeps_the_router_in_float32_through_a_checkpoint(tmp_path):
    model = _moe_model("deepseek_v3")
    mlp = model.blocks[0].mlp
    assert (mlp.W_router.dtype, mlp.router_bias.dtype, mlp.W_gate.dtype) == (torch.float32, torch.float32,
                                                                              torch.bfloat16)
    assert _moe_model("llama").blocks[0].mlp.W_router.dtype == torch.bfloat16
    again = load_checkpoint(save_checkpoint(model, tmp_path / "moe.safetensors"))  # dtype "as stored": bf16
    assert again.W_E.dtype == torch.bfloat16 and again.blocks[1].mlp.W_router.dtype == torch.float32
    assert torch.equal(again.blocks[1].mlp.router_bias, model.blocks[1].mlp.router_bias)
    with torch.no_grad():
        assert torch.equal(again(TOKENS), model(TOKENS))


@pytest.mark.parametrize("name", ["llama", "mixtral", "deepseek_v3"])
def test_the_experts_outputs_are_weighted_then_summed_in_float32(name):
    """Naive reference: each expert's output times its weight (rounded to bf16 unless the policy keeps the weights
    float32), accumulated in float32, rounded once: transformers' experts kernels."""
    model = _moe_model(name)
    seen = {}
    mlp = model.blocks[0].mlp
    for hook in ("hook_expert_out", "hook_expert_weights", "hook_routed_out", "hook_router_logits"):
        getattr(mlp, hook).add_hook(lambda x, hook=None, name=hook: seen.__setitem__(name, x))
    with torch.no_grad():
        model(TOKENS)
    slots, w = seen["hook_expert_out"], seen["hook_expert_weights"]  # [B, T, k, M], [B, T, k]
    assert w.dtype == (torch.bfloat16 if name == "llama" else torch.float32)
    assert seen["hook_router_logits"].dtype == (torch.float32 if name == "deepseek_v3" else torch.bfloat16)
    acc = torch.zeros(slots.shape[:2] + slots.shape[-1:])
    for j in range(slots.shape[2]):
        acc += (slots[:, :, j] * w[:, :, j, None]).float()
    assert torch.equal(seen["hook_routed_out"], acc.bfloat16())
    unrounded = (slots.float() * w.float()[..., None]).sum(2).bfloat16()
    if name == "llama":  # rounding each product matters here: the reference above can tell the orders apart
        assert not torch.equal(unrounded, acc.bfloat16())
