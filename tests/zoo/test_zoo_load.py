"""``interp.load``, the one loader: built-in names (random-tiny), hub names (``hf:`` / ``tl:``) taken strictly as
hub ids or absolute folders, never as folders relative to the working directory."""

import pytest
import torch

import interp
from interp.zoo import BUILTINS, list_models
from interp.zoo.induction import RANDOM_TINY_CONFIG, TokenIdTokenizer

transformers = pytest.importorskip("transformers")


def test_random_tiny_is_a_builtin_with_a_token_id_tokenizer():
    before = torch.random.get_rng_state()
    model = interp.load("random-tiny")
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is left alone
    assert "random-tiny" in BUILTINS and "random-tiny" in list_models()
    assert model.name == "random-tiny" and not model.training and model.cfg == RANDOM_TINY_CONFIG
    assert isinstance(model.tokenizer, TokenIdTokenizer) and model.tokenizer.bos_id == 0
    # Independent reference: the same config initialised from seed 0 by hand.
    torch.manual_seed(0)
    ref = interp.Transformer(RANDOM_TINY_CONFIG)
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(p, q), name
    assert torch.equal(interp.load("random-tiny").W_E, model.W_E)  # deterministic


def _gpt2_folder(path):
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(path)
    return hf


@pytest.mark.parametrize("prefix", ["hf:", "tl:"])
def test_a_hub_name_with_an_absolute_folder_converts_it(tmp_path, prefix):
    if prefix == "tl:":
        pytest.importorskip("transformer_lens")
    hf = _gpt2_folder(tmp_path / "gpt2-tiny")
    model = interp.load(f"{prefix}{tmp_path / 'gpt2-tiny'}")
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-4)
    assert model.name == str(tmp_path / "gpt2-tiny")
    with pytest.raises(FileNotFoundError, match="no Hugging Face model folder"):
        interp.load(f"{prefix}{tmp_path / 'missing'}")


@pytest.mark.parametrize("prefix", ["hf:", "tl:"])
def test_a_relative_hub_name_is_a_hub_id_never_a_local_folder(tmp_path, monkeypatch, prefix):
    # A valid model folder at ./org/model: a hub name must not reach it through the working directory.
    _gpt2_folder(tmp_path / "org" / "model")
    monkeypatch.chdir(tmp_path)
    asked = []

    def offline_hub(repo_id, **kw):
        asked.append(repo_id)
        raise OSError(f"{repo_id} is not on the hub (offline)")

    monkeypatch.setattr("huggingface_hub.snapshot_download", offline_hub)
    if prefix == "tl:":
        pytest.importorskip("transformer_lens")
    for ref in ("org/model", "org/missing"):
        with pytest.raises(OSError, match="not on the hub"):
            interp.load(prefix + ref)
    assert asked == ["org/model", "org/missing"]
    for bad in ("../org/model", "./org/model", "org/model/..", "a/b/c"):
        with pytest.raises(ValueError, match="not a hub repository id"):
            interp.load(prefix + bad)

