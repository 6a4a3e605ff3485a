"""The induction patching recipe of docs/howto/patching.md (``model.tokenizer.bos_id``, ``repeated_sequences``,
``corrupt_repeats``, ``in_context_metric``, ``activation_patching``) on a researcher's own model: a tiny Gemma 2
folder written by ``save_pretrained`` with an offline Gemma-style tokenizer (``<bos>`` added by its post-processor).
It used to stop at ``AttributeError: 'Tokenizer' object has no attribute 'bos_id'``: the page now reads
``model.tokenizer.bos_token_id``, which every tokenizer interp attaches has."""

import re
from pathlib import Path

import pytest
import torch

import interp
from interp.analysis import activation_patching, corrupt_repeats, in_context_metric
from interp.data import repeated_sequences

transformers = pytest.importorskip("transformers")

BOS = 2  # Gemma's: <pad> 0, <eos> 1, <bos> 2


def gemma_style_tokenizer(vocab_size: int):
    """A word-level fast tokenizer laid out as Gemma's (``<pad> <eos> <bos> <unk>`` first) whose post-processor
    puts ``<bos>`` in front of every text, as Gemma's ``tokenizer.json`` does; no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": BOS, "<unk>": 3} | {f"w{i}": i for i in range(4, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>", unk_token="<unk>")


@pytest.fixture(scope="module")
def gemma2_folder(tmp_path_factory):
    from interp.zoo.compat import V, hf_test_model

    folder = tmp_path_factory.mktemp("gemma2")
    hf_test_model("gemma2").save_pretrained(folder)
    gemma_style_tokenizer(V).save_pretrained(folder)
    return folder


def _page_blocks():
    """The python blocks of docs/howto/patching.md, by heading: the recipe as the docs write it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "patching.md").read_text(encoding="utf-8")
    return re.findall(r"^```python[^\n]*\n(.*?)^```", text, re.S | re.M)


def test_the_docs_induction_patching_recipe_runs_on_a_gemma2_folder(gemma2_folder, monkeypatch):
    """The page's setup block and its patching block, run as written with ``interp.load`` returning the Gemma 2
    folder's model (the page loads induction-2l)."""
    model = interp.load(str(gemma2_folder))
    monkeypatch.setattr(interp, "load", lambda name, **kw: model)
    setup, patching = (b for b in _page_blocks() if "corrupt_repeats(" in b or "in_context_metric(clean" in b)
    ns: dict = {}
    exec(compile(setup, "patching.md (setup)", "exec"), ns)  # noqa: S102 - the docs' own code
    assert ns["bos"] == BOS  # the tokenizer's own <bos>, read as the recipe reads it
    exec(compile(patching, "patching.md (patching)", "exec"), ns)  # noqa: S102
    df, half, clean = ns["df"], ns["half"], ns["clean"]
    assert len(df) == model.cfg.n_layers * model.cfg.n_heads and df["metric"].notna().all()
    with torch.no_grad():  # the metric of the clean run, written out: the repeated half's next-token advantage
        logits = model(clean)[:, :-1]  # [B, T-1, V]
    adv = logits.gather(-1, clean[:, 1:, None])[..., 0] - logits.mean(-1)  # [B, T-1]
    want = adv[:, 1 + half:].mean()  # predictions of x_2..x_n of the repeated half (its first token excluded)
    assert df.attrs["metric_clean"] == pytest.approx(float(want), abs=1e-4)


def test_the_recipe_steps_on_a_gemma2_folder(gemma2_folder):
    model = interp.load(str(gemma2_folder))
    bos = model.tokenizer.bos_token_id
    assert bos == BOS and model.tokenizer.to_tokens("w5 w6")[0, 0] == bos  # the id the tokenizer puts first
    half = 6
    clean = repeated_sequences(3, half, model.cfg.d_vocab, seed=0, bos_id=bos)  # [3, 13]
    corrupted = corrupt_repeats(clean, half, model.cfg.d_vocab, bos_id=bos, seed=1)
    assert torch.equal(corrupted[:, :1 + half], clean[:, :1 + half]) and (corrupted[:, 0] == bos).all()
    df = activation_patching(model, clean, corrupted, act="z", by="head", metric=in_context_metric(clean, half,
                                                                                                  bos=True),
                             progress=False)
    assert len(df) == model.cfg.n_layers * model.cfg.n_heads


def test_both_tokenizers_answer_to_bos_token_id():
    from interp.zoo.induction import TokenIdTokenizer
    from interp.zoo.tokenizer import Tokenizer

    ids = TokenIdTokenizer(11, bos_id=0)
    assert ids.bos_id == ids.bos_token_id == 0
    assert Tokenizer(gemma_style_tokenizer(20).backend_tokenizer).bos_token_id == BOS
