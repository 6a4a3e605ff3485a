"""Two conveniences a new user meets first: ``model.generate("text", n)`` returns text (ids in, ids out
unchanged), and a config's repr shows what differs from the defaults (``full_repr`` shows every field)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import VARIANTS, tiny_model

from interp import ModelConfig
from interp.generate import generate
from interp.zoo.induction import TokenIdTokenizer


def _model():
    model = tiny_model(0, d_vocab=20)
    model.tokenizer = TokenIdTokenizer(20, bos_id=0)
    return model


def test_text_in_text_out_is_the_ids_path_decoded():
    model = _model()
    ids = model.to_tokens("t3 t7 t3")  # [1, 4]: BOS first
    want = generate(model, ids, 6)  # the library function on ids
    text = model.generate("t3 t7 t3", 6)
    assert isinstance(text, str)
    assert text == " ".join(f"t{i}" for i in want[0, 1:].tolist())  # decoded, BOS dropped
    assert text.startswith("t3 t7 t3 ") and len(text.split()) == 3 + 6
    text2, trace = model.generate("t3 t7 t3", 6, return_trace=True, trace_filter="blocks.0.hook_resid_pre")
    assert text2 == text and trace["blocks.0.hook_resid_pre"].shape[1] == 4 + 6


def test_ids_in_ids_out_unchanged():
    model = _model()
    ids = torch.tensor([[1, 5, 9], [2, 2, 4]])
    assert torch.equal(model.generate(ids, 5), generate(model, ids, 5))


def test_text_without_a_tokenizer_is_refused_by_name():
    with pytest.raises(ValueError, match="has no tokenizer"):
        tiny_model(0).generate("The cat", 8)


CONFIGS = {
    "dense": dict(n_layers=2, d_model=32, n_heads=4, d_vocab=20, n_ctx=32),
    **{name: dict(n_layers=2, d_model=32, n_heads=4, d_vocab=20, n_ctx=32, **over) for name, over in VARIANTS.items()},
    "moe": dict(n_layers=2, d_model=32, n_heads=4, d_vocab=20, n_ctx=32, activation="swiglu", n_experts=4, n_experts_per_token=2,
                d_expert=16, router_groups=2, router_topk_groups=1),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_repr_shows_only_what_differs_and_rebuilds_the_same_config(name):
    cfg = ModelConfig(**CONFIGS[name])
    text = repr(cfg)
    assert eval(text, {"ModelConfig": ModelConfig}) == cfg  # nothing that matters is left out
    full = cfg.full_repr()
    assert all(f"{f.name}=" in full for f in dataclasses.fields(cfg))
    assert eval(full, {"ModelConfig": ModelConfig}) == cfg
    for given, value in CONFIGS[name].items():  # a given value is shown unless the other values alone derive it
        needed = given in ("n_layers", "d_model", "n_heads", "d_vocab", "n_ctx")
        try:
            needed = needed or value != getattr(ModelConfig(**{k: v for k, v in CONFIGS[name].items() if k != given}),
                                                given)
        except ValueError:  # the others alone are no valid config (MLA's latent width without attention="latent")
            needed = True
        assert (f"{given}=" in text) == needed, given
    if name == "dense":
        assert text == "ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=20, n_ctx=32)"
    if not name.startswith("mla"):
        assert "kv_latent_dim" not in text and "q_latent_dim" not in text
    if name != "moe":
        assert "router" not in text and "routed_scaling" not in text and "expert" not in text
