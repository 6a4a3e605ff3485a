"""``interp plan``: the sizes of a run from the config alone, against hand arithmetic and against a loaded model."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import run_cli

from interp import cli

# Llama-style: d_model 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 96, vocabulary 100, untied.
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 128,
          "tie_word_embeddings": False}
# By hand, in float32 values (x 4 bytes):
BLOCK = ((4 + 2 + 2) * 16 * 64  # W_qkv: H + 2K heads of 16 rows, 64 wide
         + 64 * 64  # W_O
         + 2 * 96 * 64 + 64 * 96  # W_in, W_gate, W_out
         + 2 * 64) * 4  # ln1, ln2
EMBED = 100 * 64 * 4
HEAD = (64 + 100 * 64 + 100) * 4  # ln_final, W_U and its (zero) bias
KV_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # layers x (K, V) x KV heads x d_head x 4 bytes
PATTERN_PER_TOKEN = 2 * 4 * 128 * 4  # layers x heads x 128 keys x 4 bytes


def _plan(capsys, tmp_path, *extra: str) -> tuple[int, dict | str, str]:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    code, out, err = run_cli(capsys, "plan", "--model", str(tmp_path / "config.json"), *extra)
    return code, (json.loads(out) if "--json" in extra and code == 0 else out), err


def test_plan_matches_hand_arithmetic(capsys, tmp_path):
    # cuda:0 holds the embeddings and one block (0.9 x 200,000 = 180,000 >= 25,600 + 123,392, not two blocks);
    # cuda:1 the second block and the head.
    code, plan, err = _plan(capsys, tmp_path, "--devices", "cuda:0,cuda:1", "--memory", "200kB,200kB",
                            "--tokens", "128", "--batch", "2", "--json")
    assert code == 0, err
    assert BLOCK == 123_392
    assert plan["block_bytes"] == [BLOCK, BLOCK]
    assert (plan["embedding_bytes"], plan["head_bytes"]) == (EMBED, HEAD)
    assert plan["weights_bytes"] == EMBED + 2 * BLOCK + HEAD == 298_640
    assert plan["kv_bytes_per_token"] == KV_PER_TOKEN == 512
    assert plan["kv_bytes"] == KV_PER_TOKEN * 128 * 2
    assert plan["pattern_bytes_per_token"] == PATTERN_PER_TOKEN
    assert plan["pattern_bytes"] == PATTERN_PER_TOKEN * 128 * 2  # [2, 4, 128, 128] x 2 layers x 4 bytes
    assert plan["devices"] == [
        {"device": "cuda:0", "capacity": 200_000, "layers": [0], "weights_bytes": EMBED + BLOCK},
        {"device": "cuda:1", "capacity": 200_000, "layers": [1], "weights_bytes": BLOCK + HEAD}]
    assert set(plan) == set(cli.PLAN_JSON_KEYS)


def test_plan_text_and_bfloat16_halve_everything(capsys, tmp_path):
    code, out, _ = _plan(capsys, tmp_path, "--dtype", "bfloat16", "--memory", "1GB", "--tokens", "128")
    assert code == 0
    assert "weights (bfloat16): 149.3 kB" in out  # 298,640 / 2
    assert "KV cache (bfloat16): 256 B per token" in out
    assert "layers 0-1 (2)" in out


@pytest.mark.parametrize("extra, needle", [
    (("--memory", "100kB"), "do not fit"),
    (("--devices", "cpu,cpu:1", "--memory", "1GB"), "1 size(s) for 2 device(s)"),
    (("--memory", "lots"), "'lots' is not a size"),
    (("--reserve", "1"), "outside [0, 1)"),
])
def test_plan_refuses_by_name(capsys, tmp_path, extra, needle):
    code, _, err = _plan(capsys, tmp_path, *extra)
    assert code in (1, 2) and needle in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without that GPU")
def test_plan_for_absent_devices_needs_their_memory(capsys, tmp_path):
    code, _, err = _plan(capsys, tmp_path, "--devices", "cuda:0")
    assert code == 1 and "give each device's memory with --memory" in err


def test_plan_of_a_gguf_file_counts_the_blocks_the_loaded_model_holds(capsys, tmp_path):
    pytest.importorskip("gguf")
    sys.path.insert(0, str(Path(__file__).parents[1] / "zoo"))
    from gguf_writer import hf_model, write_gguf

    from interp.quantized import quantized_weights
    from interp.zoo.gguf import load_gguf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = hf_model("llama", hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
    path = write_gguf(hf, tmp_path / "tiny.gguf", "llama", types=("q4_0", "q8_0", "f16"))
    code, out, err = run_cli(capsys, "plan", "--model", str(path), "--memory", "1GB", "--json")
    assert code == 0, err
    plan = json.loads(out)
    model = load_gguf(path, keep_quantized=True)
    held = sum(w.nbytes for _, w in quantized_weights(model)) + sum(p.numel() * 4 for p in model.parameters())
    assert plan["weights_bytes"] == held
    assert plan["weights"] == "Q4_0/Q8_0 blocks as stored, float32 otherwise"
    code, out, _ = run_cli(capsys, "plan", "--model", str(path), "--memory", "1GB", "--json", "--dequantized")
    floats = load_gguf(path)
    assert json.loads(out)["weights_bytes"] == sum(p.numel() * 4 for p in floats.parameters())
