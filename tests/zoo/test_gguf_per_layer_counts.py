"""GGUF per-layer metadata arrays: ``head_count_kv = [1, 1]`` (what llama.cpp writes for a 2-layer MQA model) is
accepted as 1; different values per layer, or an array that is not one entry per layer, are refused by name; and
no error message echoes a huge array (a 10^6-entry array used to give a 3,000,131-character message)."""

import pytest

from interp.zoo import gguf as zgguf
from interp.zoo.gguf_file import GGUFError


def _meta(arch="llama", **extra) -> dict:
    base = {"general.architecture": arch, f"{arch}.embedding_length": 64, f"{arch}.attention.head_count": 4,
            f"{arch}.block_count": 2, f"{arch}.feed_forward_length": 96, f"{arch}.context_length": 64,
            f"{arch}.vocab_size": 50}
    return {**base, **{f"{arch}.{k}": v for k, v in extra.items()}}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2"])
def test_a_per_layer_head_count_kv_with_one_value_is_accepted(arch):
    for per_layer, want in (([1, 1], 1), ([2, 2], 2), ([4, 4], 4)):
        cfg = zgguf.hf_config_from_gguf(_meta(arch, **{"attention.head_count_kv": per_layer}), set())
        assert cfg["num_key_value_heads"] == want


@pytest.mark.parametrize("per_layer, match", [
    ([1, 2], r"'llama.attention.head_count_kv' = \[1, 2\] differs between layers"),
    ([1, 1, 1], r"'llama.attention.head_count_kv' has 3 entries for llama.block_count = 2 layers"),
    ([1, 0], r"'llama.attention.head_count_kv' = 0 must be an integer >= 1"),
])
def test_per_layer_head_count_kv_that_cannot_be_one_value_is_refused_by_name(per_layer, match):
    with pytest.raises(GGUFError, match=match):
        zgguf.hf_config_from_gguf(_meta(**{"attention.head_count_kv": per_layer}), set())


@pytest.mark.parametrize("key", ["attention.head_count_kv", "embedding_length", "rope.freq_base"])
def test_messages_never_echo_a_huge_array(key):
    with pytest.raises(GGUFError) as refused:
        zgguf.hf_config_from_gguf(_meta(**{key: list(range(10**6))}), set())
    text = str(refused.value)
    assert f"'llama.{key}'" in text and len(text) < 300, text[:400]
    assert "1000000 entries" in text
