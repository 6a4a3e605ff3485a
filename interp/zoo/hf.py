"""Hugging Face converters: BERT, GPT-2 and Llama-style models to :class:`interp.Transformer`.

Each architecture has two pure functions, one from the HF config dict to a :class:`ModelConfig` and one
from the HF state dict to ours; neither imports ``transformers`` (MiniLM uses them on a bare safetensors
file). :func:`from_hf` wraps them for a model object, a local folder or (with hub access) a hub id.

Weight layouts, and what differs from ours:

* BERT (``BertModel``, also the ``bert.`` part of ``BertFor*``): post-LN encoder; Q, K, V are separate
  ``nn.Linear`` layers that we stack into ``W_qkv``. Task heads (pooler, MLM head) are dropped: the model
  returns the last hidden state (``unembed=False``).
* GPT-2 (``GPT2LMHeadModel`` / ``GPT2Model``): ``Conv1D`` stores weights as ``[in, out]``, the transpose of
  ``nn.Linear``; ``gelu_new`` is the tanh approximation; the unembedding is tied to ``wte``.
* Llama-style (``LlamaForCausalLM``, also ``mistral`` and ``qwen2``): pre-RMSNorm, rotary embeddings in the
  rotate-half convention (as :mod:`interp.rotary`) with base ``rope_theta``, SwiGLU MLP
  (``down(silu(gate(x)) * up(x))``), grouped-query attention with ``num_key_value_heads``.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..model import Transformer
from ..placement import build
from .checkpoint import load_state_dict_strict

StateDict = Mapping[str, torch.Tensor]

_HF_EXTRA = "pip install interp[hf]"


def _need(hf_cfg: Mapping[str, Any], key: str, arch: str) -> Any:
    if key not in hf_cfg or hf_cfg[key] is None:
        raise ValueError(f"{arch} config has no {key!r}; got keys {sorted(hf_cfg)}")
    return hf_cfg[key]


class _Source:
    """Reads HF tensors by name, stripping a model prefix, and names the missing one in its error."""

    def __init__(self, sd: StateDict, prefixes: tuple[str, ...], arch: str) -> None:
        self.arch = arch
        self.prefix = ""
        for p in prefixes:
            if any(k.startswith(p) for k in sd):
                self.prefix = p
                break
        self.sd = sd

    def __call__(self, key: str) -> torch.Tensor:
        full = self.prefix + key
        if full not in self.sd:
            raise ValueError(f"{self.arch} state dict has no tensor {full!r} (found e.g. {list(self.sd)[:4]})")
        return self.sd[full]

    def has(self, key: str) -> bool:
        return self.prefix + key in self.sd


# --- BERT -------------------------------------------------------------------------------------------------
def bert_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a BERT encoder from its HF config dict (``config.json`` / ``config.to_dict()``).

    Raises:
        ValueError: a setting this converter does not reproduce (relative position embeddings, an
            activation other than gelu/relu/gelu_new) or a missing key.

    Example:
        >>> bert_config(json.load(open("config.json"))).normalization
        'post'
    """
    arch = "BERT"
    pos = hf_cfg.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ValueError(f"BERT position_embedding_type={pos!r} is not supported (only 'absolute')")
    act = hf_cfg.get("hidden_act", "gelu")
    if act not in ("gelu", "relu", "gelu_new"):
        raise ValueError(f"BERT hidden_act={act!r} is not supported (gelu, relu, gelu_new)")
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=d_model // n_heads, d_mlp=_need(hf_cfg, "intermediate_size", arch), activation=act,
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=hf_cfg.get("max_position_embeddings", 512),
        n_token_types=hf_cfg.get("type_vocab_size", 2), normalization="post", embed_norm=True,
        positional="learned", causal=False, unembed=False, norm_eps=hf_cfg.get("layer_norm_eps", 1e-12),
        pad_token_id=hf_cfg.get("pad_token_id"),
    )


def bert_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF BERT one (keys with or without the ``bert.`` prefix).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("bert.",), "BERT")
    out = {
        "W_E.weight": src("embeddings.word_embeddings.weight"),
        "W_pos.weight": src("embeddings.position_embeddings.weight"),
        "embed_ln.weight": src("embeddings.LayerNorm.weight"),
        "embed_ln.bias": src("embeddings.LayerNorm.bias"),
    }
    if cfg.n_token_types:
        out["W_tt.weight"] = src("embeddings.token_type_embeddings.weight")
    for i in range(cfg.n_layers):
        h, b = f"encoder.layer.{i}.", f"blocks.{i}."
        # HF keeps Q, K, V apart, each [H*D, M] with head h in rows h*D:(h+1)*D: stacked they are our W_qkv.
        for kind in ("weight", "bias"):
            out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                [src(h + f"attention.self.{n}.{kind}") for n in ("query", "key", "value")], dim=0)  # [3*H*D(, M)]
            out[b + f"attn.W_O.{kind}"] = src(h + f"attention.output.dense.{kind}")
            out[b + f"ln1.{kind}"] = src(h + f"attention.output.LayerNorm.{kind}")
            out[b + f"mlp.W_in.{kind}"] = src(h + f"intermediate.dense.{kind}")
            out[b + f"mlp.W_out.{kind}"] = src(h + f"output.dense.{kind}")
            out[b + f"ln2.{kind}"] = src(h + f"output.LayerNorm.{kind}")
    return out


# --- GPT-2 ------------------------------------------------------------------------------------------------
def gpt2_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a GPT-2 decoder from its HF config dict.

    Raises:
        ValueError: unsupported settings (``scale_attn_by_inverse_layer_idx``, ``scale_attn_weights=False``,
            cross-attention, an unknown activation) or a missing key.
    """
    arch = "GPT-2"
    for key, bad in (("scale_attn_by_inverse_layer_idx", True), ("scale_attn_weights", False),
                     ("add_cross_attention", True)):
        if hf_cfg.get(key, not bad) == bad:
            raise ValueError(f"GPT-2 {key}={bad} is not supported by the converter")
    act = hf_cfg.get("activation_function", "gelu_new")
    acts = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
    if act not in acts:
        raise ValueError(f"GPT-2 activation_function={act!r} is not supported ({sorted(acts)})")
    d_model = _need(hf_cfg, "n_embd", arch)
    return ModelConfig(
        n_layers=_need(hf_cfg, "n_layer", arch), d_model=d_model, n_heads=_need(hf_cfg, "n_head", arch),
        d_mlp=hf_cfg.get("n_inner") or 4 * d_model, activation=acts[act], d_vocab=_need(hf_cfg, "vocab_size", arch),
        n_ctx=_need(hf_cfg, "n_positions", arch), normalization="pre", positional="learned", causal=True,
        norm_eps=hf_cfg.get("layer_norm_epsilon", 1e-5), unembed=True,
        tie_embeddings=hf_cfg.get("tie_word_embeddings", True), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def gpt2_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF GPT-2 one (``GPT2LMHeadModel`` or ``GPT2Model`` keys).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("transformer.",), "GPT-2")
    out = {"W_E.weight": src("wte.weight"), "W_pos.weight": src("wpe.weight"),
           "ln_final.weight": src("ln_f.weight"), "ln_final.bias": src("ln_f.bias")}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        # Conv1D weights are [in, out]; nn.Linear wants [out, in]. c_attn's columns are [q | k | v], each
        # split by head in order, which is our W_qkv row order once transposed.
        for ours, theirs in (("attn.W_qkv", "attn.c_attn"), ("attn.W_O", "attn.c_proj"),
                             ("mlp.W_in", "mlp.c_fc"), ("mlp.W_out", "mlp.c_proj")):
            out[b + ours + ".weight"] = src(h + theirs + ".weight").T.contiguous()  # [in, out] -> [out, in]
            out[b + ours + ".bias"] = src(h + theirs + ".bias")
        for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[b + ours + ".weight"] = src(h + theirs + ".weight")
            out[b + ours + ".bias"] = src(h + theirs + ".bias")
    if not cfg.tie_embeddings:
        out["W_U.weight"] = hf_sd["lm_head.weight"] if "lm_head.weight" in hf_sd else src("wte.weight")
        out["W_U.bias"] = torch.zeros(cfg.d_vocab)  # an untied W_U has a bias in interp; lm_head has none
    return out


# --- Llama-style ------------------------------------------------------------------------------------------
_LLAMA_TYPES = ("llama", "mistral", "qwen2")


def _rope_theta(hf_cfg: Mapping[str, Any]) -> float:
    rope = hf_cfg.get("rope_parameters") or {}
    scaling = hf_cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ValueError(f"rope_type={kind!r} (RoPE scaling) is not supported; only 'default' rotary")
    theta = rope.get("rope_theta", hf_cfg.get("rope_theta", 10000.0))
    return float(theta)


def llama_config(hf_cfg: Mapping[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of a Llama-style decoder (llama / mistral / qwen2) from its HF config dict.

    ``rotary_base`` comes from ``rope_parameters["rope_theta"]`` (transformers 5) or ``rope_theta`` (4.x).

    Raises:
        ValueError: RoPE scaling, an activation other than silu, or a missing key. A sliding window
            shorter than ``max_position_embeddings`` caps ``n_ctx`` at the window (where both agree).
    """
    arch = "Llama"
    mtype = hf_cfg.get("model_type", "llama")
    act = hf_cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{mtype} hidden_act={act!r} is not supported (only 'silu', i.e. SwiGLU)")
    n_ctx = _need(hf_cfg, "max_position_embeddings", arch)
    window = hf_cfg.get("sliding_window")
    if window is not None and hf_cfg.get("use_sliding_window", True) and window < n_ctx:
        # Within the window sliding-window attention is full causal attention: cap the context there.
        n_ctx = window
    d_model, n_heads = _need(hf_cfg, "hidden_size", arch), _need(hf_cfg, "num_attention_heads", arch)
    attn_bias = bool(hf_cfg.get("attention_bias", mtype == "qwen2"))
    return ModelConfig(
        n_layers=_need(hf_cfg, "num_hidden_layers", arch), d_model=d_model, n_heads=n_heads,
        d_head=hf_cfg.get("head_dim") or d_model // n_heads,
        n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
        d_mlp=_need(hf_cfg, "intermediate_size", arch), activation="swiglu",
        d_vocab=_need(hf_cfg, "vocab_size", arch), n_ctx=n_ctx, normalization="rms",
        norm_eps=hf_cfg.get("rms_norm_eps", 1e-6), positional="rotary", rotary_base=_rope_theta(hf_cfg),
        causal=True, attn_bias=attn_bias, out_bias=attn_bias and mtype != "qwen2",
        mlp_bias=bool(hf_cfg.get("mlp_bias", False)), unembed=True,
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)), pad_token_id=hf_cfg.get("pad_token_id"),
    )


def llama_state_dict(hf_sd: StateDict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF Llama-style one (``LlamaForCausalLM`` or ``LlamaModel`` keys).

    Raises:
        ValueError: a tensor the conversion needs is absent (named in the message).
    """
    src = _Source(hf_sd, ("model.",), "Llama")
    out = {"W_E.weight": src("embed_tokens.weight"), "ln_final.weight": src("norm.weight")}
    for i in range(cfg.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        kinds = ("weight", "bias") if cfg.attn_bias else ("weight",)
        for kind in kinds:
            # q_proj [H*D, M], k_proj / v_proj [K*D, M]; K/V head j serves query heads j*G..(j+1)*G-1, as ours.
            out[b + f"attn.W_qkv.{kind}"] = torch.cat(
                [src(h + f"self_attn.{n}_proj.{kind}") for n in ("q", "k", "v")], dim=0)  # [(H+2K)*D(, M)]
        out[b + "attn.W_O.weight"] = src(h + "self_attn.o_proj.weight")
        if cfg.out_bias:
            out[b + "attn.W_O.bias"] = src(h + "self_attn.o_proj.bias")
        out[b + "ln1.weight"] = src(h + "input_layernorm.weight")
        out[b + "ln2.weight"] = src(h + "post_attention_layernorm.weight")
        for ours, theirs in (("W_gate", "gate_proj"), ("W_in", "up_proj"), ("W_out", "down_proj")):
            for kind in (("weight", "bias") if cfg.mlp_bias else ("weight",)):
                out[b + f"mlp.{ours}.{kind}"] = src(h + f"mlp.{theirs}.{kind}")
    if not cfg.tie_embeddings:
        if "lm_head.weight" not in hf_sd:
            raise ValueError("Llama state dict has no 'lm_head.weight' and tie_word_embeddings is False "
                             "(pass a *ForCausalLM model, not the bare *Model)")
        out["W_U.weight"] = hf_sd["lm_head.weight"]
        out["W_U.bias"] = torch.zeros(cfg.d_vocab)  # an untied W_U has a bias in interp; lm_head has none
    return out


# --- dispatch ---------------------------------------------------------------------------------------------
Converter = tuple[Callable[[Mapping[str, Any]], ModelConfig], Callable[[StateDict, ModelConfig], dict]]
CONVERTERS: dict[str, Converter] = {
    "bert": (bert_config, bert_state_dict),
    "gpt2": (gpt2_config, gpt2_state_dict),
    **{t: (llama_config, llama_state_dict) for t in _LLAMA_TYPES},
}


def source_dtype(hf_sd: StateDict) -> torch.dtype | None:
    """The floating dtype that holds most of a state dict's values (a bf16 checkpoint with a few float32
    buffers is bf16), or None when it has no floating tensors.

    Example:
        >>> source_dtype({"w": torch.zeros(4, dtype=torch.bfloat16), "b": torch.zeros(1)})
        torch.bfloat16
    """
    counts: dict[torch.dtype, int] = {}
    for t in hf_sd.values():
        if t.is_floating_point():
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    return max(counts, key=counts.__getitem__) if counts else None


def convert(hf_cfg: Mapping[str, Any], hf_sd: StateDict, *, name: str = "hf-model",
            dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Transformer:
    """Build an :class:`interp.Transformer` from a HF config dict and state dict (no ``transformers`` needed).

    Args:
        hf_cfg: the HF config as a dict (``config.json`` contents); ``model_type`` picks the converter.
        hf_sd: the HF state dict (from the model or a safetensors file).
        name: the model's ``name``.
        dtype: the parameters' dtype (default: the source's, see :func:`source_dtype`: bf16 stays bf16).
        device: where to build the model (default: where the source tensors are).

    Returns:
        The converted model in eval mode.

    Raises:
        ValueError: unsupported ``model_type`` (the supported ones are listed), unsupported settings,
            missing tensors, or shape mismatches (tensor named with both shapes).
    """
    mtype = hf_cfg.get("model_type")
    if mtype not in CONVERTERS:
        raise ValueError(f"model_type={mtype!r} is not supported; supported: {sorted(CONVERTERS)}")
    make_cfg, make_sd = CONVERTERS[mtype]
    cfg = make_cfg(hf_cfg)
    if dtype is None:
        dtype = source_dtype(hf_sd)
    if device is None:  # where the source weights are (a HF model on a GPU converts on that GPU)
        device = next((t.device for t in hf_sd.values() if t.is_floating_point()), None)
    # Built directly in the target dtype and device: a bf16 checkpoint never passes through a float32 copy.
    model = build(cfg, dtype=dtype, device=device)
    load_state_dict_strict(model, make_sd(hf_sd, cfg), source=f"Hugging Face {mtype} weights")
    model.name = name
    return model.eval()


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"loading Hugging Face models needs transformers: {_HF_EXTRA}") from e
    return transformers


def _tokenizer_for(source: str):
    """Our Tokenizer for a local folder or hub id, or None when none can be found."""
    from .tokenizer import Tokenizer

    folder = Path(source)
    if (folder / "tokenizer.json").is_file():
        return Tokenizer.from_file(folder / "tokenizer.json")
    try:
        hf_tok = _transformers().AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        return None
    backend = getattr(hf_tok, "backend_tokenizer", None)
    return None if backend is None else Tokenizer(backend, pad_token_id=hf_tok.pad_token_id)


def from_hf(model_or_path: Any, *, tokenizer: Any = None, name: str | None = None,
            device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Transformer:
    """Convert a Hugging Face BERT, GPT-2 or Llama-style model to an :class:`interp.Transformer`.

    Users with hub access can pass any hub id or local folder of these architectures (``"gpt2"``,
    ``"bert-base-uncased"``, ``"TinyLlama/TinyLlama-1.1B-Chat-v1.0"``, ``"./my-llama"``); the weights and the
    tokenizer (``tokenizer.json``) are then loaded with ``transformers``. A model object is converted as
    it is (no download).

    Args:
        model_or_path: a ``transformers.PreTrainedModel`` (``BertModel``, ``GPT2LMHeadModel``,
            ``LlamaForCausalLM``, ...), a local folder, or a hub id.
        tokenizer: a :class:`interp.zoo.tokenizer.Tokenizer`, a ``tokenizers.Tokenizer`` or a HF fast
            tokenizer to attach; default: the folder's / hub id's tokenizer, none for a model object.
        name: ``model.name`` (default: the path, or the HF ``name_or_path``).
        device: where to put the converted model.
        dtype: the parameters' dtype (default: the weights' own; a bf16 checkpoint stays bf16).

    Returns:
        The converted model (eval mode). BERT models return hidden states (``cfg.unembed`` False).

    Raises:
        ImportError: a path or id was given and ``transformers`` is missing (``pip install interp[hf]``).
        TypeError: ``model_or_path`` is neither a HF model nor a path/str.
        ValueError: unsupported architecture or settings, or weights that do not fit.

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = from_hf(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4)))
        >>> model = from_hf("gpt2")   # with hub access
    """
    if isinstance(model_or_path, (str, Path)):
        source = str(model_or_path)
        tf = _transformers()
        hf_cfg = tf.AutoConfig.from_pretrained(source)
        auto = tf.AutoModel if hf_cfg.model_type == "bert" else tf.AutoModelForCausalLM
        try:
            hf_model = auto.from_pretrained(source, dtype="auto")  # the checkpoint's own dtype
        except pickle.UnpicklingError as e:
            # torch refuses to unpickle arbitrary objects (weights_only): say so instead of a pickle traceback.
            raise ValueError(f"{source}: its weights are a pickle file that cannot be loaded safely; convert "
                             f"them to model.safetensors first ({_plain(str(e).splitlines()[0])})") from e
        if tokenizer is None:
            tokenizer = _tokenizer_for(source)
        name = name or source
    elif hasattr(model_or_path, "config") and hasattr(model_or_path, "state_dict"):
        hf_model = model_or_path
        name = name or getattr(hf_model.config, "name_or_path", "") or hf_model.config.model_type
    else:
        raise TypeError(f"from_hf takes a Hugging Face model, a local folder or a hub id, "
                        f"got {type(model_or_path).__name__}")
    model = convert(hf_model.config.to_dict(), hf_model.state_dict(), name=name, dtype=dtype, device=device)
    model.tokenizer = _wrap_tokenizer(tokenizer)
    if device is not None:
        model.to(device)
    return model


def _plain(text: str) -> str:
    """``text`` without terminal colour codes (torch's pickle errors carry them)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _wrap_tokenizer(tokenizer: Any):
    from tokenizers import Tokenizer as HFTok

    from .tokenizer import Tokenizer

    if tokenizer is None or isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, HFTok):
        return Tokenizer(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, HFTok):
        return Tokenizer(backend, pad_token_id=getattr(tokenizer, "pad_token_id", None))
    raise TypeError(f"tokenizer must be an interp Tokenizer, a tokenizers.Tokenizer or a HF fast tokenizer, "
                    f"got {type(tokenizer).__name__}")
