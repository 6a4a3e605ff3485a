"""Bad configs, bad forward inputs, wrong-dtype hooks and bad gates fail at once with a message naming the
value (not deep inside a forward pass, and never silently)."""

import math

import pytest
import torch
from helpers import tiny_model

import interp
from interp import ModelConfig

BASE = dict(n_layers=2, d_model=16, n_heads=4, d_vocab=20, n_ctx=12)


@pytest.fixture(scope="module")
def model():
    return tiny_model(0, **BASE)


# --- config ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", [0.0, -1.0, math.nan, math.inf])
def test_config_rejects_a_rotary_base_that_is_not_a_positive_number(base):
    with pytest.raises(ValueError, match="rotary_base"):
        ModelConfig(**BASE, positional="rotary", rotary_base=base)


def test_config_rejects_a_nan_norm_eps():
    with pytest.raises(ValueError, match="norm_eps"):
        ModelConfig(**BASE, norm_eps=math.nan)


def test_config_rejects_a_string_norm_eps_with_a_type_error():
    with pytest.raises(TypeError, match="norm_eps='1e-5'"):
        ModelConfig(**BASE, norm_eps="1e-5")


@pytest.mark.parametrize("field, value, extra", [
    ("rotary_dim", 4.0, dict(positional="rotary")),
    ("rope_dim", 2.0, dict(attention="latent", kv_latent_dim=8, positional="rotary")),
    ("n_token_types", 1.5, {}),
])
def test_config_rejects_float_sizes(field, value, extra):
    with pytest.raises(TypeError, match=f"{field}={value}"):
        ModelConfig(**BASE, **extra, **{field: value})


def test_config_rejects_a_causal_flag_that_is_not_a_bool():
    with pytest.raises(TypeError, match="causal='no'"):
        ModelConfig(**BASE, causal="no")


# --- forward --------------------------------------------------------------------------------------------
def test_forward_rejects_an_empty_batch(model):
    with pytest.raises(ValueError, match=r"batch > 0.*\(0, 3\)"):
        model(torch.zeros(0, 3, dtype=torch.long))


def test_forward_accepts_uint8_and_int32_ids_as_int64(model):
    ids = torch.tensor([[1, 2, 3, 4]])
    ref = model(ids)
    assert torch.equal(model(ids.to(torch.uint8)), ref)
    assert torch.equal(model(ids.to(torch.int32)), ref)


def test_forward_rejects_float_position_ids(model):
    with pytest.raises(TypeError, match="position_ids must be integer"):
        model(torch.tensor([[1, 2, 3]]), position_ids=torch.tensor([[0.0, 1.0, 2.0]]))


def test_forward_rejects_position_ids_outside_the_context(model):
    with pytest.raises(ValueError, match=r"position_ids must be in \[0, n_ctx=12\).*max 40"):
        model(torch.tensor([[1, 2, 3]]), position_ids=torch.tensor([[0, 1, 40]]))


def test_forward_int_position_ids_equal_the_default_positions(model):
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(model(ids, position_ids=torch.tensor([[0, 1, 2]], dtype=torch.int32)), model(ids))


def test_forward_rejects_token_type_ids_on_a_model_without_token_types(model):
    with pytest.raises(ValueError, match="no token types"):
        model(torch.tensor([[1, 2, 3]]), token_type_ids=torch.zeros(1, 3, dtype=torch.long))


def test_forward_rejects_an_attention_mask_that_is_not_zero_or_one(model):
    with pytest.raises(ValueError, match=r"attention_mask must hold only 0.*0\.5"):
        model(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[1.0, 0.5, 1.0]]))


def test_generate_rejects_a_negative_token_count(model):
    with pytest.raises(ValueError, match="max_new_tokens=-1"):
        model.generate(torch.tensor([[1, 2]]), max_new_tokens=-1)


def test_query_chunk_must_be_an_int(model):
    with pytest.raises(TypeError, match="2.5"):
        model.set_query_chunk(2.5)
    assert all(block.attn.query_chunk is None for block in model.blocks)


# --- hooks ----------------------------------------------------------------------------------------------
def test_a_hook_returning_the_wrong_dtype_is_named(model):
    with pytest.raises(TypeError, match=r"hook on 'blocks.0.hook_resid_pre' returned dtype torch.float16"):
        model.run_with_hooks(torch.tensor([[1, 2, 3]]),
                             fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: t.half())])
    assert not any(hp.active for hp in model.hook_dict.values())


# --- gates ----------------------------------------------------------------------------------------------
def test_setting_gates_is_all_or_nothing(model):
    with pytest.raises(ValueError, match=r"gate has shape \(5,\), expected \(4,\)"):
        model.set_head_gates([torch.zeros(4), torch.zeros(5)])
    assert all(block.attn.gate is None for block in model.blocks)
    ones = torch.ones(2, 4)
    model.set_head_gates(ones)
    try:
        with pytest.raises(ValueError, match="non-finite"):
            model.set_head_gates([torch.zeros(4), torch.full((4,), math.nan)])
        assert all(torch.equal(block.attn.gate, ones[0]) for block in model.blocks)
    finally:
        model.set_head_gates(None)


def test_nan_gates_are_rejected(model):
    gates = torch.ones(2, 4)
    gates[1, 2] = math.nan
    with pytest.raises(ValueError, match="non-finite"):
        model.set_head_gates(gates)
    assert all(block.attn.gate is None for block in model.blocks)


def test_a_model_copy_gets_its_own_lock(model):
    import copy

    clone = copy.deepcopy(model)
    assert clone.lock is not model.lock
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(clone(ids), model(ids))


@pytest.mark.parametrize("bad", [0, -3])
def test_to_tokens_rejects_a_max_length_below_one(bad):
    model = interp.load("induction-2l")
    with pytest.raises(ValueError, match=f"max_length={bad} must be a positive int"):
        model.to_tokens("t1 t2 t3", max_length=bad)
    assert model.to_tokens("t1 t2 t3", max_length=4).tolist() == model.to_tokens("t1 t2 t3").tolist()
