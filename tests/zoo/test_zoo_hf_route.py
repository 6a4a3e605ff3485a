"""The attention-level route (interp.zoo.hf_route) against transformers, on random tiny configs with every
parameter re-drawn: families without a native converter (a gpt-oss with sinks and a banded layer, a hybrid whose
convolution layers pass through untouched) match transformers' own forward, its eager patterns, a head zeroed by
hand in o_proj's input and a naive patching loop; on native families it agrees with the native model; the
analyses run on it; what it cannot do is refused by name."""

import copy
import warnings

import pytest
import torch

from interp.zoo.hf import CONVERTERS, _register_dense_families, from_hf

transformers = pytest.importorskip("transformers")

from route_configs import HYBRIDS, ISSUE_FAMILIES, V, tiny_hf  # noqa: E402

from interp.zoo import hf_route  # noqa: E402
from interp.zoo.compat import hf_test_model  # noqa: E402

T = 9  # longer than the windows (4) and chunks (4) of the test configs
# Route checks against transformers (olmo, gptj, opt and cohere2 have native converters now: these still test the
# route itself, wrapped directly); gpt-oss runs eager (transformers has no SDPA path for its sinks).
# apertus and lfm2 (a hybrid) have no native converter; olmo, gptj, opt, cohere2, gpt_oss, nemotron, granitemoe
# and phimoe do now, and stay here as route checks on families whose native conversion is tested against them.
ROUTED = {"olmo": "sdpa", "gptj": "sdpa", "opt": "sdpa", "cohere2": "sdpa", "gpt_oss": "eager", "lfm2": "sdpa",
          "apertus": "sdpa", "nemotron": "sdpa", "granitemoe": "sdpa", "phimoe": "sdpa"}
# transformers computes these families' attention in their own code, not through AttentionInterface.
OWN_ATTENTION = {"gpt_neo", "bloom", "mpt"}


def _route(model_type, impl):
    hf = tiny_hf(model_type, impl)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf_route.wrap(copy.deepcopy(hf)), hf


def _o_proj(module):
    return hf_route._output_projection(module, module._interp_route.n_heads * module._interp_route.d_head)


def _attn_modules(hf):
    return [m for m in hf.modules() if "_interp_route" in m.__dict__]


def _ids(seed=3, n=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, V, (n, T), generator=g)


@pytest.mark.parametrize("model_type", sorted(ROUTED))
def test_route_logits_patterns_and_ablation_match_transformers(model_type):
    model, hf = _route(model_type, ROUTED[model_type])
    assert model.native is False and isinstance(model, hf_route.RouteModel)
    eager = copy.deepcopy(hf)
    eager.set_attn_implementation("eager")
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(model(ids), hf(ids).logits)  # nothing hooked: transformers' forward to the bit
        ref = eager(ids, output_attentions=True)
        logits, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
    torch.testing.assert_close(logits, ref.logits, rtol=0, atol=1e-5)
    attn_layers = [i for i, h in enumerate(model.cfg.layer_n_heads) if h]
    assert len(attn_layers) == sum(a is not None for a in ref.attentions) >= 1
    for layer, pattern in zip(attn_layers, [a for a in ref.attentions if a is not None]):
        torch.testing.assert_close(trace.pattern(layer), pattern, rtol=0, atol=1e-6)
    if model_type == "lfm2":  # the convolution layers have no heads and run as transformers runs them
        assert model.cfg.layer_n_heads == [0, 5, 0]
    # Head ablation by gate == zeroing that head's slice of o_proj's input in plain transformers.
    layer = attn_layers[-1]
    H, D = model.cfg.layer(layer).n_heads, model.blocks[layer].attn.d_head
    gates = [torch.ones(model.cfg.layer(i).n_heads) for i in range(model.cfg.n_layers)]
    gates[layer][2] = 0.0
    model.set_head_gates(gates)
    with torch.no_grad():
        gated = model(ids)
    model.set_head_gates(None)
    hand = copy.deepcopy(hf)
    o_proj = [_o_proj(m) for m in _attn_modules(model.hf)][attn_layers.index(layer)]
    name = next(n for n, m in model.hf.named_modules() if m is o_proj)

    def zero_head(_m, args):
        x = args[0].clone()
        x[..., 2 * D:3 * D] = 0
        return (x,)

    hand.get_submodule(name).register_forward_pre_hook(zero_head)
    with torch.no_grad():
        want = hand(ids).logits
    torch.testing.assert_close(gated, want, rtol=0, atol=1e-6)
    assert (gated - model(ids)).abs().max() > 1e-3  # the head matters: the comparison can fail
    assert H == 5


@pytest.mark.parametrize("model_type", sorted(ROUTED))
def test_route_patching_table_equals_a_naive_loop(model_type):
    from interp.analysis.patching import activation_patching, attribution_patching, logit_diff_metric

    model, hf = _route(model_type, ROUTED[model_type])
    clean, corrupted = _ids(1), _ids(2)
    answers = torch.tensor([[5, 7], [11, 13]])
    df = activation_patching(model, clean, corrupted, act="z", by="head", answer_tokens=answers, progress=False)
    # Naive: plain transformers, each head's slice of o_proj's input replaced by the corrupted run's.
    o_names = [next(n for n, m in model.hf.named_modules() if m is _o_proj(a)) for a in _attn_modules(model.hf)]
    ref = copy.deepcopy(hf)
    saved = {}
    handles = [ref.get_submodule(n).register_forward_pre_hook(
        lambda _m, args, n=n: saved.__setitem__(n, args[0].detach().clone())) for n in o_names]
    with torch.no_grad():
        ref(corrupted)
    for h in handles:
        h.remove()
    metric = logit_diff_metric(answers)
    rows = []
    attn_layers = [i for i, h in enumerate(model.cfg.layer_n_heads) if h]  # a hybrid's conv layers have none
    for layer, n in zip(attn_layers, o_names):
        D = model.blocks[layer].attn.d_head
        for head in range(model.cfg.layer(layer).n_heads):
            def patch(_m, args, n=n, head=head, D=D):
                x = args[0].clone()
                x[..., head * D:(head + 1) * D] = saved[n][..., head * D:(head + 1) * D]
                return (x,)
            h = ref.get_submodule(n).register_forward_pre_hook(patch)
            with torch.no_grad():
                rows.append(float(metric(ref(clean).logits)))
            h.remove()
    assert len(rows) == len(df)
    torch.testing.assert_close(torch.tensor(df["metric"].tolist()), torch.tensor(rows), rtol=0, atol=1e-5)
    assert torch.tensor(rows).std() > 1e-3
    attr = attribution_patching(model, clean, corrupted, act="z", by="head", answer_tokens=answers, progress=False)
    assert attr[["layer", "head"]].equals(df[["layer", "head"]]) and attr["metric"].notna().all()


@pytest.mark.parametrize("name", ["llama3", "gemma2", "gpt_neox"])
def test_route_agrees_with_the_native_model(name):
    from interp.analysis.patching import activation_patching

    # float64: the two routes order their sums differently (a fused W_qkv, rotary in place); in float32 head
    # writes of Gemma 2's sqrt(d_model)-scaled residual differ by float32 rounding (1.5e-5 on values near 1).
    hf = hf_test_model(name).double()
    native = from_hf(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        route = hf_route.wrap(copy.deepcopy(hf))
    assert native.native and not route.native
    ids = _ids(4)
    names = ["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_result", "blocks.*.attn.hook_z"]
    with torch.no_grad():
        lr, tr = route.run_with_cache(ids, names_filter=names)
        ln, tn = native.run_with_cache(ids, names_filter=names)
    torch.testing.assert_close(lr, ln, rtol=0, atol=1e-4)
    for layer in range(native.cfg.n_layers):
        torch.testing.assert_close(tr.pattern(layer), tn.pattern(layer), rtol=0, atol=1e-5)
        torch.testing.assert_close(tr.head_out(layer), tn.head_out(layer), rtol=0, atol=1e-5)
    clean, corrupted, answers = _ids(1), _ids(2), torch.tensor([[5, 7], [11, 13]])
    kw = dict(act="z", by="head", answer_tokens=answers, progress=False)
    a, b = activation_patching(route, clean, corrupted, **kw), activation_patching(native, clean, corrupted, **kw)
    torch.testing.assert_close(torch.tensor(a["metric"].tolist()), torch.tensor(b["metric"].tolist()),
                               rtol=0, atol=1e-5)


def test_hook_result_replaces_the_output_projection():
    """A hook on hook_result edits each head's write: zeroing head h there equals gating it off."""
    model, _ = _route("olmo", "sdpa")
    ids = _ids()

    def zero(result, hook):
        result = result.clone()
        result[:, :, 1] = 0
        return result

    with torch.no_grad():
        hooked = model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_result", zero)])
        model.set_head_gates(torch.tensor([[1.0, 0, 1, 1, 1], [1.0] * 5]))
        gated = model(ids)
        model.set_head_gates(None)
        plain = model(ids)
    torch.testing.assert_close(hooked, gated, rtol=0, atol=1e-5)
    assert (hooked - plain).abs().max() > 1e-3


def _native_and_route(name="llama3"):
    hf = hf_test_model(name).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_hf(hf), hf_route.wrap(copy.deepcopy(hf))


def _frames_close(a, b):
    import pandas as pd

    # HF's RMSNorm computes in float32 even in a float64 model: the two routes agree to float32 rounding.
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=False,
                                  rtol=1e-5, atol=1e-6)


def test_analyses_on_the_route_equal_the_native_models():
    from interp.analysis.ablate import ablate_heads
    from interp.analysis.attribution import direct_logit_attribution
    from interp.analysis.induction import induction_scores
    from interp.analysis.patching import attribution_patching
    from interp.analysis.positional import positional_scores
    from interp.analysis.taxonomy import classify_heads
    from interp.viz.attention_view import attention_view

    native, route = _native_and_route()
    ids = _ids(5, n=4)
    for fn in (lambda m: induction_scores(m, n_seqs=4, half_len=6, copying=False, progress=False),
               lambda m: positional_scores(m, ids),
               lambda m: attribution_patching(m, _ids(1), _ids(2), answer_tokens=torch.tensor([[5, 7], [11, 13]]),
                                              progress=False)):
        a, b = fn(route), fn(native)
        assert len(a) == 10
        _frames_close(a, b)
    da, db = (direct_logit_attribution(m, ids, torch.tensor([5, 7])) for m in (route, native))
    _frames_close(da, db[db["component"] != "unembed bias"])  # the native model's zero unembedding bias
    ra, rb = (classify_heads(m, tokens=ids, n_seqs=4, progress=False) for m in (route, native))
    _frames_close(ra.df, rb.df)
    for method, reference in (("mean", ids), ("resample", _ids(9, n=4))):
        out = []
        for m in (route, native):
            with torch.no_grad():
                before = m(ids)
                with ablate_heads(m, [(1, 0)], method, reference=reference):
                    out.append(m(ids))
                assert torch.equal(m(ids), before)  # the hooks are gone afterwards
        # The reference means are float32 sums (MeanReducer): float32 rounding of the float64 z's, 1e-5 apart.
        torch.testing.assert_close(out[0], out[1], rtol=0, atol=1e-5)
        assert (out[0] - before).abs().max() > 1e-4
    assert attention_view(route, ids[0]) is not None


def test_refusals_name_the_route():
    from interp.analysis.composition import composition_scores
    from interp.pruning.surgery import remove_heads

    model, _ = _route("olmo", "sdpa")
    for fn in (lambda: remove_heads(model, [(0, 1)]), lambda: model.W_Q, lambda: composition_scores(model),
               lambda: model.make_cache(1), lambda: model.generate(_ids(), 2), lambda: model.set_query_chunk(4)):
        with pytest.raises((TypeError, ValueError), match="attention-level route"):
            fn()
    hf = tiny_hf("bloom", "eager")
    with pytest.raises(ValueError, match="AttentionInterface"):
        hf_route.wrap(hf)
    with pytest.raises(ValueError, match="already wrapped"):
        hf_route.wrap(model.hf)


def test_load_falls_back_to_the_route_and_says_so_once():
    import interp

    hf_route._WARNED.discard("apertus")
    with pytest.warns(UserWarning, match="attention-level route"):
        model = interp.load(tiny_hf("apertus"))
    assert model.native is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        interp.load(tiny_hf("apertus"))  # once per family
    assert interp.load(hf_test_model("olmo2")).native  # a family with a converter stays native


#: Settings of the test configs above that a native converter refuses (not implemented natively): per-head
#: LayerNorms on queries and keys.
ROUTE_ONLY_SETTINGS = {"stablelm": "stablelm qk_layernorm=True is not supported",
                       "cohere": "cohere use_qk_norm=True is not supported"}


@pytest.mark.parametrize("model_type", sorted(ISSUE_FAMILIES) + sorted(HYBRIDS))
def test_every_family_of_the_issue_loads_natively_or_through_the_route(model_type):
    """Each of the 28 families (and the hybrid) loads natively or on the route, with transformers' logits; the
    three whose attention transformers computes in its own code (not through AttentionInterface) need a native
    converter (BLOOM, MPT and GPT-Neo have one) and would be refused by name without it."""
    _register_dense_families()
    assert len(ISSUE_FAMILIES) == 28
    hf = tiny_hf(model_type, "eager" if model_type in ("gpt_oss", *OWN_ATTENTION) else "sdpa")
    if model_type in OWN_ATTENTION and model_type not in CONVERTERS:
        with pytest.raises(ValueError, match=f"model_type='{model_type}'.*AttentionInterface.*native converter"):
            from_hf(hf)
        return
    with torch.no_grad():
        want = hf(_ids(n=1)).logits
    refused = ROUTE_ONLY_SETTINGS.get(model_type)
    if refused is not None:  # the native converter refuses this config's setting by name; the route takes it
        with pytest.raises(ValueError, match=refused):
            from_hf(hf)
        model = hf_route.wrap(hf)
        assert model.native is False
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = from_hf(hf)
        assert model.native == (model_type in CONVERTERS)
    with torch.no_grad():
        torch.testing.assert_close(model(_ids(n=1)), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("model_type", ["olmo", "starcoder2", "cohere2", "granite", "lfm2"])
def test_direct_logit_attribution_through_the_models_own_norm_and_unembedding(model_type):
    """Where each layer adds its attention and MLP outputs as they are and the logits are the unembedded final
    norm (OLMo's non-parametric LayerNorm, StarCoder 2's LayerNorm with bias), DLA's parts sum to transformers'
    logit difference; where they are not (Cohere 2's logit scale, Granite's multipliers, a hybrid's
    convolutions), DLA is refused by name."""
    from interp.analysis.attribution import direct_logit_attribution

    model, hf = _route(model_type, "sdpa")
    ids, answers = _ids(8), torch.tensor([[5, 7], [11, 13]])
    if model_type in ("cohere2", "granite", "lfm2"):
        assert model.cfg.sublayer_norm != "input"
        with pytest.raises(ValueError, match="attention-level route"):
            direct_logit_attribution(model, ids, answers)
        return
    df = direct_logit_attribution(model, ids, answers)
    with torch.no_grad():
        logits = hf(ids).logits[:, -1]
    want = (logits.gather(1, answers[:, :1]) - logits.gather(1, answers[:, 1:])).mean()
    assert abs(df.attrs["logit_diff"] - float(want)) < 1e-5
    assert abs(df["attribution"].sum() - float(want)) < 1e-4
    assert (df["kind"] == "head").sum() == 10 and (df["kind"] == "mlp").sum() == 2


@pytest.mark.slow  # classify_heads' default workload
def test_cli_classifies_the_heads_of_a_folder_on_the_route(tmp_path, capsys):
    """``interp heads --model FOLDER`` on a family without a converter: the folder loads on the route (the
    warning names it) and the CLI classifies its heads."""
    import json

    from helpers import run_cli

    hf = tiny_hf("apertus")
    hf.save_pretrained(tmp_path / "apertus")
    hf_route._WARNED.discard("apertus")
    with pytest.warns(UserWarning, match="attention-level route"):
        code, out, err = run_cli(capsys, "heads", "--model", str(tmp_path / "apertus"), "--json", "--no-progress")
    assert code == 0, err
    rows = json.loads(out)
    assert all(0 <= r["layer"] < 2 and 0 <= r["head"] < 5 for r in rows)


@pytest.mark.slow  # a Streamlit app run
def test_the_dashboard_draws_a_route_models_patterns(tmp_path, monkeypatch):
    """A saved OLMo folder typed into the dashboard's Hugging Face box loads (natively since OLMo has a converter)
    and the attention page draws the pattern the route records for the same weights (the two agree)."""
    pytest.importorskip("streamlit")
    import base64
    import json

    import numpy as np
    from helpers import word_tokenizer
    from streamlit.testing.v1 import AppTest

    from interp.app import DASHBOARD

    hf = tiny_hf("olmo")
    hf.save_pretrained(tmp_path / "olmo")
    word_tokenizer(V).save_pretrained(tmp_path / "olmo")
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(tmp_path))
    at = AppTest.from_file(str(DASHBOARD), default_timeout=300)
    at.query_params["model"] = "Hugging Face name"
    at.run()
    at.sidebar.text_input(key="hf_name").set_value("./olmo")
    at.run()
    assert not at.exception, at.exception
    text = "w1 w2 w3 w4 w1 w2 w3 w4"
    at.sidebar.text_area(key="text").set_value(text)
    at.selectbox(key="attn_layer").set_value(1)
    at.selectbox(key="attn_head").set_value(3)
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    fig = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if c.key == "fig_attn_head")
    z = fig["data"][0]["z"]
    if isinstance(z, dict):  # plotly's base64 array
        z = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(
            [int(n) for n in str(z["shape"]).split(",")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf_route.wrap(tiny_hf("olmo"), tokenizer=word_tokenizer(V))
    ids = model.to_tokens(text)
    with torch.no_grad():
        _, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
    np.testing.assert_allclose(np.asarray(z, dtype=float), trace.pattern(1)[0, 3].numpy(), atol=1e-5)


@pytest.mark.parametrize("model_type", ["apertus", "lfm2"])
def test_families_without_a_converter_take_the_route(model_type):
    """The route's exactness tests above cover these families because interp has no native converter for them."""
    import interp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = interp.load(tiny_hf(model_type, ROUTED[model_type]))
    assert model.native is False
