"""GGUF files of Cohere 2, EXAONE 4, GLM-4, Hunyuan dense and Llama 4 (text), written from random transformers
models as llama.cpp's ``convert_hf_to_gguf.py`` writes them (tests/zoo/gguf_writer.py).

transformers' GGUF loading reads none of these architectures, so each file is checked against two references:
the HF model it was written from (its parameters set to what the file dequantises to: F32, F16 and Q8_0 in
turn) and the same weights saved as safetensors and loaded through interp's Hugging Face route.

Each converter change that the loader undoes is shown to matter (reading the file without undoing it changes the
logits or is refused), each structure llama.cpp fixes rather than writes is checked on the loaded config, and
each setting these files can carry that interp does not reproduce is refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gguf_writer import FAMILIES, SEQ, WINDOW, V, hf_model, write_gguf  # noqa: E402
from test_zoo_gguf_reliability import rewrite  # noqa: E402

import interp  # noqa: E402
from interp.families import family_for  # noqa: E402
from interp.zoo import gguf as zgguf  # noqa: E402

NEWER = ("cohere2", "exaone4", "exaone4_global", "glm4", "hunyuan_dense", "llama4")
U32 = gguf.GGUFValueType.UINT32


def _ids() -> torch.Tensor:
    torch.manual_seed(3)
    return torch.randint(1, V, (2, SEQ))


def _logits(model, ids=None) -> torch.Tensor:
    with torch.no_grad():
        out = model(_ids() if ids is None else ids)
    return getattr(out, "logits", out)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (path, HF model), written once."""
    root = tmp_path_factory.mktemp("gguf_newer")
    out = {}
    for name in NEWER:
        hf = hf_model(name)
        out[name] = (write_gguf(hf, root / f"{name}.gguf", FAMILIES[name][0]), hf)
    return out


def _load(path):
    return zgguf.load_gguf(path, tokenizer=False)


@pytest.mark.parametrize("name", NEWER)
def test_gguf_matches_transformers_and_the_safetensors_route(files, tmp_path, name):
    path, hf = files[name]
    ours = _logits(_load(path))
    diff = (ours - _logits(hf)).abs().max().item()
    assert diff <= 1e-4, f"{name}: max |logit diff| vs transformers {diff:.2e}"
    hf.save_pretrained(tmp_path)  # the same weights as safetensors, through interp's Hugging Face route
    folder = interp.load(str(tmp_path))
    same = (ours - _logits(folder)).abs().max().item()
    assert same <= 1e-5, f"{name}: GGUF vs safetensors route {same:.2e}"


def test_structure_comes_from_the_keys_and_llama_cpps_fixed_rules(files):
    """What the keys say (windows, pattern, rotary share, MoE interleave) and what llama.cpp fixes per
    architecture (Cohere 2's and Llama 4's patterns, Llama 4's chunk, temperature and QK-norm) reach the model."""
    cohere2 = _load(files["cohere2"][0]).cfg
    assert (cohere2.sliding_window, cohere2.nope_layers) == ([WINDOW] * 3 + [None], [3])
    exaone = _load(files["exaone4"][0]).cfg
    assert (exaone.sliding_window, exaone.nope_layers) == ([WINDOW, None, WINDOW], [1])
    assert _load(files["exaone4_global"][0]).cfg.nope_layers is None  # no window: every layer rotates
    assert _load(files["glm4"][0]).cfg.rotary_dim == 8  # rope.dimension_count: half of the 16-wide heads
    hunyuan = _load(files["hunyuan_dense"][0]).cfg
    assert hunyuan.rotary_base == pytest.approx(10000.0 * 1000.0 ** (16 / 14), rel=1e-6)  # alpha folded in
    llama4 = _load(files["llama4"][0]).cfg
    assert llama4.attention_chunk == [8192, 8192, 8192, None] and llama4.nope_layers == [3]
    assert llama4.nope_temperature == [pytest.approx(0.1), 8192.0] and llama4.qk_norm == "head_after_rotary"
    assert (llama4.dense_mlp_layers, llama4.n_experts, llama4.n_experts_per_token, llama4.d_expert) == ([0, 2], 8, 2, 24)


def test_llama4_experts_split_and_transposed_are_joined_back_exactly(files):
    """The converter splits HF's ``gate_up_proj`` ``[E, M, 2F]`` into gate and up ``[E, F, M]`` and transposes
    ``down_proj``; the loader's HF state dict gives back HF's halves exactly, and the halves' order matters."""
    path, hf = files["llama4"]
    reader = zgguf.read_gguf(path)
    hf_cfg = zgguf.hf_config_from_gguf(reader.metadata, {t.name for t in reader.tensors})
    got = zgguf.hf_state_dict_from_gguf(reader, hf_cfg)
    sd = hf.state_dict()
    ff = "model.layers.1.feed_forward.experts."
    F_ = hf.config.intermediate_size
    stored = {t.name: tuple(reversed([int(d) for d in t.shape])) for t in reader.tensors}
    assert stored["blk.1.ffn_gate_exps.weight"] == (8, F_, 80) != tuple(sd[ff + "gate_up_proj"].shape)
    assert torch.equal(got[ff + "gate_proj"], sd[ff + "gate_up_proj"][..., :F_])
    assert torch.equal(got[ff + "up_proj"], sd[ff + "gate_up_proj"][..., F_:])
    assert torch.equal(got[ff + "down_proj"], sd[ff + "down_proj"])
    swapped = hf_model("llama4")
    with torch.no_grad():
        for layer in swapped.model.layers:
            experts = getattr(layer.feed_forward, "experts", None)
            if experts is not None:
                experts.gate_up_proj.copy_(experts.gate_up_proj.roll(F_, dims=-1))  # up first, then gate
    assert (_logits(swapped) - _logits(hf)).abs().max().item() > 1e-3


def test_the_scalars_and_patterns_the_files_carry_change_the_logits():
    """Each value the loader takes from a file changes the logits when it differs, so matching the HF model
    shows it was read: Cohere 2's ``logit_scale``; EXAONE 4's per-layer pattern; GLM-4's rotary share; Hunyuan's
    NTK alpha, which the converter folds into ``rope.freq_base`` (reading ``rope_theta`` alone is wrong)."""
    base = {name: _logits(hf_model(name)) for name in ("cohere2", "exaone4", "glm4", "hunyuan_dense")}
    changed = {
        "cohere2": {"logit_scale": 1.0},
        "exaone4": {"layer_types": ["sliding_attention"] * 3},
        "glm4": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}},
        "hunyuan_dense": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    }
    for name, change in changed.items():
        assert (_logits(hf_model(name, **change)) - base[name]).abs().max().item() > 1e-3, name


def test_hunyuan_file_holds_the_folded_base(files):
    meta = zgguf.read_metadata(files["hunyuan_dense"][0])
    assert meta["hunyuan-dense.rope.freq_base"] == pytest.approx(10000.0 * 1000.0 ** (16 / 14), rel=1e-6)
    assert meta["hunyuan-dense.context_length"] == 256 * 1024  # the converter's fixed context


def test_llama4_moe_interleave_is_read_from_its_key(files, tmp_path):
    """``interleave_moe_layer_step`` says which layers hold experts: a file whose key says every layer is refused
    by the tensor table (layer 0 holds a dense MLP), naming the tensors."""
    path, _ = files["llama4"]
    every = rewrite(path, tmp_path / "every.gguf", arch="llama4", set_={"llama4.interleave_moe_layer_step": (1, U32)})
    with pytest.raises(ValueError, match="feed_forward"):
        _load(every)


def test_llama4_qk_norm_follows_llama_cpps_expert_count_rule():
    """llama.cpp skips the weightless QK-norm for the 128-expert model only (Maverick's ``use_qk_norm: false``)."""
    for experts, norm in ((16, True), (128, False)):
        cfg = zgguf.hf_config_from_gguf(_meta("llama4", expert_count=experts, expert_used_count=1,
                                              expert_feed_forward_length=32, interleave_moe_layer_step=1), set())
        assert cfg["use_qk_norm"] is norm


def _meta(arch: str, **extra) -> dict:
    base = {"general.architecture": arch, f"{arch}.embedding_length": 64, f"{arch}.attention.head_count": 4,
            f"{arch}.block_count": 4, f"{arch}.feed_forward_length": 96, f"{arch}.context_length": 64,
            f"{arch}.vocab_size": 50}
    return {**base, **{f"{arch}.{k.replace('__', '.')}": v for k, v in extra.items()}}


_LLAMA4 = dict(interleave_moe_layer_step=1)


@pytest.mark.parametrize("meta, names, match", [
    (_meta("cohere2"), set(), "metadata has no 'cohere2.attention.sliding_window'"),
    (_meta("cohere2", attention__sliding_window=8, attention__sliding_window_pattern=2), set(),
     "sliding_window_pattern = 2"),
    (_meta("cohere2", attention__sliding_window=8, rope__dimension_count=8), set(), "rope.dimension_count = 8"),
    (_meta("exaone4", attention__sliding_window=8), set(), "without 'exaone4.attention.sliding_window_pattern'"),
    (_meta("exaone4", attention__sliding_window=8, attention__sliding_window_pattern=[True, False]), set(),
     "must be one boolean per layer"),
    (_meta("exaone4", nextn_predict_layers=1), set(), "nextn_predict_layers' = 1 \\(multi-token-prediction"),
    (_meta("glm4", rope__dimension_sections=[8, 12, 12, 0]), set(), "M-RoPE"),
    (_meta("glm4", nextn_predict_layers=1), set(), "nextn_predict_layers"),
    (_meta("glm4", attention__sliding_window=8), set(), "glm4.attention.sliding_window = 8"),
    (_meta("hunyuan-dense", rope__scaling__alpha=1000.0), set(), "XD-RoPE alpha"),
    (_meta("llama4", attention__sliding_window=0, **_LLAMA4), set(), "sliding_window = 0 is not supported"),
    (_meta("llama4", **_LLAMA4), {"rope_freqs.weight"}, "rope_freqs"),
    (_meta("llama4", expert_count=4, expert_used_count=8, expert_feed_forward_length=32, **_LLAMA4), set(),
     "expert_used_count = 8 is more than"),
    (_meta("llama4"), set(), "interleave_moe_layer_step"),
])
def test_settings_these_files_can_carry_that_interp_does_not_reproduce_are_refused_by_name(meta, names, match):
    with pytest.raises(ValueError, match=match):
        hf_cfg = zgguf.hf_config_from_gguf(meta, names)
        family_for(hf_cfg["model_type"]).config(hf_cfg)


def test_cohere2_nonzero_attention_biases_are_read_not_dropped(tmp_path):
    """The converter refuses a Cohere 2 with non-zero biases; a file that carries bias tensors anyway (written
    by another tool) is read as ``attention_bias`` rather than silently losing them."""
    hf = hf_model("cohere2", attention_bias=True)
    path = write_gguf(hf, tmp_path / "biased.gguf", "cohere2")
    names = {t.name for t in zgguf.read_gguf(path).tensors}
    assert "blk.0.attn_q.bias" in names
    assert (_logits(_load(path)) - _logits(hf)).abs().max().item() <= 1e-4


def test_a_foreign_tensor_in_a_newer_file_is_refused_by_name(files, tmp_path):
    for name in ("glm4", "llama4"):
        path, _ = files[name]
        arch = FAMILIES[name][0]
        extra = rewrite(path, tmp_path / f"{name}.gguf", arch=arch,
                        extra_tensors={"blk.0.nextn.eh_proj.weight": np.zeros(4, np.float32)})
        with pytest.raises(ValueError, match=f"'blk.0.nextn.eh_proj.weight' has no place in a '{arch}' decoder"):
            _load(extra)


@pytest.mark.parametrize("name", ["exaone4", "glm4", "hunyuan_dense", "llama4", "cohere2", "granite"])
def test_keep_quantized_keeps_the_blocks_or_refuses_a_scaled_weight_by_name(tmp_path, name):
    """Q8_0 weights kept in blocks give the HF model's logits; a converter that folds a scalar into a weight
    (Cohere's ``logit_scale``, Granite's multipliers) is refused naming the weight, rather than failing later on
    a shape."""
    hf = hf_model(name)
    path = write_gguf(hf, tmp_path / f"{name}.gguf", FAMILIES[name][0], types="q8_0")
    if name in ("cohere2", "granite"):
        with pytest.raises(ValueError, match=r"computes '.*' from the file's weight matrices with more than a "
                                             r"reordering of rows \(it scales them\)"):
            zgguf.load_gguf(path, tokenizer=False, keep_quantized=True)
        return
    model = zgguf.load_gguf(path, tokenizer=False, keep_quantized=True)
    assert (_logits(model) - _logits(hf)).abs().max().item() <= 1e-4
