"""The dashboard reads server files only inside the folder the operator serves, with size limits and no
way to probe which paths exist; uploads live in a private per-session folder removed with the session."""

import gc
import os
import stat

import pytest

pytest.importorskip("streamlit")
from helpers import tiny_model  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import interp  # noqa: E402
from interp.app import DASHBOARD  # noqa: E402

APP = str(DASHBOARD)


def make_app(model="local checkpoint", page=None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["model"] = model
    at.run()
    assert not at.exception, at.exception
    if page:
        at.sidebar.radio(key="page").set_value(page)
        at.run()
        assert not at.exception, at.exception
    return at


@pytest.fixture
def served(tmp_path, monkeypatch):
    folder = tmp_path / "served"
    folder.mkdir()
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(folder))
    return folder


@pytest.fixture(scope="module")
def ckpt_bytes(tmp_path_factory):
    model = tiny_model(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=16)
    model.name = "uploaded-tiny"
    return interp.zoo.save_checkpoint(model, tmp_path_factory.mktemp("c") / "m.safetensors").read_bytes()


def _errors(at):
    return [e.value for e in at.error]


def test_without_a_served_folder_there_is_no_path_box(monkeypatch):
    monkeypatch.delenv("INTERP_DASHBOARD_FILES", raising=False)
    at = make_app()
    assert not [w for w in at.sidebar.text_input if w.key == "ckpt_path"]
    at = make_app(model="Hugging Face name")
    at.sidebar.text_input(key="hf_name").set_value("/etc")
    at.run()
    assert not at.exception and any("not available" in e for e in _errors(at))


def test_paths_outside_the_served_folder_are_refused_like_missing_ones(served, tmp_path):
    (tmp_path / "secret.safetensors").write_bytes(b"x" * 100)  # exists, outside the served folder
    messages = {}
    for typed in ("../../../../etc/hostname", "../secret.safetensors", str(tmp_path / "secret.safetensors"),
                  "missing.safetensors"):
        at = make_app()
        at.sidebar.text_input(key="ckpt_path").set_value(typed)
        at.run()
        assert not at.exception
        (msg,) = _errors(at)
        messages[typed] = msg.replace(repr(typed), "PATH")
    # One message whatever the reason: the box tells nothing about which server paths exist.
    assert len(set(messages.values())) == 1, messages
    assert "not available" in next(iter(messages.values()))


def test_a_fifo_or_device_in_the_served_folder_is_refused_without_reading(served):
    os.mkfifo(served / "pipe.json")
    (served / "zero.json").symlink_to("/dev/zero")
    at = make_app(model="random-tiny", page="Pruning")
    at.radio(key="curve_source").set_value("Load a saved curve")
    at.run()
    for name in ("pipe.json", "zero.json"):
        at.text_input(key="curve_path").set_value(name)
        at.run()  # a FIFO would block here, /dev/zero would read forever
        assert not at.exception and any("not available" in e for e in _errors(at)), name


def test_files_larger_than_the_limit_are_refused(served, monkeypatch, ckpt_bytes):
    (served / "m.safetensors").write_bytes(ckpt_bytes)
    monkeypatch.setenv("INTERP_DASHBOARD_MAX_FILE_MB", str(len(ckpt_bytes) / 2**20 / 2))
    at = make_app(page="Induction")  # a page that needs no text: this model has no tokenizer
    at.sidebar.text_input(key="ckpt_path").set_value("m.safetensors")
    at.run()
    assert not at.exception and any("more than the" in e for e in _errors(at))
    monkeypatch.setenv("INTERP_DASHBOARD_MAX_FILE_MB", "100")
    at.run()
    assert not at.exception and not at.error, _errors(at)
    assert "uploaded-tiny" in at.sidebar.caption[0].value


def test_uploads_go_to_a_private_session_folder_removed_with_the_session(ckpt_bytes, monkeypatch):
    monkeypatch.delenv("INTERP_DASHBOARD_FILES", raising=False)
    at = make_app(page="Induction")
    at.sidebar.file_uploader(key="ckpt_upload").set_value(("m.safetensors", ckpt_bytes, "application/octet-stream"))
    at.run()
    assert not at.exception and not at.error, _errors(at)
    assert "uploaded-tiny" in at.sidebar.caption[0].value
    folder = at.session_state["_upload_dir"].path
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].read_bytes() == ckpt_bytes
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # other users of the machine cannot list or read it
    assert files[0].parent == folder and folder.name.startswith("interp-session-")  # a random name per session
    del at
    gc.collect()
    assert not folder.exists()


def test_hub_name_box_cannot_load_folders_outside_the_served_folder(served, tmp_path, monkeypatch):
    # A real model folder at a path relative to the server's working directory, outside the served folder.
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "work" / "tmp" / "some")
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setattr("huggingface_hub.snapshot_download",
                        lambda repo_id, **kw: (_ for _ in ()).throw(OSError("no such repository on the hub")))
    messages = {}
    for box, model in (("hf_name", "Hugging Face name"), ("tl_name", "TransformerLens name")):
        for typed in ("tmp/some", "tmp/missing", "./tmp/some", "./tmp/missing", str(tmp_path / "work" / "tmp" / "some")):
            at = make_app(model=model)
            at.sidebar.text_input(key=box).set_value(typed)
            at.run()
            assert not at.exception, at.exception
            assert not at.sidebar.caption or "some" not in at.sidebar.caption[0].value  # no model was loaded
            (msg,) = _errors(at)
            messages[box, typed] = msg.replace(repr(typed), "NAME").replace(f"tl:{typed}", "NAME").replace(
                f"hf:{typed}", "NAME")
    # Existing and missing folders give one message: the box tells nothing about which server paths exist.
    for box in ("hf_name", "tl_name"):
        assert messages[box, "tmp/some"] == messages[box, "tmp/missing"], messages
        assert messages[box, "./tmp/some"] == messages[box, "./tmp/missing"] == messages[box, str(
            tmp_path / "work" / "tmp" / "some")], messages
        assert "not available" in messages[box, "./tmp/some"]
