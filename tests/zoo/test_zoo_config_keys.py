"""The config-key audit (issue 38): every config key a converted family's transformers classes read, found in
the installed transformers source, is read by interp's converter (mapped, or refused by name) or listed with the
reason it cannot change the forward pass. A key a future transformers release adds fails here, by name."""

from pathlib import Path

import pytest

tf = pytest.importorskip("transformers")

from interp.zoo import config_audit  # noqa: E402
from interp.zoo.config_audit import FAMILY_CONFIGS, IGNORED, IGNORED_BY_FAMILY, audit, audit_table  # noqa: E402
from interp.zoo.hf import CONVERTERS, _register_dense_families  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "config-keys.md"


def test_every_converted_model_type_is_audited():
    _register_dense_families()
    assert sorted(FAMILY_CONFIGS) == sorted(CONVERTERS)


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_no_key_read_by_transformers_is_silently_ignored(name):
    row = audit(name)
    assert row["unaccounted"] == [], (
        f"transformers' {name} reads {row['unaccounted']}, which interp's converter neither reads nor lists in "
        "interp.zoo.config_audit.IGNORED with a reason: map or refuse it in the converter")
    assert {"hidden_size", "num_hidden_layers", "vocab_size"} & row["transformers"]  # the parse found the classes


def test_a_key_added_by_transformers_would_fail_the_audit(monkeypatch):
    """The audit is not vacuous: a key the classes start reading is reported as unaccounted."""
    real = config_audit.transformers_reads
    monkeypatch.setattr(config_audit, "transformers_reads", lambda model: real(model) | {"attention_sink_size"})
    assert audit("llama")["unaccounted"] == ["attention_sink_size"]


def test_converter_reads_are_recorded_through_every_helper():
    """Keys read inside helpers (RoPE, windows, biases) count; the key list of an error message does not."""
    reads = config_audit.converter_reads({"model_type": "qwen2", "hidden_size": 32, "num_attention_heads": 4,
                                          "num_hidden_layers": 2, "intermediate_size": 48, "vocab_size": 11,
                                          "max_position_embeddings": 64, "use_sliding_window": True,
                                          "sliding_window": 4, "unrelated_key": 1})
    assert {"use_sliding_window", "max_window_layers", "layer_types", "rope_parameters", "rope_theta"} <= reads
    assert "unrelated_key" not in reads


@pytest.mark.parametrize("name", sorted(IGNORED_BY_FAMILY))
def test_family_exemptions_are_read_by_transformers_and_not_by_interp(name):
    """A listed exemption is a key the family's classes really read, and one the converter really skips (a stale
    entry would hide nothing, and an entry the converter reads needs no reason)."""
    row = audit(name)
    for key in IGNORED_BY_FAMILY[name]:
        assert key in row["transformers"] and key not in row["converter"], key
    assert all(IGNORED_BY_FAMILY[name].values()) and all(IGNORED.values())


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_docs_page_holds_the_audit_row(name):
    """docs/reference/config-keys.md is ``python -m interp.zoo.config_audit``'s output for this transformers."""
    header, rule, row = audit_table([name]).splitlines()
    text = DOCS.read_text(encoding="utf-8")
    assert header in text and row in text, f"regenerate the table: python -m interp.zoo.config_audit\n{row}"


def test_docs_page_holds_every_reason():
    text = DOCS.read_text(encoding="utf-8")
    for line in config_audit.reasons_table().splitlines():
        assert line in text, line


# --- every key both sides read, perturbed: exact or refused by name ------------------------------------------
#: Keys that set shapes (checked by every exact conversion, and against the tensors) or are audited elsewhere
#: (rope_parameters: tests/core/test_rope_scaling.py and the RoPE refusals; layer_types: the window tests).
STRUCTURAL = {"hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size",
              "num_hidden_layers", "head_dim", "max_position_embeddings", "n_embd", "n_head", "n_layer", "n_inner",
              "n_positions", "ffn_hidden_size", "num_kv_heads", "moe_intermediate_size", "kv_lora_rank",
              "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_experts", "num_local_experts",
              "n_routed_experts", "shared_expert_intermediate_size", "pad_token_id", "type_vocab_size",
              "rope_parameters", "model_type", "num_experts_per_tok", "n_group", "topk_group", "layer_types"}
ACTIVATIONS = ("gelu", "relu", "silu", "gelu_new", "gelu_pytorch_tanh")
FROM_NONE = {"sliding_window": 6, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 2.0,
             "query_pre_attn_scalar": 7, "clip_qkv": 0.3, "original_max_position_embeddings": 16}


def _perturbations(key, value):
    """Other values for a config key: a flipped bool, the other activations, a changed number or list."""
    if key in STRUCTURAL:
        return []
    if isinstance(value, bool):
        return [not value]
    if key in ("hidden_act", "hidden_activation", "activation_function", "activation"):
        return [a for a in ACTIVATIONS if a != value]
    if value is None:
        return [FROM_NONE[key]] if key in FROM_NONE else []
    if isinstance(value, float):
        return [0.1 if value < 1e-3 else value * 2.5]
    if isinstance(value, int):
        return [value + 1, max(value - 1, 0)]
    if isinstance(value, list):
        return [[], list(reversed(value)) if value else [0]]
    return []


@pytest.mark.parametrize("name", [n for n in FAMILY_CONFIGS if n not in ("bert", "gpt2")])
def test_each_key_both_read_converts_exactly_or_is_refused_by_name_when_changed(name):
    """Each key transformers and the converter both read, set to other values one at a time on the family's test
    config: the conversion's logits are within 1e-4 of transformers' or it is refused naming that key. (Values
    transformers itself cannot build or run are skipped.)"""
    import torch

    from interp.zoo.compat import V, hf_test_model
    from interp.zoo.hf import from_hf

    row = audit(name)
    base = hf_test_model(FAMILY_CONFIGS[name])
    ids = torch.randint(1, V, (1, 24), generator=torch.Generator().manual_seed(3))
    exact, refused, wrong = 0, 0, []
    for key in sorted(row["transformers"] & row["converter"]):
        for value in _perturbations(key, getattr(base.config, key, None)):
            try:
                hf = hf_test_model(FAMILY_CONFIGS[name], **{key: value})
                with torch.no_grad():
                    ref = hf(ids).logits
            except Exception:  # noqa: BLE001 - transformers refuses or crashes on this value: nothing to match
                continue
            try:
                model = from_hf(hf)
            except ValueError as e:
                assert key in str(e), f"{key}={value!r} refused, but the message does not name it: {e}"
                refused += 1
                continue
            with torch.no_grad():
                diff = float((model(ids) - ref).abs().max())
            exact += diff <= 1e-4
            if diff > 1e-4:
                wrong.append(f"{key}={value!r}: max |logit diff| {diff:.2e}")
    assert not wrong, f"{name} converts silently wrong with " + "; ".join(wrong)
    assert exact + refused >= 3  # the perturbations ran
