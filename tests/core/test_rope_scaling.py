"""RoPE scaling (linear, dynamic NTK, llama3, YaRN with mscale, LongRoPE) against transformers' own rope init
functions and against random tiny Llama models past their original context (no download)."""

import math

import pytest
import torch

from interp import ModelConfig, Transformer
from interp.rotary import Rotary, rope_frequencies, yarn_attention_factor
from interp.zoo.hf import _rope, convert, from_hf

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HEAD_DIM = 16
ORIG = 16  # the "original" context the scalings stretch; test sequences run to 40 positions

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIG},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG},
    "yarn_deepseek": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG,
                      "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16, "beta_slow": 2},
}


def _hf_config(rope, max_pos):
    return transformers.LlamaConfig(hidden_size=80, num_attention_heads=5, head_dim=HEAD_DIM, num_key_value_heads=5,
                                    max_position_embeddings=max_pos,
                                    rope_parameters={**rope, "rope_theta": 500.0})


@pytest.mark.parametrize("name", sorted(SCALINGS))
@pytest.mark.parametrize("seq_len", [None, 10, 40])
def test_frequencies_match_transformers(name, seq_len):
    rope = SCALINGS[name]
    max_pos = ORIG if rope["rope_type"] == "dynamic" else 4 * ORIG
    hf_cfg = _hf_config(rope, max_pos)
    want_inv, want_att = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg, "cpu", seq_len=seq_len)
    _, scaling = _rope(hf_cfg.to_dict(), "llama")
    got_inv, got_att = rope_frequencies(HEAD_DIM, 500.0, scaling, seq_len=seq_len)
    torch.testing.assert_close(got_inv, want_inv, rtol=0, atol=0)
    assert got_att == pytest.approx(want_att, rel=1e-12)


def test_yarn_attention_factor_formulas():
    assert yarn_attention_factor(1.0) == 1.0
    assert yarn_attention_factor(4.0) == pytest.approx(0.1 * math.log(4.0) + 1)
    want = (0.1 * 0.707 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1)
    assert yarn_attention_factor(40.0, mscale=0.707, mscale_all_dim=0.707) == pytest.approx(want)
    want = (0.1 * 1.0 * math.log(40) + 1) / (0.1 * 0.5 * math.log(40) + 1)
    assert yarn_attention_factor(40.0, mscale=1.0, mscale_all_dim=0.5) == pytest.approx(want)


def test_longrope_frequencies_switch_past_the_original_context():
    short, long = [1.0 + 0.1 * i for i in range(8)], [2.0 + 0.5 * i for i in range(8)]
    hf_cfg = transformers.Phi3Config(hidden_size=80, num_attention_heads=5, max_position_embeddings=4 * ORIG,
                                     original_max_position_embeddings=ORIG, pad_token_id=0,
                                     rope_parameters={"rope_type": "longrope", "short_factor": short,
                                                      "long_factor": long})
    theta, scaling = _rope(hf_cfg.to_dict(), "phi3")
    for seq_len in (None, ORIG, ORIG + 1, 40):
        want_inv, want_att = ROPE_INIT_FUNCTIONS["longrope"](hf_cfg, "cpu", seq_len=seq_len)
        got_inv, got_att = rope_frequencies(HEAD_DIM, theta, scaling, seq_len=seq_len)
        torch.testing.assert_close(got_inv, want_inv, rtol=0, atol=0)
        assert got_att == pytest.approx(want_att, rel=1e-12)
    rot = Rotary(HEAD_DIM, theta, scaling)
    assert rot.length_dependent
    assert not torch.equal(rot.frequencies(torch.arange(ORIG)), rot.frequencies(torch.arange(ORIG + 1)))


def _seed(model):
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p)) if "norm" in name else p.normal_(0, 0.2)
    return model.eval()


def _llama(rope, max_pos):
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=80, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=5, num_key_value_heads=1, head_dim=HEAD_DIM,
                                   max_position_embeddings=max_pos, rope_parameters={**rope, "rope_theta": 500.0},
                                   rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                   attn_implementation="eager")
    torch.manual_seed(0)
    return _seed(transformers.LlamaForCausalLM(cfg))


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_scaled_llama_matches_transformers_past_the_original_context(name):
    rope = SCALINGS[name]
    max_pos = ORIG if rope["rope_type"] == "dynamic" else 4 * ORIG
    hf = _llama(rope, max_pos)
    model = from_hf(hf)
    assert model.cfg.rope_scaling["rope_type"] == rope["rope_type"]
    torch.manual_seed(4)
    ids = torch.randint(0, 97, (2, 40))  # positions 0..39, past the original 16
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
        logits, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
        torch.testing.assert_close(logits, ref.logits, rtol=0, atol=1e-4)
        for layer, pattern in enumerate(ref.attentions):
            torch.testing.assert_close(trace.pattern(layer), pattern, rtol=0, atol=1e-5)
        torch.testing.assert_close(model(ids), ref.logits, rtol=0, atol=1e-4)  # the SDPA path
    # Greedy decoding from a prompt inside the original context to well past it.
    prompt = ids[:1, :8]
    want = hf.generate(prompt, max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(prompt),
                       eos_token_id=None)
    got = model.generate(prompt, max_new_tokens=32)
    assert torch.equal(got, want), (got, want)
    assert len(set(got[0, 8:].tolist())) > 1
    if rope["rope_type"] != "dynamic":  # dynamic NTK's cached keys keep the frequencies they were rotated with
        assert torch.equal(model.generate(prompt, max_new_tokens=32, use_cache=False), got)


def test_scaling_changes_logits_past_the_original_context():
    ids = torch.randint(0, 97, (1, 40))
    plain = from_hf(_llama({"rope_type": "default"}, 4 * ORIG))
    scaled = from_hf(_llama(SCALINGS["llama3"], 4 * ORIG))
    with torch.no_grad():
        assert (plain(ids) - scaled(ids)).abs().max() > 1e-3


def test_config_refuses_bad_scalings_by_name():
    base = dict(n_layers=1, d_model=32, n_heads=2, d_vocab=10, n_ctx=16, positional="rotary")
    with pytest.raises(ValueError, match=r"rope_type='ntk-by-parts' is not supported; supported: \['dynamic'"):
        ModelConfig(**base, rope_scaling={"rope_type": "ntk-by-parts", "factor": 2.0})
    with pytest.raises(ValueError, match=r"rope_type='llama3' needs \['low_freq_factor'"):
        ModelConfig(**base, rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['beta'\]"):
        ModelConfig(**base, rope_scaling={"rope_type": "linear", "factor": 2.0, "beta": 1})
    with pytest.raises(ValueError, match=r"factor=0.5 must be >= 1"):
        ModelConfig(**base, rope_scaling={"rope_type": "linear", "factor": 0.5})
    with pytest.raises(ValueError, match=r"factor=nan must be a finite number"):
        ModelConfig(**base, rope_scaling={"rope_type": "linear", "factor": float("nan")})
    with pytest.raises(ValueError, match=r"short_factor must be 8 positive numbers"):
        ModelConfig(**base, rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 3,
                                          "long_factor": [1.0] * 8, "original_max_position_embeddings": 8})
    with pytest.raises(ValueError, match=r"needs positional='rotary'"):
        ModelConfig(**{**base, "positional": "learned"}, rope_scaling={"rope_type": "linear", "factor": 2.0})
    cfg = ModelConfig(**base, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})
    assert ModelConfig.from_dict(cfg.to_dict()).rope_scaling == cfg.rope_scaling
    assert Transformer(cfg).blocks[0].attn.rotary.attention_factor == pytest.approx(yarn_attention_factor(4.0))


def test_converter_refuses_other_rope_kinds_by_name():
    hf_cfg = _llama({"rope_type": "default"}, 4 * ORIG).config.to_dict()
    with pytest.raises(ValueError, match=r"llama rope_type='proportional' is not supported; supported: \['default'"):
        convert({**hf_cfg, "rope_parameters": {"rope_type": "proportional", "rope_theta": 1.0, "factor": 2.0}}, {})


@pytest.mark.parametrize("name", ["yarn", "llama3"])
def test_the_hook_free_decode_step_rotates_scaled_rope_exactly(name, monkeypatch):
    # The decode step is traced from the blocks with Rotary as a leaf module, so a scaled RoPE (YaRN's attention
    # factor included) runs its own code at every step: the lean tokens equal the hooked pass's, past ORIG.
    from interp.decode import LeanDecoder

    model = from_hf(_llama(SCALINGS[name], 4 * ORIG))
    assert LeanDecoder.unsupported(model) is None
    prompt = torch.randint(0, 97, (2, ORIG - 4), generator=torch.Generator().manual_seed(3))
    with model.hooks([("blocks.0.hook_resid_pre", lambda x, hook: None)]):  # a hook: every step is hooked
        hooked = model.generate(prompt, 12)
    steps = []
    real = LeanDecoder.step
    monkeypatch.setattr(LeanDecoder, "step", lambda self, *a: steps.append(1) or real(self, *a))
    assert torch.equal(model.generate(prompt, 12), hooked)
    assert len(steps) == 11  # every step past the prompt ran the hook-free step
