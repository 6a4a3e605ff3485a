"""GGUF files of every dense architecture the loader reads, against two references: the random HF model the
file was written from (llama.cpp's converter conventions, tests/zoo/gguf_writer.py), and, where transformers
can load that GGUF architecture itself, transformers' own GGUF loading of the same file.

Configs make the features bite: odd head counts, GQA / MQA, sliding windows shorter than the sequence,
Gemma 2's soft-caps, Gemma 3's local / global layers and linear RoPE, Qwen3's QK-norm and head dim, Falcon's
two layouts; weights are stored as F32, F16 and Q8_0 in turn.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gguf_writer import FAMILIES, SEQ, WINDOW, V, hf_model, write_gguf  # noqa: E402

from interp.zoo import gguf as zgguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


U32_ = gguf.GGUFValueType.UINT32


def _ids(n: int = SEQ) -> torch.Tensor:
    torch.manual_seed(3)
    return torch.randint(1, V, (2, n))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (path, HF model), written once per module."""
    root = tmp_path_factory.mktemp("gguf_families")
    out = {}
    for name, (arch, _, _) in FAMILIES.items():
        hf = hf_model(name)
        out[name] = (write_gguf(hf, root / f"{name}.gguf", arch), hf)
    return out


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_gguf_matches_the_hf_model(files, name):
    path, hf = files[name]
    model = zgguf.load_gguf(path, tokenizer=False)
    ids = _ids()
    with torch.no_grad():
        diff = (model(ids) - hf(ids).logits).abs().max().item()
    assert diff <= 1e-4, f"{name}: max |logit diff| {diff:.2e}"


# transformers reads these GGUF architectures itself; "what" names the settings its loader does not take from
# the metadata (it keeps its config class's defaults), so those files are written with the defaults.
TRANSFORMERS_GGUF = {
    "llama": {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},  # ignores rope.scaling
    "qwen2": {},
    "qwen3": {"head_dim": 128},  # ignores attention.key_length (Qwen3Config's head_dim is 128)
    "gemma2": {"head_dim": 256, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0},  # ignores the soft-caps
    "gemma3": {"head_dim": 256, "query_pre_attn_scalar": 256, "final_logit_softcapping": None, "num_hidden_layers": 2,
               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "phi3": {"sliding_window": None},  # ignores attention.sliding_window
    "falcon": {},
}


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_GGUF))
def test_family_gguf_matches_transformers_gguf_loading(tmp_path, name):
    arch = FAMILIES[name][0]
    hf = hf_model(name, **TRANSFORMERS_GGUF[name])
    path = write_gguf(hf, tmp_path / f"{name}.gguf", arch)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    ours = zgguf.load_gguf(path, tokenizer=False)
    ids = _ids()
    with torch.no_grad():
        want = theirs(ids).logits
        diff = (ours(ids) - want).abs().max().item()
        assert diff <= 1e-4, f"{name}: max |logit diff| vs transformers' GGUF loading {diff:.2e}"
        assert (hf(ids).logits - want).abs().max().item() <= 1e-4  # the file is the HF model, for both


def test_features_bite():
    """The window, the soft-caps, the Gemma norm shift and Falcon's regrouping each change the logits, so
    matching the HF model shows the loader reads them."""
    ids = _ids()
    with torch.no_grad():
        g2 = hf_model("gemma2")
        base = g2(ids).logits
        for change in ({"sliding_window": 4 * SEQ}, {"attn_logit_softcapping": None},
                       {"final_logit_softcapping": None}):
            other = hf_model("gemma2", **change)
            assert (other(ids).logits - base).abs().max() > 1e-3, change
    assert WINDOW < SEQ


def test_gemma_norms_are_stored_plus_one(files):
    path, hf = files["gemma2"]
    f = zgguf.read_gguf(path)
    stored = next(t for t in f.tensors if t.name == "blk.0.attn_norm.weight")
    w = hf.model.layers[0].input_layernorm.weight.detach()
    torch.testing.assert_close(torch.from_numpy(stored.data.copy()), w + 1)


def test_dtype_and_device_are_kept(files):
    path, hf = files["qwen3"]
    full = zgguf.load_gguf(path, tokenizer=False)
    half = zgguf.load_gguf(path, tokenizer=False, dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in half.parameters()} == {"cpu"}
    for (n, a), (_, b) in zip(full.named_parameters(), half.named_parameters()):
        torch.testing.assert_close(b.float(), a.to(torch.bfloat16).float(), rtol=0, atol=0, msg=n)


def test_interp_load_passes_dtype(files):
    import interp

    path, _ = files["qwen2"]
    model = interp.load(path, dtype=torch.bfloat16)
    assert model.W_E.dtype == torch.bfloat16 and model.tokenizer is not None
    assert model.tokenizer.to_tokens("ab").shape[-1] == 2


# --- refusals ---------------------------------------------------------------------------------------------
def _meta(arch: str, **extra) -> dict:
    base = {"general.architecture": arch, f"{arch}.embedding_length": 64, f"{arch}.attention.head_count": 4,
            f"{arch}.block_count": 2, f"{arch}.feed_forward_length": 96, f"{arch}.context_length": 64,
            f"{arch}.vocab_size": 50}
    return {**base, **{f"{arch}.{k}": v for k, v in extra.items()}}


@pytest.mark.parametrize("meta, match", [
    (_meta("mamba"), "architecture 'mamba' is not supported"),
    (_meta("qwen2", **{"rope.scaling.type": "yarn"}), "RoPE scaling 'yarn'"),
    (_meta("llama", **{"attention.sliding_window": 4096}), "attention.sliding_window = 4096"),
    (_meta("gemma2", **{"attention.sliding_window": 8, "attention.sliding_window_pattern": 3}),
     "sliding_window_pattern = 3"),
    (_meta("starcoder", **{"attention.head_count_kv": 4}), "head_count_kv = 4"),
    (_meta("falcon", **{"tensor_data_layout": "other"}), "tensor_data_layout = 'other'"),
    (_meta("qwen3", **{"rope.dimension_count": 8}), "rope.dimension_count = 8"),
    (_meta("gemma3", **{"attn_logit_softcapping": -1.0}), None),
    (_meta("qwen2", **{"expert_count": 8}), "8 experts per layer"),  # llama's experts: test_zoo_gguf_moe
])
def test_unsupported_settings_are_refused_by_name(meta, match):
    if match is None:  # Gemma 3 has no attention soft-cap: the key is ignored, as llama.cpp ignores it
        assert zgguf.hf_config_from_gguf(meta, set())["attn_logit_softcapping"] is None
        return
    with pytest.raises(ValueError, match=match):
        zgguf.hf_config_from_gguf(meta, set())


HOSTILE = ("qwen3", "gemma2", "gemma3", "phi3", "starcoder", "falcon_new_arch", "gpt2", "gptneox", "stablelm", "granite")


def test_declared_sizes_are_checked_before_allocating_for_every_architecture(files, tmp_path):
    """The reliability suite's header bombs (block_count 1e6, feed_forward_length 1e9) on each architecture:
    refused by name within 1 GiB of memory, before any weight is dequantised."""
    from test_zoo_gguf_reliability import BOMB_SCRIPT, U32, rewrite

    paths, wants = [], []
    for name in ("gemma3", "starcoder", "falcon_new_arch"):  # rotary + sandwich, learned positions, fused QKV
        arch = FAMILIES[name][0]
        for key, value, want in (("block_count", 10**6, "block_count = 1000000"),
                                 ("feed_forward_length", 10**9, "mlp")):
            paths.append(str(rewrite(files[name][0], tmp_path / f"{name}.{key}.gguf", arch=arch,
                                     set_={f"{arch}.{key}": (value, U32)})))
            wants.append(want)
    res = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, *paths], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    lines = [line for line in res.stdout.splitlines() if line.startswith(("REFUSED", "LOADED"))]
    assert res.returncode == 0 and len(lines) == len(paths), (res.stdout, res.stderr[-2000:])
    for line, path, want in zip(lines, paths, wants):
        assert line.startswith("REFUSED") and path in line and want in line, line


@pytest.mark.parametrize("name", HOSTILE)
def test_foreign_and_misshapen_tensors_are_refused_by_name(files, tmp_path, name):
    from test_zoo_gguf_reliability import rewrite

    arch = FAMILIES[name][0]
    extra = rewrite(files[name][0], tmp_path / "extra.gguf", arch=arch,
                    extra_tensors={"blk.0.attn_bogus.weight": np.zeros(4, np.float32)})
    with pytest.raises(ValueError, match=f"'blk.0.attn_bogus.weight' has no place in a '{arch}' decoder"):
        zgguf.load_gguf(extra, tokenizer=False)
    wrong = rewrite(files[name][0], tmp_path / "wide.gguf", arch=arch, set_={f"{arch}.embedding_length": (
        FAMILIES[name][2].get("hidden_size", FAMILIES[name][2].get("n_embd")) + 8, U32_)})
    with pytest.raises(ValueError, match="token_embd.weight"):
        zgguf.load_gguf(wrong, tokenizer=False)


def test_longrope_and_llama3_factor_tensors_are_refused():
    with pytest.raises(ValueError, match="longrope"):
        zgguf.hf_config_from_gguf(_meta("phi3"), {"rope_factors_long.weight"})
    with pytest.raises(ValueError, match="rope_freqs"):
        zgguf.hf_config_from_gguf(_meta("llama"), {"rope_freqs.weight"})


@pytest.mark.parametrize("name", ["gemma2", "qwen3"])
def test_assigned_weights_generate_as_hf_and_stay_tied(files, name):
    """The loader assigns the dequantised tensors as the parameters (no second copy): tied embeddings stay one
    tensor, and cached greedy decoding equals HF's."""
    path, hf = files[name]
    model = zgguf.load_gguf(path, tokenizer=False)
    if hf.config.tie_word_embeddings:
        assert model.unembed.weight is model.embed.weight
    prompt = _ids(6)[:1]
    want = hf.generate(prompt, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt),
                       eos_token_id=None, pad_token_id=0)
    assert torch.equal(model.generate(prompt, max_new_tokens=12), want)


def test_sentencepiece_space_prefix_follows_the_file():
    """Gemma's files say add_space_prefix = False: no "▁" is prepended (Llama 2's files prepend one)."""
    tokens = ["<unk>", "<s>", "</s>", "▁", "H", "i", "Hi", "▁Hi"]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -0.5, -0.1],
            "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1], "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.add_bos_token": False}
    llama = zgguf.tokenizer_from_gguf(meta)
    gemma = zgguf.tokenizer_from_gguf({**meta, "tokenizer.ggml.add_space_prefix": False})
    assert llama.to_tokens("Hi")[0].tolist() == [tokens.index("▁Hi")]
    assert gemma.to_tokens("Hi")[0].tolist() == [tokens.index("Hi")]
