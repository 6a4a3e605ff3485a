"""Model configuration: one keyword-only dataclass that says what a Transformer is.

Every field is validated in ``__post_init__``; an invalid combination raises ``ValueError`` that quotes
the offending values, so a typo in a config fails at construction, not deep inside a forward pass.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from .precision import LEGACY_FIELDS, Precision, precision_from

AttentionKind = Literal["standard", "latent"]
Positional = Literal["learned", "rotary", "none"]
Normalization = Literal["pre", "post", "rms", "none"]
Activation = Literal["gelu", "gelu_new", "relu", "relu2", "silu", "swiglu", "geglu", "geglu_tanh", "swiglu_clamped"]
QKNorm = Literal["none", "head", "full", "head_after_rotary"]
SublayerNorm = Literal["input", "sandwich", "output"]
ParallelBlock = Literal["none", "one_norm", "two_norms"]
RouterScore = Literal["softmax", "sigmoid", "sparsemixer"]
RouterGroupScore = Literal["max", "top2_sum"]

_ATTENTION_KINDS = ("standard", "latent")
_POSITIONALS = ("learned", "rotary", "none")
_NORMALIZATIONS = ("pre", "post", "rms", "none")
_ACTIVATIONS = ("gelu", "gelu_new", "relu", "relu2", "silu", "swiglu", "geglu", "geglu_tanh", "swiglu_clamped")
_QK_NORMS = ("none", "head", "full", "head_after_rotary")
_SUBLAYER_NORMS = ("input", "sandwich", "output")
_PARALLEL_BLOCKS = ("none", "one_norm", "two_norms")
_ROUTER_SCORES = ("softmax", "sigmoid", "sparsemixer")
_ROUTER_GROUP_SCORES = ("max", "top2_sum")

#: For each RoPE scaling kind, its (required, optional) keys besides ``rope_type``.
ROPE_SCALING_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("factor",), ()),
    "dynamic": (("factor", "original_max_position_embeddings"), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")),
    "longrope": (("short_factor", "long_factor", "original_max_position_embeddings"),
                 ("factor", "attention_factor")),
}


@dataclass(frozen=True)
class LayerShape:
    """The attention shape of one layer, from :meth:`ModelConfig.layer` (layers differ after head removal).

    Attributes:
        n_heads: query heads H of the layer (0 when every head was removed).
        n_kv_heads: K/V heads K (equals H for MLA).
        d_head: width of one head.
        kv_map: the K/V head each query head reads (``len == n_heads``).
    """

    n_heads: int
    n_kv_heads: int
    d_head: int
    kv_map: tuple[int, ...]

    @property
    def uniform_groups(self) -> bool:
        """True when every K/V head serves ``H // K`` consecutive query heads (no index map needed)."""
        H, K = self.n_heads, self.n_kv_heads
        return not H or (H % K == 0 and self.kv_map == tuple(i // (H // K) for i in range(H)))

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """K and V bytes this layer caches per token (standard attention)."""
        return 2 * self.n_kv_heads * self.d_head * bytes_per_element



def _per_layer_sizes(name: str, value: Any, n_layers: int, none_means: str) -> list[int | None]:
    """``value`` (one positive int for every layer, or one entry per layer, each a positive int or None) as a
    per-layer list.

    Raises:
        ValueError: ``value`` is neither, quoting it.
    """
    sizes = [value] * n_layers if isinstance(value, int) and not isinstance(value, bool) else value
    if (not isinstance(sizes, (list, tuple)) or len(sizes) != n_layers
            or any(v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1) for v in sizes)):
        raise ValueError(f"{name}={value!r} must be a positive int or {n_layers} entries (one per layer), each a "
                         f"positive int or {none_means}")
    return list(sizes)

@dataclass(kw_only=True)
class ModelConfig:
    """Hyper-parameters of an :class:`interp.Transformer`.

    Args:
        n_layers: number of blocks.
        d_model: residual stream width.
        n_heads: query heads per layer (H).
        d_head: width of one head (D). Defaults to ``d_model // n_heads``.
        n_kv_heads: key/value heads (K). ``n_heads`` is multi-head attention, 1 is multi-query, anything
            between that divides ``n_heads`` is grouped-query attention. Defaults to ``n_heads``.
            Ignored (must stay ``None`` or equal ``n_heads``) for ``attention="latent"``.
        attention: ``"standard"`` (MHA/GQA/MQA) or ``"latent"`` (multi-head latent attention, DeepSeek-V2).
        kv_latent_dim: MLA only: width of the compressed K/V latent, the only K/V state the cache keeps
            (0 once resolved for standard attention, which has no latent).
        q_latent_dim: MLA only: width of the compressed query latent; ``None`` projects queries directly.
        rope_dim: MLA only: width of the decoupled rotary part of queries and keys (0 disables it).
        causal: ``True`` for a decoder (causal mask), ``False`` for a bidirectional encoder.
        positional: ``"learned"`` absolute embeddings, ``"rotary"`` (RoPE on queries and keys) or ``"none"``.
        rotary_base: RoPE base frequency.
        rotary_dim: how many dims of each head RoPE rotates (standard attention); defaults to ``d_head`` (0 once
            resolved when nothing rotates: another ``positional``, or MLA, whose rotary width is ``rope_dim``).
        rope_scaling: optional RoPE scaling, a dict in Hugging Face's ``rope_parameters`` vocabulary:
            ``rope_type`` one of ``linear``, ``dynamic``, ``llama3``, ``yarn``, ``longrope`` and the keys
            :data:`interp.rotary.ROPE_SCALING_KEYS` lists for it (e.g. ``{"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}``).
        local_rotary_base: RoPE base of the sliding-window layers, when it differs from ``rotary_base`` (Gemma 3:
            local layers rotate with plain RoPE of this base, global ones with ``rotary_base`` and
            ``rope_scaling``).
        nope_layers: layers whose attention has no positional rotation (NoPE: SmolLM3's every 4th layer,
            EXAONE 4's global layers) in a ``positional="rotary"`` model; ``None`` or ``[]``: every layer rotates.
        sliding_window: sliding-window attention: an int (every layer) or one entry per layer, an int W (the
            query at position p sees keys p - W + 1 .. p) or ``None`` (global attention). ``n_ctx`` is not capped
            by it, and the KV cache keeps only the last W - 1 positions of a windowed layer.
        attention_chunk: chunked local attention (Llama 4): an int C (every layer) or one entry per layer, an int
            C (the query at position p sees keys from ``C * (p // C)`` to p) or ``None`` (no chunks). A layer may
            not have both a chunk and a sliding window. Its KV cache keeps every position.
        nope_temperature: ``[scale, floor]``: on the ``nope_layers``, each query is multiplied by
            ``1 + scale * log1p(floor((p + 1) / floor))`` at absolute position p (Llama 4's
            ``attn_temperature_tuning`` with ``attn_scale`` / ``floor_scale``); ``hook_q`` sees the query before it.
        alibi_slopes: ALiBi (BLOOM, MPT, Falcon with ``alibi=True``): head h adds ``slope_h * (k - q)`` to its
            score of key position k from query position q (after the scale, before the mask). One slope per
            query head, as the family computes them (:func:`alibi_slopes` gives the ALiBi paper's geometric
            sequence, exact for head counts that are not powers of two), or one list per layer (a model with
            heads removed keeps each remaining head's slope). ``None``: no ALiBi.
        attn_scale: the factor on ``q . k`` (default ``1 / sqrt(d_head)``; Gemma 2's ``query_pre_attn_scalar``
            gives ``query_pre_attn_scalar ** -0.5``).
        attn_sinks: learned attention sinks (gpt-oss): each query head has a parameter ``attn.sinks[h]``, a logit
            that joins every row's softmax beside the real keys and writes nothing (its value is zero). The
            pattern (``hook_pattern``) holds the real keys' probabilities, so a row sums to ``1 - sink mass``;
            ``hook_sink_mass`` ``[B, H, T]`` holds the sink's probability (pattern row + sink mass = 1). Both
            attention paths, the KV cache (a sink is a parameter, nothing is cached) and head removal honour it.
        attn_softcap: attention-logit soft-capping: scores become ``cap * tanh(scores / cap)`` before the mask
            (Gemma 2). Attention then always takes the explicit path (SDPA has no soft-cap).
        final_softcap: final-logit soft-capping, ``cap * tanh(logits / cap)`` (Gemma 2).
        qk_norm: RMSNorm on queries and keys before RoPE: ``"head"`` (per head, over ``d_head``: Qwen3,
            Gemma 3), ``"full"`` (over all heads' concatenation: OLMo 2), ``"head_after_rotary"`` (per head,
            after RoPE: Hunyuan) or ``"none"``. Hooks ``hook_q_normed`` / ``hook_k_normed`` read the normalised
            ``[B, T, heads, D]`` (rotated first for ``"head_after_rotary"``, which normalises only the layers that
            rotate: Llama 4's NoPE layers have no QK-norm).
        sublayer_norm: where a pre-norm model (``normalization`` ``"pre"`` or ``"rms"``) normalises each sublayer:
            ``"input"`` (its input, GPT-2 / Llama), ``"sandwich"`` (its input and its output, Gemma 2/3: norms
            ``ln1_post`` / ``ln2_post``) or ``"output"`` (its output only, OLMo 2). ``hook_attn_out`` /
            ``hook_mlp_out`` are what is added to the residual (after the output norm); the values before it are
            ``hook_attn_out_pre_norm`` / ``hook_mlp_out_pre_norm``.
        parallel_block: ``"none"`` (attention, then MLP), or attention and MLP reading the same residual and
            both added to it (GPT-NeoX / Pythia, Falcon, Phi): ``"one_norm"`` (one shared input norm, ``ln1``) or
            ``"two_norms"`` (``ln1`` and ``ln2``). A parallel block has no ``hook_resid_mid``.
        embed_scale: multiplies the token embeddings (Gemma: ``sqrt(d_model)``); ``hook_embed`` sees the product.
        positions_from_mask: learned positions count real tokens only (OPT): with an ``attention_mask``, a token's
            position is the number of unpadded tokens before it, so a left-padded row starts at position 0 (a
            padding token gets position 0; its output is masked from every real token). Without a mask, or
            with ``position_ids`` given, positions are as usual.
        normalization: ``"pre"`` (pre-LN, GPT-2), ``"post"`` (post-LN, BERT), ``"rms"`` (pre-RMSNorm, Llama)
            or ``"none"``.
        norm_eps: epsilon of the norms.
        precision: where a bf16 / fp16 model computes in float32 before rounding (:class:`interp.precision.Precision`:
            RMSNorm weights, rotary), the policy of its family: ``Precision.named("llama")`` (the default),
            ``"gemma"``, ``"olmo2"`` or ``"cohere"``; a name or a dict of its fields is accepted. No effect in
            float32. Configs saved with the old ``norm_weight_float32`` / ``rotary_float32`` keys load onto it
            (:meth:`from_dict`).
        embed_norm: a LayerNorm right after the embeddings (BERT).
        attn_only: blocks without MLPs.
        d_mlp: MLP hidden width; defaults to ``4 * d_model``.
        activation: MLP non-linearity; ``"swiglu"``/``"geglu"``/``"geglu_tanh"`` are gated MLPs (Llama uses
            ``"swiglu"``, Gemma ``"geglu_tanh"``, the gate through the tanh approximation of GELU); ``"relu2"``
            is ``relu(x) ** 2`` (Arcee, Nemotron); ``"swiglu_clamped"`` is gpt-oss's gated unit
            ``(clamp(up, -l, l) + 1) * g * sigmoid(alpha g)`` with ``g = clamp(gate, max=l)``.
        swiglu_alpha, swiglu_limit: ``alpha`` and ``l`` of ``"swiglu_clamped"`` (gpt-oss: 1.702 and 7.0); only
            that activation reads them.
        d_vocab: vocabulary size.
        n_ctx: the longest sequence the model accepts (and the size of learned position tables).
        n_token_types: token-type (segment) embeddings, 0 for none (BERT uses 2).
        attn_bias: biases on the Q/K/V projections; out_bias: bias on W_O; mlp_bias: biases in the MLP.
        unembed: whether the model ends in an unembedding to logits (an encoder such as MiniLM returns its
            final hidden states instead).
        tie_embeddings: the unembedding is ``W_E`` transposed (GPT-2).
        cross_attention: every block gets a cross-attention sub-layer that reads a ``context`` sequence.
        use_sdpa: allow the fused ``scaled_dot_product_attention`` kernel when nothing needs the pattern.
        pad_token_id: token id used for padding by tokenizers of this model (informational).
        layer_n_heads: optional per-layer query-head counts (a model with heads removed by
            :func:`interp.pruning.remove_heads`); ``None`` means every layer has ``n_heads``. A layer may
            have 0 heads (its attention then adds only W_O's bias).
        layer_n_kv_heads: optional per-layer K/V-head counts (standard attention). Defaults to
            ``layer_n_heads`` for an MHA config; required for GQA/MQA configs with ``layer_n_heads``; must
            stay ``None`` for ``attention="latent"``.
        layer_kv_map: optional per-layer list mapping each query head to its K/V head (entries ``None``
            mean the uniform grouping, query head h reads K/V head ``h // (H_l // K_l)``). Needed when a
            partially pruned K/V group leaves groups of unequal size.

    Multi-head latent attention (DeepSeek-V2/V3), besides ``kv_latent_dim`` / ``q_latent_dim`` / ``rope_dim``
    (DeepSeek's YaRN ``mscale**2`` softmax correction goes in ``attn_scale``):

    Args:
        v_head_dim: MLA only: width of one head's value (and of its slice of ``W_O``); defaults to ``d_head``,
            which for MLA is the no-position part of the query/key head (DeepSeek's ``qk_nope_head_dim``) and for
            standard attention the only value width there is (another value is refused).

    Mixture of experts (``n_experts > 0``; see :mod:`interp.moe`):

    Args:
        n_experts: routed experts per MoE layer (E); 0 means every MLP is dense.
        n_experts_per_token: experts each token is routed to (top-k), ``1 <= k <= n_experts``; 0 once resolved
            for a dense model.
        d_expert: hidden width of one routed expert; defaults to ``d_mlp`` (also for a dense model, where no
            other value is accepted).
        router_score: ``"softmax"`` (Mixtral, Qwen, OLMoE, DeepSeek-V2) or ``"sigmoid"`` (DeepSeek-V3) of the
            router logits, or ``"sparsemixer"`` (Phi-MoE, top-2 only: :func:`interp.moe.sparsemixer`).
        sparsemixer_eps: Phi-MoE's ``router_jitter_noise`` at inference: each of the two choices' softmax
            leaves out the logits more than ``2 * eps`` (relative) below the best remaining one.
        router_renormalize: divide the k chosen scores by their sum.
        router_groups: DeepSeek's ``n_group``: experts fall in this many equal groups and a token first picks
            ``router_topk_groups`` groups, then its top-k experts inside them.
        router_topk_groups: groups a token may use (``topk_group``); defaults to ``router_groups`` (also for a
            dense model, where no other value is accepted).
        router_group_score: a group's score, ``"max"`` of its scores (DeepSeek-V2) or ``"top2_sum"``, the sum of
            its two best (DeepSeek-V3).
        router_choice_bias: a per-expert bias added to the scores for choosing only, never to the weights
            (DeepSeek-V3's ``e_score_correction_bias``).
        routed_scaling: multiplies the chosen weights (``routed_scaling_factor``).
        d_shared_expert: hidden width of the shared expert every token passes through (0: none); DeepSeek's
            ``n_shared_experts`` experts are one MLP of ``n_shared_experts * d_expert``.
        shared_expert_gate: the shared expert's output is scaled by ``sigmoid(x @ w)`` (Qwen-MoE).
        router_logit_bias: a per-expert bias ``b_router`` added to the router logits before the choice and the
            weights (gpt-oss; unlike ``router_choice_bias`` it moves the weights too).
        expert_input_weighting: each chosen expert reads its input times its weight, ``expert(w x)``, and the
            outputs are summed unweighted (Llama 4); ``hook_expert_out`` is then already weighted.
        expert_bias: the experts' projections have biases ``b_gate`` / ``b_in`` ``[E, F]`` and ``b_out``
            ``[E, M]`` (gpt-oss).
        dense_mlp_layers: layers that keep a dense MLP of width ``d_mlp`` (DeepSeek's first
            ``first_k_dense_replace`` layers, Qwen-MoE's ``mlp_only_layers``).

    Raises:
        ValueError: on any invalid value or combination, quoting the values.

    Example:
        >>> from interp import ModelConfig
        >>> cfg = ModelConfig(n_layers=2, d_model=64, n_heads=8, n_kv_heads=2, d_vocab=100, n_ctx=32)
        >>> cfg.group_size
        4
    """

    n_layers: int
    d_model: int
    n_heads: int
    # The config is resolved: a field typed ``int`` whose default is None ("derive it") accepts None and holds
    # an int once __post_init__ has run (d_head, n_kv_heads, d_mlp, rotary_dim, kv_latent_dim, v_head_dim,
    # n_experts_per_token, d_expert, router_topk_groups): typed as what every reader sees. A field typed
    # ``X | None`` keeps None as a meaning of its own (no soft-cap, global attention, ...).
    d_head: int = None  # type: ignore[assignment]
    n_kv_heads: int = None  # type: ignore[assignment]
    attention: AttentionKind = "standard"
    kv_latent_dim: int = None  # type: ignore[assignment]
    q_latent_dim: int | None = None
    rope_dim: int = 0
    causal: bool = True
    positional: Positional = "learned"
    rotary_base: float = 10000.0
    rotary_dim: int = None  # type: ignore[assignment]
    rope_scaling: dict[str, Any] | None = None
    local_rotary_base: float | None = None
    sliding_window: int | list[int | None] | None = None
    nope_layers: list[int] | None = None
    attention_chunk: int | list[int | None] | None = None
    nope_temperature: list[float] | None = None
    alibi_slopes: list[float] | list[list[float]] | None = None
    attn_scale: float | None = None
    attn_sinks: bool = False
    attn_softcap: float | None = None
    final_softcap: float | None = None
    qk_norm: QKNorm = "none"
    sublayer_norm: SublayerNorm = "input"
    parallel_block: ParallelBlock = "none"
    embed_scale: float = 1.0
    positions_from_mask: bool = False
    normalization: Normalization = "pre"
    norm_eps: float = 1e-5
    precision: Precision = Precision()
    embed_norm: bool = False
    attn_only: bool = False
    d_mlp: int = None  # type: ignore[assignment]
    activation: Activation = "gelu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    d_vocab: int
    n_ctx: int
    n_token_types: int = 0
    attn_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    unembed: bool = True
    tie_embeddings: bool = False
    cross_attention: bool = False
    use_sdpa: bool = True
    pad_token_id: int | None = None
    layer_n_heads: list[int] | None = None
    layer_n_kv_heads: list[int] | None = None
    layer_kv_map: list[list[int] | None] | None = None
    # --- multi-head latent attention (DeepSeek) ---
    v_head_dim: int = None  # type: ignore[assignment]
    # --- mixture of experts ---
    n_experts: int = 0
    n_experts_per_token: int = None  # type: ignore[assignment]
    d_expert: int = None  # type: ignore[assignment]
    router_score: RouterScore = "softmax"
    sparsemixer_eps: float = 0.01
    router_renormalize: bool = False
    router_groups: int = 1
    router_topk_groups: int = None  # type: ignore[assignment]
    router_group_score: RouterGroupScore = "max"
    router_choice_bias: bool = False
    routed_scaling: float = 1.0
    d_shared_expert: int = 0
    shared_expert_gate: bool = False
    router_logit_bias: bool = False
    expert_bias: bool = False
    expert_input_weighting: bool = False
    dense_mlp_layers: list[int] | None = None

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "d_vocab", "n_ctx"):
            _positive_int(name, getattr(self, name))
        for name in ("d_head", "n_kv_heads", "kv_latent_dim", "q_latent_dim", "rotary_dim", "d_mlp",
                     "pad_token_id", "rope_dim", "n_token_types"):
            _int_or_none(name, getattr(self, name))
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                value = getattr(self, name)
                raise TypeError(f"{name}={value!r} must be True or False, got {type(value).__name__}")
        _positive_float("rotary_base", self.rotary_base)
        _positive_float("norm_eps", self.norm_eps)
        self.precision = precision_from(self.precision)  # a name or a JSON dict becomes the policy itself
        if self.attention not in _ATTENTION_KINDS:
            raise ValueError(f"attention={self.attention!r} is not one of {_ATTENTION_KINDS}")
        if self.positional not in _POSITIONALS:
            raise ValueError(f"positional={self.positional!r} is not one of {_POSITIONALS}")
        if not isinstance(self.positions_from_mask, bool):
            raise ValueError(f"positions_from_mask={self.positions_from_mask!r} must be True or False")
        if self.positions_from_mask and self.positional != "learned":
            raise ValueError(f"positions_from_mask=True counts positions for a learned position embedding; "
                             f"positional={self.positional!r} has none")
        if self.normalization not in _NORMALIZATIONS:
            raise ValueError(f"normalization={self.normalization!r} is not one of {_NORMALIZATIONS}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} is not one of {_ACTIVATIONS}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_head not given and d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
                )
            self.d_head = self.d_model // self.n_heads
        _positive_int("d_head", self.d_head)
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        _positive_int("n_kv_heads", self.n_kv_heads)
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads} "
                "(n_kv_heads == n_heads: MHA; 1: MQA; a divisor in between: GQA)"
            )
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        if not self.attn_only:
            _positive_int("d_mlp", self.d_mlp)
        if self.n_token_types < 0:
            raise ValueError(f"n_token_types={self.n_token_types} must be >= 0")
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps={self.norm_eps} must be > 0")
        if self.attention == "latent":
            if self.n_kv_heads != self.n_heads:
                raise ValueError(
                    f"attention='latent' has one K/V head per query head; got n_kv_heads={self.n_kv_heads} "
                    f"with n_heads={self.n_heads}"
                )
            if self.kv_latent_dim is None:
                raise ValueError("attention='latent' needs kv_latent_dim (the size of the cached K/V latent)")
            _positive_int("kv_latent_dim", self.kv_latent_dim)
            if self.q_latent_dim is not None:
                _positive_int("q_latent_dim", self.q_latent_dim)
            if self.rope_dim < 0 or self.rope_dim % 2:
                raise ValueError(f"rope_dim={self.rope_dim} must be a non-negative even number")
            if self.rope_dim and self.positional != "rotary":
                raise ValueError(
                    f"rope_dim={self.rope_dim} needs positional='rotary', got positional={self.positional!r}"
                )
            if self.positional == "rotary" and not self.rope_dim:
                raise ValueError("attention='latent' with positional='rotary' needs rope_dim > 0 (decoupled RoPE)")
        else:
            if self.kv_latent_dim not in (None, 0):
                raise ValueError(f"kv_latent_dim={self.kv_latent_dim} only applies to attention='latent'")
            self.kv_latent_dim = 0
            if self.q_latent_dim is not None:
                raise ValueError(f"q_latent_dim={self.q_latent_dim} only applies to attention='latent'")
            if self.rope_dim:
                raise ValueError(f"rope_dim={self.rope_dim} only applies to attention='latent'")
        if self.positional == "rotary" and self.attention == "standard":
            if self.rotary_dim is None:
                self.rotary_dim = self.d_head
            if self.rotary_dim <= 0 or self.rotary_dim > self.d_head or self.rotary_dim % 2:
                raise ValueError(
                    f"rotary_dim={self.rotary_dim} must be even and in (0, d_head={self.d_head}]"
                )
        else:
            if self.rotary_dim and self.positional != "rotary":
                raise ValueError(f"rotary_dim={self.rotary_dim} needs positional='rotary', got {self.positional!r}")
            if self.rotary_dim:
                raise ValueError(f"rotary_dim={self.rotary_dim} applies to attention='standard'; MLA's rotary "
                                 f"width is rope_dim={self.rope_dim}")
            self.rotary_dim = 0
        self._check_rope_scaling()
        self._check_block_features()
        if self.tie_embeddings and not self.unembed:
            raise ValueError("tie_embeddings=True needs unembed=True")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.d_vocab:
            raise ValueError(f"pad_token_id={self.pad_token_id} is outside the vocabulary [0, {self.d_vocab})")
        self._check_latent_extras()
        self._check_experts()
        self._check_layer_heads()
        self._check_alibi()

    def _check_alibi(self) -> None:
        """Validate ``alibi_slopes``: one finite number per head, flat or per layer, in a causal decoder."""
        slopes = self.alibi_slopes
        if slopes is None:
            return
        if not isinstance(slopes, (list, tuple)):
            raise TypeError(f"alibi_slopes={slopes!r} must be a list of numbers (one per head) or None")
        per_layer = bool(slopes) and all(isinstance(s, (list, tuple)) for s in slopes)
        rows: list[Any] = list(slopes) if per_layer else [slopes] * self.n_layers
        if len(rows) != self.n_layers:
            raise ValueError(f"alibi_slopes has {len(rows)} per-layer lists, expected one per layer "
                             f"({self.n_layers})")
        for layer, row in enumerate(rows):
            want = self.layer(layer).n_heads
            if (not isinstance(row, (list, tuple)) or len(row) != want
                    or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                           for v in row)):
                raise ValueError(f"alibi_slopes{f'[{layer}]' if per_layer else ''}={list(row)!r} must be {want} "
                                 f"finite numbers (one per query head of layer {layer})")
        if not self.causal or self.attention != "standard" or self.cross_attention:
            raise ValueError(f"alibi_slopes needs a causal decoder with standard self-attention, got "
                             f"causal={self.causal}, attention={self.attention!r}, "
                             f"cross_attention={self.cross_attention}")
        if self.sliding_window is not None:
            # Not a combination any family uses; the bias reads key positions from the cache's length.
            raise ValueError(f"alibi_slopes with sliding_window={self.sliding_window!r} is not supported")
        self.alibi_slopes = ([[float(v) for v in row] for row in rows] if per_layer
                             else [float(v) for v in rows[0]])

    def layer_alibi_slopes(self, layer: int) -> list[float] | None:
        """The ALiBi slopes of ``layer``'s query heads (``None`` without ALiBi).

        Example:
            >>> from interp import ModelConfig
            >>> cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=5, n_ctx=4, alibi_slopes=[0.5, 0.25])
            >>> cfg.layer_alibi_slopes(0)
            [0.5, 0.25]
        """
        slopes = self.alibi_slopes
        if slopes is None:
            return None
        row = slopes[layer] if slopes and isinstance(slopes[0], list) else slopes
        return list(row)  # type: ignore[arg-type]

    def _check_latent_extras(self) -> None:
        """Validate the DeepSeek MLA field (value width)."""
        _int_or_none("v_head_dim", self.v_head_dim)
        if self.attention != "latent":
            if self.v_head_dim not in (None, self.d_head):
                raise ValueError(f"v_head_dim={self.v_head_dim} only applies to attention='latent' (standard "
                                 f"attention's value width is d_head={self.d_head})")
            self.v_head_dim = self.d_head
            return
        if self.v_head_dim is None:
            self.v_head_dim = self.d_head
        _positive_int("v_head_dim", self.v_head_dim)

    def _check_experts(self) -> None:
        """Validate the mixture-of-experts fields, quoting the values."""
        for name in ("n_experts", "n_experts_per_token", "d_expert", "router_groups", "router_topk_groups",
                     "d_shared_expert"):
            _int_or_none(name, getattr(self, name))
        for name in ("router_renormalize", "router_choice_bias", "shared_expert_gate", "router_logit_bias",
                     "expert_bias", "expert_input_weighting"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.n_experts < 0:
            raise ValueError(f"n_experts={self.n_experts} must be >= 0 (0: dense MLPs)")
        if not self.n_experts:
            # The derived fields also take their resolved dense values (what to_dict wrote).
            resolved = {"n_experts_per_token": 0, "d_expert": self.d_mlp, "router_topk_groups": self.router_groups}
            set_fields = [f"{name}={getattr(self, name)!r}" for name, default in _MOE_DEFAULTS.items()
                          if getattr(self, name) not in (default, resolved.get(name, default))]
            if set_fields:
                raise ValueError(f"{', '.join(set_fields)} only apply to a mixture of experts (n_experts > 0)")
            self.n_experts_per_token, self.d_expert, self.router_topk_groups = 0, self.d_mlp, self.router_groups
            return
        if self.attn_only:
            raise ValueError(f"n_experts={self.n_experts} needs MLPs, but attn_only=True")
        if self.activation not in ("swiglu", "geglu", "swiglu_clamped"):
            raise ValueError(f"experts are gated MLPs: activation={self.activation!r} must be 'swiglu', 'geglu' "
                             "or 'swiglu_clamped'")
        E, k = self.n_experts, self.n_experts_per_token
        if not k:
            raise ValueError(f"n_experts={E} needs n_experts_per_token (the router's top-k), got {k!r}")
        _positive_int("n_experts_per_token", k)
        if k > E:
            raise ValueError(f"router top-k n_experts_per_token={k} is larger than the number of experts "
                             f"n_experts={E}")
        if self.d_expert is None:
            self.d_expert = self.d_mlp
        _positive_int("d_expert", self.d_expert)
        if self.router_score not in _ROUTER_SCORES:
            raise ValueError(f"router_score={self.router_score!r} is not one of {_ROUTER_SCORES}")
        if self.router_score == "sparsemixer":
            if k != 2 or self.router_groups != 1 or self.router_choice_bias:
                raise ValueError(f"router_score='sparsemixer' picks exactly 2 experts with no groups or choice bias, "
                                 f"got n_experts_per_token={k}, router_groups={self.router_groups}, "
                                 f"router_choice_bias={self.router_choice_bias}")
            if isinstance(self.sparsemixer_eps, bool) or not isinstance(self.sparsemixer_eps, (int, float)) \
                    or not math.isfinite(self.sparsemixer_eps) or self.sparsemixer_eps < 0:
                raise ValueError(f"sparsemixer_eps={self.sparsemixer_eps!r} must be a finite number >= 0")
        elif self.sparsemixer_eps != 0.01:
            raise ValueError(f"sparsemixer_eps={self.sparsemixer_eps!r} only applies to router_score='sparsemixer', "
                             f"got router_score={self.router_score!r}")
        if self.router_group_score not in _ROUTER_GROUP_SCORES:
            raise ValueError(f"router_group_score={self.router_group_score!r} is not one of {_ROUTER_GROUP_SCORES}")
        _positive_int("router_groups", self.router_groups)
        if self.router_topk_groups is None:
            self.router_topk_groups = self.router_groups
        _positive_int("router_topk_groups", self.router_topk_groups)
        G, Gk = self.router_groups, self.router_topk_groups
        if E % G:
            raise ValueError(f"n_experts={E} is not divisible by router_groups={G}")
        if Gk > G:
            raise ValueError(f"router_topk_groups={Gk} is larger than router_groups={G}")
        if G > 1 and self.router_group_score == "top2_sum" and E // G < 2:
            raise ValueError(f"router_group_score='top2_sum' needs >= 2 experts per group, got n_experts={E} "
                             f"in router_groups={G}")
        if k > Gk * (E // G):
            raise ValueError(f"n_experts_per_token={k} is more than the {Gk * (E // G)} experts of the "
                             f"router_topk_groups={Gk} groups a token may use")
        _positive_float("routed_scaling", self.routed_scaling)
        if self.d_shared_expert < 0:
            raise ValueError(f"d_shared_expert={self.d_shared_expert} must be >= 0 (0: no shared expert)")
        if self.shared_expert_gate and not self.d_shared_expert:
            raise ValueError("shared_expert_gate=True needs a shared expert (d_shared_expert > 0)")
        if self.dense_mlp_layers is not None:
            dense = list(self.dense_mlp_layers)
            if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers for i in dense) \
                    or len(set(dense)) != len(dense):
                raise ValueError(f"dense_mlp_layers={self.dense_mlp_layers!r} must be distinct layer indices in "
                                 f"[0, {self.n_layers})")
            self.dense_mlp_layers = sorted(dense)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts (False for dense configs and ``dense_mlp_layers``).

        Example:
            >>> from interp import ModelConfig
            >>> cfg = ModelConfig(n_layers=2, d_model=8, n_heads=2, d_vocab=10, n_ctx=8, activation="swiglu",
            ...                   n_experts=4, n_experts_per_token=2, dense_mlp_layers=[0])
            >>> [cfg.is_moe_layer(i) for i in range(2)]
            [False, True]
        """
        return bool(self.n_experts) and layer not in (self.dense_mlp_layers or ())

    def _check_rope_scaling(self) -> None:
        """Validate ``rope_scaling``: a known kind, its required keys, no unknown key, sensible numbers."""
        rs = self.rope_scaling
        if rs is None:
            return
        if not isinstance(rs, dict):
            raise TypeError(f"rope_scaling={rs!r} must be a dict with a 'rope_type', or None")
        if self.positional != "rotary":
            raise ValueError(f"rope_scaling={rs!r} needs positional='rotary', got positional={self.positional!r}")
        kind = rs.get("rope_type")
        if kind not in ROPE_SCALING_KEYS:
            raise ValueError(f"rope_scaling rope_type={kind!r} is not supported; supported: "
                             f"{sorted(ROPE_SCALING_KEYS)}")
        required, optional = ROPE_SCALING_KEYS[kind]
        missing = [k for k in required if rs.get(k) is None]
        if missing:
            raise ValueError(f"rope_scaling rope_type={kind!r} needs {missing}; got {rs!r}")
        unknown = sorted(set(rs) - {"rope_type", *required, *optional})
        if unknown:
            raise ValueError(f"rope_scaling rope_type={kind!r} has unknown key(s) {unknown}; "
                             f"known: {sorted((*required, *optional))}")
        for key in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor",
                    "mscale", "mscale_all_dim"):
            if rs.get(key) is not None:
                value = rs[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"rope_scaling {key}={value!r} must be a finite number")
                if key not in ("mscale", "mscale_all_dim") and value <= 0:
                    raise ValueError(f"rope_scaling {key}={value!r} must be > 0")
        if kind in ("linear", "dynamic", "llama3", "yarn") and rs["factor"] < 1:
            raise ValueError(f"rope_scaling factor={rs['factor']!r} must be >= 1 (it stretches the context)")
        if "original_max_position_embeddings" in rs:
            _positive_int("rope_scaling original_max_position_embeddings", rs["original_max_position_embeddings"])
        if kind == "llama3" and not rs["low_freq_factor"] <= rs["high_freq_factor"]:
            # equal factors (Llama 4 Scout): no blended band, every wavelength is kept or divided
            raise ValueError(f"rope_scaling low_freq_factor={rs['low_freq_factor']} must be <= "
                             f"high_freq_factor={rs['high_freq_factor']}")
        if kind == "longrope":
            half = (self.rotary_dim or self.rope_dim or self.d_head) // 2
            for key in ("short_factor", "long_factor"):
                value = rs[key]
                if (not isinstance(value, (list, tuple)) or len(value) != half
                        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)):
                    raise ValueError(f"rope_scaling {key} must be {half} positive numbers (one per rotary "
                                     f"frequency), got {value!r}")

    def _check_block_features(self) -> None:
        """Validate windows, soft-caps, the score scale, QK-norm, norm placement and parallel blocks."""
        for name, value, allowed in (("qk_norm", self.qk_norm, _QK_NORMS),
                                     ("sublayer_norm", self.sublayer_norm, _SUBLAYER_NORMS),
                                     ("parallel_block", self.parallel_block, _PARALLEL_BLOCKS)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {allowed}")
        for name in ("attn_scale", "attn_softcap", "final_softcap", "local_rotary_base"):
            if getattr(self, name) is not None:
                _positive_float(name, getattr(self, name))
        _positive_float("embed_scale", self.embed_scale)
        window = self.sliding_window
        if window is not None:
            windows = _per_layer_sizes("sliding_window", window, self.n_layers, "None (global attention)")
            if any(w is not None for w in windows) and not self.causal:
                raise ValueError(f"sliding_window={window!r} needs a causal decoder (causal=False)")
            self.sliding_window = None if all(w is None for w in windows) else list(windows)
        if self.nope_layers is not None:
            nope = self.nope_layers
            if (not isinstance(nope, (list, tuple))
                    or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers for i in nope)
                    or len(set(nope)) != len(nope)):
                raise ValueError(f"nope_layers={nope!r} must list distinct layer indices in [0, {self.n_layers})")
            if nope and self.positional != "rotary":
                raise ValueError(f"nope_layers={nope!r} needs positional='rotary', got {self.positional!r}")
            self.nope_layers = sorted(nope) or None
        chunk = self.attention_chunk
        if chunk is not None:
            chunks = _per_layer_sizes("attention_chunk", chunk, self.n_layers, "None")
            both = [i for i, c in enumerate(chunks) if c is not None and self.window(i) is not None]
            if both:
                raise ValueError(f"attention_chunk={chunk!r} and sliding_window={self.sliding_window!r} both apply "
                                 f"to layers {both}; a layer has one or the other")
            if any(c is not None for c in chunks) and not self.causal:
                raise ValueError(f"attention_chunk={chunk!r} needs a causal decoder (causal=False)")
            self.attention_chunk = None if all(c is None for c in chunks) else list(chunks)
        if self.nope_temperature is not None:
            temp = self.nope_temperature
            if (not isinstance(temp, (list, tuple)) or len(temp) != 2
                    or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0
                           for t in temp)):
                raise ValueError(f"nope_temperature={temp!r} must be [scale, floor], two finite numbers > 0")
            if not self.nope_layers:
                raise ValueError(f"nope_temperature={temp!r} needs nope_layers (it scales their queries), got "
                                 f"nope_layers={self.nope_layers!r}")
            self.nope_temperature = [float(t) for t in temp]
        if self.local_rotary_base is not None and (self.positional != "rotary" or self.sliding_window is None):
            raise ValueError(f"local_rotary_base={self.local_rotary_base} needs positional='rotary' and "
                             f"sliding-window layers, got positional={self.positional!r}, "
                             f"sliding_window={self.sliding_window!r}")
        if self.attn_sinks and (self.attention != "standard" or self.cross_attention):
            raise ValueError(f"attn_sinks=True needs attention='standard' without cross-attention, got "
                             f"attention={self.attention!r}, cross_attention={self.cross_attention}")
        for name in ("swiglu_alpha", "swiglu_limit"):
            _positive_float(name, getattr(self, name))
        if self.activation != "swiglu_clamped" and (self.swiglu_alpha, self.swiglu_limit) != (1.702, 7.0):
            raise ValueError(f"swiglu_alpha={self.swiglu_alpha!r}, swiglu_limit={self.swiglu_limit!r} only apply to "
                             f"activation='swiglu_clamped', got activation={self.activation!r}")
        if self.qk_norm != "none" and self.attention != "standard":
            raise ValueError(f"qk_norm={self.qk_norm!r} applies to attention='standard', got {self.attention!r}")
        if self.sublayer_norm != "input" and self.normalization not in ("pre", "rms"):
            raise ValueError(f"sublayer_norm={self.sublayer_norm!r} needs a pre-norm model (normalization 'pre' "
                             f"or 'rms'), got normalization={self.normalization!r}")
        if self.parallel_block != "none":
            if self.attn_only or self.cross_attention or self.sublayer_norm != "input":
                raise ValueError(f"parallel_block={self.parallel_block!r} needs an MLP, no cross-attention and "
                                 f"sublayer_norm='input'; got attn_only={self.attn_only}, "
                                 f"cross_attention={self.cross_attention}, sublayer_norm={self.sublayer_norm!r}")
            if self.normalization not in ("pre", "rms"):
                raise ValueError(f"parallel_block={self.parallel_block!r} needs a pre-norm model, got "
                                 f"normalization={self.normalization!r}")

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (``None``: global attention).

        Example:
            >>> from interp import ModelConfig
            >>> ModelConfig(n_layers=2, d_model=8, n_heads=2, d_vocab=10, n_ctx=32, sliding_window=[4, None]).window(0)
            4
        """
        windows = self.sliding_window
        if windows is None or isinstance(windows, int):  # an int (every layer) set after construction
            return windows
        return windows[layer]

    def cache_bounded(self, layer: int) -> bool:
        """Whether ``layer``'s KV cache keeps only the recent positions a later query can see (a sliding window
        or an attention chunk; a latent cache keeps every position), so that a prefix cannot be rewound to.

        Example:
            >>> from interp import ModelConfig
            >>> cfg = ModelConfig(n_layers=2, d_model=8, n_heads=2, d_vocab=10, n_ctx=32, attention_chunk=[4, None])
            >>> cfg.cache_bounded(0), cfg.cache_bounded(1)
            (True, False)
        """
        return self.attention != "latent" and (self.window(layer) is not None or self.chunk(layer) is not None)

    def chunk(self, layer: int) -> int | None:
        """The attention chunk of ``layer`` (``None``: not chunked).

        Example:
            >>> from interp import ModelConfig
            >>> ModelConfig(n_layers=2, d_model=8, n_heads=2, d_vocab=10, n_ctx=32, attention_chunk=[4, None]).chunk(0)
            4
        """
        chunks = self.attention_chunk
        if chunks is None or isinstance(chunks, int):
            return chunks
        return chunks[layer]

    def set_features(self, names: tuple[str, ...]) -> str:
        """``"name=value, ..."`` for those of ``names`` whose value is not what omitting them gives ("" when none):
        how a code path that covers only the defaults says what it does not cover.

        Example:
            >>> from interp import ModelConfig
            >>> ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=5, n_ctx=4, d_mlp=16).set_features(
            ...     ("d_mlp", "d_expert", "attn_softcap"))
            'd_mlp=16'
        """
        return ", ".join(f"{n}={getattr(self, n)!r}" for n in names if self._differs_from_default(n))

    def _differs_from_default(self, name: str) -> bool:
        """Whether field ``name`` holds something other than what omitting it gives: its default, or for a field
        resolved in ``__post_init__`` (default None) what the other values derive (a dense model's ``d_expert``
        equal to its ``d_mlp`` is not set)."""
        default = self.__dataclass_fields__[name].default
        value = getattr(self, name)
        if default is not None:
            return bool(value != default)
        if value is None:
            return False
        others = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != name}
        try:
            return bool(value != getattr(type(self)(**others), name))
        except (TypeError, ValueError):  # the others alone are no valid config: the value is needed
            return True

    def _check_layer_heads(self) -> None:
        """Validate the optional per-layer head counts and query-to-K/V maps (pruned models)."""
        L = self.n_layers
        if self.layer_n_heads is None:
            for name in ("layer_n_kv_heads", "layer_kv_map"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}={getattr(self, name)!r} needs layer_n_heads")
            return
        heads = list(self.layer_n_heads)
        if len(heads) != L or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in heads):
            raise ValueError(f"layer_n_heads={self.layer_n_heads!r} must be {L} non-negative ints (one per layer)")
        self.layer_n_heads = heads
        if self.attention == "latent":
            if self.layer_n_kv_heads is not None or self.layer_kv_map is not None:
                raise ValueError("attention='latent' has one K/V head per query head: leave layer_n_kv_heads "
                                 f"and layer_kv_map as None, got {self.layer_n_kv_heads!r}, {self.layer_kv_map!r}")
            return
        if self.layer_n_kv_heads is None:
            if self.n_kv_heads != self.n_heads:
                raise ValueError(f"layer_n_heads={heads} on a GQA/MQA config (n_kv_heads={self.n_kv_heads}) "
                                 "needs layer_n_kv_heads")
            self.layer_n_kv_heads = list(heads)
        kvs = list(self.layer_n_kv_heads)
        if len(kvs) != L or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in kvs):
            raise ValueError(f"layer_n_kv_heads={self.layer_n_kv_heads!r} must be {L} non-negative ints")
        self.layer_n_kv_heads = kvs
        maps = self.layer_kv_map if self.layer_kv_map is not None else [None] * L
        if len(maps) != L:
            raise ValueError(f"layer_kv_map has {len(maps)} entries, expected one per layer ({L})")
        self.layer_kv_map = None if self.layer_kv_map is None else [None if m is None else list(m) for m in maps]
        for layer, (h, k, m) in enumerate(zip(heads, kvs, maps)):
            if (h == 0) != (k == 0) or k > h:
                raise ValueError(f"layer {layer}: {h} query heads and {k} K/V heads (need 0 < K <= H, or both 0)")
            if m is None:
                if h and h % k:
                    raise ValueError(f"layer {layer}: {h} query heads are not a multiple of {k} K/V heads; "
                                     "give layer_kv_map for unequal groups")
            elif len(m) != h or sorted(set(m)) != list(range(k)):
                raise ValueError(f"layer_kv_map[{layer}]={m!r} must give each of the {h} query heads a K/V head "
                                 f"in [0, {k}) and use every K/V head")

    # --- derived sizes -------------------------------------------------------------------------------
    def layer(self, layer: int) -> LayerShape:
        """The attention shape of ``layer``: what attention, the KV cache, surgery and analysis all read.

        Raises:
            ValueError: ``layer`` is out of range.

        Example:
            >>> from interp import ModelConfig
            >>> ModelConfig(n_layers=2, d_model=64, n_heads=8, n_kv_heads=2, d_vocab=10, n_ctx=8).layer(1)
            LayerShape(n_heads=8, n_kv_heads=2, d_head=8, kv_map=(0, 0, 0, 0, 1, 1, 1, 1))
        """
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer={layer!r} is outside [0, {self.n_layers})")
        h = self.n_heads if self.layer_n_heads is None else self.layer_n_heads[layer]
        if self.attention == "latent":
            k = h
        else:
            k = self.n_kv_heads if self.layer_n_kv_heads is None else self.layer_n_kv_heads[layer]
        given = None if self.layer_kv_map is None else self.layer_kv_map[layer]
        if given is not None:
            kv_map = tuple(given)
        else:
            kv_map = tuple(i // (h // k) for i in range(h)) if h else ()
        return LayerShape(n_heads=h, n_kv_heads=k, d_head=self.d_head, kv_map=kv_map)

    @property
    def group_size(self) -> int:
        """Query heads per K/V head (G = H // K)."""
        return self.n_heads // self.n_kv_heads

    @property
    def kind(self) -> str:
        """``"mha"``, ``"gqa"``, ``"mqa"`` or ``"mla"``."""
        return "mla" if self.attention == "latent" else head_sharing(self.n_heads, self.n_kv_heads)

    def heads_in_layer(self, layer: int) -> int:
        """Query heads of ``layer`` (``cfg.layer(layer).n_heads``)."""
        return self.layer(layer).n_heads

    def kv_heads_in_layer(self, layer: int) -> int:
        """K/V heads of ``layer`` (``cfg.layer(layer).n_kv_heads``; equals the query heads for MLA)."""
        return self.layer(layer).n_kv_heads

    def kv_map(self, layer: int) -> list[int]:
        """The K/V head each query head of ``layer`` reads (``cfg.layer(layer).kv_map``)."""
        return list(self.layer(layer).kv_map)

    @property
    def uniform_heads(self) -> bool:
        """True when every layer has ``n_heads`` query heads and ``n_kv_heads`` K/V heads in uniform groups."""
        return self.layer_n_heads is None

    def kv_cache_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """Bytes the KV cache holds per token over all layers.

        Args:
            bytes_per_element: 2 for fp16/bf16, 4 for fp32.

        Returns:
            ``sum over layers of 2 * K_layer * d_head * bytes`` for standard attention; for MLA the latent plus
            the decoupled rotary key: ``(kv_latent_dim + rope_dim) * bytes`` per layer that has heads (a layer
            whose every head was removed caches nothing).
        """
        if self.attention == "latent":
            layers = sum(1 for layer in range(self.n_layers) if self.layer(layer).n_heads)
            return layers * (self.kv_latent_dim + self.rope_dim) * bytes_per_element
        return sum(self.layer(layer).kv_bytes_per_token(bytes_per_element) for layer in range(self.n_layers))

    # --- display ----------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        """The required sizes and only the fields that differ from what the defaults give (a dense model's repr
        names no MoE or MLA field); :meth:`full_repr` lists every field.

        Example:
            >>> ModelConfig(n_layers=2, d_model=64, n_heads=4, d_vocab=50, n_ctx=32, positional="rotary")
            ModelConfig(n_layers=2, d_model=64, n_heads=4, d_vocab=50, n_ctx=32, positional='rotary')
        """
        required = ("n_layers", "d_model", "n_heads", "d_vocab", "n_ctx")
        shown = [f"{n}={getattr(self, n)!r}" for n in required]
        shown += [f"{f.name}={_shown(getattr(self, f.name))}" for f in dataclasses.fields(self)
                  if f.name not in required and self._differs_from_default(f.name)]
        return f"{type(self).__name__}({', '.join(shown)})"

    def full_repr(self) -> str:
        """Every field and its value, defaults included (``repr`` shows only what differs from them).

        Example:
            >>> from interp import ModelConfig
            >>> "router_groups=1" in ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=5, n_ctx=4).full_repr()
            True
        """
        values = ", ".join(f"{f.name}={_shown(getattr(self, f.name))}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({values})"

    # --- (de)serialisation ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        # the policy's later fields only when set: a config that does not use them saves as it did before them
        data["precision"] = {k: v for k, v in data["precision"].items() if k in LEGACY_FIELDS or v}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build a config from a dict, rejecting unknown keys by name.

        A dict saved before the precision policy holds ``norm_weight_float32`` / ``rotary_float32`` instead of
        ``precision``: those keys map onto it.

        Example:
            >>> from interp import ModelConfig
            >>> old = {"n_layers": 1, "d_model": 8, "n_heads": 2, "d_vocab": 5, "n_ctx": 4,
            ...        "norm_weight_float32": True, "rotary_float32": False}
            >>> ModelConfig.from_dict(old).precision
            Precision.named('gemma')
        """
        data = dict(data)
        legacy = {k: data.pop(k) for k in LEGACY_FIELDS if k in data}
        if legacy:
            if "precision" in data:
                raise ValueError(f"config holds both 'precision' and the old key(s) {sorted(legacy)} it replaced")
            data["precision"] = precision_from(legacy, what=f"the old key(s) {sorted(legacy)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def head_sharing(n_heads: int, n_kv_heads: int) -> str:
    """How query heads share K/V heads: ``"mha"`` (one each), ``"mqa"`` (one for all) or ``"gqa"`` (groups).

    Args:
        n_heads: query heads.
        n_kv_heads: K/V heads.

    Returns:
        ``"mha"``, ``"mqa"`` or ``"gqa"``.

    Example:
        >>> from interp.config import head_sharing
        >>> head_sharing(8, 8), head_sharing(8, 1), head_sharing(8, 2)
        ('mha', 'mqa', 'gqa')
    """
    if n_kv_heads == n_heads:
        return "mha"
    return "mqa" if n_kv_heads == 1 else "gqa"


def alibi_slopes(n_heads: int, max_bias: float = 8.0) -> list[float]:
    """ALiBi's per-head slopes, as BLOOM, Falcon and MPT compute them.

    For a power of two n: ``2 ** (-max_bias * i / n)``, i = 1 .. n. Otherwise the n' = largest power of two below
    n heads get n'-head slopes and the rest take every other slope of the 2n'-head sequence (odd i), as the
    ALiBi paper's reference code does (BLOOM's ``_get_alibi_slopes``; MPT's ``gen_slopes`` with
    ``alibi_bias_max=max_bias`` gives the same numbers).

    Args:
        n_heads: query heads.
        max_bias: the exponent span (8 in the paper and in every published BLOOM / Falcon / MPT checkpoint).

    Returns:
        ``n_heads`` floats.

    Raises:
        ValueError: ``n_heads < 1`` or ``max_bias <= 0``.

    Example:
        >>> from interp.config import alibi_slopes
        >>> alibi_slopes(4)
        [0.25, 0.0625, 0.015625, 0.00390625]
        >>> alibi_slopes(6)[4:]
        [0.5, 0.125]
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"alibi_slopes: n_heads={n_heads!r} must be a positive int")
    _positive_float("max_bias", max_bias)
    power = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = [2.0 ** (-max_bias * i / power) for i in range(1, power + 1)]
    extra = [2.0 ** (-max_bias * i / (2 * power)) for i in range(1, 2 * power + 1, 2)]
    return slopes + extra[: n_heads - power]


_MOE_DEFAULTS = {"n_experts_per_token": None, "d_expert": None, "router_score": "softmax", "sparsemixer_eps": 0.01,
                 "router_renormalize": False, "router_groups": 1, "router_topk_groups": None,
                 "router_group_score": "max", "router_choice_bias": False, "routed_scaling": 1.0,
                 "d_shared_expert": 0, "shared_expert_gate": False, "router_logit_bias": False,
                 "expert_bias": False, "expert_input_weighting": False, "dense_mlp_layers": None}

_BOOL_FIELDS = ("causal", "embed_norm", "attn_only", "attn_bias", "out_bias", "mlp_bias", "unembed",
                "tie_embeddings", "cross_attention", "use_sdpa", "attn_sinks")


def _shown(value: Any) -> str:
    """A field's value as a config's repr writes it: one that evaluates with ``ModelConfig`` alone in scope (a
    precision policy by its name, or its fields as a dict, both of which the config accepts)."""
    if isinstance(value, Precision):
        return repr(value.name) if value.name is not None else repr(dataclasses.asdict(value))
    return repr(value)


def _int_or_none(name: str, value: Any) -> None:
    # 4.0 or "4" would pass the range checks below and fail later inside a forward pass.
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name}={value!r} must be an int, got {type(value).__name__}")


def _positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a finite number > 0")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name}={value} must be > 0")
