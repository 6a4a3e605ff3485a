"""Checkpoints from untrusted sources: declared sizes are checked before anything is allocated, bad headers
name the file, reduced-precision weights stay as stored, and a missing path says so."""

import json

import pytest
import torch
from helpers import tiny_model
from safetensors import safe_open
from safetensors.torch import save_file

import interp
from interp.zoo import checkpoint, load, load_checkpoint, save_checkpoint

CFG = dict(n_layers=2, d_model=16, n_heads=4, d_vocab=30, n_ctx=16, attn_only=True)


@pytest.fixture
def tiny(tmp_path):
    model = tiny_model(**CFG)
    return model, save_checkpoint(model, tmp_path / "tiny.safetensors")


def _rewrite(path, out, **header_changes):
    """Copy a checkpoint with some header entries replaced (None deletes one)."""
    with safe_open(str(path), framework="pt") as f:
        header = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for k, v in header_changes.items():
        if v is None:
            header.pop(k, None)
        else:
            header[k] = v
    save_file(tensors, str(out), metadata=header)
    return out


@pytest.fixture
def no_real_allocation(monkeypatch):
    """Fail at once if load_checkpoint builds a model with real (non-meta) parameters."""
    real = checkpoint.build

    def guarded(cfg, *, device=None, meta_weights=False, **kw):
        if torch.device(device or "cpu").type != "meta" and not meta_weights:
            raise AssertionError(f"a real model was built from an unchecked header (d_vocab={cfg.d_vocab}, "
                                 f"n_layers={cfg.n_layers})")
        return real(cfg, device=device, meta_weights=meta_weights, **kw)

    monkeypatch.setattr(checkpoint, "build", guarded)


@pytest.mark.parametrize("change", [{"d_vocab": 10**9}, {"n_layers": 10**6}, {"d_model": 4096}])
def test_declared_sizes_are_checked_against_the_file_before_allocating(tiny, tmp_path, change,
                                                                       no_real_allocation):
    _, path = tiny
    cfg = {**interp.ModelConfig(**CFG).to_dict(), **change}
    bomb = _rewrite(path, tmp_path / "bomb.safetensors", config=json.dumps(cfg))
    with pytest.raises(ValueError, match=r"bomb\.safetensors.*(does not fit|n_layers=1000000)"):
        load_checkpoint(bomb)


def test_a_checkpoint_without_a_config_names_the_file(tiny, tmp_path):
    bad = _rewrite(tiny[1], tmp_path / "noconf.safetensors", config=None)
    with pytest.raises(ValueError, match=r"noconf\.safetensors.*without a 'config'"):
        load_checkpoint(bad)


def test_a_checkpoint_with_invalid_config_json_names_the_file(tiny, tmp_path):
    bad = _rewrite(tiny[1], tmp_path / "badjson.safetensors", config="{n_layers: 2")
    with pytest.raises(ValueError, match=r"badjson\.safetensors.*not valid JSON"):
        load_checkpoint(bad)


def test_a_checkpoint_whose_config_is_a_json_list_says_so(tiny, tmp_path):
    bad = _rewrite(tiny[1], tmp_path / "list.safetensors", config="[1, 2]")
    with pytest.raises(ValueError, match=r"list\.safetensors.*must be a JSON object.*list"):
        load_checkpoint(bad)


def test_a_garbage_tokenizer_header_is_a_value_error_naming_the_file(tiny, tmp_path):
    bad = _rewrite(tiny[1], tmp_path / "tok.safetensors", tokenizer="{this is not a tokenizer")
    with pytest.raises(ValueError, match=r"tok\.safetensors.*tokenizer"):
        load_checkpoint(bad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_reduced_precision_checkpoint_loads_as_stored(tiny, tmp_path, dtype):
    model, _ = tiny
    half = model.to(dtype)
    path = save_checkpoint(half, tmp_path / "half.safetensors")
    back = load_checkpoint(path)
    assert {p.dtype for p in back.parameters()} == {dtype}
    for (k, a), b in zip(half.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), k
    assert load_checkpoint(path, dtype=torch.float32).W_E.dtype == torch.float32


def test_a_missing_checkpoint_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        load(str(tmp_path / "missing.safetensors"))
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        load(str(tmp_path / "missing-folder"))
    with pytest.raises(ValueError, match="unknown model 'no-such-model'"):
        load("no-such-model")


def test_an_hf_folder_with_unsafe_pickle_weights_is_a_value_error(tmp_path):
    transformers = pytest.importorskip("transformers")
    import datetime

    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20,
                                                              n_positions=8, bos_token_id=0, eos_token_id=0))
    hf.config.save_pretrained(tmp_path)
    # A pickle that torch's weights-only loader refuses (it would run arbitrary code in general).
    torch.save({"state": hf.state_dict(), "when": datetime.datetime(2020, 1, 1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pickle file that cannot be loaded safely.*Weights only load failed"):
        load(str(tmp_path))


def test_an_int32_weight_in_a_checkpoint_is_refused_with_both_dtypes(tiny, tmp_path, no_real_allocation):
    _, path = tiny
    with safe_open(str(path), framework="pt") as f:
        header = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    header.pop("tensor_record")
    tensors["blocks.1.attn.W_O.weight"] = tensors["blocks.1.attn.W_O.weight"].to(torch.int32)
    save_file(tensors, str(tmp_path / "int.safetensors"), metadata=header)
    with pytest.raises(ValueError, match=r"int\.safetensors: non-floating weights: blocks\.1\.attn\.W_O\.weight is "
                                         r"stored as I32 \[16, 16\], the model expects torch\.float32"):
        load_checkpoint(tmp_path / "int.safetensors")


def test_a_checkpoint_loads_into_its_parameters_without_a_second_copy(tiny):
    """The tensors read are the parameters (assigned on meta parameters, not copied into initialised ones),
    and the model computes what the saved one did."""
    model, path = tiny
    again = load_checkpoint(path)
    tokens = torch.tensor([[1, 5, 7, 2]])
    with torch.no_grad():
        assert torch.equal(again(tokens), model(tokens))
    assert not any(p.is_meta for p in again.parameters())
    assert all(p.data_ptr() % 64 == 0 for p in again.parameters())  # aligned as torch allocates
