"""Training checkpoints from the hub: ``load("hf:ID", revision=...)`` (or ``"hf:ID@REV"``) reaches the download
with that revision, names the model ``ID@REV`` and records the revision in traces, saved and loaded.

The hub is not reachable here: ``huggingface_hub.snapshot_download`` is replaced by a stand-in that records its
arguments and returns a local folder holding a tiny random GPT-2.
"""

import pytest
import torch

import interp
from interp.trace import Trace
from interp.zoo import split_revision

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50,
                                                                 n_positions=16))
    with torch.no_grad():
        for p in model.parameters():  # every parameter re-drawn: the default init leaves biases 0 and norms 1
            p.copy_(torch.randn_like(p) * 0.2)
    path = tmp_path_factory.mktemp("hub") / "snapshot"
    model.save_pretrained(path)
    return path


@pytest.fixture
def hub(folder, monkeypatch):
    calls = []

    def snapshot_download(repo_id, revision=None, **kwargs):
        calls.append({"repo_id": repo_id, "revision": revision})
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


@pytest.mark.parametrize("name, kwargs", [("hf:EleutherAI/pythia-160m", {"revision": "step3000"}),
                                          ("hf:EleutherAI/pythia-160m@step3000", {})])
def test_the_revision_reaches_the_download_and_is_recorded(hub, name, kwargs, tmp_path):
    model = interp.load(name, **kwargs)
    assert hub == [{"repo_id": "EleutherAI/pythia-160m", "revision": "step3000"}]
    assert model.name == "EleutherAI/pythia-160m@step3000" and model.revision == "step3000"
    _, trace = model.run_with_cache(torch.tensor([[1, 2, 3]]), names_filter="*hook_pattern")
    assert trace.meta["revision"] == "step3000" and trace.meta["model"] == "EleutherAI/pythia-160m@step3000"
    again = Trace.load(trace.save(tmp_path / "run.safetensors"))
    assert again.meta["revision"] == "step3000"


def test_without_a_revision_nothing_is_recorded(hub):
    model = interp.load("hf:EleutherAI/pythia-160m")
    assert hub == [{"repo_id": "EleutherAI/pythia-160m", "revision": None}]
    assert model.name == "EleutherAI/pythia-160m" and model.revision is None
    _, trace = model.run_with_cache(torch.tensor([[1, 2]]), names_filter=[])
    assert "revision" not in trace.meta


def test_the_revision_does_not_change_the_weights_read(hub, folder):
    """The stand-in serves one folder, so both loads must give the folder's model exactly."""
    a = interp.load("hf:EleutherAI/pythia-160m", revision="step1")
    b = interp.load(f"hf:{folder}")
    tokens = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(a(tokens), b(tokens))


def test_bad_revisions_are_refused_by_name(hub, folder):
    with pytest.raises(ValueError, match=r"revision='step1' selects a version of a hub model.*'induction-2l'"):
        interp.load("induction-2l", revision="step1")
    with pytest.raises(ValueError, match="a local folder has one version"):
        interp.load(f"hf:{folder}", revision="step1")
    with pytest.raises(ValueError, match="name two different revisions"):
        interp.load("hf:org/model@step1", revision="step2")
    with pytest.raises(ValueError, match="must be a branch, tag or commit name"):
        interp.load("hf:org/model@")
    assert hub == []  # refused before any download


def test_split_revision():
    assert split_revision("org/m@main") == ("org/m", "main")
    assert split_revision("org/m") == ("org/m", None)
    assert split_revision("/abs/folder@x") == ("/abs/folder@x", None)  # a local path keeps its name
