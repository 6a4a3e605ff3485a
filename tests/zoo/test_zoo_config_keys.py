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
