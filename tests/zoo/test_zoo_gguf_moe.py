"""Mixture-of-experts GGUF files against transformers: Mixtral (``llama`` with experts), DeepSeek-V2/V3
(``deepseek2``), Qwen2-MoE, Qwen3-MoE and OLMoE.

A random tiny HF model (routing that varies: 8 experts, top-2/3, DeepSeek with expert groups) is written to GGUF
here the way llama.cpp's ``convert_hf_to_gguf.py`` writes it: the metadata keys it writes, tensor names from the
``gguf`` package's own tensor map, experts merged into 3-D tensors, llama's Q/K rotary permutation for Mixtral,
DeepSeek's ``kv_b`` split into ``k_b`` (transposed) and ``v_b`` by newer converters (whole, with per-head key
lengths, by older ones). The reference is the HF model itself, and for Qwen3-MoE also transformers' own GGUF
loading (which reads neither ``deepseek2`` nor ``llama`` with experts).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
tf = pytest.importorskip("transformers")

import test_zoo_hf_moe as hf_moe  # noqa: E402  (tests/zoo is on sys.path)
from test_zoo_gguf import llama_cpp_permute  # noqa: E402

from interp.families import _gguf_experts as gguf_experts  # noqa: E402
from interp.zoo import gguf as zgguf  # noqa: E402

V = hf_moe.V
# DeepSeek's published YaRN has mscale == mscale_all_dim, the case GGUF can express (it keeps only the latter).
YARN = {**hf_moe.YARN, "mscale": 0.707, "mscale_all_dim": 0.707}
# llama.cpp's qwen2moe / qwen3moe have experts in every layer (its tensor map has no dense MLP for them).
GGUF_FAMILIES = {
    **{f: hf_moe.FAMILIES[f] for f in ("mixtral", "olmoe")},
    "qwen2_moe": lambda: tf.Qwen2MoeConfig(**hf_moe.BASE, intermediate_size=48, moe_intermediate_size=24,
                                           shared_expert_intermediate_size=40, num_key_value_heads=2, num_experts=8,
                                           num_experts_per_tok=2, norm_topk_prob=False),
    "qwen3_moe": lambda: tf.Qwen3MoeConfig(**hf_moe.BASE, intermediate_size=48, moe_intermediate_size=24, head_dim=8,
                                           num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
                                           norm_topk_prob=True),
    "deepseek_v3": lambda: tf.DeepseekV3Config(**hf_moe.BASE, **hf_moe.MLA, q_lora_rank=12, n_shared_experts=1,
                                               n_group=4, topk_group=2, rope_parameters=YARN),
    "deepseek_v2": hf_moe.FAMILIES["deepseek_v2"],  # q_lora_rank None, group-limited, routed_scaling_factor 1.5
}


@pytest.fixture
def make_hf(monkeypatch):
    def make(family: str):
        monkeypatch.setitem(hf_moe.FAMILIES, f"gguf_{family}", GGUF_FAMILIES[family])
        return hf_moe.hf_model(f"gguf_{family}")
    return make


def _tokenizer(w) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list([f"<t{i}>" for i in range(V)])
    w.add_token_types([1] * V)


def _experts(hf_sd, h: str) -> dict[str, np.ndarray]:
    """A layer's experts as llama.cpp merges them: ``[E, F, M]`` gate and up, ``[E, M, F]`` down."""
    gate_up, down = hf_sd[h + "mlp.experts.gate_up_proj"], hf_sd[h + "mlp.experts.down_proj"]
    F = gate_up.shape[1] // 2
    return {"ffn_gate_exps": gate_up[:, :F], "ffn_up_exps": gate_up[:, F:], "ffn_down_exps": down}


ARCH = {"mixtral": "llama", "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2", "qwen2_moe": "qwen2moe",
        "qwen3_moe": "qwen3moe", "olmoe": "olmoe"}


def write_gguf(hf, path, *, split_kv: bool = True, set_: dict | None = None, drop: tuple = (),
               reshape: dict | None = None, q8: tuple = ()) -> None:
    """``hf`` written as llama.cpp's converter writes it; ``set_`` / ``drop`` change metadata keys (arch prefix
    omitted), ``reshape`` maps a tensor name to a function of its array (to corrupt it), ``q8`` names the
    tensors stored as Q8_0."""
    c = hf.config
    arch = ARCH[c.model_type]
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    H, L = c.num_attention_heads, c.num_hidden_layers
    meta: dict[str, object] = {
        "block_count": L, "context_length": c.max_position_embeddings,
        "embedding_length": c.hidden_size, "feed_forward_length": c.intermediate_size,
        "attention.head_count": H, "attention.layer_norm_rms_epsilon": c.rms_norm_eps,
        "rope.freq_base": c.rope_parameters["rope_theta"], "vocab_size": V, "expert_used_count": c.num_experts_per_tok,
        "attention.head_count_kv": c.num_key_value_heads,
    }
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
               "output.weight": sd["lm_head.weight"]}
    if arch == "llama":
        meta.update({"expert_count": c.num_local_experts, "rope.dimension_count": c.hidden_size // H})
    elif arch != "deepseek2":
        meta["expert_count"] = c.num_experts
        if arch != "olmoe":
            meta["expert_feed_forward_length"] = c.moe_intermediate_size
        if arch == "qwen2moe":
            meta["expert_shared_feed_forward_length"] = c.shared_expert_intermediate_size
        if arch == "qwen3moe":
            meta.update({"attention.key_length": c.head_dim, "attention.value_length": c.head_dim})
    else:
        C, R = c.kv_lora_rank, c.qk_rope_head_dim
        D, Dv = c.qk_nope_head_dim, c.v_head_dim
        if split_kv:  # newer converters: key/value_length describe the latent as one MQA head
            meta.update({"attention.head_count_kv": 1, "attention.key_length": C + R, "attention.value_length": C,
                         "attention.key_length_mla": D + R, "attention.value_length_mla": Dv})
        else:  # older ones: the per-head widths, all heads
            meta.update({"attention.key_length": D + R, "attention.value_length": Dv})
        meta.update({"leading_dense_block_count": c.first_k_dense_replace, "attention.kv_lora_rank": C,
                     "expert_feed_forward_length": c.moe_intermediate_size, "expert_count": c.n_routed_experts,
                     "expert_shared_count": c.n_shared_experts, "expert_weights_scale": c.routed_scaling_factor,
                     "rope.dimension_count": R,
                     "expert_gating_func": 2 if c.model_type == "deepseek_v3" else 1})
        if c.model_type == "deepseek_v3" or c.topk_method == "group_limited_greedy":
            meta.update({"expert_group_count": c.n_group, "expert_group_used_count": c.topk_group})
        if c.q_lora_rank is not None:
            meta["attention.q_lora_rank"] = c.q_lora_rank
        if getattr(c, "norm_topk_prob", False) and c.model_type == "deepseek_v3":
            meta["expert_weights_norm"] = True
        rope = c.rope_parameters
        if rope.get("rope_type") == "yarn":
            meta.update({"rope.scaling.type": "yarn", "rope.scaling.factor": rope["factor"],
                         "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
                         "rope.scaling.yarn_beta_fast": float(rope["beta_fast"]),
                         "rope.scaling.yarn_beta_slow": float(rope["beta_slow"]),
                         "rope.scaling.yarn_log_multiplier": 0.1 * rope["mscale_all_dim"]})
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), L)
    for key, a in sd.items():
        if not key.startswith("model.layers."):
            continue
        parts = key.split(".")
        i, rest = int(parts[2]), ".".join(parts[3:-1])
        b = f"blk.{i}."
        if key.endswith("mlp.experts.gate_up_proj"):  # merged per layer, as the converter stacks the experts
            tensors.update({b + f"{n}.weight": e for n, e in _experts(sd, f"model.layers.{i}.").items()})
        elif key.endswith("mlp.experts.down_proj"):
            continue
        elif key.endswith("mlp.gate.e_score_correction_bias"):  # "...e_score_correction" + ".bias"
            tensors[b + "exp_probs_b.bias"] = a
        elif rest == "self_attn.kv_b_proj":
            if not split_kv:  # older converters keep kv_b whole
                tensors[b + "attn_kv_b.weight"] = a
                continue
            kv_b = a.reshape(H, D + Dv, C)  # per head: key rows, then value rows
            tensors[b + "attn_k_b.weight"] = np.ascontiguousarray(kv_b[:, :D].transpose(0, 2, 1))  # [H, C, D]
            tensors[b + "attn_v_b.weight"] = np.ascontiguousarray(kv_b[:, D:])  # [H, Dv, C]
        else:  # names from gguf's own tensor map, the table the converter uses
            name = names.get_name(key, try_suffixes=(".weight", ".bias"))
            if arch == "llama" and rest in ("self_attn.q_proj", "self_attn.k_proj"):  # llama's rotary permutation
                a = llama_cpp_permute(a, H if rest == "self_attn.q_proj" else c.num_key_value_heads)
            tensors[name] = a
    meta.update(set_ or {})
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if key in drop:
            continue
        full = f"{arch}.{key}"
        if isinstance(value, bool):
            w.add_bool(full, value)
        elif isinstance(value, int):
            w.add_uint32(full, value)
        elif isinstance(value, str):
            w.add_string(full, value)
        else:
            w.add_float32(full, float(value))
    _tokenizer(w)
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        a = (reshape or {}).get(name, lambda x: x)(a)
        if name in q8:
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("family,split_kv", [("mixtral", True), ("deepseek_v3", True), ("deepseek_v2", False),
                                             ("qwen2_moe", True), ("qwen3_moe", True), ("olmoe", True)])
def test_moe_gguf_matches_transformers(tmp_path, make_hf, family, split_kv):
    hf = make_hf(family)
    path = tmp_path / f"{family}.gguf"
    write_gguf(hf, path, split_kv=split_kv)
    model = zgguf.load_gguf(path, tokenizer=False)
    assert model.cfg.n_experts == 8
    tokens = torch.randint(0, V, (2, 48), generator=torch.Generator().manual_seed(1))
    ref, hf_ids = hf_moe.hf_router_ids(hf, tokens)
    with torch.no_grad():
        logits, trace = model.run_with_cache(tokens, names_filter="*hook_expert_ids")
    diff = (logits - ref).abs().max().item()
    print(f"{family}: max |logit diff| vs transformers = {diff:.2e}")
    assert diff <= 1e-4
    moe_layers = [i for i in range(model.cfg.n_layers) if model.cfg.is_moe_layer(i)]
    assert sorted(hf_ids) == moe_layers and moe_layers
    for layer in moe_layers:
        ours = trace[f"blocks.{layer}.mlp.hook_expert_ids"].reshape(-1, model.cfg.n_experts_per_token)
        assert torch.equal(ours.sort(-1).values, hf_ids[layer])  # the same experts on every token
        assert len({tuple(r) for r in ours.sort(-1).values.tolist()}) > 4  # routing really varies
    if family == "mixtral":  # interp.load dispatches an expert file like any GGUF file, tokenizer included
        import interp

        loaded = interp.load(path)
        assert loaded.cfg.n_experts == 8 and loaded.tokenizer is not None
        with torch.no_grad():
            assert torch.equal(loaded(tokens), logits)
    if family == "deepseek_v3":  # cached decoding through the latent cache, YaRN included (the others: test_zoo_hf_moe)
        prompt = tokens[:1, :8]
        with torch.no_grad():
            hf_out = hf.generate(prompt, max_new_tokens=8, do_sample=False)
        assert torch.equal(model.generate(prompt, 8), hf_out)


def test_quantised_merged_experts_split_in_order(tmp_path, make_hf):
    """Q8_0 3-D expert tensors dequantise to ``[E, F, M]`` and expert e of the file is our expert e."""
    hf = make_hf("mixtral")
    path = tmp_path / "q8.gguf"
    write_gguf(hf, path, q8=("blk.1.ffn_up_exps.weight",))
    model = zgguf.load_gguf(path, tokenizer=False)
    stored = next(t for t in zgguf.read_gguf(path).tensors if t.name == "blk.1.ffn_up_exps.weight")
    assert stored.tensor_type.name == "Q8_0"
    want = torch.from_numpy(gguf.quants.dequantize(stored.data, stored.tensor_type))  # [E, F, M]
    assert torch.equal(model.blocks[1].mlp.W_in.detach(), want)
    F = hf.config.intermediate_size
    exact = hf.model.layers[1].mlp.experts.gate_up_proj.detach()[:, F:]  # [E, F, M]
    assert (want - exact).abs().max() < 0.01 and (want - exact).abs().max() > 0  # quantised, expert by expert


def test_qwen3_moe_matches_transformers_gguf_loading(tmp_path, monkeypatch):
    """transformers reads qwen3moe GGUF files itself (not deepseek2, nor llama with experts): both loaders agree.
    Its reader ignores expert_feed_forward_length, so the experts have Qwen3MoeConfig's default width (768)."""
    import warnings

    monkeypatch.setitem(hf_moe.FAMILIES, "gguf_qwen3_wide", lambda: tf.Qwen3MoeConfig(
        **hf_moe.BASE, intermediate_size=48, moe_intermediate_size=768, head_dim=8, num_key_value_heads=2,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True))
    hf = hf_moe.hf_model("gguf_qwen3_wide")
    write_gguf(hf, tmp_path / "q3.gguf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q3.gguf").eval()
    ours = zgguf.load_gguf(tmp_path / "q3.gguf", tokenizer=False)
    tokens = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = (ours(tokens) - ref(tokens).logits).abs().max().item()
    print(f"qwen3_moe: max |logit diff| vs transformers' GGUF loading = {diff:.2e}")
    assert diff <= 1e-4


def test_deepseek_config_from_gguf_metadata(tmp_path, make_hf):
    hf = make_hf("deepseek_v3")
    write_gguf(hf, tmp_path / "v3.gguf")
    f = zgguf.read_gguf(tmp_path / "v3.gguf")
    cfg = zgguf.hf_config_from_gguf(f.metadata, {t.name for t in f.tensors})
    assert cfg["model_type"] == "deepseek_v3" and cfg["q_lora_rank"] == 12 and cfg["kv_lora_rank"] == 16
    assert (cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]) == (8, 4, 6)
    assert (cfg["n_group"], cfg["topk_group"], cfg["norm_topk_prob"], cfg["first_k_dense_replace"]) == (4, 2, True, 1)
    assert cfg["rope_parameters"]["mscale_all_dim"] == pytest.approx(0.707, rel=1e-6)
    model = zgguf.load_gguf(tmp_path / "v3.gguf", tokenizer=False, dtype=torch.bfloat16)
    assert model.cfg.router_choice_bias and model.cfg.router_score == "sigmoid" and model.cfg.q_latent_dim == 12
    assert model.blocks[1].mlp.W_gate.dtype == torch.bfloat16
    F = hf.config.moe_intermediate_size
    gate = hf.model.layers[1].mlp.experts.gate_up_proj.detach()[:, :F]  # [E, F, M]
    assert torch.equal(model.blocks[1].mlp.W_gate.float(), gate.bfloat16().float())


# --- refusals: each named with its value, before any weight is dequantised ---------------------------------------
REFUSALS = [
    ("mixtral", dict(set_={"expert_count": 6}),
     r"'blk\.0\.ffn_gate_inp\.weight' has shape \[8, 32\].*expert_count = 6.*need \[6, 32\]"),
    ("mixtral", dict(set_={"expert_used_count": 9}), r"'llama\.expert_used_count' = 9.*larger than.*= 8"),
    ("mixtral", dict(set_={"expert_gating_func": 2}), r"'llama\.expert_gating_func' = 2 is not supported"),
    ("deepseek_v3", dict(reshape={"blk.1.ffn_up_exps.weight": lambda a: a[:6]}),
     r"'blk\.1\.ffn_up_exps\.weight' has shape \[6, 24, 32\].*expert_count = 8"),
    ("deepseek_v3", dict(set_={"attention.kv_lora_rank": 12, "attention.key_length": 16, "attention.value_length": 12}),
     r"'blk\.0\.attn_kv_a_mqa\.weight' has shape \[20, 32\].*kv_lora_rank 12.*need \[16, 32\]"),
    ("deepseek_v3", dict(set_={"attention.kv_lora_rank": 12}), r"'deepseek2\.attention\.key_length' = 20.*needs 16"),
    ("deepseek_v3", dict(set_={"attention.q_lora_rank": 10}),
     r"'blk\.0\.attn_q_a\.weight' has shape \[12, 32\].*q_lora_rank 10"),
    ("deepseek_v2", dict(set_={"attention.q_lora_rank": 10}), r"q_lora_rank' = 10, but the file has a direct query"),
    ("deepseek_v3", dict(set_={"expert_gating_func": 3}), r"'deepseek2\.expert_gating_func' = 3 is not supported"),
    ("deepseek_v3", dict(set_={"expert_gating_func": 1}), r"correction biases .*exp_probs_b.* with softmax gating"),
    ("deepseek_v2", dict(set_={"expert_gating_func": 2}), r"sigmoid, DeepSeek-V3\) needs the router correction bias"),
    ("deepseek_v2", dict(set_={"expert_weights_norm": True}), r"expert_weights_norm' = True with softmax gating"),
    ("deepseek_v3", dict(set_={"rope.scaling.yarn_ext_factor": 0.5}), r"yarn_ext_factor' = 0\.5 is not supported"),
    ("deepseek_v3", dict(set_={"nextn_predict_layers": 1}), r"nextn_predict_layers' = 1: multi-token-prediction"),
    ("deepseek_v3", dict(set_={"expert_group_count": 3}), r"expert_group_count' = 3 .* do not split .* = 8 experts"),
    ("qwen2_moe", dict(set_={"expert_shared_feed_forward_length": 36}),
     r"'blk\.0\.ffn_gate_shexp\.weight' has shape \[40, 32\].*expert_shared_feed_forward_length = 36"),
    ("qwen3_moe", dict(set_={"rope.scaling.type": "yarn"}), r"RoPE scaling 'yarn' \(qwen3moe\.rope\.scaling\.type\)"),
    ("olmoe", dict(set_={"expert_feed_forward_length": 12}), r"expert_feed_forward_length = 12, feed_forward_length = 24"),
]


@pytest.mark.parametrize("family,change,match", REFUSALS)
def test_moe_gguf_refusals_name_the_value(tmp_path, make_hf, monkeypatch, family, change, match):
    path = tmp_path / "bad.gguf"
    write_gguf(make_hf(family), path, **change)

    def no_weights(*a, **k):
        raise AssertionError("weights were dequantised before the file was checked")

    monkeypatch.setattr(zgguf, "hf_state_dict_from_gguf", no_weights)
    with pytest.raises(ValueError, match=match):
        zgguf.load_gguf(path, tokenizer=False)


def test_split_kv_needs_both_halves():
    with pytest.raises(ValueError, match="has no 'model.layers.0.self_attn.v_b_proj.weight'"):
        gguf_experts.join_split_tensors({"model.layers.0.self_attn.k_b_proj.weight": torch.zeros(2, 5, 3)})
