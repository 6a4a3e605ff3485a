"""KV cache & FLOPs: KV-cache memory per token and FLOPs per layer from a configuration (the selected model's,
or a worked example), with GQA, MQA and MLA derived from it. Works without a model."""

from __future__ import annotations

import hashlib

import streamlit as st

import interp
from interp import viz
from interp.app.page import Page, PageContext
from interp.flops import (
    DTYPE_BYTES,
    default_kv_groups,
    flops_per_layer,
    format_bytes,
    format_flops,
    gqa_group_options,
    kv_cache_table,
    worked_example_config,
)


def _config_from_inputs(prefix: str, preset: interp.ModelConfig) -> interp.ModelConfig:
    c = st.columns(4)
    n_layers = c[0].number_input("Layers", 1, 1000, preset.n_layers, key=f"{prefix}_layers")
    n_heads = c[1].number_input("Query heads", 1, 1024, preset.n_heads, key=f"{prefix}_heads")
    d_head = c[2].number_input("d_head", 1, 4096, preset.d_head, key=f"{prefix}_dhead")
    d_model = c[3].number_input("d_model", 1, 65536, preset.d_model, key=f"{prefix}_dmodel")
    c = st.columns(4)
    kv = c[0].number_input("KV heads (this model)", 1, 1024, preset.n_kv_heads, key=f"{prefix}_kv")
    d_mlp = c[1].number_input("d_mlp (0 = no MLP)", 0, 262144, 0 if preset.attn_only else preset.d_mlp,
                              key=f"{prefix}_dmlp")
    gated = c[2].checkbox("Gated MLP (SwiGLU)", preset.activation in ("swiglu", "geglu"), key=f"{prefix}_gated")
    rotary = c[3].checkbox("Rotary positions", preset.positional == "rotary", key=f"{prefix}_rotary")
    return interp.ModelConfig(
        n_layers=int(n_layers), d_model=int(d_model), n_heads=int(n_heads), d_head=int(d_head), n_kv_heads=int(kv),
        attn_only=d_mlp == 0, activation="swiglu" if gated else "gelu",
        d_mlp=int(d_mlp) or None,  # type: ignore[arg-type]  # None: the config derives it
        positional="rotary" if rotary else "learned", normalization="rms" if rotary else "pre",
        d_vocab=32000, n_ctx=1 << 20)


def render(ctx: PageContext) -> None:
    """Draw the page (the selected model, when there is one, is the first preset)."""
    model = ctx.model
    st.markdown("KV-cache memory per token and FLOPs per layer, from a configuration. The other attention kinds "
                "are derived from it: GQA with fewer KV heads, MQA with one, MLA caching a latent.")
    presets = {}
    if model is not None and model.cfg.attention == "standard":
        presets[f"This model ({model.name})"] = model.cfg  # first: the page starts from the selected model
    presets["Worked example: 80 layers, 64 heads x 128 (Llama-2-70B size)"] = worked_example_config()
    name = str(st.selectbox("Start from", list(presets), key="cost_preset"))
    prefix = "cost" + hashlib.md5(name.encode()).hexdigest()[:6]
    try:
        cfg = _config_from_inputs(prefix, presets[name])
    except (ValueError, TypeError) as e:
        st.error(f"Not a valid configuration: {e}")
        return
    c = st.columns(5)
    dtype = str(c[0].selectbox("dtype", ["fp16", "bf16", "fp32", "fp8"], key="cost_dtype"))
    batch = int(c[1].number_input("Batch", 1, 100000, 32, key="cost_batch"))
    tokens = int(c[2].number_input("Tokens per sequence", 1, 10_000_000, 4096, key="cost_tokens"))
    options = gqa_group_options(cfg.n_heads)
    own = cfg.n_kv_heads if cfg.kind == "gqa" else default_kv_groups(cfg.n_heads)
    groups = c[3].selectbox("GQA KV heads", options, index=options.index(own) if own in options else 0,
                            key=f"cost_groups_{cfg.n_heads}_{cfg.n_kv_heads}") if options else None
    # DeepSeek-V2's proportions: a latent of 4 x d_head (512 for d_head 128) plus a d_head / 2 rotary key. Keyed by
    # the head width so that a new starting model gets its own default, not the last one's.
    latent = int(c[4].number_input("MLA latent", 1, 65536, 4 * cfg.d_head, key=f"cost_latent_{cfg.d_head}",
                                   help="DeepSeek-V2 caches a 512-wide latent for d_head 128 (4 x d_head) plus a "
                                        "64-wide rotary key (d_head / 2); the default keeps those proportions"))
    try:
        table = kv_cache_table(cfg, batch=batch, tokens=tokens, dtype=dtype, n_kv_groups=groups,
                               kv_latent_dim=latent)
    except ValueError as e:
        st.error(str(e))
        return
    this = table[table["this_model"]].iloc[0] if table["this_model"].any() else table.iloc[0]
    m = st.columns(3)
    m[0].metric(f"KV cache per token ({this['kind'].upper()})", format_bytes(this["bytes_per_token"]))
    m[1].metric(f"For {batch} x {tokens} tokens", format_bytes(this["total_bytes"]))
    m[2].metric("Bytes per element", DTYPE_BYTES[dtype])
    per_token = st.toggle("Per token", value=False, key="cost_per_token")
    st.plotly_chart(viz.kv_cache_figure(table, batch=batch, tokens=tokens, per_token=per_token),
                    width="stretch", key="fig_kv")
    show = table.assign(per_token=table["bytes_per_token"].map(format_bytes),
                        total=table["total_bytes"].map(format_bytes))
    st.dataframe(show[["kind", "n_kv_heads", "cached_per_layer", "per_token", "total", "vs_mha", "this_model"]],
                 hide_index=True, width="stretch")

    st.subheader("FLOPs per layer")
    c2 = st.columns(2)
    mode = c2[0].radio("Pass", ["Prefill", "One decoding step"], horizontal=True, key="flops_mode")
    seq = int(c2[1].number_input("Context length", 1, 10_000_000, min(tokens, 4096), key="flops_seq"))
    if mode == "Prefill":
        flops = flops_per_layer(cfg, seq_len=seq, batch=batch)
    else:
        flops = flops_per_layer(cfg, seq_len=1, batch=batch, kv_len=seq)
    st.metric("Per layer", format_flops(flops["flops"].sum()),
              help="matrix products only, 2 FLOPs per multiply-add; x layers for the whole stack")
    st.plotly_chart(viz.flops_figure(flops), width="stretch", key="fig_flops")


PAGE = Page("KV cache & FLOPs", "costs", render, needs="nothing")
