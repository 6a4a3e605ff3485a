"""``interp heads`` / ``interp prune --model FOLDER`` on saved Hugging Face folders of the dense families (random
tiny configs of :mod:`interp.zoo.compat`, ``save_pretrained`` plus a word-level tokenizer: nothing downloaded).

The folder the CLI loads must be the model transformers runs (logits within 1e-4, the folder's tokenizer
attached), and each command must print what the library computes on the model converted from the in-memory
HF object: the CLI adds loading and printing, nothing else.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_cli, word_tokenizer

from interp import cli

transformers = pytest.importorskip("transformers")

from interp.zoo.compat import V, hf_test_model  # noqa: E402
from interp.zoo.hf import from_hf  # noqa: E402

#: One folder per family of the issue that the converter added (GQA/MQA, windows, soft-caps, QK-norm,
#: parallel blocks, learned positions, output norms).
FOLDER_FAMILIES = ["gemma2", "qwen3", "gpt_neox", "gpt_bigcode", "falcon", "phi3", "olmo2"]
TEXT = "w1 w2 w3 w4 w5 w6 w7 w8 w1 w2 w3 w4 w5 w6 w7 w8"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> (saved folder, the HF model it holds)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name in FOLDER_FAMILIES:
        hf = hf_test_model(name)
        hf.save_pretrained(root / name)
        word_tokenizer(V).save_pretrained(root / name)
        out[name] = (root / name, hf)
    return out


@pytest.mark.parametrize("name", FOLDER_FAMILIES)
def test_heads_on_a_family_folder_loads_it_exactly_and_prints_what_the_library_finds(capsys, folders, name):
    from interp.analysis import classify_heads

    folder, hf = folders[name]
    model = cli._load_model(str(folder))
    ids = model.to_tokens(TEXT, prepend_bos=False)
    assert ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8] * 2]  # the folder's own tokenizer, offline
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-4)
    code, out, err = run_cli(capsys, "heads", "--model", str(folder), "--text", TEXT, "--json", "--no-progress")
    assert code == 0, err
    report = classify_heads(from_hf(hf, tokenizer=word_tokenizer(V)), texts=[TEXT], progress=False)
    assert json.loads(out) == cli.heads_records(report.df)


@pytest.mark.parametrize("name", ["gemma2", "gpt_neox"])  # MQA + windows + soft-caps; parallel + partial rotary
def test_prune_importance_on_a_family_folder_is_the_library_curve(capsys, folders, name):
    from interp.pruning import run_experiment

    folder, hf = folders[name]
    argv = ["prune", "--model", str(folder), "--method", "importance", "--step", "0.5", "--n-seqs", "4"]
    code, out, err = run_cli(capsys, *argv, "--json", "--no-progress")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["fraction_pruned"] for r in rows] == [0.0, 0.5, 1.0]  # 10 heads, 5 removed per step
    args = cli.build_parser().parse_args(argv)
    want = cli.prune_records(run_experiment(cli.prune_config(args), model=from_hf(hf), progress=False),
                             default_method="importance")
    assert [r["fraction_pruned"] for r in want] == [r["fraction_pruned"] for r in rows]
    assert [r["metric"] for r in rows] == pytest.approx([r["metric"] for r in want], abs=1e-6)


@pytest.mark.slow  # 100 gate-training steps: fewer land short of the target on any family (MHA too)
def test_prune_l0_on_a_parallel_mqa_folder_hits_its_target(capsys, folders):
    folder, _ = folders["falcon"]
    code, out, err = run_cli(capsys, "prune", "--model", str(folder), "--method", "l0", "--target", "0.5",
                             "--l0-steps", "100", "--n-seqs", "4", "--json", "--no-progress")
    assert code == 0, err
    rows = json.loads(out)
    assert {r["method"] for r in rows} == {"l0"} and all(list(r) == list(cli.PRUNE_JSON_KEYS) for r in rows)
    pruned = [r for r in rows if r["fraction_pruned"] > 0]
    assert len(pruned) == 1 and abs(pruned[0]["fraction_pruned"] * 10 - 5) <= 1  # 0.5 of 10 heads, within one
