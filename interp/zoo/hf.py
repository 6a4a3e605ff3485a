"""The Hugging Face driver: a model object, a local folder or a hub id -> :class:`interp.Transformer`.

What each family's config and weights mean lives in the family layer (:mod:`interp.families`, one file per
family); this module looks the family up by ``model_type`` (:func:`converter`), checks the weights against the
config before anything is allocated, converts and assigns them (:func:`convert`), and reads folders and hub
snapshots (:func:`from_hf`). A decoder of a family without a converter goes on the attention-level route
(:mod:`interp.zoo.hf_route`). Nothing here imports ``transformers`` except to read a folder's config or a hub id.

The family functions are re-exported here under their old names (``llama_config``, ``deepseek_state_dict``, ...).
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..families import BY_MODEL_TYPE, HEADLINE
from ..families import converter as converter
from ..families._base import StateDict as StateDict
from ..families._base import _decoder_checks as _decoder_checks
from ..families._base import _need as _need
from ..families._positions import _rope as _rope
from ..families._positions import sliding_windows as sliding_windows
from ..families._tensors import _Source as _Source
from ..families.bert import bert_config as bert_config
from ..families.bert import bert_state_dict as bert_state_dict
from ..families.deepseek import deepseek_config as deepseek_config
from ..families.deepseek import deepseek_state_dict as deepseek_state_dict
from ..families.gpt2 import gpt2_config as gpt2_config
from ..families.gpt2 import gpt2_state_dict as gpt2_state_dict
from ..families.llama import llama_config as llama_config
from ..families.llama import llama_state_dict as llama_state_dict
from ..families.moe import moe_config as moe_config
from ..model import Transformer
from ..placement import build, check_dtype
from .checkpoint import assign_weights, check_finite, check_fits
from .tokenizer import as_tokenizer as _wrap_tokenizer

#: ``(config function, state-dict function)`` of one ``model_type``.
Converter = tuple[Callable[[Mapping[str, Any]], ModelConfig], Callable[[StateDict, ModelConfig], dict]]

_HF_EXTRA = "pip install interp[hf]"

#: HF ``model_type`` -> ``(config function, state-dict function for the defaults)``, derived from the family
#: registry (:mod:`interp.families`); :func:`converter` builds the state-dict function for a given config.
CONVERTERS: dict[str, Converter] = {t: fam.converter({"model_type": t}) for t, fam in BY_MODEL_TYPE.items()}

#: The families the converters take, in short, for help texts (:func:`converter` lists every ``model_type``
#: when it refuses one).
FAMILIES = HEADLINE


def _register_dense_families() -> None:
    """Kept for callers of the old two-module layout: every family is registered when :mod:`interp.families`
    is imported."""


def source_dtype(hf_sd: StateDict) -> torch.dtype | None:
    """The floating dtype that holds most of a state dict's values (a bf16 checkpoint with a few float32
    buffers is bf16), or None when it has no floating tensors. Meta-device tensors count as well (their
    shapes and dtypes are all it reads).

    Example:
        >>> import torch
        >>> from interp.zoo.hf import source_dtype
        >>> source_dtype({"w": torch.zeros(4, dtype=torch.bfloat16), "b": torch.zeros(1)})
        torch.bfloat16
    """
    counts: dict[torch.dtype, int] = {}
    for t in hf_sd.values():
        if t.is_floating_point():
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    return max(counts, key=counts.__getitem__) if counts else None


def convert(hf_cfg: Mapping[str, Any], hf_sd: StateDict, *, name: str = "hf-model",
            dtype: torch.dtype | None = None, device: torch.device | str | None = None,
            source: str | None = None, allow_unused: bool = False) -> Transformer:
    """Build an :class:`interp.Transformer` from a HF config dict and state dict (no ``transformers`` needed).

    Check before allocate: the config's layer count is compared with the weights' layers, then the converter
    runs on meta-device tensors of the weights' shapes and dtypes and the result is fitted to a model whose
    parameters are on the meta device (:func:`interp.zoo.hf_weights.check_weights`). Only then is each tensor
    read (once: a :class:`~interp.zoo.hf_weights.StoredWeights` reads it from disk when the converter asks),
    checked for NaN / infinite values and assigned as the model's parameter, so a conversion peaks near the
    weights' own bytes.

    Args:
        hf_cfg: the HF config as a dict (``config.json`` contents); ``model_type`` picks the converter.
        hf_sd: the HF state dict: a model's (its tensors are copied, never shared) or a folder's
            :class:`~interp.zoo.hf_weights.StoredWeights` (read lazily, assigned without a copy).
        name: the model's ``name``.
        dtype: the parameters' dtype (default: the source's, see :func:`source_dtype`: bf16 stays bf16).
        device: where to build the model (default: where the source tensors are; the CPU for a folder).
        source: the folder or model named in errors (default: "Hugging Face <model_type> weights").
        allow_unused: accept tensors the converter does not read (a TransformerLens bridge adds its own views
            of the weights); by default each one is refused by name.

    Returns:
        The converted model in eval mode.

    Raises:
        TypeError: ``dtype`` is not a floating-point torch.dtype.
        ValueError: unsupported ``model_type`` (the supported ones are listed), unsupported settings, layer
            counts that disagree, missing, unexpected or non-floating tensors, shape mismatches (tensor named
            with both shapes), or a tensor holding NaN / infinite values (named with the count).

    Example:
        >>> from interp.zoo.hf import convert
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=8))
        >>> convert(hf.config.to_dict(), hf.state_dict()).cfg.n_layers
        1
    """
    from .hf_weights import StoredWeights, check_layers, check_weights

    check_dtype(dtype)
    mtype = hf_cfg.get("model_type")
    named = source is not None  # a folder or model object: its name goes before the converter's refusals
    source = source or f"Hugging Face {mtype} weights"
    make_cfg, make_sd = converter(hf_cfg)
    cfg = make_cfg(hf_cfg)
    stored = hf_sd if isinstance(hf_sd, StoredWeights) else None  # a folder's weights, read lazily
    lazy = stored is not None
    check_layers(hf_cfg, cfg.n_layers, set(hf_sd), source=source)
    meta = stored.meta() if stored is not None else {k: torch.empty(t.shape, dtype=t.dtype, device="meta") for k, t in hf_sd.items()}
    if dtype is None:
        dtype = source_dtype(meta) or torch.float32
    if device is None:  # where the source weights are (a HF model on a GPU converts on that GPU)
        device = "cpu" if lazy else next((t.device for t in hf_sd.values() if t.is_floating_point()), None)
    target = torch.device(device if device is not None else "cpu")
    shapes = check_weights(hf_cfg, cfg, make_sd, meta, dtype=dtype, source=source, allow_unused=allow_unused,
                           wrap_converter_errors=named)
    model = build(cfg, dtype=dtype, device=target, meta_weights=True)
    check_fits(model, shapes, source=f"{source} (converted)")
    if not lazy:  # a model's own tensors: the same NaN / inf policy as a folder's and a GGUF file's
        hf_sd = _FiniteChecked(hf_sd, source)
    try:
        ours = make_sd(hf_sd, cfg)
    finally:
        if stored is not None:
            stored.close()
    # A model object's tensors are copied (our weights never share storage with it); a folder's are ours.
    assign_weights(model, ours, dtype=dtype, device=target, source=source, copy=not lazy)
    del ours
    model.name = name
    return model.eval()


class _FiniteChecked(dict):
    """A state dict whose tensors are checked for NaN / infinite values when the converter reads them."""

    def __init__(self, sd: StateDict, source: str) -> None:
        super().__init__(sd)
        self.source = source

    def __getitem__(self, key: str) -> torch.Tensor:
        t = super().__getitem__(key)
        check_finite(t, key, self.source)
        return t


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"loading Hugging Face models needs transformers: {_HF_EXTRA}") from e
    return transformers


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    """A model folder's ``config.json`` as the dict the converters read.

    With ``transformers`` installed the dict is its config class's ``to_dict()`` (the defaults of keys the file
    leaves out filled in as transformers fills them); without it, the file as it is. Only the config is read.

    Args:
        folder: the model folder.

    Returns:
        The config dict (``model_type`` included).

    Raises:
        FileNotFoundError: no ``config.json``.
        ValueError: not valid JSON, not an object, no ``model_type``, or a value transformers refuses (its
            message is quoted after the file's name).

    Example:
        >>> from interp.zoo.hf import read_hf_config
        >>> from interp.examples import tmp
        >>> import json; (tmp / "m").mkdir(); _ = (tmp / "m" / "config.json").write_text('{"model_type": 3')
        >>> read_hf_config(tmp / "m")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: .../m/config.json: not valid JSON: Expecting ',' delimiter: line 1 column 17 (char 16)
    """
    import json

    file = Path(folder) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{folder}: no config.json")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: must hold a JSON object, got a JSON {type(raw).__name__}")
    if not isinstance(raw.get("model_type"), str):
        raise ValueError(f"{file}: key 'model_type' must name the model family (a string), got "
                         f"{raw.get('model_type')!r}")
    try:
        tf = _transformers()
    except ImportError:
        return raw
    try:
        return tf.AutoConfig.from_pretrained(str(folder)).to_dict()
    except Exception as e:  # noqa: BLE001 - transformers / huggingface_hub validators raise their own types
        raise ValueError(f"{file} (model_type={raw['model_type']!r}): transformers refuses the config: "
                         f"{_plain(str(e))}") from e


def _tokenizer_for(source: str):
    """Our Tokenizer for a local folder or hub id, or None when none can be found.

    Raises:
        ValueError: a ``tokenizer.json`` the tokenizers library cannot read (its message after the file).
    """
    from .tokenizer import Tokenizer

    folder = Path(source)
    if (folder / "tokenizer.json").is_file():
        try:
            return Tokenizer.from_file(folder / "tokenizer.json")
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises a plain Exception
            raise ValueError(f"{folder / 'tokenizer.json'}: cannot be read as a tokenizer: {e}") from e
    try:
        hf_tok = _transformers().AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        return None
    backend = getattr(hf_tok, "backend_tokenizer", None)
    return None if backend is None else Tokenizer(backend, pad_token_id=hf_tok.pad_token_id)


def from_hf(model_or_path: Any, *, tokenizer: Any = None, name: str | None = None,
            device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Transformer:
    """Convert a Hugging Face model of a supported family (:data:`FAMILIES`; :func:`converter` lists every
    ``model_type``) to an :class:`interp.Transformer`; a decoder of any other family is put on the
    attention-level route (:func:`interp.zoo.hf_route.wrap`, a warning says so once per family).

    A local folder is read directly, not through ``transformers``' ``from_pretrained`` (which fills missing
    weights with a random initialisation and only warns): ``config.json`` (:func:`read_hf_config`) and the
    weights' headers are checked against each other before anything is allocated, then each tensor is read
    once, shard by shard, into the model (see :func:`convert` and :mod:`interp.zoo.hf_weights`). Users with hub
    access can pass a hub id (``"gpt2"``, ``"TinyLlama/TinyLlama-1.1B-Chat-v1.0"``); its snapshot is downloaded
    and read the same way. A model object is converted as it is (no download), with the same checks.

    Args:
        model_or_path: a ``transformers.PreTrainedModel`` (``BertModel``, ``GPT2LMHeadModel``,
            ``LlamaForCausalLM``, ...), a local folder, or a hub id.
        tokenizer: a :class:`interp.zoo.tokenizer.Tokenizer`, a ``tokenizers.Tokenizer`` or a HF fast
            tokenizer to attach; default: the folder's / hub id's tokenizer, none for a model object.
        name: ``model.name`` (default: the path, or the HF ``name_or_path``).
        device: where to put the converted model.
        dtype: the parameters' dtype (default: the weights' own; a bf16 checkpoint stays bf16).

    Returns:
        The converted model (eval mode; BERT models return hidden states, ``cfg.unembed`` False), or a
        :class:`interp.zoo.hf_route.RouteModel` (``model.native`` False) for a family without a converter.

    Raises:
        ImportError: a hub id was given and ``transformers`` / ``huggingface_hub`` is missing
            (``pip install interp[hf]``).
        TypeError: ``model_or_path`` is neither a HF model nor a path/str, or ``dtype`` is not floating
            (checked first).
        FileNotFoundError: a folder without ``config.json`` or weights.
        ValueError: unsupported architecture or settings, a weight file outside the folder, or weights that
            do not fit (each tensor named with both shapes or dtypes).

    Example:
        >>> from interp.zoo.hf import from_hf
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = from_hf(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4)))
        >>> model = from_hf("gpt2")   # with hub access  # doctest: +SKIP
    """
    from .hf_weights import open_weights

    check_dtype(dtype)
    if isinstance(model_or_path, (str, Path)):
        source = str(model_or_path)
        folder = Path(source)
        if not (folder / "config.json").is_file() and not folder.is_absolute():
            from .hub import hub_source  # a hub id: its downloaded snapshot

            _transformers()  # hub models come with the hf extra (its tokenizers, hub access)
            folder = Path(hub_source(source))
        hf_cfg = read_hf_config(folder)
        if tokenizer is None:
            tokenizer = _tokenizer_for(str(folder))
        if hf_cfg.get("model_type") not in CONVERTERS:  # no native converter: the attention-level route
            return _route_folder(folder, hf_cfg, name=name or source, tokenizer=tokenizer, dtype=dtype, device=device)
        weights = open_weights(folder)
        model = convert(hf_cfg, weights, name=name or source, dtype=dtype, device=device, source=str(folder))
    elif hasattr(model_or_path, "config") and hasattr(model_or_path, "state_dict"):
        hf_model = model_or_path
        name = name or getattr(hf_model.config, "name_or_path", "") or hf_model.config.model_type
        if hf_model.config.model_type not in CONVERTERS:  # no native converter: the attention-level route
            return _route_model(hf_model.to(device=device, dtype=dtype), name=name, tokenizer=tokenizer)
        model = convert(hf_model.config.to_dict(), hf_model.state_dict(), name=name, dtype=dtype, device=device,
                        source=f"Hugging Face {type(hf_model).__name__} ({name})")
    else:
        raise TypeError(f"from_hf takes a Hugging Face model, a local folder or a hub id, "
                        f"got {type(model_or_path).__name__}")
    model.tokenizer = _wrap_tokenizer(tokenizer)
    return model


def _route_model(hf_model: Any, *, name: str, tokenizer: Any) -> Any:
    """A model object of a family without a converter, on the attention-level route (a ``RouteModel``)."""
    from .hf_route import wrap

    return wrap(hf_model, name=name, tokenizer=_wrap_tokenizer(tokenizer), warn=True)


def _route_folder(folder: Path, hf_cfg: Mapping[str, Any], *, name: str, tokenizer: Any,
                  dtype: torch.dtype | None, device: torch.device | str | None) -> Any:
    """A folder of a family without a converter, loaded by transformers for the attention-level route; refused
    when transformers reports a missing, unexpected or mis-shaped weight (which it would fill with random values
    and only warn about)."""
    from .hf_route import wrap

    tf = _transformers()
    try:
        hf_model, info = tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype or "auto",
                                                                 output_loading_info=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{folder}: its weights are a pickle file that cannot be loaded safely; convert them to "
                         f"model.safetensors first ({_plain(str(e).splitlines()[0])})") from e
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{folder}: transformers could not load this {hf_cfg.get('model_type')!r} model: "
                         f"{_plain(str(e).splitlines()[0] if str(e) else type(e).__name__)}") from e
    bad = [f"{what.replace('_', ' ')}: {sorted(map(str, info.get(what) or []))[:8]}"
           for what in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(what)]
    if bad:
        raise ValueError(f"{folder}: the weights do not match config.json (model_type "
                         f"{hf_cfg.get('model_type')!r}): {'; '.join(bad)}")
    if device is not None:
        hf_model = hf_model.to(device)
    return wrap(hf_model, name=name, tokenizer=_wrap_tokenizer(tokenizer), warn=True)


def _plain(text: str) -> str:
    """``text`` without terminal colour codes (torch's pickle errors carry them)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
