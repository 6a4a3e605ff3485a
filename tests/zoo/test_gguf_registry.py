"""GGUF dispatch through the family registry, and the families that read GGUF through it.

* ``general.architecture`` is one lookup in :data:`interp.families.BY_GGUF_ARCH`; an architecture no family reads
  is refused by name with the list of those read.
* Every architecture a family declares is one llama.cpp knows, and every tensor stem its table names is in
  llama.cpp's own tensor list for that architecture (``gguf.MODEL_TENSORS``): an independent check of the names.
* The families added to the GGUF path (GPT-2, GPT-NeoX, Phi-2, OLMo, OLMo 2, StableLM, Starcoder 2, Granite,
  Command-R, Arcee, Seed-OSS, BLOOM, SmolLM3, ERNIE 4.5, MPT):
  a float32 file written from a random transformers model as llama.cpp's converter writes it (GPT-2's transposed
  ``Conv1D`` weights, GPT-NeoX's QKV regrouped to ``[q | k | v]``, OLMo's and Granite's Q/K permutation, Granite's
  four scalars; tests/zoo/gguf_writer.py) loads with ``interp.load`` within 1e-4 of transformers' logits.
"""

from __future__ import annotations

import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from gguf_writer import FAMILIES, SEQ, V, hf_model, write_gguf  # noqa: E402

import interp  # noqa: E402
from interp.families import BY_GGUF_ARCH, family_for  # noqa: E402
from interp.families import FAMILIES as FAMILY_RECORDS  # noqa: E402
from interp.zoo import gguf as zgguf  # noqa: E402

#: The families whose GGUF files interp reads through the registry since this change (writer name -> family).
NEW = {"gpt2": "gpt2", "gptneox": "gpt_neox", "gptneox_sequential": "gpt_neox", "phi2": "phi", "olmo": "olmo",
       "olmo2": "olmo2", "stablelm": "stablelm", "stablelm_parallel": "stablelm", "starcoder2": "starcoder2",
       "granite": "granite", "command_r": "cohere", "arcee": "arcee", "seed_oss": "llama",
       "bloom": "bloom", "smollm3": "smollm3", "ernie4_5": "ernie4_5",
       "mpt": "mpt"}
_ARCH_ENUM = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}


def _ids() -> torch.Tensor:
    torch.manual_seed(3)
    return torch.randint(1, V, (2, SEQ))


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_family_float32_gguf_matches_transformers(tmp_path, name):
    arch = FAMILIES[name][0]
    hf = hf_model(name)
    path = write_gguf(hf, tmp_path / f"{name}.gguf", arch, types="f32")
    assert BY_GGUF_ARCH[arch].name == NEW[name]
    model = interp.load(str(path))
    with torch.no_grad():
        diff = (model(_ids()) - hf(_ids()).logits).abs().max().item()
    assert diff <= 1e-4, f"{name}: max |logit diff| {diff:.2e}"


@pytest.mark.parametrize("name, stem, hf_key, changed", [
    ("gpt2", "blk.0.attn_qkv.weight", "transformer.h.0.attn.c_attn.weight", True),  # transposed
    ("gptneox", "blk.1.attn_qkv.weight", "gpt_neox.layers.1.attention.query_key_value.weight", True),  # regrouped
    ("gptneox", "blk.1.attn_qkv.bias", "gpt_neox.layers.1.attention.query_key_value.bias", True),
    ("bloom", "blk.0.attn_qkv.weight", "transformer.h.0.self_attention.query_key_value.weight", True),  # regrouped
    ("olmo", "blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", True),  # permuted
    ("olmo", "blk.0.attn_q.bias", "model.layers.0.self_attn.q_proj.bias", False),  # OLMo's converter leaves it
    ("granite", "blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", True),  # permuted
    ("granite", "blk.1.attn_k.bias", "model.layers.1.self_attn.k_proj.bias", True),  # Llama's converter permutes it
])
def test_the_converters_changes_are_undone_and_bite(tmp_path, name, stem, hf_key, changed):
    """The stored tensor differs from the HF one where llama.cpp changed it (so reading it as stored would be
    wrong), and the loader's HF state dict holds the HF tensor exactly."""
    hf = hf_model(name)
    path = write_gguf(hf, tmp_path / f"{name}.gguf", FAMILIES[name][0], types="f32")
    reader = zgguf.read_gguf(path)
    hf_cfg = zgguf.hf_config_from_gguf(reader.metadata, {t.name for t in reader.tensors})
    want = hf.state_dict()[hf_key]
    t = next(t for t in reader.tensors if t.name == stem)
    stored = torch.from_numpy(t.data.copy()).reshape(tuple(reversed([int(d) for d in t.shape])))  # torch order
    assert (stored.shape != want.shape or not torch.equal(stored, want)) == changed
    assert torch.equal(zgguf.hf_state_dict_from_gguf(reader, hf_cfg)[hf_key], want)


def test_granite_scalars_come_from_the_metadata(tmp_path):
    hf = hf_model("granite")
    path = write_gguf(hf, tmp_path / "granite.gguf", "granite", types="f32")
    cfg = zgguf.hf_config_from_gguf(zgguf.read_metadata(path), set())
    assert (cfg["embedding_multiplier"], cfg["attention_multiplier"], cfg["residual_multiplier"],
            cfg["logits_scaling"]) == pytest.approx((3.0, 0.3, 0.6, 2.5))


def _meta(arch: str, **extra) -> dict:
    base = {"general.architecture": arch, f"{arch}.embedding_length": 64, f"{arch}.attention.head_count": 4,
            f"{arch}.block_count": 2, f"{arch}.feed_forward_length": 96, f"{arch}.context_length": 64,
            f"{arch}.vocab_size": 50}
    return {**base, **{f"{arch}.{k}": v for k, v in extra.items()}}


def test_an_unknown_architecture_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"GGUF architecture 'mamba' is not supported; this loader reads \[") as e:
        zgguf.hf_config_from_gguf(_meta("mamba"), set())
    for arch in ("llama", "gpt2", "gptneox", "olmo2", "gpt-oss", "deepseek2"):
        assert repr(arch) in str(e.value)


@pytest.mark.parametrize("meta, names, match", [
    (_meta("olmo", **{"attention.clamp_kqv": 8.0}), set(), r"'olmo.attention.clamp_kqv' = 8.0 \(clip_qkv\)"),
    (_meta("stablelm", **{"rope.dimension_count": 4}), {"blk.0.attn_q_norm.weight"}, "qk_layernorm"),
    (_meta("gpt2", **{"attention.head_count_kv": 1}), set(), "gpt2.attention.head_count_kv = 1: GPT-2 has 4 K/V head\\(s\\) \\(one per query head\\)"),
    (_meta("phi2", **{"expert_count": 4}), set(), "4 experts per layer .* not supported for 'phi2'"),
    (_meta("starcoder2", **{"rope.scaling.type": "yarn"}), set(), "RoPE scaling 'yarn'"),
    (_meta("mpt", **{"attention.clamp_kqv": 6.0}), set(), "clip_qkv=6.0 is not supported"),
    (_meta("mpt", **{"max_alibi_bias": 16.0}), set(), "alibi_bias_max=16.0 is not supported"),
])
def test_settings_the_new_families_do_not_reproduce_are_refused_by_name(meta, names, match):
    """Refused reading the metadata, or by the family's HF config mapping it feeds (as loading does)."""
    with pytest.raises(ValueError, match=match):
        hf_cfg = zgguf.hf_config_from_gguf(meta, names)
        family_for(hf_cfg["model_type"]).config(hf_cfg)


def test_every_declared_architecture_and_tensor_is_llama_cpps():
    """Each family's GGUF architectures are names llama.cpp writes, and each tensor stem a table maps is in
    llama.cpp's tensor list for that architecture (``gguf.MODEL_TENSORS``)."""
    seen = set()
    for fam in FAMILY_RECORDS:
        for arch, spec in fam.gguf.items():
            assert arch in _ARCH_ENUM, f"{fam.name}: {arch!r} is not a llama.cpp architecture"
            known = {gguf.TENSOR_NAMES[t].rsplit(".", 1)[-1] for t in gguf.MODEL_TENSORS[_ARCH_ENUM[arch]]}
            block = spec.block({"new_decoder_architecture": True, "num_ln_in_parallel_attn": 2}) \
                if callable(spec.block) else spec.block
            stems = set(spec.global_names) | set(block)
            assert stems <= known, f"{fam.name} / {arch}: {sorted(stems - known)} are not llama.cpp's"
            seen.add(arch)
    assert seen == set(BY_GGUF_ARCH) == set(zgguf.SUPPORTED_ARCHITECTURES)
    assert len(seen) >= 22
