"""generate(): sampling (reproducible by seed, equal to Hugging Face's under the same logits processors and seed),
greedy as its limits, stop tokens, steering hooks during generation (equal to a manual forward loop with the same
hook), and the trace of a generation."""

from __future__ import annotations

import pytest
import torch
from core_helpers import make

from interp.generate import decode_one_token, generate, prefill, process_logits, sample


def tiny(**over):
    # Larger weights than the default init, so that sampling has several likely tokens and greedy decoding
    # does not repeat one token.
    model = make("gqa-rotary", **over)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


PROMPT = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])


def test_the_same_seed_gives_the_same_tokens_and_another_seed_others():
    model = tiny()
    a = model.generate(PROMPT, 12, temperature=1.0, seed=7)
    assert torch.equal(a, model.generate(PROMPT, 12, temperature=1.0, seed=7))
    assert torch.equal(a, model.generate(PROMPT, 12, temperature=1.0, seed=7, use_cache=False))
    torch.manual_seed(0)  # a seeded call does not read torch's global generator
    assert torch.equal(a, model.generate(PROMPT, 12, temperature=1.0, seed=7))
    others = [model.generate(PROMPT, 12, temperature=1.0, seed=s) for s in (8, 9)]
    assert any(not torch.equal(a, o) for o in others)
    assert not torch.equal(a, model.generate(PROMPT, 12))  # sampling is not greedy here


def test_temperature_zero_top_k_one_and_a_tiny_top_p_are_greedy():
    model = tiny()
    greedy = model.generate(PROMPT, 12)
    ids = PROMPT
    with torch.no_grad():
        for _ in range(12):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)  # [B, T + 1]
    assert torch.equal(greedy, ids)
    assert torch.equal(model.generate(PROMPT, 12, temperature=0.0, top_k=5, seed=3), greedy)
    for temperature in (0.5, 1.0, 2.0):
        assert torch.equal(model.generate(PROMPT, 12, temperature=temperature, top_k=1, seed=1), greedy)
        assert torch.equal(model.generate(PROMPT, 12, temperature=temperature, top_p=1e-6, seed=1), greedy)


def test_top_k_and_top_p_keep_the_tokens_they_name():
    logits = torch.tensor([[0.0, 4.0, 3.0, 1.0, 2.0]])
    assert torch.isinf(process_logits(logits, top_k=2)).tolist() == [[True, False, False, True, True]]
    probs = logits.softmax(-1)[0]  # 0.64, 0.24, 0.09, 0.03, 0.01 (indices 1, 2, 4, 3, 0)
    keep = ~torch.isinf(process_logits(logits, top_p=float(probs[1] + probs[2]) - 1e-3))
    assert keep.tolist() == [[False, True, True, False, False]]  # the smallest set reaching top_p
    torch.testing.assert_close(process_logits(logits, temperature=2.0), logits / 2)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample(logits.expand(500, -1), temperature=1.0, top_k=3, generator=g)])
    assert set(draws.unique().tolist()) == {1, 2, 4}


@pytest.mark.parametrize(("kw", "error", "match"), [
    (dict(temperature=-1.0), ValueError, "temperature=-1.0"),
    (dict(temperature=float("nan")), ValueError, "temperature=nan"),
    (dict(temperature="hot"), TypeError, "temperature='hot'"),
    (dict(top_k=0), ValueError, "top_k=0"),
    (dict(top_k=2.5), TypeError, "top_k=2.5"),
    (dict(top_p=0.0), ValueError, "top_p=0.0"),
    (dict(top_p=1.5), ValueError, "top_p=1.5"),
    (dict(seed=1.5), TypeError, "seed=1.5"),
    (dict(stop_tokens=[37]), ValueError, "stop token 37 is outside the vocabulary"),
    (dict(stop_tokens="x"), TypeError, "stop_tokens='x'"),
    (dict(pad_token_id=-1), ValueError, "pad_token_id=-1"),
])
def test_bad_sampling_arguments_are_refused_by_name(kw, error, match):
    with pytest.raises(error, match=match):
        tiny().generate(PROMPT, 3, **kw)


def test_stop_tokens_end_each_sequence_and_the_run_when_all_have_stopped():
    model = tiny()
    greedy = model.generate(PROMPT, 12)
    stop = int(greedy[0, 5 + 3])  # sequence 0's 4th new token
    first = [int((row[5:] == stop).nonzero()[0]) if bool((row[5:] == stop).any()) else None for row in greedy]
    out = model.generate(PROMPT, 12, stop_tokens=[stop], pad_token_id=0)
    for row, hit, full in zip(out, first, greedy):
        if hit is None:
            assert torch.equal(row, full[:out.shape[1]])
        else:
            assert torch.equal(row[:5 + hit + 1], full[:5 + hit + 1]) and bool((row[5 + hit + 1:] == 0).all())
    if all(h is not None for h in first):
        assert out.shape[1] == 5 + max(first) + 1  # the run ends when the last sequence stops
    one = model.generate(PROMPT[:1], 12, eos_token_id=stop)  # eos_token_id is a stop token
    assert torch.equal(one, greedy[:1, :5 + first[0] + 1])
    repeated = model.generate(PROMPT, 12, stop_tokens=stop)
    assert all(bool((row[5 + h:] == stop).all()) for row, h in zip(repeated, first) if h is not None)


def test_prefill_and_decode_one_token_are_the_cached_forward_pass():
    model = tiny()
    cache = model.make_cache(2, 8)
    with torch.no_grad():
        logits = prefill(model, PROMPT, cache)
        torch.testing.assert_close(logits, model(PROMPT)[:, -1], atol=1e-5, rtol=1e-5)
        nxt = logits.argmax(-1)
        step = decode_one_token(model, nxt, cache)
        torch.testing.assert_close(step, model(torch.cat([PROMPT, nxt[:, None]], 1))[:, -1], atol=1e-5, rtol=1e-5)
    assert cache.length == 6


# --- steering: hooks during generate -------------------------------------------------------------------------
def _manual_loop(model, prompt, n, hooks, *, seed=None, temperature=0.0, top_k=None):
    """The reference: a full forward pass per token with the hooks attached, no cache."""
    g = None if seed is None else torch.Generator().manual_seed(seed)
    ids = prompt
    with torch.no_grad(), model.hooks(hooks):
        for _ in range(n):
            logits = model(ids)[:, -1]
            nxt = sample(logits, temperature=temperature, top_k=top_k, generator=g)
            ids = torch.cat([ids, nxt[:, None]], dim=1)  # [B, T + 1]
    return ids


def test_adding_a_vector_at_a_layer_during_generate_equals_a_manual_forward_loop_with_the_same_hook():
    model = tiny()
    steer = 4.0 * torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(5))
    hooks = [("blocks.0.hook_resid_post", lambda x, hook: x + steer)]
    with model.hooks(hooks):
        steered = model.generate(PROMPT, 10)
    assert torch.equal(steered, _manual_loop(model, PROMPT, 10, hooks))
    assert not torch.equal(steered, model.generate(PROMPT, 10))  # the vector changed the tokens
    with model.hooks(hooks):
        sampled = model.generate(PROMPT, 10, temperature=1.0, top_k=8, seed=2)
    assert torch.equal(sampled, _manual_loop(model, PROMPT, 10, hooks, seed=2, temperature=1.0, top_k=8))
    with model.decoding(batch_size=2), model.hooks(hooks):  # inside decoding() too
        assert torch.equal(model.generate(PROMPT, 10), steered)


def test_ablating_a_head_during_generate_equals_a_manual_forward_loop_and_head_gates():
    model = tiny()

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, 3] = 0  # [B, T, H, D]: head 3 writes nothing
        return z

    hooks = [("blocks.1.attn.hook_z", zero_head)]
    with model.hooks(hooks):
        ablated = model.generate(PROMPT, 10)
    assert torch.equal(ablated, _manual_loop(model, PROMPT, 10, hooks))
    gates = torch.ones(2, 8)
    gates[1, 3] = 0.0
    model.set_head_gates(gates)
    assert torch.equal(model.generate(PROMPT, 10), ablated)
    model.set_head_gates(None)


# --- the trace of a generation -------------------------------------------------------------------------------
def test_return_trace_records_the_activations_that_chose_each_token():
    model = tiny()
    steer = 4.0 * torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(6))
    with model.hooks([("blocks.0.hook_resid_post", lambda x, hook: x + steer)]):
        ids, trace = model.generate(PROMPT, 6, return_trace=True, trace_filter="blocks.*.hook_resid_post")
    assert trace.keys() == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    resid = trace["blocks.1.hook_resid_post"]  # [B, T + 6, M], the steered run's
    assert resid.shape == (2, 11, model.cfg.d_model)
    with torch.no_grad():
        chosen = model.unembed(model.ln_final(resid[:, 4:-1])).argmax(-1)  # the logits at each generating position
    assert torch.equal(chosen, ids[:, 5:])
    only_ids = model.generate(PROMPT, 6)
    assert not torch.equal(only_ids, ids)  # the trace is of the steered generation, hooks included


# --- the same sampling as Hugging Face's ---------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, top_k=20, top_p=0.9),
])
def test_sampling_equals_hugging_face_under_the_same_processors_and_seed(kw):
    transformers = pytest.importorskip("transformers")
    from interp.zoo.hf import from_hf

    cfg = transformers.LlamaConfig(vocab_size=103, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
                                   rope_theta=500.0, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=None,
                                   pad_token_id=0)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2)
    model = from_hf(hf)
    prompt = torch.randint(1, 103, (3, 5), generator=torch.Generator().manual_seed(1))
    hf_kw = dict(temperature=kw["temperature"], top_k=kw.get("top_k", 0), top_p=kw.get("top_p", 1.0))
    torch.manual_seed(11)
    ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=True,
                      eos_token_id=None, pad_token_id=0, **hf_kw)
    ours = model.generate(prompt, 16, seed=11, **kw)
    assert torch.equal(ours, ref), (ours, ref)
    assert len(set(ours[:, 5:].flatten().tolist())) > 5  # a varied sample, not a constant one
    torch.manual_seed(11)  # seed=None draws from torch's global generator, as HF does
    assert torch.equal(model.generate(prompt, 16, **kw), ref)
    assert torch.equal(generate(model, prompt, 16, seed=11, **kw), ref)
