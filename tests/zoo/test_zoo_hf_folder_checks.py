"""Hugging Face folders are checked against their config before anything is allocated (issue 38, item 2 / 3).

transformers' ``from_pretrained`` fills a missing tensor with a random initialisation and only warns; interp
reads the folder itself and refuses, by name, every missing, unexpected, mis-shaped or non-floating tensor, a
layer count that disagrees with the weights, a weight file that resolves outside the folder, and a weight
holding NaN / infinite values. A config far bigger than its weights (10^6 layers, 10^6 experts) is refused
without building anything of that size.
"""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import interp
from interp.zoo.compat import _seed_init, hf_test_model
from interp.zoo.hf import from_hf

transformers = pytest.importorskip("transformers")

V = 61


def _save(hf, folder, **kw):
    hf.save_pretrained(folder, **kw)
    return folder


def _gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=16, bos_token_id=0,
                                  eos_token_id=0)
    return _seed_init(transformers.GPT2LMHeadModel(cfg))


def _mixtral(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.MixtralConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     max_position_embeddings=64, intermediate_size=48, num_key_value_heads=2,
                                     num_local_experts=4, num_experts_per_tok=2)
    return _seed_init(transformers.MixtralForCausalLM(cfg))


# One dense family per layout the issue saw silently wrong (Llama, Mistral, Gemma 2, GPT-2), plus Mixtral.
MAKERS = {"llama3": lambda: hf_test_model("llama3"), "mistral": lambda: hf_test_model("mistral"),
          "gemma2": lambda: hf_test_model("gemma2"), "gpt2": _gpt2, "mixtral": _mixtral}


def _edit_weights(folder, edit):
    file = folder / "model.safetensors"
    sd = load_file(str(file))
    edit(sd)
    save_file(sd, str(file), metadata={"format": "pt"})


def _edit_config(folder, **changes):
    file = folder / "config.json"
    cfg = json.loads(file.read_text())
    cfg.update(changes)
    file.write_text(json.dumps(cfg))


def _layers_key(folder):
    return "n_layer" if "n_layer" in json.loads((folder / "config.json").read_text()) else "num_hidden_layers"


def _ids():
    torch.manual_seed(3)
    return torch.randint(1, V - 1, (2, 9))


def _every_family():
    """Every dense test family of interp.zoo.compat, the MoE / MLA ones of test_zoo_hf_moe, GPT-2 and BERT: the
    checks must not refuse any real layout (no tensor of theirs is "unexpected")."""
    from test_zoo_hf_moe import FAMILIES as MOE
    from test_zoo_hf_moe import hf_model as moe_model

    from interp.zoo.compat import FAMILIES

    makers = {name: (lambda name=name: hf_test_model(name)) for name in FAMILIES}
    makers.update({f"moe-{name}": (lambda name=name: moe_model(name)) for name in MOE})
    makers["gpt2"] = _gpt2
    makers["bert"] = lambda: _seed_init(transformers.BertModel(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
        max_position_embeddings=16)))
    return makers


EVERY = _every_family()


@pytest.mark.parametrize("family", sorted(EVERY))
def test_a_folder_converts_exactly_like_its_model(tmp_path, family):
    hf = EVERY[family]()
    folder = _save(hf, tmp_path / family)
    model = interp.load(str(folder))
    ids = _ids()
    with torch.no_grad():
        want = hf(ids)
        want = want.last_hidden_state if family == "bert" else want.logits
        torch.testing.assert_close(model(ids), want, rtol=0, atol=1e-4)


def test_a_sharded_folder_reads_every_shard(tmp_path):
    hf = hf_test_model("llama3")
    folder = _save(hf, tmp_path / "sharded", max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("model-*.safetensors"))) > 2
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(interp.load(str(folder))(ids), hf(ids).logits, rtol=0, atol=1e-4)


def test_a_bf16_folder_stays_bf16_and_equals_the_converted_model(tmp_path):
    hf = hf_test_model("llama3").to(torch.bfloat16)
    folder = _save(hf, tmp_path / "bf16")
    model = interp.load(str(folder))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    reference = from_hf(hf)
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(p, q), name


def test_a_folder_missing_a_tensor_is_refused_by_name(tmp_path):
    for family in ("llama3", "gpt2", "mixtral"):
        folder = _save(MAKERS[family](), tmp_path / family)
        names = list(load_file(str(folder / "model.safetensors")))
        gone = next(n for n in names if n.startswith(("model.layers.1.", "transformer.h.1."))
                    and "experts" not in n and n.endswith("weight"))
        _edit_weights(folder, lambda sd, gone=gone: sd.pop(gone))
        with pytest.raises(ValueError, match="no tensor") as err:
            interp.load(str(folder))
        # Named by its layer and weight (Mixtral's converter names the router by its transformers 5 name).
        layer, leaf = gone.split(".1.", 1)[0][-6:] + ".1.", ".".join(gone.split(".")[-2:])
        assert layer in str(err.value) and leaf in str(err.value) and str(folder) in str(err.value), str(err.value)
    folder = tmp_path / "mixtral"  # one expert of four gone
    _edit_weights(folder, lambda sd: sd.pop("model.layers.0.block_sparse_moe.experts.2.w1.weight"))
    with pytest.raises(ValueError, match=r"n_experts=4, but layer 0 stores 3 experts"):
        interp.load(str(folder))


def test_a_folder_with_an_unexpected_tensor_is_refused_by_name(tmp_path):
    folder = _save(hf_test_model("llama3"), tmp_path / "extra")
    _edit_weights(folder, lambda sd: sd.update({"model.layers.0.self_attn.extra.weight": torch.ones(3, 4)}))
    with pytest.raises(ValueError, match=r"unexpected tensors.*model\.layers\.0\.self_attn\.extra\.weight \[3, 4\]"):
        interp.load(str(folder))


@pytest.mark.parametrize("family", sorted(MAKERS))
@pytest.mark.parametrize("delta", [1, -1])
def test_a_layer_count_that_disagrees_with_the_weights_is_refused(tmp_path, family, delta):
    folder = _save(MAKERS[family](), tmp_path / family)
    changes = {_layers_key(folder): 2 + delta}
    types = json.loads((folder / "config.json").read_text()).get("layer_types")
    if types:  # a consistent config (transformers itself refuses a layer_types list of another length)
        changes["layer_types"] = (types * 2)[:2 + delta]
    _edit_config(folder, **changes)
    with pytest.raises(ValueError, match=rf"declares {2 + delta} layers .*weights hold layers 0\.\.1 \(2 layer"):
        interp.load(str(folder))


def test_an_int32_weight_is_refused_with_both_dtypes(tmp_path):
    folder = _save(hf_test_model("llama3"), tmp_path / "int32")
    key = "model.layers.0.mlp.up_proj.weight"
    _edit_weights(folder, lambda sd: sd.update({key: sd[key].to(torch.int32)}))
    with pytest.raises(ValueError, match=rf"{key} is stored as torch.int32 .*expects a floating dtype \(torch.float32\)"):
        interp.load(str(folder))


def test_a_weight_of_the_wrong_shape_is_refused_with_both_shapes(tmp_path):
    folder = _save(hf_test_model("llama3"), tmp_path / "shape")
    key = "model.layers.1.mlp.down_proj.weight"
    _edit_weights(folder, lambda sd: sd.update({key: sd[key][:, :-1].contiguous()}))
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.W_out\.weight: .* has \(\d+, \d+\), model expects"):
        interp.load(str(folder))


def test_a_weights_symlink_outside_the_folder_is_refused(tmp_path):
    other = _save(_gpt2(seed=1), tmp_path / "other")
    folder = _save(_gpt2(seed=0), tmp_path / "mine")
    (folder / "model.safetensors").unlink()
    os.symlink(other / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"resolves to .*other/model\.safetensors, outside the model folder"):
        interp.load(str(folder))


def test_a_weights_file_of_another_model_is_refused_by_its_header(tmp_path):
    wide = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=48, n_head=2, vocab_size=V,
                                                                n_positions=16))
    other = _save(wide, tmp_path / "other")
    folder = _save(_gpt2(), tmp_path / "mine")
    os.replace(other / "model.safetensors", folder / "model.safetensors")
    os.symlink(folder / "model.safetensors", folder / "link.safetensors")  # links inside the folder are fine
    with pytest.raises(ValueError, match=r"W_E\.weight: .* has \(61, 48\), model expects \(61, 32\)"):
        interp.load(str(folder))


def test_a_hub_cache_snapshot_may_link_into_its_blobs(tmp_path):
    hf = _gpt2()
    repo = tmp_path / "models--org--tiny"
    snapshot = _save(hf, repo / "snapshots" / "abc123")
    (repo / "blobs").mkdir()
    os.replace(snapshot / "model.safetensors", repo / "blobs" / "sha")
    os.symlink(os.path.join("..", "..", "blobs", "sha"), snapshot / "model.safetensors")
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(interp.load(str(snapshot))(ids), hf(ids).logits, rtol=0, atol=1e-4)


def test_a_nan_weight_is_refused_by_name_and_count_in_a_folder_and_a_model(tmp_path):
    hf = hf_test_model("mistral")
    key = "model.layers.1.self_attn.o_proj.weight"
    with torch.no_grad():
        hf.get_parameter(key)[0, :3] = float("nan")
        hf.get_parameter(key)[1, 0] = float("inf")
    with pytest.raises(ValueError, match=rf"{key}' holds 4 NaN or infinite value"):
        from_hf(hf)
    folder = _save(hf, tmp_path / "nan")
    with pytest.raises(ValueError, match=rf"nan \(model\.safetensors\): tensor '{key}' holds 4 NaN or infinite"):
        interp.load(str(folder))


def test_a_pytorch_bin_folder_is_checked_the_same_way(tmp_path):
    hf = _gpt2()
    folder = tmp_path / "bin"
    hf.config.save_pretrained(folder)  # transformers 5 writes only safetensors: the .bin is written by hand
    sd = {k: v.clone() for k, v in hf.state_dict().items()}
    torch.save(sd, folder / "pytorch_model.bin")
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(interp.load(str(folder))(ids), hf(ids).logits, rtol=0, atol=1e-4)
    sd.pop("transformer.h.1.mlp.c_fc.weight")
    torch.save(sd, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"no tensor 'transformer\.h\.1\.mlp\.c_fc\.weight'"):
        interp.load(str(folder))


def test_a_bad_dtype_for_a_folder_is_refused_before_anything_is_read(tmp_path, monkeypatch):
    folder = _save(_gpt2(), tmp_path / "m")
    import interp.zoo.hf_weights as hf_weights

    def never(*a, **k):
        raise AssertionError("the weights were opened before the dtype was checked")

    monkeypatch.setattr(hf_weights, "open_weights", never)
    for dtype in ("bf16", torch.int32):
        with pytest.raises(TypeError, match=r"dtype must be a floating-point torch\.dtype"):
            interp.load(str(folder), dtype=dtype)
        with pytest.raises(TypeError, match=r"dtype must be a floating-point torch\.dtype"):
            from_hf(folder, dtype=dtype)


def test_unreadable_config_and_tokenizer_files_are_named(tmp_path):
    folder = _save(_gpt2(), tmp_path / "m")
    (folder / "tokenizer.json").write_text('{3: "x"}')
    with pytest.raises(ValueError, match=r"m/tokenizer\.json: cannot be read as a tokenizer: .*key must be a string"):
        interp.load(str(folder))
    (folder / "tokenizer.json").unlink()
    (folder / "config.json").write_text('{"model_type": "gpt2", "n_layer": }')
    with pytest.raises(ValueError, match=r"m/config\.json: not valid JSON: Expecting value: line 1"):
        interp.load(str(folder))


def _status_kb(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def _peak_growth(fn):
    """(what ``fn`` raised, how far the process's peak RSS rose above its RSS before the call, in bytes): the
    kernel's high-water mark is reset first (``/proc/self/clear_refs``), so earlier tests' peaks do not hide it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pytest.skip("this kernel does not let a process reset its peak RSS (/proc/self/clear_refs)")
    before = _status_kb("VmRSS")
    try:
        fn()
        raised = None
    except ValueError as e:
        raised = e
    return raised, (_status_kb("VmHWM") - before) * 1024


@pytest.mark.parametrize("name,make,changes", [
    ("layers_gpt2", _gpt2, {"n_layer": 10**6}),
    ("layers_llama", lambda: hf_test_model("llama3"), {"num_hidden_layers": 10**6}),
    ("experts_mixtral", _mixtral, {"num_local_experts": 10**6}),
])
def test_a_config_far_bigger_than_its_weights_is_refused_without_allocating_it(tmp_path, name, make, changes):
    """10^6 layers (GPT-2, Llama) and a Mixtral declaring 10^6 experts over 4: refused by name, the process
    growing by less than 200 MB (the old loader allocated 24 GB for the experts, and hung on the layers)."""
    folder = _save(make(), tmp_path / name)
    _edit_config(folder, **changes)
    raised, growth = _peak_growth(lambda: interp.load(str(folder)))
    assert raised is not None, f"{name} loaded"
    assert "1000000" in str(raised) and str(folder) in str(raised), str(raised)
    assert growth < 200 * 2**20, (name, growth)
