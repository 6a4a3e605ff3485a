"""``interp heads --coref FILE``: the hand-built coreference head comes out of the command line, and only it."""

import json

from helpers import run_cli
from toy_coref import COREF_HEAD, hand_built_coref_model, toy_gap_lines

from interp.zoo.checkpoint import save_checkpoint


def test_heads_coref_json_names_the_wired_head(capsys, tmp_path, one_thread):
    model_path = save_checkpoint(hand_built_coref_model(), tmp_path / "coref.safetensors")
    lines = toy_gap_lines()
    gap = tmp_path / "toy.tsv"
    gap.write_text("\n".join([lines[0]] + lines[1:] * 5) + "\n", encoding="utf-8")  # 60 scorable rows >= 50
    code, out, err = run_cli(capsys, "heads", "--model", str(model_path), "--coref", str(gap), "--json")
    assert code == 0, err
    coref = {(r["layer"], r["head"]) for r in json.loads(out) if r["kind"] == "coreference:gap"}
    assert coref == {COREF_HEAD}


def test_heads_coref_missing_file_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "heads", "--model", "induction-2l", "--coref", str(tmp_path / "none.tsv"))
    assert code != 0 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert "--coref file" in line and "none.tsv" in line and "does not exist" in line
