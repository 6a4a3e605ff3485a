"""The config-key audit of the Hugging Face converters: every config key a family's transformers classes read is
either read by interp's converter (mapped, or refused by name when its value is not reproduced) or listed here
with the reason it cannot change the forward pass.

The keys transformers reads are found in its installed source, not written down: the modelling classes a tiny
model of each family instantiates (and their bases) are parsed for ``config.<key>``, ``self.config.<key>`` and
``getattr(config, "<key>")``, plus the config class's ``__post_init__`` (``self.<key>``, which derives settings
such as ``layer_types`` from others) and the shared mask and RoPE helpers every decoder calls. The keys the
converter reads are recorded while it converts that family's config. A key a future transformers release adds
to a class therefore shows up as unaccounted for (``tests/zoo/test_zoo_config_keys.py`` fails naming it) until
the converter reads it or it is listed in :data:`IGNORED` with a reason.

``python -m interp.zoo.config_audit`` prints the Markdown table of ``docs/reference/config-keys.md``. Needs
``transformers``; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
from collections.abc import Iterator, Mapping
from typing import Any

from ..families.registry import BY_MODEL_TYPE, COMPAT_CONFIGS

__all__ = ["FAMILY_CONFIGS", "IGNORED", "IGNORED_BY_FAMILY", "SHARED_READS", "audit", "audit_model", "audit_table",
           "converter_reads", "reasons_table", "transformers_reads"]

#: The audit's row order and the ``model_type``s whose test config has another name (the first rows, listed
#: before the test configs moved into the family files).
_LISTED: dict[str, str] = {
    "llama": "llama3", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
    "gemma2": "gemma2", "gemma3_text": "gemma3_text", "gpt_neox": "gpt_neox", "gpt_bigcode": "gpt_bigcode",
    "falcon": "falcon_new_arch", "phi": "phi", "phi3": "phi3_longrope", "olmo2": "olmo2", "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe", "qwen3_moe": "qwen3_moe", "olmoe": "olmoe", "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3", "bert": "bert", "gpt2": "gpt2", "olmo": "olmo", "olmo3": "olmo3", "ministral": "ministral",
    "seed_oss": "seed_oss", "starcoder2": "starcoder2", "arcee": "arcee",
    "hunyuan_v1_dense": "hunyuan_v1_dense", "smollm3": "smollm3", "exaone4": "exaone4",
    "granite": "granite", "glm": "glm", "glm4": "glm4", "stablelm": "stablelm",
    "ernie4_5": "ernie4_5", "cohere": "cohere", "cohere2": "cohere2", "gptj": "gptj", "opt": "opt",
    "gpt_oss": "gpt_oss",
    "bloom": "bloom", "mpt": "mpt_12_heads", "gpt_neo": "gpt_neo",
    "nemotron": "nemotron", "granitemoe": "granitemoe", "glm4_moe": "glm4_moe", "phimoe": "phimoe",
    "llama4_text": "llama4_text",
}
#: One test config per converted ``model_type``: an entry of :data:`interp.zoo.compat.TABLE` (BERT and GPT-2,
#: which compat does not cover, are built here). A family whose test config is named after its ``model_type``
#: comes after the listed ones, in registry order, so adding a family needs no edit here.
FAMILY_CONFIGS: dict[str, str] = {**_LISTED, **{t: t for t in BY_MODEL_TYPE if t not in _LISTED and t in COMPAT_CONFIGS}}

_DROPOUT = "dropout: off in eval mode, and interp models run inference only"

#: Keys read by transformers that cannot change the logits of a converted model, with the reason.
IGNORED: dict[str, str] = {
    "_attn_implementation": "which attention kernel (eager, SDPA, flash) computes the same scores",
    "attention_dropout": _DROPOUT, "attention_probs_dropout_prob": _DROPOUT, "hidden_dropout": _DROPOUT,
    "hidden_dropout_prob": _DROPOUT, "attn_pdrop": _DROPOUT, "resid_pdrop": _DROPOUT, "embd_pdrop": _DROPOUT,
    "summary_first_dropout": _DROPOUT, "classifier_dropout": _DROPOUT,
    "initializer_range": "random initialisation only: converted weights are the checkpoint's",
    "use_cache": "whether transformers returns its cache, not what the pass computes",
    "output_router_logits": "returns the router logits for the training loss; the forward is unchanged",
    "router_aux_loss_coef": "the training-time load-balancing loss",
    "router_jitter_noise": "router noise applied in training mode only",
    "num_nextn_predict_layers": "DeepSeek-V3's multi-token-prediction layers, which the causal-LM forward skips",
    "bos_token_id": "generation defaults, not the forward", "eos_token_id": "generation defaults, not the forward",
    "gradient_checkpointing": "training memory only",
    "use_return_dict": "the output container's type", "output_attentions": "what transformers returns",
    "output_hidden_states": "what transformers returns",
    "default_theta": "the default RoPE base the config class fills into rope_parameters, which interp reads",
}

#: Keys a family's transformers class reads that do not change its forward, with the reason (by ``model_type``).
IGNORED_BY_FAMILY: dict[str, dict[str, str]] = {
    "phimoe": {"input_jitter_noise": "training-time noise on the router's input (applied only in training mode)",
               "lm_head_bias": "read by the state-dict step, which adds the lm_head bias where it is set",
               "original_max_position_embeddings": "copied by the config class from rope_parameters, which the "
                                                   "converter reads (generate recomputes the cache past it, as "
                                                   "transformers' does)"},
    "llama4_text": {"no_rope_layer_interval": "turned into no_rope_layers by the config class; the converter reads "
                                              "no_rope_layers",
                    "text_config": "the multimodal wrapper's text model config (Llama4ForConditionalGeneration); "
                                   "llama4_text is that text model"},
    "gemma3_text": {"attn_logit_softcapping": "stored on Gemma 3's attention module but never applied "
                                              "(test_gemma3_ignores_attn_logit_softcapping_as_transformers_does)"},
    "olmoe": {"sliding_window": "handed to the attention kernel, but OLMoE's mask is never windowed and its eager "
                                "and SDPA paths ignore it"},
    "deepseek_v2": {"head_dim": "set to qk_rope_head_dim by the config class whatever config.json says; interp "
                                "reads qk_rope_head_dim"},
    "deepseek_v3": {"head_dim": "set to qk_rope_head_dim by the config class whatever config.json says; interp "
                                "reads qk_rope_head_dim"},
    "phi": {"tie_word_embeddings": "the tied weight is the embedding, which the state dict's lm_head.weight holds "
                                   "either way; interp's W_U is always separate, to keep lm_head's bias"},
    "gpt_bigcode": {
        "attention_softmax_in_fp32": "the softmax's precision in half-precision models (interp's is always "
                                     "float32, transformers' default); no effect in float32",
        "scale_attention_softmax_in_fp32": "divides and re-multiplies the scores by the layer index in fp16: the "
                                           "same scores up to rounding",
    },
    "gptj": {
        "rope_parameters": "GPT-J's sinusoidal table has base 10000 and rotary_dim dims; it never reads "
                           "rope_parameters (only the shared RoPE helpers do, which GPT-J does not call)",
        "head_dim": "GPT-J's attention and positions use n_embd / n_head and rotary_dim",
        "tie_word_embeddings": "the tied weight is the embedding, which the state dict's lm_head.weight holds "
                               "either way; interp's W_U is always separate, to keep lm_head's bias",
    },
    "opt": {"dropout": _DROPOUT, "layerdrop": "skips whole layers in training mode only"},
    "seed_oss": {"residual_dropout": _DROPOUT},
    "bloom": {"pretraining_tp": "with slow_but_exact, splits the output projection's matmul into slices that are "
                                "summed: the same product up to rounding",
              "slow_but_exact": "see pretraining_tp: the same product up to rounding"},
    "gpt_neo": {"embed_dropout": _DROPOUT, "resid_dropout": _DROPOUT,
                "expand_attention_types_params": "the config class's method that expands attention_types into "
                                                 "attention_layers (both read by interp)"},
    "starcoder2": {"residual_dropout": _DROPOUT, "embedding_dropout": _DROPOUT},
    "gpt2": {"reorder_and_upcast_attn": "scales before the product and upcasts to float32 (a half-precision "
                                        "overflow guard): the same scores up to rounding"},
    "bert": {
        "chunk_size_feed_forward": "runs the feed-forward layer in chunks of positions: the same numbers",
        "embedding_size": "read only to word an error message about hidden_size",
        "is_encoder_decoder": "cache handling when BERT is the encoder of an encoder-decoder model",
        "tie_word_embeddings": "ties the masked-LM head, which the conversion drops (BERT returns hidden states)",
    },
}

#: Keys the shared helpers every decoder calls read: the causal / sliding-window masks
#: (``transformers.masking_utils``) and the RoPE initialisation (``transformers.modeling_rope_utils``).
SHARED_READS: dict[str, tuple[str, ...]] = {
    "masks": ("is_causal", "_attn_implementation"),
    "rope": ("rope_parameters", "head_dim", "hidden_size", "num_attention_heads", "max_position_embeddings"),
}

#: ``PreTrainedModel`` ties the unembedding to the embeddings by this key.
_BASE_READS = ("tie_word_embeddings",)


def _config_reads(source: str, *, names: tuple[str, ...] = ("config",), self_attrs: bool = False) -> set[str]:
    """Keys read as ``config.<key>``, ``<x>.config.<key>`` or ``getattr(config, "<key>")`` in ``source`` (and
    ``self.<key>`` when ``self_attrs``: a config class's own methods)."""
    out: set[str] = set()

    def is_config(node: ast.AST) -> bool:
        return ((isinstance(node, ast.Name) and node.id in names)
                or (isinstance(node, ast.Attribute) and node.attr == "config")
                or (self_attrs and isinstance(node, ast.Name) and node.id == "self"))

    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Attribute) and is_config(node.value) and isinstance(node.ctx, ast.Load):
            out.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and is_config(node.args[0]) and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            out.add(node.args[1].value)
    return {k for k in out if not (k.startswith("__") or k in _CONFIG_METHODS)}


#: Methods and helpers of ``PreTrainedConfig`` that the parsing above would otherwise take for keys.
_CONFIG_METHODS = frozenset({
    "get_text_config", "to_dict", "to_json_string", "standardize_rope_params", "validate_rope", "get",
    "convert_rope_params_to_dict", "validate_architecture", "validate_layer_type", "rope_scaling",
    "_rope_scaling", "_sliding_window_pattern", "keys_to_ignore_at_inference", "base_model_tp_plan",
    "base_model_pp_plan", "model_type", "name_or_path", "_name_or_path", "return_dict", "num_labels",
})


def audit_model(name: str) -> Any:
    """The random tiny transformers model the audit reads family ``name``'s classes from."""
    import transformers

    from .compat import V, hf_test_model

    if name == "bert":
        return transformers.BertModel(transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1,
                                                              num_attention_heads=4, intermediate_size=48))
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=1, n_head=4))
    return hf_test_model(name)


def _classes(model: Any) -> Iterator[type]:
    """The transformers modelling classes of ``model``'s modules, their bases included."""
    seen: set[type] = set()
    for module in model.modules():
        for cls in type(module).__mro__:
            if cls.__module__.startswith("transformers.models.") and cls not in seen:
                seen.add(cls)
                yield cls


def transformers_reads(model: Any) -> set[str]:
    """Every config key the classes of a transformers ``model`` read (see the module docstring).

    Example:
        >>> from interp.zoo.config_audit import transformers_reads
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> keys = transformers_reads(LlamaForCausalLM(LlamaConfig(hidden_size=16, num_attention_heads=2,
        ...                           num_hidden_layers=1, intermediate_size=32, vocab_size=11)))
        >>> {"mlp_bias", "attention_bias", "rms_norm_eps", "is_causal"} <= keys
        True
    """
    keys: set[str] = set(_BASE_READS)
    for cls in _classes(model):
        try:
            keys |= _config_reads(inspect.getsource(cls))
        except (OSError, TypeError):  # a class without source (built dynamically)
            continue
    post_init = getattr(type(model.config), "__post_init__", None)
    if post_init is not None and post_init.__qualname__.startswith(type(model.config).__name__ + "."):
        keys |= _config_reads(inspect.getsource(post_init), names=(), self_attrs=True)
    if model.config.model_type != "bert":  # every decoder builds its causal (or windowed) mask there
        keys |= set(SHARED_READS["masks"])
    if "rope_parameters" in keys or "rotary_emb" in {n.split(".")[-1] for n, _ in model.named_modules()}:
        keys |= set(SHARED_READS["rope"])
    aliases = getattr(type(model.config), "attribute_map", {}) or {}
    return {aliases.get(k, k) for k in keys}  # GPT-2's hidden_size is its n_embd, DeepSeek's num_experts ...


class _Recorder(Mapping):
    """A read-only config dict that records every key asked for (``get``, ``[]``, ``in``)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self._data

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self._data.get(key, default)

    def __iter__(self) -> Iterator[str]:  # listing the keys (an error message's) reads none of them
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def converter_reads(hf_cfg: Mapping[str, Any]) -> set[str]:
    """The keys interp's converter reads from ``hf_cfg`` while converting it (config and state-dict choice).

    Example:
        >>> from interp.zoo.config_audit import converter_reads
        >>> reads = converter_reads({"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 4,
        ...                          "vocab_size": 11, "n_positions": 16, "summary_type": "cls_index"})
        >>> "scale_attn_weights" in reads, "is_causal" in reads, "summary_type" in reads
        (True, True, False)
    """
    from .hf import converter

    read: set[str] = set()
    # Once as given and once without the keys config classes derive in __post_init__ (a config.json may lack
    # them, and the converter then reads what they are derived from: Qwen's max_window_layers, ...).
    for cfg in (hf_cfg, {k: v for k, v in hf_cfg.items() if k not in _DERIVED}):
        rec = _Recorder(cfg)
        make_cfg, _ = converter(rec)
        make_cfg(rec)
        read |= rec.read
    return read


#: Keys config classes fill in from others in ``__post_init__``.
_DERIVED = ("layer_types",)


def audit(name: str) -> dict[str, Any]:
    """The audit of one converted ``model_type``.

    Returns:
        a dict: ``model_type``, ``transformers`` (keys its classes read), ``converter`` (keys interp's converter
        reads), ``ignored`` ({key: reason} of the keys in neither that cannot change the forward) and
        ``unaccounted`` (keys transformers reads that interp neither reads nor lists: must be empty).
    """
    model = audit_model(FAMILY_CONFIGS[name])
    hf_cfg = model.config.to_dict()
    theirs = transformers_reads(model)
    ours = converter_reads(hf_cfg)
    reasons = {**IGNORED, **IGNORED_BY_FAMILY.get(name, {})}
    missing = theirs - ours
    return dict(model_type=name, transformers=theirs, converter=ours,
                ignored={k: reasons[k] for k in sorted(missing) if k in reasons},
                unaccounted=sorted(k for k in missing if k not in reasons))


def audit_table(names: list[str] | None = None) -> str:
    """The Markdown table of ``docs/reference/config-keys.md``: per family, the keys transformers reads, which
    the converter reads (mapped or refused by value), and which it leaves with the reason."""
    lines = ["| model_type | read by transformers and by interp's converter | read by transformers, not needed by "
             "interp (why: see the reasons below) | unaccounted |", "|---|---|---|---|"]
    for name in names or list(FAMILY_CONFIGS):
        row = audit(name)
        both = sorted(row["transformers"] & row["converter"])
        lines.append(f"| `{name}` | {', '.join(f'`{k}`' for k in both)} | "
                     f"{', '.join(f'`{k}`' for k in row['ignored']) or '-'} | "
                     f"{', '.join(f'`{k}`' for k in row['unaccounted']) or '0'} |")
    return "\n".join(lines)


def reasons_table() -> str:
    """The Markdown table of every ignored key and its reason."""
    lines = ["| key | family | why it cannot change a converted model's forward |", "|---|---|---|"]
    lines += [f"| `{k}` | all | {why} |" for k, why in sorted(IGNORED.items())]
    lines += [f"| `{k}` | `{fam}` | {why} |" for fam, keys in sorted(IGNORED_BY_FAMILY.items())
              for k, why in sorted(keys.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m interp.zoo.config_audit", description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help=f"model_types (default all: {', '.join(FAMILY_CONFIGS)})")
    args = parser.parse_args(argv)
    print(audit_table(args.families or None))
    print()
    print(reasons_table())


if __name__ == "__main__":
    main()
