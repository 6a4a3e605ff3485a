"""Cost calculators: KV-cache bytes (MHA / GQA / MQA / MLA) and forward FLOPs per layer by operation.

Pure arithmetic on a :class:`~interp.config.ModelConfig`; nothing is allocated or run. Figures of these
tables live in :mod:`interp.viz.cost`; the CLI's ``interp kv-cache`` and the dashboard's calculator page
call these functions.

Worked example (a Llama-2-70B-sized stack with full multi-head attention): 80 layers, 64 heads of 128, fp16
-> 80 * 2 * 64 * 128 * 2 bytes = 2.62 MB per token; a batch of 32 x 4096 tokens holds about 343 GB of K/V;
8 KV groups (GQA) cut that 8 times.

    >>> from interp.flops import worked_example_config, kv_cache_table
    >>> cfg = worked_example_config()
    >>> cfg.kv_cache_bytes_per_token(2)
    2621440
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd
import torch

from .config import ModelConfig

#: Bytes per element of the usual storage dtypes.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "float32": 4, "tf32": 4, "fp16": 2, "float16": 2, "bf16": 2,
                               "bfloat16": 2, "fp8": 1, "int8": 1}


def dtype_bytes(dtype: str | int) -> int:
    """Bytes per element for a dtype name (``"fp16"``, ``"bf16"``, ``"fp32"``, ``"fp8"``...) or an int.

    Raises:
        ValueError: unknown name or a non-positive int.

    Example:
        >>> from interp.flops import dtype_bytes
        >>> dtype_bytes("bf16")
        2
    """
    if isinstance(dtype, bool):
        raise TypeError(f"dtype={dtype!r} must be a name like 'fp16' or a positive int")
    if isinstance(dtype, int):
        if dtype <= 0:
            raise ValueError(f"bytes per element must be > 0, got {dtype}")
        return dtype
    try:
        return DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}") from None


def worked_example_config(**overrides) -> ModelConfig:
    """The worked example: 80 layers, 64 heads, d_head 128 (d_model 8192), MHA.

    Example:
        >>> from interp.flops import worked_example_config
        >>> worked_example_config(n_kv_heads=8).kind
        'gqa'
    """
    fields: dict[str, Any] = dict(n_layers=80, d_model=8192, n_heads=64, d_head=128, d_mlp=28672, activation="swiglu",
                  normalization="rms", positional="rotary", d_vocab=32000, n_ctx=4096)
    fields.update(overrides)
    return ModelConfig(**fields)


def rotary_decoder_config(*, layers: int, heads: int, d_head: int, kv_heads: int | None = None) -> ModelConfig:
    """The smallest config that describes a rotary decoder's attention stack for the cost tables: ``layers``
    layers of ``heads`` query heads of width ``d_head`` and ``kv_heads`` K/V heads (``d_model = heads * d_head``;
    vocabulary and context of 1, which the KV-cache figures do not depend on).

    Args:
        layers, heads, d_head: the stack's layers, query heads and head width.
        kv_heads: K/V heads (default ``heads``, multi-head attention).

    Returns:
        A :class:`~interp.config.ModelConfig` with ``positional="rotary"``.

    Raises:
        ValueError: ``kv_heads`` does not divide ``heads``, an odd ``d_head`` (RoPE rotates pairs of dimensions),
            or a value ModelConfig rejects (quoted).

    Example:
        >>> from interp.flops import rotary_decoder_config
        >>> rotary_decoder_config(layers=80, heads=64, d_head=128, kv_heads=8).kind
        'gqa'
    """
    if kv_heads is not None and (kv_heads <= 0 or heads % kv_heads or kv_heads > heads):
        raise ValueError(f"kv_heads={kv_heads} must divide heads={heads}")
    if d_head % 2:
        # The cost tables describe a rotary decoder, and RoPE rotates pairs of dimensions.
        raise ValueError(f"d_head={d_head} must be even (the KV-cache table assumes rotary positions)")
    return ModelConfig(n_layers=layers, n_heads=heads, d_head=d_head, d_model=heads * d_head, d_vocab=1, n_ctx=1,
                       n_kv_heads=kv_heads or heads, positional="rotary")


def gqa_group_options(n_heads: int) -> list[int]:
    """KV-head counts that make ``n_heads`` query heads grouped-query attention (divisors strictly between
    1 and ``n_heads``).

    Example:
        >>> from interp.flops import gqa_group_options
        >>> gqa_group_options(12)
        [2, 3, 4, 6]
    """
    return [d for d in range(2, n_heads) if n_heads % d == 0]


def default_kv_groups(n_heads: int) -> int | None:
    """The divisor of ``n_heads`` strictly between 1 and ``n_heads`` closest to ``n_heads / 8`` (8 KV heads for
    64 query heads, as Llama-2-70B); ``None`` when no such divisor exists (GQA would equal MHA or MQA).

    Example:
        >>> from interp.flops import default_kv_groups
        >>> default_kv_groups(64), default_kv_groups(7)
        (8, None)
    """
    divisors = gqa_group_options(n_heads)
    if not divisors:
        return None
    return min(divisors, key=lambda d: (abs(d - n_heads / 8), d))


def kv_variants(
    cfg: ModelConfig,
    *,
    n_kv_groups: int | None = None,
    kv_latent_dim: int | None = None,
    rope_dim: int | None = None,
) -> dict[str, ModelConfig]:
    """The same stack with each attention kind: ``{"mha", "gqa", "mqa", "mla"}`` -> config.

    Args:
        cfg: the base config; its own kind keeps its own settings (a GQA config keeps its KV heads).
        n_kv_groups: KV heads of the GQA variant (default: the config's own if it is GQA, else the divisor
            of ``n_heads`` nearest ``n_heads / 8``). GQA is left out when ``n_heads`` has no divisor in between.
        kv_latent_dim: the MLA latent width (default: the config's own if MLA, else ``4 * d_head``, the
            DeepSeek-V2 ratio 512 / 128).
        rope_dim: the MLA decoupled rotary key width (default: the config's own if MLA, else ``d_head // 2``;
            0 for a model without positions in attention).

    Returns:
        An ordered dict of configs, MHA first.

    Raises:
        ValueError: ``n_kv_groups`` does not divide ``n_heads``, or an odd ``rope_dim`` (RoPE rotates pairs).

    Example:
        >>> from interp.flops import kv_variants, worked_example_config
        >>> sorted(kv_variants(worked_example_config()))
        ['gqa', 'mha', 'mla', 'mqa']
    """
    H, D = cfg.n_heads, cfg.d_head
    if n_kv_groups is None:
        n_kv_groups = cfg.n_kv_heads if cfg.kind == "gqa" else default_kv_groups(H)
    elif n_kv_groups <= 0 or H % n_kv_groups:
        raise ValueError(f"n_kv_groups={n_kv_groups} must be a positive divisor of n_heads={H}")
    if cfg.attention == "latent":
        latent = cfg.kv_latent_dim if kv_latent_dim is None else kv_latent_dim
        rope = cfg.rope_dim if rope_dim is None else rope_dim
    else:
        latent = 4 * D if kv_latent_dim is None else kv_latent_dim
        rope = (D // 2 if cfg.positional == "rotary" else 0) if rope_dim is None else rope_dim
    if rope_dim is not None and rope_dim > 0 and rope_dim % 2:
        raise ValueError(f"rope_dim={rope_dim} must be even (RoPE rotates pairs of dimensions)")
    rope -= rope % 2  # a derived width (d_head // 2) rounds down to pairs: decoupled RoPE rotates pairs
    # MLA with rope_dim == 0 cannot be "rotary" (its RoPE lives only in the decoupled part).
    positional = "rotary" if rope else ("none" if cfg.positional == "rotary" else cfg.positional)
    # The variants are uniform what-ifs: drop the per-layer head counts of a pruned model.
    uniform: dict[str, Any] = {f: None for f in ("layer_n_heads", "layer_n_kv_heads", "layer_kv_map") if hasattr(cfg, f)}
    std: dict[str, Any] = dict(attention="standard", kv_latent_dim=None, q_latent_dim=None, rope_dim=0, v_head_dim=None,
                               **uniform,
               positional=cfg.positional if cfg.attention == "standard" else "rotary",
               rotary_dim=cfg.rotary_dim if cfg.attention == "standard" else None)
    out: dict[str, ModelConfig] = {"mha": dataclasses.replace(cfg, n_kv_heads=H, **std)}
    if n_kv_groups is not None and 1 < n_kv_groups < H:
        out["gqa"] = dataclasses.replace(cfg, n_kv_heads=n_kv_groups, **std)
    out["mqa"] = dataclasses.replace(cfg, n_kv_heads=1, **std)
    out["mla"] = dataclasses.replace(cfg, attention="latent", n_kv_heads=H, kv_latent_dim=latent, **uniform,
                                     q_latent_dim=cfg.q_latent_dim if cfg.attention == "latent" else None,
                                     rope_dim=rope, positional=positional, rotary_dim=0)
    return out


def kv_cache_bytes(cfg: ModelConfig, *, batch: int = 1, tokens: int = 1, dtype: str | int = "fp16") -> int:
    """Bytes of KV cache for ``batch`` sequences of ``tokens`` positions (all layers).

    Builds on :meth:`ModelConfig.kv_cache_bytes_per_token`.

    Raises:
        ValueError: batch or tokens < 1, or an unknown dtype.

    Example:
        >>> from interp.flops import kv_cache_bytes, worked_example_config
        >>> round(kv_cache_bytes(worked_example_config(), batch=32, tokens=4096) / 1e9)
        344
    """
    for name, value in (("batch", batch), ("tokens", tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    return cfg.kv_cache_bytes_per_token(dtype_bytes(dtype)) * batch * tokens


def kv_cache_table(
    cfg: ModelConfig,
    *,
    batch: int = 1,
    tokens: int = 1,
    dtype: str | int = "fp16",
    n_kv_groups: int | None = None,
    kv_latent_dim: int | None = None,
    rope_dim: int | None = None,
) -> pd.DataFrame:
    """KV-cache size of ``cfg``'s stack under MHA, GQA, MQA and MLA.

    Args:
        cfg: the base config (see :func:`kv_variants` for how the other kinds are derived).
        batch, tokens: the workload; ``total_bytes = bytes_per_token * batch * tokens``.
        dtype: storage dtype name or bytes per element.
        n_kv_groups, kv_latent_dim, rope_dim: see :func:`kv_variants`.

    Returns:
        One row per kind with columns ``kind``, ``n_kv_heads`` (K/V heads cached; for MLA the heads
        reconstructed from the latent), ``cached_per_layer`` (values cached per token per layer),
        ``bytes_per_token``, ``total_bytes``, ``vs_mha`` (fraction of MHA's size), ``this_model`` (the row
        matching ``cfg``). A model with heads removed (per-layer head counts) gets one more row,
        ``"<kind> (pruned)"``, with its own cache (``n_kv_heads`` is then the mean per layer).

    Example:
        >>> from interp.flops import kv_cache_table, worked_example_config
        >>> t = kv_cache_table(worked_example_config(), batch=32, tokens=4096)
        >>> float(t.set_index("kind").loc["gqa", "vs_mha"])
        0.125
    """
    nbytes = dtype_bytes(dtype)
    variants = kv_variants(cfg, n_kv_groups=n_kv_groups, kv_latent_dim=kv_latent_dim, rope_dim=rope_dim)
    rows = []
    for kind, c in variants.items():
        per_token = c.kv_cache_bytes_per_token(nbytes)
        rows.append({
            "kind": kind,
            "n_kv_heads": c.n_kv_heads,
            "cached_per_layer": per_token // (c.n_layers * nbytes),
            "bytes_per_token": per_token,
            "total_bytes": kv_cache_bytes(c, batch=batch, tokens=tokens, dtype=nbytes),
        })
    pruned = getattr(cfg, "layer_n_heads", None) is not None
    if pruned:
        # A model with heads removed: its own (non-uniform) cache, next to the uniform kinds.
        per_token = cfg.kv_cache_bytes_per_token(nbytes)
        kv_total = sum(cfg.kv_heads_in_layer(layer) for layer in range(cfg.n_layers))
        rows.append({"kind": f"{cfg.kind} (pruned)", "n_kv_heads": kv_total / cfg.n_layers,
                     "cached_per_layer": per_token / (cfg.n_layers * nbytes), "bytes_per_token": per_token,
                     "total_bytes": per_token * batch * tokens})
    df = pd.DataFrame(rows)
    df["vs_mha"] = df["bytes_per_token"] / df.loc[df["kind"] == "mha", "bytes_per_token"].iloc[0]
    df["this_model"] = df["kind"] == (f"{cfg.kind} (pruned)" if pruned else cfg.kind)
    return df


def format_bytes(n: float) -> str:
    """Decimal (SI) units, as the worked example quotes them: ``2621440 -> '2.62 MB'``.

    Example:
        >>> from interp.flops import format_bytes
        >>> format_bytes(343597383680)
        '343.6 GB'
    """
    n = float(n)
    if n < 0:
        return "-" + format_bytes(-n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else (f"{n:.2f} {unit}" if n < 100 else f"{n:.1f} {unit}")
        n /= 1000
    raise AssertionError("unreachable")


def flops_per_layer(
    cfg: ModelConfig,
    *,
    seq_len: int,
    batch: int = 1,
    kv_len: int | None = None,
    layer: int | None = None,
    absorbed: bool | None = None,
) -> pd.DataFrame:
    """Forward-pass FLOPs of one block, by operation (matrix products only, 2 FLOPs per multiply-add).

    Counts what :class:`interp.Transformer` computes densely: softmax, norms, activations and biases are
    left out (they are a few percent and not matrix products), and the causal mask does not halve the
    score FLOPs (the kernels compute the full square). ``seq_len`` new tokens attend to ``kv_len`` keys:
    a prefill has ``kv_len == seq_len`` (the default); one decoding step with a cache of ``n`` tokens is
    ``seq_len=1, kv_len=n + 1``. MLA re-expands K/V from the cached latent for every key (``kv_up``, the
    expanded path). A mixture-of-experts layer counts the router, the k experts each token runs and the shared
    expert (``layer=None`` on an MoE config describes an MoE layer, not one of its ``dense_mlp_layers``).

    Args:
        cfg: the model config.
        seq_len: new (query) tokens per sequence, T.
        batch: sequences, B.
        kv_len: keys each query sees, S (default ``seq_len``).
        layer: which block, for a model with heads removed (per-layer head counts); any block of a
            uniform model costs the same.
        absorbed: MLA only: count the absorbed decode path (no K/V expansion; see
            :class:`~interp.attention.LatentAttention`) instead of the expanded one. ``None`` (default) counts
            what the model runs: absorbed for one query against a longer cache (``seq_len == 1 < kv_len``).

    Returns:
        DataFrame with columns ``operation``, ``flops``, ``share`` (of the block's total), in forward order.

    Raises:
        ValueError: non-positive sizes, ``kv_len < seq_len``, or a pruned model without ``layer``.

    Example:
        >>> from interp import ModelConfig
        >>> from interp.flops import flops_per_layer
        >>> cfg = ModelConfig(n_layers=1, d_model=64, n_heads=4, d_vocab=10, n_ctx=16, attn_only=True)
        >>> int(flops_per_layer(cfg, seq_len=16).set_index("operation").loc["q_proj", "flops"])  # 2*16*64*64
        131072
    """
    T, B = seq_len, batch
    S = T if kv_len is None else kv_len
    for name, value in (("seq_len", T), ("batch", B), ("kv_len", S)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    if S < T:
        raise ValueError(f"kv_len={S} must be >= seq_len={T} (queries see themselves)")
    M, H, K, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    if layer is not None:
        if not 0 <= layer < cfg.n_layers:
            raise ValueError(f"layer={layer} out of range for {cfg.n_layers} layers")
        if hasattr(cfg, "heads_in_layer"):
            H, K = cfg.heads_in_layer(layer), cfg.kv_heads_in_layer(layer)
    elif getattr(cfg, "layer_n_heads", None) is not None:
        raise ValueError(f"this config has per-layer head counts {cfg.layer_n_heads}: pass layer=")
    rows: list[tuple[str, int]] = []
    Dv = D  # a head's value width
    if cfg.attention == "latent":
        C, R, Dv = cfg.kv_latent_dim, cfg.rope_dim, cfg.v_head_dim
        if cfg.q_latent_dim is not None:
            rows += [("q_down", 2 * B * T * M * cfg.q_latent_dim),
                     ("q_up", 2 * B * T * cfg.q_latent_dim * H * (D + R))]
        else:
            rows.append(("q_proj", 2 * B * T * M * H * (D + R)))
        if absorbed is None:
            absorbed = T == 1 and S > 1  # what LatentAttention does on a one-token step with a cache
        if absorbed:
            # W_UK folded into the query, W_UV into the output: attention runs over the C + R wide latent.
            rows += [("kv_down", 2 * B * T * M * (C + R)),
                     ("q_absorb (W_UK)", 2 * B * T * H * D * C),
                     ("scores (QK^T)", 2 * B * H * T * S * (C + R)),
                     ("mix (pattern @ latent)", 2 * B * H * T * S * C),
                     ("out_absorb (W_UV)", 2 * B * T * H * C * Dv)]
        else:
            rows += [("kv_down", 2 * B * T * M * (C + R)),
                     ("kv_up", 2 * B * S * C * H * (D + Dv)),
                     ("scores (QK^T)", 2 * B * H * T * S * (D + R))]
    else:
        rows += [("q_proj", 2 * B * T * M * H * D),
                 ("k_proj", 2 * B * T * M * K * D),
                 ("v_proj", 2 * B * T * M * K * D),
                 ("scores (QK^T)", 2 * B * H * T * S * D)]
    if not (cfg.attention == "latent" and absorbed):
        rows.append(("mix (pattern @ V)", 2 * B * H * T * S * Dv))
    rows.append(("out_proj", 2 * B * T * H * Dv * M))
    moe = cfg.n_experts > 0 and (cfg.is_moe_layer(layer) if layer is not None else True)
    if moe:
        # Each token runs only its k experts (MLPs of width d_expert); the router scores all E.
        E, k, Fe, Fs = cfg.n_experts, cfg.n_experts_per_token, cfg.d_expert, cfg.d_shared_expert
        # (the weighted sum of the k outputs is elementwise, rounded per product as transformers does: no matmul)
        rows += [("router", 2 * B * T * M * E), (f"experts ({k} of {E} per token)", 3 * 2 * B * T * k * M * Fe)]
        if Fs:
            rows.append(("shared expert", 3 * 2 * B * T * M * Fs))
    elif not cfg.attn_only:
        F = cfg.d_mlp
        rows.append(("mlp_in", 2 * B * T * M * F))
        if cfg.activation in ("swiglu", "geglu", "geglu_tanh", "swiglu_clamped"):
            rows.append(("mlp_gate", 2 * B * T * M * F))
        rows.append(("mlp_out", 2 * B * T * F * M))
    df = pd.DataFrame(rows, columns=["operation", "flops"])
    df["share"] = df["flops"] / df["flops"].sum()
    return df


def format_flops(n: float) -> str:
    """``1.5e12 -> '1.50 TFLOP'`` (decimal units).

    Example:
        >>> from interp.flops import format_flops
        >>> format_flops(131072)
        '131.1 kFLOP'
    """
    return format_bytes(n)[:-1] + "FLOP"  # same scaling as bytes; swap the trailing unit letter


def parameter_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of the model ``cfg`` describes: all of them, and those one token actually uses.

    A mixture of experts stores ``E`` experts per MoE layer but runs ``k`` of them per token: ``active``
    counts the k routed experts (plus the router, the shared expert, attention, norms, embeddings and
    unembedding) and ``total`` all E. For a dense model both are equal. The embedding counts once in each
    (a token reads one row of it, but the unembedding reads all of a tied matrix).

    Returns:
        ``{"total": int, "active": int, "experts_total": int, "experts_active": int}``.

    Example:
        >>> from interp import ModelConfig
        >>> from interp.flops import parameter_counts
        >>> cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=50, n_ctx=8, activation="swiglu",
        ...                   mlp_bias=False, n_experts=8, n_experts_per_token=2, d_expert=32)
        >>> c = parameter_counts(cfg)
        >>> c["experts_total"] == 2 * 8 * 3 * 16 * 32, c["experts_active"] == 2 * 2 * 3 * 16 * 32
        (True, True)
    """
    from .model import Transformer
    from .moe import MoE

    with torch.device("meta"):
        model = Transformer(cfg)
    total = sum(p.numel() for p in model.parameters())
    experts_total = experts_active = 0
    for block in model.blocks:
        mlp = block.mlp
        if isinstance(mlp, MoE):  # the layers cfg.is_moe_layer names
            per_expert = mlp.W_gate[0].numel() + mlp.W_in[0].numel() + mlp.W_out[0].numel()
            experts_total += cfg.n_experts * per_expert
            experts_active += cfg.n_experts_per_token * per_expert
    return {"total": total, "active": total - experts_total + experts_active, "experts_total": experts_total,
            "experts_active": experts_active}
