"""Trace: what a run recorded, keyed by hook name, with TransformerLens-style views and safetensors persistence.

``interp.streaming.record(model, tokens, names_filter=...)`` (or ``model.run_with_cache``) builds one; ``Trace.save`` /
``Trace.load`` write and read it. The streaming engine (reducers, ``record``, ``stream``) lives in
:mod:`interp.streaming`.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

import torch
from safetensors import safe_open

from . import trace_views
from ._io import atomic_path, check_tensor_record, tensor_record, write_safetensors

if TYPE_CHECKING:
    from .model import Transformer
    from .trace_views import PosSlice, Stack


class StrTokenizer(Protocol):
    """What a trace needs of a tokenizer: the token strings of one sequence of ids."""

    def to_str_tokens(self, ids: list[int]) -> list[str]: ...

_LAYER_RX = re.compile(r"^blocks\.(\d+)\.")
_TRACE_FORMAT = "interp.trace/1"
_TOKENS_KEY = "__tokens__"
_RECORD_KEY = "tensor_record"  # each tensor's dtype, shape and sha256 (interp._io.tensor_record)


def _json_object(path: Path, header: dict[str, str], key: str) -> dict[str, Any]:
    """A JSON object stored under ``key`` in a trace file's header (``{}`` when absent)."""
    try:
        value = json.loads(header.get(key, "{}"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{str(path)!r}: the trace's {key!r} header is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{str(path)!r}: the trace's {key!r} header must be a JSON object, "
                         f"got {type(value).__name__}")
    return value

def _check_fewer_layers(where: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any], layers: set[int],
                        n_layers: int) -> None:
    """A trace holding fewer layers than its meta's ``n_layers`` must be a recording of some layers.

    :func:`interp.streaming.record` says so in meta ``layers_recorded`` (the layers its filter selected); the
    stored layers must then be among them. A file without that statement whose layers ``0..k`` each hold the same
    hooks (what an unfiltered or pattern-filtered recording of a ``k + 1``-layer model holds) contradicts an
    ``n_layers`` above ``k + 1``: it is refused, naming both numbers.
    """
    stated = meta.get("layers_recorded")
    if stated is not None:
        if not isinstance(stated, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in stated) \
                or any(not 0 <= x < n_layers for x in stated) or not layers <= set(stated):
            raise ValueError(f"{where}: meta layers_recorded = {str(stated)[:80]} does not list the layers the file "
                             f"holds ({sorted(layers)[:3]}..{max(layers)}) within n_layers = {n_layers}")
        return
    k = max(layers)
    per_layer = {layer: {n.split(".", 2)[2] for n in tensors if n.startswith(f"blocks.{layer}.")} for layer in layers}
    if k >= 1 and layers == set(range(k + 1)) and len({frozenset(h) for h in per_layer.values()}) == 1:
        raise ValueError(f"{where}: meta n_layers = {n_layers}, but the file holds the same hooks in each of layers "
                         f"0..{k} ({k + 1} layers) and none in layers {k + 1}..{n_layers - 1}: its n_layers "
                         f"disagrees with its tensors (a recording of some layers lists them in meta "
                         f"'layers_recorded')")


def _check_consistent(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                      tokens: torch.Tensor | None) -> None:
    """What a trace file says about itself must agree: dtypes, the layer count, the token strings."""
    where = repr(str(path))
    if tokens is not None and (tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dim() != 2):
        raise ValueError(f"{where}: the stored tokens must be a [batch, pos] integer tensor, got "
                         f"{str(tokens.dtype).removeprefix('torch.')} {list(tokens.shape)}")
    for name, t in tensors.items():
        if not t.dtype.is_floating_point:
            raise ValueError(f"{where}: recorded tensor {name!r} is {str(t.dtype).removeprefix('torch.')}; "
                             f"activations are floating point (the header was altered?)")
    n_layers = meta.get("n_layers")
    if n_layers is not None:
        layers = {int(m.group(1)) for n in tensors if (m := _LAYER_RX.match(n))}
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1 or \
                any(layer >= n_layers for layer in layers):
            raise ValueError(f"{where}: meta n_layers = {n_layers!r}, but the file holds tensors for layer(s) "
                             f"{sorted(layers)[-3:]}")
        if layers and max(layers) + 1 < n_layers:
            _check_fewer_layers(where, tensors, meta, layers, n_layers)
    str_tokens = meta.get("str_tokens")
    if str_tokens is not None:
        if not isinstance(str_tokens, list) or not all(isinstance(r, list) for r in str_tokens):
            raise ValueError(f"{where}: meta str_tokens must be a list of lists of token strings")
        if tokens is not None and [len(r) for r in str_tokens] != [tokens.shape[1]] * tokens.shape[0]:
            raise ValueError(f"{where}: meta str_tokens has {len(str_tokens)} row(s) of lengths "
                             f"{[len(r) for r in str_tokens][:4]}, the stored tokens are {list(tokens.shape)}")


class Trace:
    """Recorded activations keyed by hook name.

    Args:
        tensors: hook name -> tensor.
        meta: free metadata (``model``, ``n_layers``, ``n_heads``, ``str_tokens``...).
        tokens: the ``[B, T]`` input ids, when known.
        stats: results of reducers, by reducer index.

    Example:
        >>> from interp import Trace
        >>> from interp.examples import model, tokens, tmp
        >>> _, trace = model.run_with_cache(tokens, names_filter="*hook_pattern")
        >>> trace.pattern(0).shape      # [batch, n_heads, query_pos, key_pos]
        >>> trace.save(tmp / "run.safetensors"); Trace.load(tmp / "run.safetensors")
    """

    def __init__(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any] | None = None,
                 tokens: torch.Tensor | None = None, stats: list[Any] | None = None, *,
                 head_writes: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
                 tokenizer: StrTokenizer | None = None) -> None:
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict (str -> JSON value), got {type(meta).__name__}: {meta!r:.80}")
        self.tensors = dict(tensors)
        self.meta = dict(meta or {})
        self.tokens = tokens
        self.stats = list(stats or [])
        # Per-head writes kept as (z [B, T, H, D], W_O per head [H, D, M]) and multiplied out on access:
        # z is d_model / d_head times smaller than the writes, and recording stays cheap.
        self._head_writes = dict(head_writes or {})
        self._tokenizer = tokenizer

    # --- mapping interface ------------------------------------------------------------------------------
    def __getitem__(self, name: str | tuple) -> torch.Tensor:
        if not isinstance(name, (str, tuple)):
            raise TypeError(f"a Trace is indexed by hook name (trace['blocks.0.attn.hook_pattern']) or a "
                            f"TransformerLens short name (trace['pattern', 0]), not by {type(name).__name__} "
                            f"{name!r}; to take sequences, index the tensor: trace.pattern(0)[0:2]")
        if isinstance(name, tuple) or name in trace_views.GLOBAL_NAMES:  # TL short names: trace["pattern", 0]
            name = trace_views.act_name(self, name if isinstance(name, tuple) else (name,))
        if name in self.tensors:
            return self.tensors[name]
        if name in self._head_writes:
            z, w_o = self._head_writes[name]
            return torch.einsum("bthd,hdm->bthm", z, w_o)  # [B, T, H, M]
        names = list(self)
        raise KeyError(f"{name!r} was not recorded; recorded: {sorted(names)[:8]}"
                       f"{' ...' if len(names) > 8 else ''}")

    def __contains__(self, name: object) -> bool:
        return name in self.tensors or name in self._head_writes

    def __iter__(self) -> Iterator[str]:
        yield from self.tensors
        yield from (n for n in self._head_writes if n not in self.tensors)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def keys(self) -> list[str]:
        return list(self)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        return ((k, self[k]) for k in self)

    @property
    def layers(self) -> list[int]:
        """Layers with at least one recorded tensor."""
        return sorted({int(m.group(1)) for n in self if (m := _LAYER_RX.match(n))})

    # --- per-head accessors -----------------------------------------------------------------------------
    def pattern(self, layer: int) -> torch.Tensor:
        """Attention pattern of ``layer``: ``[B, H, query_pos, key_pos]``."""
        return self[f"blocks.{layer}.attn.hook_pattern"]

    def patterns(self, layers: Sequence[int] | None = None) -> torch.Tensor:
        """Patterns stacked over layers: ``[L, B, H, query_pos, key_pos]``."""
        layers = self._layers_with("attn.hook_pattern") if layers is None else layers
        return torch.stack([self.pattern(layer) for layer in layers])

    def sink_mass(self, layer: int) -> torch.Tensor:
        """The learned sinks' share of each row of ``layer`` (a model with ``cfg.attn_sinks``, gpt-oss):
        ``[B, H, query_pos]``; with :meth:`pattern` a row sums to 1 (record ``"*hook_sink_mass"``)."""
        return self[f"blocks.{layer}.attn.hook_sink_mass"]

    def z(self, layer: int) -> torch.Tensor:
        """Per-head mixed values of ``layer``: ``[B, pos, H, D]``."""
        return self[f"blocks.{layer}.attn.hook_z"]

    def head_out(self, layer: int) -> torch.Tensor:
        """Per-head writes z_h W_O[h] of ``layer``: ``[B, pos, H, d_model]`` (with a norm after attention,
        ``sublayer_norm`` sandwich / output, each head's share of the sum that norm reads)."""
        return self[f"blocks.{layer}.attn.hook_result"]

    def head_outs(self, layers: Sequence[int] | None = None) -> torch.Tensor:
        """Per-head writes stacked over layers: ``[L, B, pos, H, d_model]``."""
        layers = self._layers_with("attn.hook_result") if layers is None else layers
        return torch.stack([self.head_out(layer) for layer in layers])

    # --- TransformerLens-style residual views (interp/trace_views.py) ------------------------------------
    # The stacks return a tensor, or (tensor, labels) with return_labels=True: overloads say which.
    @overload
    def stack_head_results(self, layer: int | None = None, *, pos_slice: PosSlice = None, apply_ln: bool = False,
                           model: Transformer | None = None, return_labels: Literal[False] = False) -> torch.Tensor: ...

    @overload
    def stack_head_results(self, layer: int | None = None, *, pos_slice: PosSlice = None, apply_ln: bool = False,
                           model: Transformer | None = None,
                           return_labels: Literal[True]) -> tuple[torch.Tensor, list[str]]: ...

    def stack_head_results(self, layer: int | None = None, *, pos_slice: PosSlice = None, apply_ln: bool = False,
                           model: Transformer | None = None, return_labels: bool = False) -> Stack:
        """Every head's write stacked ``[n_heads_total, B, T, M]``, labels ``"L3H5"``; see
        :func:`trace_views.stack_head_results` for the arguments.

        Example:
            >>> from interp.examples import model, tokens
            >>> _, trace = model.run_with_cache(tokens, names_filter="*hook_result")
            >>> heads, labels = trace.stack_head_results(return_labels=True)
            >>> labels[:2]
            ['L0H0', 'L0H1']
        """
        return trace_views.stack_head_results(self, layer, pos_slice=pos_slice, apply_ln=apply_ln, model=model,
                                              return_labels=return_labels)

    @overload
    def decompose_resid(self, layer: int | None = None, *, mlp_input: bool = False, mode: str = "all",
                        incl_embeds: bool = True, pos_slice: PosSlice = None, apply_ln: bool = False,
                        model: Transformer | None = None, return_labels: Literal[False] = False) -> torch.Tensor: ...

    @overload
    def decompose_resid(self, layer: int | None = None, *, mlp_input: bool = False, mode: str = "all",
                        incl_embeds: bool = True, pos_slice: PosSlice = None, apply_ln: bool = False,
                        model: Transformer | None = None,
                        return_labels: Literal[True]) -> tuple[torch.Tensor, list[str]]: ...

    def decompose_resid(self, layer: int | None = None, *, mlp_input: bool = False, mode: str = "all",
                        incl_embeds: bool = True, pos_slice: PosSlice = None, apply_ln: bool = False,
                        model: Transformer | None = None, return_labels: bool = False) -> Stack:
        """Embeddings, attention and MLP outputs stacked ``[C, B, T, M]``; see :func:`trace_views.decompose_resid`
        for the arguments."""
        return trace_views.decompose_resid(self, layer, mlp_input=mlp_input, mode=mode, incl_embeds=incl_embeds,
                                           pos_slice=pos_slice, apply_ln=apply_ln, model=model,
                                           return_labels=return_labels)

    @overload
    def accumulated_resid(self, layer: int | None = None, *, incl_mid: bool = False, pos_slice: PosSlice = None,
                          apply_ln: bool = False, model: Transformer | None = None,
                          return_labels: Literal[False] = False) -> torch.Tensor: ...

    @overload
    def accumulated_resid(self, layer: int | None = None, *, incl_mid: bool = False, pos_slice: PosSlice = None,
                          apply_ln: bool = False, model: Transformer | None = None,
                          return_labels: Literal[True]) -> tuple[torch.Tensor, list[str]]: ...

    def accumulated_resid(self, layer: int | None = None, *, incl_mid: bool = False, pos_slice: PosSlice = None,
                          apply_ln: bool = False, model: Transformer | None = None,
                          return_labels: bool = False) -> Stack:
        """Residual stream at each layer's input ``[C, B, T, M]``; see :func:`trace_views.accumulated_resid` for
        the arguments."""
        return trace_views.accumulated_resid(self, layer, incl_mid=incl_mid, pos_slice=pos_slice, apply_ln=apply_ln,
                                             model=model, return_labels=return_labels)

    def apply_ln_to_stack(self, stack: torch.Tensor, model: Transformer, *, layer: int | None = None,
                          mlp_input: bool = False, pos_slice: PosSlice = None, weight: bool = False) -> torch.Tensor:
        """A stack normalised by the recorded run's norm scale; see :func:`trace_views.apply_ln_to_stack` for the
        arguments."""
        return trace_views.apply_ln_to_stack(self, stack, model, layer=layer, mlp_input=mlp_input,
                                             pos_slice=pos_slice, weight=weight)

    def _layers_with(self, suffix: str) -> list[int]:
        layers = [layer for layer in self.layers if f"blocks.{layer}.{suffix}" in self]
        if not layers:
            raise KeyError(f"no 'blocks.*.{suffix}' was recorded; record it with names_filter='*{suffix}'")
        return layers

    @property
    def str_tokens(self) -> list[list[str]] | None:
        """Token strings per sequence, when the model had a tokenizer (decoded on first access)."""
        if "str_tokens" not in self.meta and self._tokenizer is not None and self.tokens is not None:
            self.meta["str_tokens"] = [self._tokenizer.to_str_tokens(row.tolist()) for row in self.tokens]
        return self.meta.get("str_tokens")

    # --- persistence ------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write tensors to a safetensors file; metadata goes into its JSON header.

        Recordings that share memory (``hook_embed`` and ``blocks.0.hook_resid_pre`` are one tensor) are
        written once and restored as the same tensor.

        Args:
            path: the file to write; its folder must exist.

        Returns:
            The path written.

        Raises:
            FileNotFoundError: the folder does not exist.
            ValueError: a recorded tensor uses the reserved name ``__tokens__``, or ``meta`` is not JSON.

        Example:
            >>> from interp import Trace
            >>> from interp.examples import trace, tmp
            >>> trace.save(tmp / "run.safetensors"); Trace.load(tmp / "run.safetensors")
        """
        path = Path(path)
        if not path.parent.is_dir():
            raise FileNotFoundError(f"cannot save the trace to {str(path)!r}: folder {str(path.parent)!r} "
                                    "does not exist")
        if _TOKENS_KEY in self:
            raise ValueError(f"{_TOKENS_KEY!r} is reserved for the input tokens; rename that recorded tensor")
        _ = self.str_tokens  # decode before writing, so the file carries them
        try:
            meta_json = json.dumps(self.meta)
        except (TypeError, ValueError) as e:
            raise ValueError(f"trace meta must be JSON (str keys; str, number, list, dict values): {e}") from e
        tensors: dict[str, torch.Tensor] = {}
        aliases: dict[str, str] = {}
        seen: dict[tuple, str] = {}  # a view's identity -> the name it was written under
        storages: set[int] = set()
        items = list(self.items())
        if self.tokens is not None:
            items.append((_TOKENS_KEY, self.tokens))
        for name, t in items:
            t = t.detach().contiguous().cpu()
            view = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
            if view in seen:
                aliases[name] = seen[view]
                continue
            if t.untyped_storage().data_ptr() in storages:
                t = t.clone()  # a different view of memory already written: safetensors needs its own copy
            seen[view] = name
            storages.add(t.untyped_storage().data_ptr())
            tensors[name] = t
        header = {"format": _TRACE_FORMAT, "meta": meta_json, _RECORD_KEY: tensor_record(tensors)}
        if aliases:
            header["aliases"] = json.dumps(aliases)
        with atomic_path(path) as tmp:  # a killed save leaves the previous file, never half of one
            write_safetensors(tensors, tmp, metadata=header)  # no second temporary
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a file written by :meth:`save`.

        Args:
            path: a ``.safetensors`` file written by :meth:`save`.

        Returns:
            The trace, with its tokens and metadata.

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not an interp trace, its metadata is not a JSON object, its tensors'
                bytes, dtypes or shapes differ from the record written with them, or what it says about
                itself disagrees (``n_layers`` vs the layers stored, ``str_tokens`` vs the tokens, integer
                activations); the message names the file.

        Example:
            >>> from interp import Trace
            >>> from interp.examples import trace, tmp
            >>> trace = Trace.load(trace.save(tmp / "run.safetensors"))
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no trace file at {str(path)!r}")
        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ValueError(f"{str(path)!r} is not a readable safetensors trace: {e}") from e
        if header.get("format") != _TRACE_FORMAT:
            raise ValueError(f"{str(path)!r} is not an interp trace (format={header.get('format')!r})")
        if _RECORD_KEY in header:
            check_tensor_record(header[_RECORD_KEY], tensors, repr(str(path)))
        meta = _json_object(path, header, "meta")
        for name, source in _json_object(path, header, "aliases").items():
            if not isinstance(source, str) or source not in tensors:
                raise ValueError(f"{str(path)!r}: alias {name!r} points to {source!r}, which is not in the file")
            tensors[name] = tensors[source]
        tokens = tensors.pop(_TOKENS_KEY, None)
        _check_consistent(path, tensors, meta, tokens)
        return cls(tensors, meta, tokens)

    # --- display ----------------------------------------------------------------------------------------
    def nbytes(self) -> int:
        """Bytes held (per-head writes count as their z and W_O, which is what is stored)."""
        held = list(self.tensors.values()) + [t for pair in self._head_writes.values() for t in pair]
        return sum(t.numel() * t.element_size() for t in {id(t): t for t in held}.values())

    def __repr__(self) -> str:
        return (f"Trace(model={self.meta.get('model')!r}, tensors={len(self)}, layers={self.layers}, "
                f"MB={self.nbytes() / 2**20:.2f})")

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{tuple(v.shape)}</td><td>{str(v.dtype).replace('torch.', '')}</td></tr>"
            for k, v in self.tensors.items()
        ) + "".join(
            f"<tr><td>{html.escape(k)}</td><td>{tuple(z.shape[:3]) + (w.shape[-1],)}</td><td>{str(z.dtype).replace('torch.', '')}"
            " (z @ W_O on access)</td></tr>"
            for k, (z, w) in self._head_writes.items()
        )
        return (f"<b>Trace</b> of {html.escape(str(self.meta.get('model')))} ({self.nbytes() / 2**20:.2f} MB)"
                f"<table><tr><th>hook</th><th>shape</th><th>dtype</th></tr>{rows}</table>")
