"""load_gguf(keep_quantized=True): weights stay in their blocks and the model computes what the same file
dequantised to float32 computes (tiny GGUF files written as llama.cpp writes them, tests/zoo/gguf_writer.py)."""

import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from gguf_writer import FAMILIES, hf_model, write_gguf  # noqa: E402

import interp  # noqa: E402
from interp.pruning import remove_heads  # noqa: E402
from interp.quantized import QuantizedEmbedding, QuantizedLinear, dequantize_model, quantized_weights  # noqa: E402
from interp.zoo.checkpoint import save_checkpoint  # noqa: E402
from interp.zoo.gguf import GGUFError, load_gguf  # noqa: E402

# Widths that are whole blocks of 32 (the legacy types) or 256 (the K-quants).
SMALL = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
WIDE = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
TYPES = {"q8_0": SMALL, "q4_0": SMALL, "q4_1": SMALL, "q5_0": SMALL, "q5_1": SMALL, "q4_k": WIDE, "q5_k": WIDE,
         "q6_k": WIDE}
TOKENS = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(0))


def _write(tmp_path, name, kind, **overrides):
    arch = FAMILIES[name][0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shape = {} if name != "llama" else TYPES.get(kind, SMALL) if isinstance(kind, str) else SMALL
        hf = hf_model(name, **{**shape, **overrides})
    return write_gguf(hf, tmp_path / f"{name}-{kind}.gguf", arch, types=kind), hf


@pytest.mark.parametrize("kind", list(TYPES))
def test_quantized_forward_equals_the_dequantized_model(tmp_path, kind):
    path, _ = _write(tmp_path, "llama", kind)
    q, f = load_gguf(path, keep_quantized=True), load_gguf(path)
    kept = quantized_weights(q)
    # 2 layers x (W_qkv, W_O, W_in, W_gate, W_out) + W_E + W_U, each in the file's type
    assert len(kept) == 12 and {k for _, w in kept for k in w.kinds} == {kind.upper()}
    assert isinstance(q.embed, QuantizedEmbedding) and isinstance(q.blocks[0].attn.W_qkv, QuantizedLinear)
    with torch.no_grad():
        lq, lf = q(TOKENS), f(TOKENS)
    assert (lq - lf).abs().max() <= 1e-5
    assert torch.equal(q.W_Q, f.W_Q) and torch.equal(q.W_U, f.W_U)  # the weight views dequantise on read


def test_fused_weights_keep_each_part_in_its_own_type(tmp_path):
    # Q, K, V (and gate / up) stored in different types, F16 among them: W_qkv keeps three parts.
    path, hf = _write(tmp_path, "llama", ("q8_0", "q4_1", "f16"))
    q, f = load_gguf(path, keep_quantized=True), load_gguf(path)
    assert sorted(q.blocks[0].attn.W_qkv.q.kinds) == ["F16", "Q4_1", "Q8_0"]
    with torch.no_grad():
        assert torch.equal(q(TOKENS), f(TOKENS))
        want = hf(TOKENS).logits  # transformers on the values the file holds: an independent reference
    torch.testing.assert_close(q(TOKENS).detach(), want, rtol=1e-4, atol=1e-4)


# Families whose converters fuse or split differently (Phi-3's fused QKV and gate_up, Falcon's per-group QKV
# order, Gemma 2's norms stored plus one) with widths of whole blocks.
FAMILY_SHAPES = {"qwen2": SMALL, "gemma2": dict(SMALL, head_dim=16, query_pre_attn_scalar=16), "phi3": SMALL,
                 "falcon_new_arch": dict(hidden_size=64, num_attention_heads=4, num_kv_heads=2)}


@pytest.mark.parametrize("name", list(FAMILY_SHAPES))
def test_other_families_through_the_same_converter(tmp_path, name):
    path, _ = _write(tmp_path, name, ("q4_0", "q8_0"), **FAMILY_SHAPES[name])
    q, f = load_gguf(path, keep_quantized=True), load_gguf(path)
    assert len(quantized_weights(q)) >= 9  # 2 x (QKV, O, MLP in, out) + the embedding, at least
    with torch.no_grad():
        assert (q(TOKENS) - f(TOKENS)).abs().max() <= 1e-5


def test_tied_embeddings_share_one_set_of_blocks(tmp_path):
    path, _ = _write(tmp_path, "llama", "q4_1", tie_word_embeddings=True)
    q, f = load_gguf(path, keep_quantized=True), load_gguf(path)
    assert q.unembed.q is q.embed.q
    assert len(quantized_weights(q)) == 11  # W_E counted once
    with torch.no_grad():
        assert torch.equal(q(TOKENS), f(TOKENS))
    assert "quantized=11 weights in Q4_1 blocks" in repr(q)


def test_run_with_cache_and_hooks_see_what_the_float_model_sees(tmp_path):
    path, _ = _write(tmp_path, "llama", "q4_0")
    q, f = load_gguf(path, keep_quantized=True), load_gguf(path)
    _, tq = q.run_with_cache(TOKENS)
    _, tf = f.run_with_cache(TOKENS)
    for layer in range(2):
        assert torch.equal(tq.pattern(layer), tf.pattern(layer))

    def ablate(x, hook):
        x[:, :, 1] = 0  # head 1's z
        return x

    hooks = [("blocks.0.attn.hook_z", ablate)]
    with torch.no_grad():
        assert torch.equal(q.run_with_hooks(TOKENS, fwd_hooks=hooks), f.run_with_hooks(TOKENS, fwd_hooks=hooks))


def test_the_model_holds_the_files_bytes_not_floats(tmp_path):
    path, _ = _write(tmp_path, "llama", "q4_0")
    q = load_gguf(path, keep_quantized=True)
    stored = sum(w.nbytes for _, w in quantized_weights(q))
    floats = sum(w.rows * w.cols * 4 for _, w in quantized_weights(q))
    assert stored * 7 < floats  # Q4_0: 18 bytes per 32 values against 128
    assert stored < path.stat().st_size


def test_interp_load_passes_keep_quantized_and_dtype(tmp_path):
    path, _ = _write(tmp_path, "llama", "q8_0")
    q = interp.load(str(path), keep_quantized=True, dtype=torch.bfloat16)
    assert quantized_weights(q) and q.blocks[0].attn.W_qkv.weight.dtype == torch.bfloat16
    assert q(TOKENS).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="keep_quantized=True applies to .gguf files; 'random-tiny'"):
        interp.load("random-tiny", keep_quantized=True)


def test_what_cannot_stay_quantized_is_refused_by_name(tmp_path):
    path, _ = _write(tmp_path, "llama", "q2_k", **WIDE)
    with pytest.raises(GGUFError, match=r"'token_embd.weight' is Q2_K; keep_quantized keeps .*Q4_0"):
        load_gguf(path, keep_quantized=True)
    path, _ = _write(tmp_path, "llama", "q8_0")
    q = load_gguf(path, keep_quantized=True)
    with pytest.raises(ValueError, match=r"remove_heads needs float weights, but 12 weight\(s\)"):
        remove_heads(q, {0: [1]})
    with pytest.raises(ValueError, match="cannot be assigned"):
        q.blocks[0].mlp.W_in.weight = torch.nn.Parameter(torch.zeros(96, 64))
    f = load_gguf(path)
    dequantize_model(q)  # the explicit way to float weights
    with torch.no_grad():
        assert torch.equal(remove_heads(q, {0: [1]})(TOKENS), remove_heads(f, {0: [1]})(TOKENS))


def test_save_checkpoint_refuses_quantized_weights_and_saves_after_dequantize(tmp_path):
    """The checkpoint format holds float tensors: blocks kept as bytes are refused by name, nothing is written,
    and the dequantised model round-trips exactly."""
    path, _ = _write(tmp_path, "llama", "q8_0")
    q = load_gguf(path, keep_quantized=True)
    out = tmp_path / "q.safetensors"
    with pytest.raises(ValueError, match=r"save_checkpoint needs float weights, but 12 weight\(s\).*dequantize_model"):
        save_checkpoint(q, out)
    assert not out.exists()
    f = load_gguf(path)
    back = interp.load(str(save_checkpoint(dequantize_model(q), out)))
    with torch.no_grad():
        assert torch.equal(back(TOKENS), f(TOKENS))


def test_classify_heads_gives_the_float_models_table(tmp_path):
    from interp.analysis import classify_heads

    path, _ = _write(tmp_path, "llama", "q4_1", tie_word_embeddings=True)
    q, f = load_gguf(path, keep_quantized=True), load_gguf(path)
    kw = dict(tokens=TOKENS, n_seqs=4, half_len=8, progress=False)
    rq, rf = classify_heads(q, **kw), classify_heads(f, **kw)
    assert rq.df.equals(rf.df)
    for name, table in rf.details.items():  # every score, copying (the unembedding's rows) included
        assert rq.details[name].equals(table), name
    assert "induction" in rf.details


def test_copying_scores_the_same_in_layer_groups(tmp_path, monkeypatch):
    # A big model's copying score holds W_O for a group of layers at a time, not all of them at once.
    from interp.analysis import classify_heads
    from interp.analysis.induction import CopyingReducer

    path, _ = _write(tmp_path, "llama", "q8_0")
    q = load_gguf(path, keep_quantized=True)
    kw = dict(tokens=TOKENS, n_seqs=4, half_len=8, progress=False)
    whole = classify_heads(q, **kw)
    monkeypatch.setattr(CopyingReducer, "W_O_GROUP_BYTES", 64 * 64 * 4)  # one layer per group
    assert CopyingReducer(q)._layer_groups([0, 1]) == [[0], [1]]
    grouped = classify_heads(q, **kw)
    assert "copying" in whole.details["induction"].columns
    # the same rows compared; only float32 sums of per-row fractions may round differently
    pd.testing.assert_frame_equal(grouped.details["induction"], whole.details["induction"], rtol=0, atol=1e-6)
    assert grouped.df.equals(whole.df)


def test_a_quantized_model_splits_over_devices(tmp_path):
    from interp.placement import _held_sizes, place

    path, _ = _write(tmp_path, "llama", "q4_1", tie_word_embeddings=True)
    whole = load_gguf(path, keep_quantized=True)
    split = interp.load(str(path), keep_quantized=True, devices=["cpu", "cpu"])
    with torch.no_grad():
        assert torch.equal(split(TOKENS), whole(TOKENS))
    emb, blocks, head = _held_sizes(whole)  # what the planner sizes: the blocks as held, not float32
    held = sum(w.nbytes for _, w in quantized_weights(whole))
    assert emb + sum(blocks) + head == held + sum(t.numel() * t.element_size()
                                                   for t in (*whole.parameters(), *whole.buffers())
                                                   if t.dtype not in (torch.uint8, torch.bool))
    planned = place(whole, "auto", capacities={"cpu": 4 * (emb + sum(blocks) + head)})
    with torch.no_grad():
        assert torch.equal(planned(TOKENS), split(TOKENS))
    assert planned.unembed.q is planned.embed.q


def test_generate_and_decoding_match_the_float_model(tmp_path):
    path, _ = _write(tmp_path, "llama", "q4_0")
    q, f = load_gguf(path, keep_quantized=True), load_gguf(path)
    prompt = TOKENS[:1, :5]
    want = f.generate(prompt, 6)
    assert torch.equal(q.generate(prompt, 6), want)
    with q.decoding(1):  # the hook-free decode path lays float weights out; quantised layers stay as they are
        assert torch.equal(q.generate(prompt, 6), want)
