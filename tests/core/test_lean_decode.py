"""LeanDecoder, the hook-free decode step traced from the model's own blocks: each step's logits and cache writes
equal the hooked forward pass with a KV cache (an independent path through the modules), for every shape it
accepts and over every weight layout; generate uses it only while nothing could observe the difference, and
the tokens it generates are always those of the current weights, however they were edited."""

from __future__ import annotations

import copy

import pytest
import torch
from core_helpers import make
from torch import nn

import interp.decode as decode_mod
from interp.config import alibi_slopes
from interp.decode import DecodeLayout, LeanDecoder

needs_mkl = pytest.mark.skipif(not decode_mod._mkl_packing_available(), reason="this torch build has no MKL packed sgemm")

LLAMA = dict(n_kv_heads=4, positional="rotary", normalization="rms", activation="swiglu", attn_bias=False,
             out_bias=False, mlp_bias=False)
SHAPES = {
    "gqa": {},
    "mqa": dict(n_kv_heads=1),
    "mha-biases": dict(n_kv_heads=8, attn_bias=True, out_bias=True, mlp_bias=True),  # Qwen-style biases too
    "partial-rotary": dict(rotary_dim=4),
    "ungated-mlp": dict(activation="gelu"),
    "attn-only": dict(attn_only=True),
    "per-layer-heads": dict(n_heads=8, n_kv_heads=4, layer_n_heads=[6, 2], layer_n_kv_heads=[3, 1]),
    "untied-geglu": dict(activation="geglu", tie_embeddings=False),
    # The unembedding shares the embedding's weight (SmolLM2, Gemma): traced under the embedding's name, it is
    # still the output head's own product over the layout.
    "tied": dict(tie_embeddings=True),
    # Families a hand-written llama step did not cover: the traced blocks do.
    "layernorm-rotary": dict(normalization="pre"),
    "unequal-kv-groups": dict(n_heads=8, n_kv_heads=4, layer_n_heads=[5, 8], layer_n_kv_heads=[3, 4],
                              layer_kv_map=[[0, 0, 1, 2, 2], None]),
    # ALiBi (BLOOM / MPT): 6 heads, so the slopes include the interleaved extra ones; per layer after surgery
    "alibi": dict(positional="none", n_heads=6, n_kv_heads=6, alibi_slopes=alibi_slopes(6)),
    "alibi-per-layer": dict(positional="none", n_heads=6, n_kv_heads=6, layer_n_heads=[4, 6],
                            alibi_slopes=[alibi_slopes(6)[2:], alibi_slopes(6)]),
    # Block layouts and attention details of the newer families, each traced from the same blocks
    "qk-norm-per-head": dict(qk_norm="head"),  # Qwen3, Gemma 3
    "qk-norm-whole": dict(qk_norm="full"),  # OLMo 2
    "sandwich-norms": dict(sublayer_norm="sandwich"),  # Gemma 2 / 3
    "output-norms": dict(sublayer_norm="output"),  # OLMo 2
    "parallel-one-norm": dict(parallel_block="one_norm", normalization="pre"),  # GPT-J, Falcon
    "parallel-two-norms": dict(parallel_block="two_norms", normalization="pre"),  # GPT-NeoX
    "attn-scale-and-nope": dict(attn_scale=0.3, nope_layers=[1]),  # Gemma 2's scalar; SmolLM3's NoPE layers
    "clamped-swiglu": dict(activation="swiglu_clamped", swiglu_alpha=1.5, swiglu_limit=0.5),  # gpt-oss
    # Sliding windows shorter than the 9-token test (Mistral), local and global layers with their own RoPE
    # bases (Gemma 3): a windowed layer's cache hands the step exactly its window's keys
    "sliding-window": dict(sliding_window=4),
    "local-global-layers": dict(sliding_window=[3, None], local_rotary_base=100.0),
    # Llama 4: chunked layers (a chunk boundary falls inside the decoded steps) and a NoPE layer with its
    # temperature tuning
    "chunks-and-nope-temperature": dict(attention_chunk=[3, None], nope_layers=[1], nope_temperature=[2.0, 3.0]),
    # Mixtures of experts: the MoE module runs its own forward at each step (its routing branches on data)
    "moe": dict(n_experts=4, n_experts_per_token=2, d_expert=16),
    "moe-shared-gated": dict(n_experts=4, n_experts_per_token=2, d_expert=16, d_shared_expert=8,
                             shared_expert_gate=True),  # Qwen-MoE
    "moe-gpt-oss": dict(n_experts=4, n_experts_per_token=2, d_expert=16, router_logit_bias=True, expert_bias=True,
                        activation="swiglu_clamped", swiglu_limit=0.5, router_renormalize=True),
    "moe-deepseek-v3": dict(n_experts=8, n_experts_per_token=2, d_expert=16, router_score="sigmoid",
                            router_groups=4, router_topk_groups=2, router_choice_bias=True, routed_scaling=2.5,
                            router_renormalize=True, d_shared_expert=8, dense_mlp_layers=[0]),
    "moe-llama4": dict(n_experts=4, n_experts_per_token=1, d_expert=16, expert_input_weighting=True,
                       router_score="sigmoid", d_shared_expert=8),
    "moe-phimoe": dict(n_experts=4, n_experts_per_token=2, d_expert=16, router_score="sparsemixer",
                       sparsemixer_eps=0.1),
}


def llama(shape: str, **over):
    return make("mha", **{**LLAMA, **SHAPES[shape], **over})


def _count_lean_steps(monkeypatch) -> list[int]:
    calls = []
    real = LeanDecoder.step
    monkeypatch.setattr(LeanDecoder, "step", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


def _layout(model, kind: str, rows: int) -> DecodeLayout:
    if kind == "plain":
        return DecodeLayout.plain(model, rows)
    return DecodeLayout.build(model, rows, held=kind == "held")


def _step_equals_hooked(model, rows: int, layout: DecodeLayout, atol: float = 1e-5) -> None:
    tokens = torch.randint(0, 37, (rows, 9), generator=torch.Generator().manual_seed(1))
    hooked, lean_cache = model.make_cache(rows, 9), model.make_cache(rows, 9)
    with torch.no_grad():
        decoder = LeanDecoder.build(model, layout)
        assert decoder is not None and decoder.usable(rows)
        model(tokens[:, :4], kv_cache=hooked)
        model(tokens[:, :4], kv_cache=lean_cache)
        for t in range(4, 9):
            want = model(tokens[:, t:t + 1], kv_cache=hooked)[:, -1]  # [rows, V]
            got = decoder.step(tokens[:, t], lean_cache)
            torch.testing.assert_close(got, want, atol=atol, rtol=atol)
            assert lean_cache.length == hooked.length == t + 1
        for a, b in zip(lean_cache.layers, hooked.layers):
            for x, y in zip(a.buffers, b.buffers):
                torch.testing.assert_close(x, y, atol=atol, rtol=atol)


@pytest.mark.parametrize(("layout", "rows"), [
    ("copies", 1),  # a generate call's own transposed copies
    ("copies", decode_mod.PACK_MIN_ROWS + 1),  # MKL-packed copies
    ("held", 1),  # decoding(): the parameters themselves stored transposed
    ("held", decode_mod.PACK_MIN_ROWS + 1),  # decoding(): packed copies with a fingerprint
    ("plain", 1), ("plain", 3),  # the weights themselves, as generate() runs without copies
])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_step_equals_the_hooked_cached_forward(shape, layout, rows):
    if layout != "plain" and not decode_mod._mkl_packing_available():
        pytest.skip("this torch build has no MKL packed sgemm")
    model = llama(shape)
    laid = _layout(model, layout, rows)
    try:
        assert (len(laid) > 0) == (layout != "plain")
        _step_equals_hooked(model, rows, laid)
    finally:
        laid.release()
    assert all(p.is_contiguous() for p in model.parameters())


@pytest.mark.parametrize("variant", ["mla", "gqa-rotary"])
def test_latent_attention_steps_equal_the_hooked_cached_forward(variant):
    model = make(variant)
    _step_equals_hooked(model, 2, DecodeLayout.plain(model, 2))


def test_the_trace_is_kept_across_generate_calls_and_made_again_when_a_setting_changes(monkeypatch):
    model = make("mla")
    traces = []
    real = decode_mod._trace
    monkeypatch.setattr(decode_mod, "_trace", lambda m: traces.append(1) or real(m))
    prompt = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(3))
    absorbed = model.generate(prompt, 6)
    assert torch.equal(model.generate(prompt, 6), absorbed) and len(traces) == 1  # tracing costs more than a step
    for block in model.blocks:  # the MLA switch between its two decode paths: a plain attribute of each block
        block.attn.decode_path = "expanded"
    expanded = model.generate(prompt, 6)
    assert len(traces) == 2  # the switch is seen: a new trace, made with the expanded path
    assert ("decode_path", "expanded") in model._decode_trace.settings[list(model.modules()).index(model.blocks[0].attn)]
    assert torch.equal(expanded, absorbed)  # the same tokens by either path


@needs_mkl
@pytest.mark.parametrize("rows", [1, 5])
def test_generate_inside_decoding_runs_lean_steps_and_equals_the_hooked_and_full_paths(rows, monkeypatch):
    model = llama("gqa")
    prompt = torch.randint(0, 37, (rows, 4), generator=torch.Generator().manual_seed(2))
    plain = model.generate(prompt, 8, pack_weights=False)
    full = model.generate(prompt, 8, use_cache=False)
    calls = _count_lean_steps(monkeypatch)
    with model.decoding(batch_size=rows):
        assert torch.equal(model.generate(prompt, 8), plain)
        assert len(calls) == 7  # every step past the prompt
        with model.decoding(batch_size=rows):  # nested: the outer layout serves, nothing is rebuilt
            assert torch.equal(model.generate(prompt, 8), plain)
    assert torch.equal(plain, full)
    assert model._decode_layout is None and not any("forward" in m.__dict__ for m in model.modules())
    assert all(p.is_contiguous() for p in model.parameters())


@needs_mkl
def test_hooks_and_gates_make_every_step_the_hooked_pass(monkeypatch):
    model = llama("gqa")
    prompt = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(3))
    gates = torch.ones(2, 8)
    gates[1, 3] = 0.0
    plain = model.generate(prompt, 6, pack_weights=False)
    model.set_head_gates(gates)
    plain_gated = model.generate(prompt, 6, pack_weights=False)
    model.set_head_gates(None)
    assert not torch.equal(plain, plain_gated)  # the gate changes the tokens, so the check below has teeth
    calls = _count_lean_steps(monkeypatch)
    fired = []
    with model.decoding(batch_size=1):
        with model.hooks([("blocks.1.hook_resid_post", lambda x, hook: fired.append(x.shape[1]))]):
            assert torch.equal(model.generate(prompt, 6), plain)
        assert fired == [4, 1, 1, 1, 1, 1] and calls == []  # the hook saw the prompt and every step
        model.set_head_gates(gates)
        assert torch.equal(model.generate(prompt, 6), plain_gated) and calls == []
        model.set_head_gates(None)
        handle = model.blocks[0].mlp.register_forward_hook(lambda mod, args, out: fired.append("torch"))
        model.generate(prompt, 3)
        handle.remove()
        assert fired[-3:] == ["torch"] * 3 and calls == []  # torch's own module hooks are not skipped either
        model.generate(prompt, 3)
        assert len(calls) == 2


def _edits():
    """Every way a user edits a weight: (name, function(model) that edits it)."""
    def data_mul(m):
        m.blocks[1].mlp.W_out.weight.data.mul_(-4.0)  # behind the parameter's version counter

    def data_copy(m):
        w = m.blocks[0].attn.W_qkv.weight
        w.data.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(9)))

    def data_rebind(m):
        w = m.blocks[0].attn.W_O.weight
        w.data = torch.randn(w.shape, generator=torch.Generator().manual_seed(10))

    def no_grad_mul(m):
        with torch.no_grad():
            m.blocks[1].attn.W_qkv.weight.mul_(3.0)

    def new_parameter(m):
        w = m.blocks[1].mlp.W_in.weight
        m.blocks[1].mlp.W_in.weight = nn.Parameter(torch.randn(w.shape, generator=torch.Generator().manual_seed(11)))

    def unembedding_zeroed(m):
        m.unembed.weight.data[:, :16] = 0  # the tied embedding too: a slice of it, through .data

    return {f.__name__: f for f in (data_mul, data_copy, data_rebind, no_grad_mul, new_parameter, unembedding_zeroed)}


@pytest.mark.parametrize("rows", [1, decode_mod.PACK_MIN_ROWS + 1])
@pytest.mark.parametrize("edit", sorted(_edits()))
def test_generate_inside_decoding_sees_every_kind_of_weight_edit(edit, rows):
    model = llama("gqa")
    prompt = torch.randint(0, 37, (rows, 4), generator=torch.Generator().manual_seed(3))
    edited = copy.deepcopy(model)
    _edits()[edit](edited)
    want = edited.generate(prompt, 8, pack_weights=False)  # the edited weights' tokens, no layout at all
    assert not torch.equal(want, model.generate(prompt, 8, pack_weights=False))  # the edit changes the tokens
    with model.decoding(batch_size=rows):
        model.generate(prompt, 8)  # the layout is in use before the edit
        _edits()[edit](model)
        assert torch.equal(model.generate(prompt, 8), want)
    assert torch.equal(model.generate(prompt, 8), want)  # and after the block, which kept the edit


@pytest.mark.parametrize(("variant", "over", "reason"), [
    ("mla", dict(sliding_window=4), "sliding windows or chunks on latent attention"),
    ("mla", dict(attention_chunk=4), "sliding windows or chunks on latent attention"),
    ("gqa-rotary", dict(attn_softcap=5.0), "attn_softcap=5.0"),
    ("gqa-rotary", dict(causal=False, unembed=True), "not a causal decoder"),
    ("gqa-rotary", dict(use_sdpa=False), "use_sdpa=False"),
])
def test_models_it_does_not_cover_are_named_and_take_the_hooked_path(variant, over, reason, monkeypatch):
    model = make(variant, **over)
    assert reason in LeanDecoder.unsupported(model)
    assert LeanDecoder.build(model, DecodeLayout.plain(model, 1)) is None
    if model.cfg.causal:
        calls = _count_lean_steps(monkeypatch)
        prompt = torch.randint(0, 37, (1, 3), generator=torch.Generator().manual_seed(4))
        assert torch.equal(model.generate(prompt, 5), model.generate(prompt, 5, use_cache=False))
        assert calls == []


def test_a_layer_without_heads_keeps_the_hooked_path_and_counts_its_cache_positions(monkeypatch):
    model = llama("gqa", n_heads=8, n_kv_heads=4, layer_n_heads=[0, 2], layer_n_kv_heads=[0, 1])
    assert LeanDecoder.build(model, DecodeLayout.plain(model, 1)) is None  # its zero output does not trace
    calls = _count_lean_steps(monkeypatch)
    prompt = torch.randint(0, 37, (2, 3), generator=torch.Generator().manual_seed(4))
    assert torch.equal(model.generate(prompt, 5), model.generate(prompt, 5, use_cache=False)) and calls == []


def test_a_block_the_trace_cannot_hold_keeps_the_hooked_path(monkeypatch):
    # A block whose decode step reads the mask's positions (a window, say) must not have one step's numbers
    # frozen into the trace: tracing refuses it and generate keeps the hooked pass.
    model = llama("gqa")
    attn = model.blocks[1].attn
    real = type(attn).forward

    def windowed(self, x, *, mask, **kw):
        _ = mask.start  # what a sliding-window mask would read
        return real(self, x, mask=mask, **kw)

    monkeypatch.setattr(type(attn), "forward", windowed)
    assert LeanDecoder.build(model, DecodeLayout.plain(model, 1)) is None
    calls = _count_lean_steps(monkeypatch)
    prompt = torch.randint(0, 37, (1, 3), generator=torch.Generator().manual_seed(4))
    assert torch.equal(model.generate(prompt, 5), model.generate(prompt, 5, use_cache=False)) and calls == []


def test_without_copies_generate_runs_lean_steps_on_the_weights_themselves(monkeypatch):
    model = llama("gqa")
    prompt = torch.randint(0, 37, (2, 4), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        hooked = model.hooks([("blocks.0.hook_resid_pre", lambda x, hook: None)])  # forces the hooked pass
        with hooked:
            want = model.generate(prompt, 7, pack_weights=False)
    calls = _count_lean_steps(monkeypatch)
    assert torch.equal(model.generate(prompt, 7, pack_weights=False), want) and len(calls) == 6
    assert torch.equal(want, model.generate(prompt, 7, use_cache=False))


def test_a_module_replaced_after_the_trace_is_not_run_from_the_old_trace(monkeypatch):
    model = llama("gqa")
    prompt = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(5))
    with model.decoding(batch_size=1):
        model.generate(prompt, 4)  # the trace is made and kept with the layout
        replacement = copy.deepcopy(model.blocks[1].mlp)
        with torch.no_grad():
            replacement.W_out.weight.mul_(-3.0)
        model.blocks[1].mlp = replacement
        got = model.generate(prompt, 8)
    assert torch.equal(got, model.generate(prompt, 8, use_cache=False))


def test_bfloat16_models_decode_lean_on_their_own_weights():
    model = llama("gqa").to(torch.bfloat16)
    prompt = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(5))
    hooked, lean_cache = model.make_cache(1, 8), model.make_cache(1, 8)
    with torch.no_grad():
        decoder = LeanDecoder.build(model, DecodeLayout.plain(model, 1))
        model(prompt, kv_cache=hooked)
        model(prompt, kv_cache=lean_cache)
        nxt = torch.tensor([5])
        want = model(nxt[:, None], kv_cache=hooked)[:, -1]
        got = decoder.step(nxt, lean_cache)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_a_model_built_under_inference_mode_decodes_on_its_own_weights():
    # Inference tensors have no version counter and cannot be re-laid-out: no layout touches them, and the
    # lean step reads the weights themselves.
    with torch.inference_mode():
        model = llama("gqa")
        prompt = torch.randint(0, 37, (decode_mod.PACK_MIN_ROWS + 1, 3), generator=torch.Generator().manual_seed(6))
        full = model.generate(prompt, decode_mod.PACK_MIN_STEPS, use_cache=False)
        assert torch.equal(model.generate(prompt, decode_mod.PACK_MIN_STEPS), full)
        with model.decoding(batch_size=1) as m:
            assert len(m._decode_layout) == 0
            assert torch.equal(model.generate(prompt[:1], 5), full[:1, :8])


def test_a_step_that_raises_leaves_the_cache_as_it_found_it(monkeypatch):
    model = llama("gqa")
    cache = model.make_cache(1, 8)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), kv_cache=cache)
        decoder = LeanDecoder.build(model, DecodeLayout.plain(model, 1))
        leaf = decoder._leaves[-1]

        def boom(*a):
            raise RuntimeError("stop here")

        decoder._leaves[-1] = boom  # the last layer's rotary: layers before it have already written
        with pytest.raises(RuntimeError, match="stop here"):
            decoder.step(torch.tensor([4]), cache)
        assert cache.length == 3
        decoder._leaves[-1] = leaf
        torch.testing.assert_close(decoder.step(torch.tensor([4]), cache),
                                   model(torch.tensor([[1, 2, 3, 4]]))[:, -1], atol=1e-5, rtol=1e-5)


# The ends of the model: the step embeds and unembeds through the model's own methods, so each feature there is
# covered by the same code as the hooked pass (no second embedding to fall behind).
ENDS = {
    "learned-positions": dict(positional="learned"),
    "positions-from-mask": dict(positional="learned", positions_from_mask=True),  # OPT
    "embed-scale": dict(embed_scale=2.5),
    "embed-norm": dict(embed_norm=True),
    "token-types": dict(n_token_types=2),
    "final-softcap": dict(final_softcap=2.0),
    "gemma-like": dict(embed_scale=2.5, final_softcap=2.0, embed_norm=True),
}


@pytest.mark.parametrize("feature", sorted(ENDS))
def test_the_step_covers_the_models_own_embedding_and_head(feature, monkeypatch):
    model = llama("gqa", **ENDS[feature])
    assert LeanDecoder.unsupported(model) is None
    _step_equals_hooked(model, 2, DecodeLayout.plain(model, 2))
    calls = _count_lean_steps(monkeypatch)
    prompt = torch.randint(0, 37, (2, 4), generator=torch.Generator().manual_seed(5))
    assert torch.equal(model.generate(prompt, 6), model.generate(prompt, 6, use_cache=False))  # the plain forward
    assert len(calls) == 5  # every step past the prompt ran the traced step


def test_what_the_step_covers_is_an_allow_list_of_config_fields(monkeypatch):
    import dataclasses

    from interp import ModelConfig

    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert decode_mod._LEAN_COVERED <= fields  # no stale name
    # Any field outside the list that leaves its default is named, whatever it is: a field added to the config
    # later (played here by two covered ones taken off the list) is never trusted by omission.
    model = llama("gqa", qk_norm="head", parallel_block="two_norms", normalization="pre")
    assert LeanDecoder.unsupported(model) is None
    monkeypatch.setattr(decode_mod, "_LEAN_COVERED", decode_mod._LEAN_COVERED - {"qk_norm", "parallel_block"})
    why = LeanDecoder.unsupported(model)
    assert why is not None and "qk_norm='head'" in why and "parallel_block='two_norms'" in why
    assert LeanDecoder.build(model, DecodeLayout.plain(model, 1)) is None
