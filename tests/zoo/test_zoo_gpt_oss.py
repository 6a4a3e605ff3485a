"""gpt-oss natively (interp.families.gpt_oss) against transformers, beyond the family test of test_zoo_families.py
(logits on both attention paths, eager patterns, greedy 32, cached decoding past the window): every feature
changes the logits, the sink mass completes HF's pattern rows, an MXFP4 checkpoint written as the release is
loads with transformers' logits, bad weights and settings are refused by name, and classify_heads reports each
head's learned sink mass."""

import json
import warnings

import pytest
import torch

from interp.families.gpt_oss import gpt_oss_config, mxfp4_dequantize
from interp.zoo.compat import SEQ, V, hf_test_model
from interp.zoo.hf import convert, from_hf

transformers = pytest.importorskip("transformers")


def _ids(n=2, T=SEQ, seed=4):
    return torch.randint(1, V, (n, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def pair():
    hf = hf_test_model("gpt_oss")
    return hf, from_hf(hf)


def test_every_feature_bites(pair):
    """Sinks, the clamp, the router bias and the expert biases each change the logits: matching transformers in
    the family test shows each is implemented."""
    hf, model = pair
    ids = _ids(1)
    with torch.no_grad():
        base = model(ids)
    state = model.state_dict()
    for field, keys in (("attn_sinks", ("attn.sinks",)), ("router_logit_bias", ("mlp.b_router",)),
                        ("expert_bias", ("mlp.b_gate", "mlp.b_in", "mlp.b_out"))):
        cfg = type(model.cfg).from_dict({**model.cfg.to_dict(), field: False})
        other = type(model)(cfg).eval()
        other.load_state_dict({k: v for k, v in state.items() if not k.endswith(keys)})
        with torch.no_grad():
            assert (other(ids) - base).abs().max() > 1e-3, field
    unclamped = type(model)(type(model.cfg).from_dict({**model.cfg.to_dict(), "swiglu_limit": 1e4})).eval()
    unclamped.load_state_dict(state)
    with torch.no_grad():
        assert (unclamped(ids) - base).abs().max() > 1e-3
    assert model.cfg.sliding_window == [8, None] and SEQ > 8


def test_sink_mass_completes_the_eager_rows(pair):
    """transformers' eager weights drop the sink's column: 1 - their row sum is our hook_sink_mass."""
    hf, model = pair
    ids = _ids()
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
        _, trace = model.run_with_cache(ids, names_filter=["*hook_sink_mass", "*hook_pattern"])
    for layer, pattern in enumerate(ref.attentions):
        mass = trace.sink_mass(layer)  # [B, H, T]
        torch.testing.assert_close(mass, 1 - pattern.sum(-1), rtol=0, atol=1e-5)
        torch.testing.assert_close(trace.pattern(layer).sum(-1) + mass, torch.ones_like(mass), rtol=0, atol=1e-6)
    masses = torch.stack([trace[f"blocks.{i}.attn.hook_sink_mass"].mean((0, 2)) for i in range(2)])  # [L, H]
    assert masses.max() > 0.5 and masses.min() < 0.1  # large sinks: some heads park most of their mass there


def test_cached_decoding_equals_a_full_recompute_past_the_window(pair):
    _, model = pair
    ids = _ids(2, 14)
    for explicit in (False, True):  # the fused path's extra key, and the recording path
        names = "*hook_pattern" if explicit else []
        with torch.no_grad():
            full, _ = model.run_with_cache(ids, names_filter=names)
            cache = model.make_cache(2, 14)
            steps = [model.run_with_cache(ids[:, :5], names_filter=names, kv_cache=cache)[0][:, -1]]
            for t in range(5, 14):
                steps.append(model.run_with_cache(ids[:, t:t + 1], names_filter=names, kv_cache=cache)[0][:, -1])
        torch.testing.assert_close(torch.stack(steps, 1), full[:, 4:], rtol=0, atol=1e-4)


def _release_folder(tmp_path, hf):
    """A checkpoint written as the gpt-oss release is: MXFP4 experts (uint8 blocks and scales), the rest plain."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    for key in [k for k in sd if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        E, n_in, n_out = sd.pop(key).shape  # [E, in, out]: the release stores [E, out, in / 32, 16]
        sd[key + "_blocks"] = torch.randint(0, 256, (E, n_out, n_in // 32, 16), dtype=torch.uint8, generator=g)
        sd[key + "_scales"] = torch.randint(121, 128, (E, n_out, n_in // 32), dtype=torch.uint8, generator=g)
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cfg = hf.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return sd


def test_mxfp4_checkpoint_matches_transformers(tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf = hf_test_model("gpt_oss", hidden_size=64, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16)
    sd = _release_folder(tmp_path, hf)
    for key in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        want = convert_moe_packed_tensors(sd[key + "_blocks"], sd[key + "_scales"], dtype=torch.float32)
        assert torch.equal(mxfp4_dequantize(sd[key + "_blocks"], sd[key + "_scales"]).transpose(1, 2), want)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers: no triton, it dequantizes on the CPU
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert not any(isinstance(p, torch.nn.Parameter) and p.dtype == torch.uint8 for p in ref.parameters())
    model = from_hf(str(tmp_path))
    ids = _ids()
    with torch.no_grad():
        want = ref(ids).logits
        assert want.abs().max() > 1.0
        torch.testing.assert_close(model(ids), want, rtol=0, atol=1e-4)


def test_mxfp4_and_shape_refusals_name_the_tensor(tmp_path):
    hf = hf_test_model("gpt_oss", hidden_size=64, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16)
    sd = _release_folder(tmp_path, hf)
    hf_cfg = json.loads((tmp_path / "config.json").read_text())
    key = "model.layers.0.mlp.experts.gate_up_proj_scales"
    bad = dict(sd, **{key: sd[key][:, :, :1]})
    with pytest.raises(ValueError, match=r"gate_up_proj_blocks.*MXFP4 scales have shape \[4, 64, 1\]"):
        convert(hf_cfg, bad)
    with pytest.raises(ValueError, match="quant_method='fp8'"):
        gpt_oss_config({**hf_cfg, "quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(ValueError, match="non-floating weights"):  # uint8 codes without the MXFP4 config
        convert({k: v for k, v in hf_cfg.items() if k != "quantization_config"}, sd)
    more = {**hf_cfg, "num_local_experts": 8}
    with pytest.raises(ValueError, match="gate_up_proj_blocks has shape \\[4, 64, 2, 16\\].*\\[8, 64, 2, 16\\]"):
        convert(more, sd)
    with pytest.raises(ValueError, match=r"layer_types\[1\]='chunked_attention'"):
        gpt_oss_config({**hf_cfg, "layer_types": ["sliding_attention", "chunked_attention"]})


def test_native_and_route_agree(pair):
    """The attention-level route over transformers' own forward gives the native model's patterns and head writes
    (float32: transformers' gpt-oss experts have no float64 kernel)."""
    from interp.zoo import hf_route

    hf, model = pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        route = hf_route.wrap(hf_test_model("gpt_oss"))
    ids = _ids()
    names = ["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_z"]
    with torch.no_grad():
        _, a = model.run_with_cache(ids, names_filter=names)
        _, b = route.run_with_cache(ids, names_filter=names)
    for layer in range(2):
        torch.testing.assert_close(a.pattern(layer), b.pattern(layer), rtol=0, atol=1e-5)
        torch.testing.assert_close(a[f"blocks.{layer}.attn.hook_z"], b[f"blocks.{layer}.attn.hook_z"], rtol=0, atol=1e-5)


def test_classify_heads_reports_each_heads_learned_sink_mass():
    """A gpt-oss-shaped model where one head's sink logit is huge: only that head is a sink, and every head's
    mass is the mean of its hook_sink_mass over the real queries."""
    from interp.analysis import classify_heads

    hf = hf_test_model("gpt_oss")
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.fill_(-30.0)  # no sink anywhere ...
        hf.model.layers[1].self_attn.sinks[4] = 30.0  # ... but layer 1 head 4
    model = from_hf(hf)
    tokens = _ids(6, 16, seed=7)
    report = classify_heads(model, kinds=["sink"], tokens=tokens, progress=False)
    assert report.heads("sink") == [(1, 4)]
    table = report.details["sink"]
    assert len(table) == 2 * 9
    with torch.no_grad():
        _, trace = model.run_with_cache(tokens, names_filter="*hook_sink_mass")
    naive = torch.stack([trace[f"blocks.{i}.attn.hook_sink_mass"].mean(-1).mean(0) for i in range(2)])  # [L, H]
    torch.testing.assert_close(torch.tensor(table.sink_mass.values, dtype=torch.float32).view(2, 9), naive.float(),
                               rtol=0, atol=1e-6)
    assert float(naive[1, 4]) > 0.99 and float(naive.flatten()[:13].max()) < 1e-6


# --- GGUF, the way llama.cpp's convert_hf_to_gguf.py writes gpt-oss ----------------------------------------------
def _mxfp4_round_trip(w):
    """``w`` ``[E, rows, cols]`` as MXFP4 blocks along ``cols`` (ggml's MXFP4, as the release's experts are stored)
    and the float values those blocks hold."""
    gguf = pytest.importorskip("gguf")
    blocks = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.MXFP4)
    return blocks, torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.MXFP4).copy())


def _write_gguf(path, hf):
    """The converter's metadata, tensor names and tensor changes: gate and up split out of the interleaved
    gate_up_proj, experts transposed to [E, out, in] and stored as MXFP4, sinks as attn_sinks.weight, every other
    tensor F32. The HF model's experts are set to the MXFP4 values, so it is an exact reference for the file."""
    gguf = pytest.importorskip("gguf")
    from gguf_writer import text_model_keys  # tests/zoo is on sys.path; it needs gguf

    c = hf.config
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    text_model_keys(w, c)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_vocab_size(c.vocab_size)
    w.add_sliding_window(c.sliding_window)
    w.add_expert_feed_forward_length(c.intermediate_size)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(c.rope_parameters["factor"])
    w.add_rope_scaling_orig_ctx_len(c.rope_parameters["original_max_position_embeddings"])
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm",
                 "post_attention_layernorm": "post_attention_norm", "mlp.router": "ffn_gate_inp"}
    tensors = {}
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            ex = layer.mlp.experts
            gate, up = ex.gate_up_proj[:, :, 0::2].transpose(1, 2), ex.gate_up_proj[:, :, 1::2].transpose(1, 2)
            down = ex.down_proj.transpose(1, 2)  # [E, M, F]
            (g_blocks, g), (u_blocks, u), (d_blocks, d) = (_mxfp4_round_trip(t.contiguous()) for t in (gate, up, down))
            ex.gate_up_proj.copy_(torch.stack([g.transpose(1, 2), u.transpose(1, 2)], dim=-1).flatten(-2))
            ex.down_proj.copy_(d.transpose(1, 2))
            b = ex.gate_up_proj_bias
            for kind, blocks, bias in (("gate", g_blocks, b[:, 0::2]), ("up", u_blocks, b[:, 1::2]),
                                       ("down", d_blocks, ex.down_proj_bias)):
                tensors[f"blk.{i}.ffn_{kind}_exps.weight"] = (blocks, gguf.GGMLQuantizationType.MXFP4)
                tensors[f"blk.{i}.ffn_{kind}_exps.bias"] = (bias.contiguous().numpy(), None)
            tensors[f"blk.{i}.attn_sinks.weight"] = (layer.self_attn.sinks.numpy(), None)
        for key, t in hf.state_dict().items():
            if key in names:
                tensors[names[key]] = (t.numpy(), None)
            elif key.startswith("model.layers."):
                _, _, i, *rest = key.split(".")
                stem, suffix = ".".join(rest[:-1]), rest[-1]
                if stem in per_layer:
                    tensors[f"blk.{i}.{per_layer[stem]}.{suffix}"] = (t.numpy(), None)
    for name, (data, raw) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw) if raw is not None else w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_written_as_llama_cpp_writes_gpt_oss_matches_the_same_model(tmp_path):
    from interp.zoo.gguf import load_gguf

    # llama.cpp fixes the clamp at 7.0 (no metadata key holds it): the reference model has the release's value.
    hf = hf_test_model("gpt_oss", hidden_size=64, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, swiglu_limit=7.0)
    path = tmp_path / "gpt-oss.gguf"
    _write_gguf(path, hf)
    model = load_gguf(path, tokenizer=False)
    assert model.cfg.attn_sinks and model.cfg.sliding_window == [8, None]
    ids = _ids()
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(model(ids), want, rtol=0, atol=1e-4)


def test_gguf_refusals_name_the_key_or_tensor():
    from interp.families.gpt_oss import gguf_hf_config as hf_config
    from interp.families.gpt_oss import gguf_hf_tensors as hf_tensors

    meta = {"general.architecture": "gpt-oss", "gpt-oss.block_count": 2, "gpt-oss.context_length": 64,
            "gpt-oss.embedding_length": 64, "gpt-oss.feed_forward_length": 32, "gpt-oss.vocab_size": 50,
            "gpt-oss.attention.head_count": 4, "gpt-oss.attention.key_length": 16, "gpt-oss.expert_count": 4,
            "gpt-oss.expert_used_count": 2, "gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": 4.0}
    cfg = hf_config(meta, {"output.weight"})
    with pytest.raises(ValueError, match="RoPE scaling 'linear'"):
        hf_config({**meta, "gpt-oss.rope.scaling.type": "linear"}, set())
    with pytest.raises(ValueError, match="'gpt-oss.expert_used_count' = 5"):
        hf_config({**meta, "gpt-oss.expert_used_count": 5}, set())
    with pytest.raises(ValueError, match=r"'blk.0.ffn_up_exps.weight' has shape \[3, 32, 64\]"):
        hf_tensors("blk.0.ffn_up_exps.weight", torch.zeros(3, 32, 64), cfg)
    with pytest.raises(ValueError, match="'blk.0.ffn_gate_shexp.weight' has no place in a 'gpt-oss' decoder"):
        hf_tensors("blk.0.ffn_gate_shexp.weight", torch.zeros(32, 64), cfg)
