"""The KV cache: cached decoding equals the full forward pass; cache sizes per variant."""

from __future__ import annotations

import pytest
import torch
from core_helpers import VARIANTS, make, naive_attention, naive_rotary  # noqa: F401


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("chunks", [[1] * 9, [4, 1, 1, 3], [5, 4]])
def test_cached_decoding_matches_full_forward(variant, chunks):
    model = make(variant)
    tokens = torch.randint(0, 37, (2, sum(chunks)))
    full, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
    cache = model.make_cache(batch_size=2)
    start = 0
    for n in chunks:
        step, tr = model.run_with_cache(tokens[:, start:start + n], kv_cache=cache, names_filter="*hook_pattern")
        torch.testing.assert_close(step, full[:, start:start + n], atol=1e-5, rtol=0)
        for layer in range(2):
            # A cached step's pattern rows are the full pattern's rows for those queries, over the keys so far.
            torch.testing.assert_close(tr.pattern(layer), trace.pattern(layer)[:, :, start:start + n, :start + n],
                                       atol=1e-5, rtol=0)
        start += n
    assert cache.length == sum(chunks)


def test_kv_cache_sizes_follow_the_variant():
    sizes = {}
    for variant in ("mha", "gqa", "mqa", "mla"):
        model = make(variant)
        cache = model.make_cache(batch_size=1, max_len=10)
        sizes[variant] = cache.nbytes_per_token
        assert cache.nbytes_per_token == model.cfg.kv_cache_bytes_per_token(4)
    # float32: 2 layers x 2 (K and V) x kv_heads x 6 dims x 4 bytes; MLA: 2 layers x (12 + 4) x 4.
    assert sizes == {"mha": 2 * 2 * 8 * 6 * 4, "gqa": 2 * 2 * 2 * 6 * 4, "mqa": 2 * 2 * 1 * 6 * 4, "mla": 2 * 16 * 4}
    model = make("mha")
    cache = model.make_cache(batch_size=1, max_len=4)
    model(torch.tensor([[1, 2, 3]]), kv_cache=cache)
    assert cache.nbytes_used == 3 * cache.nbytes_per_token
    with pytest.raises(ValueError, match="exceeds max_len=4"):
        model(torch.tensor([[1, 2]]), kv_cache=cache)
    cache.reset()
    assert cache.length == 0
