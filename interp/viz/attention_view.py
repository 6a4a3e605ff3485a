"""An interactive attention view for notebooks: hover a token to colour the tokens it attends to.

The page is self-contained HTML (inline script and style, no CDN), so it works as a Jupyter / VS Code cell output
(``_repr_html_``) and as a saved file. It stays responsive on long inputs because it sends only what it shows:
for every head and query, the ``top_k`` keys with weight at least ``min_weight`` (8-bit weights, 16-bit key
positions), and the browser decodes one layer when that layer is selected.
"""

from __future__ import annotations

import base64
import html
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import atomic_write_text
from ._common import token_labels


@dataclass
class _Layer:
    """One layer's kept attention, row-major over (head, query): ``counts[h, q]`` keys each."""

    layer: int
    counts: np.ndarray  # [H, T] uint8: keys kept per query
    keys: np.ndarray  # [sum(counts)] uint16/uint32 key positions, each query's keys by falling weight
    weights: np.ndarray  # [sum(counts)] uint8: round(weight * 255)
    kv_map: tuple[int, ...]  # the K/V head each query head reads


@dataclass
class AttentionView:
    """The compressed attention of some layers and the page that shows it (see :func:`attention_view`).

    Attributes:
        tokens: the token strings.
        layers: the kept attention of each shown layer.
        top_k: most keys kept per query.
        min_weight: smallest weight kept (the largest key of every query is always kept).
        title: the heading of the page.
    """

    tokens: list[str]
    layers: list[_Layer]
    top_k: int
    min_weight: float
    title: str = ""
    _id: str = field(default_factory=lambda: "av" + uuid.uuid4().hex[:10])

    def keys_of(self, layer: int, head: int, query: int) -> list[tuple[int, float]]:
        """The ``(key position, weight)`` pairs the page highlights for one query (weights as sent: k/255).

        Raises:
            KeyError: ``layer`` is not in the view.
            IndexError: ``head`` or ``query`` is out of range.
        """
        found = [lay for lay in self.layers if lay.layer == layer]
        if not found:
            raise KeyError(f"layer {layer} is not in this view; it has {[lay.layer for lay in self.layers]}")
        lay = found[0]
        H, T = lay.counts.shape
        if not (0 <= head < H and 0 <= query < T):
            raise IndexError(f"head {head} / query {query} outside [0, {H}) / [0, {T})")
        flat = lay.counts.reshape(-1).astype(np.int64)  # [H * T]
        start = int(flat[: head * T + query].sum())
        n = int(flat[head * T + query])
        return [(int(k), float(w) / 255) for k, w in zip(lay.keys[start:start + n], lay.weights[start:start + n])]

    def _payload(self) -> str:
        wide = any(lay.keys.dtype == np.uint32 for lay in self.layers)
        b64 = lambda a: base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")
        data = {
            "title": self.title, "tokens": self.tokens, "top_k": self.top_k, "min_weight": self.min_weight,
            "key_bytes": 4 if wide else 2,
            "layers": [{"layer": lay.layer, "heads": int(lay.counts.shape[0]), "kv_map": list(lay.kv_map),
                        "counts": b64(lay.counts),
                        "keys": b64(lay.keys.astype("<u4" if wide else "<u2")), "weights": b64(lay.weights)}
                       for lay in self.layers],
        }
        # Inside a script element "</script" ends it and "<!--" followed by "<script" swallows the page after it
        # (the HTML parser's script-data escape states): tokens such as "<!--<script>" must not reach the page raw.
        # JSON strings may spell any character as \uXXXX, and "<", ">" and "&" appear only inside strings.
        text = json.dumps(data, ensure_ascii=False)
        return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")

    def to_html(self, full_page: bool = False) -> str:
        """The view as HTML: a fragment for a notebook cell, or a whole document (``full_page``)."""
        static = resources.files(__package__)
        css = (static / "attention_view.css").read_text(encoding="utf-8")
        js = (static / "attention_view.js").read_text(encoding="utf-8")
        body = (f'<div class="av-root" id="{self._id}"><style>{css}</style>'
                f'<script type="application/json" id="{self._id}-data">{self._payload()}</script>'
                f'<div class="av-msg">attention view: needs JavaScript (a trusted notebook or a browser)</div>'
                f'<script>({js})("{self._id}");</script></div>')
        if not full_page:
            return body
        return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(self.title or "attention")}'
                f'</title></head><body>{body}</body></html>')

    def _repr_html_(self) -> str:
        return self.to_html()

    def save(self, path: str | Path) -> Path:
        """Write the view as a standalone HTML file (opens in any browser, offline).

        Returns:
            The path written.
        """
        path = Path(path)
        atomic_write_text(path, self.to_html(full_page=True))  # a killed save leaves the previous page whole
        return path

    @property
    def nbytes(self) -> int:
        """Bytes of attention data the page carries (before base64)."""
        return sum(lay.counts.nbytes + lay.keys.nbytes + lay.weights.nbytes for lay in self.layers)


def _top_keys(pattern: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` heaviest keys of every query: ``(weights, positions)``, each ``[H, T, k]``, falling weight."""
    vals, idx = pattern.detach().float().topk(min(k, pattern.shape[-1]), dim=-1)  # [H, T, k]
    return vals.cpu(), idx.cpu()


def _pack(layer: int, vals: torch.Tensor, idx: torch.Tensor, min_weight: float, kv_map: Sequence[int],
          n_keys: int) -> _Layer:
    keep = vals >= min_weight  # [H, T, k]
    keep[..., 0] = True  # every query shows at least its heaviest key
    key_type = np.uint16 if n_keys <= 2**16 else np.uint32
    return _Layer(layer=layer, counts=keep.sum(-1).numpy().astype(np.uint8),
                  keys=idx[keep].numpy().astype(key_type),
                  weights=(vals[keep] * 255).round().clamp(0, 255).numpy().astype(np.uint8),
                  kv_map=tuple(int(g) for g in kv_map))


def _uniform_kv_map(n_heads: int, n_kv_heads: int | None, layer: int) -> tuple[int, ...]:
    if n_kv_heads is None:
        return tuple(range(n_heads))
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads!r} must be a positive int dividing the {n_heads} heads of "
                         f"layer {layer}")
    return tuple(h // (n_heads // n_kv_heads) for h in range(n_heads))


def _patterns_of(source: Any, layers: Sequence[int] | None, batch: int) -> dict[int, torch.Tensor]:
    """``{layer: [H, T, S]}`` from a Trace, a mapping, or a ``[H, T, S]`` / ``[L, H, T, S]`` tensor."""
    from ..trace import Trace

    if isinstance(source, Trace):
        available = source.layers
        if not available:
            raise ValueError("the trace holds no attention patterns; record them with names_filter='*hook_pattern'")
        found = {lay: source.pattern(lay) for lay in (available if layers is None else layers)}
    elif isinstance(source, Mapping):
        found = {int(lay): torch.as_tensor(p) for lay, p in source.items()}
    else:
        t = torch.as_tensor(source)
        if t.dim() == 3:
            t = t[None]  # [1, H, T, S]: one layer
        if t.dim() != 4:
            raise ValueError(f"patterns must be [H, T, S] or [L, H, T, S], got shape {tuple(t.shape)}")
        found = dict(enumerate(t))
    if layers is not None:
        missing = [lay for lay in layers if lay not in found]
        if missing:
            raise ValueError(f"layers {missing} are not in the patterns; available: {sorted(found)}")
        found = {lay: found[lay] for lay in layers}
    out = {}
    for lay, p in found.items():
        if p.dim() == 4:  # [B, H, T, S]
            if not 0 <= batch < p.shape[0]:
                raise ValueError(f"batch={batch} is outside the {p.shape[0]} sequences of layer {lay}")
            p = p[batch]
        if p.dim() != 3:
            raise ValueError(f"layer {lay}: a pattern must be [H, T, S] or [B, H, T, S], got {tuple(p.shape)}")
        out[lay] = p
    return out


def _run_model(model: Any, tokens: Any, layers: Sequence[int] | None, top_k: int, batch: int
               ) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Run the model once, reducing each layer's pattern to its top keys inside the hook (one layer's full
    pattern alive at a time, whatever the length)."""
    from ..hooks import QueryChunkHook

    if isinstance(tokens, str):
        tokens = model.to_tokens(tokens)
    ids = torch.as_tensor(tokens)
    if ids.dim() == 1:
        ids = ids[None]  # [1, T]
    if ids.dim() != 2 or not 0 <= batch < ids.shape[0]:
        raise ValueError(f"tokens must be text, [T] or [B, T] ids with batch={batch} in range; got {tuple(ids.shape)}")
    ids = ids[batch:batch + 1]  # [1, T]
    n_layers = model.cfg.n_layers
    chosen = list(range(n_layers)) if layers is None else list(layers)
    bad = [lay for lay in chosen if not (isinstance(lay, int) and 0 <= lay < n_layers)]
    if bad:
        raise ValueError(f"layers {bad} are outside the model's {n_layers} layers")
    chunks: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {lay: [] for lay in chosen}

    def keep_top(lay: int) -> QueryChunkHook:
        def hook(pattern: torch.Tensor, _hook: Any, _q_start: int) -> None:
            chunks[lay].append(_top_keys(pattern[0], top_k))  # pattern [1, H, t, S]; chunks come in query order

        return QueryChunkHook(hook)

    hooks = [(f"blocks.{lay}.attn.hook_pattern", keep_top(lay)) for lay in chosen]
    with torch.no_grad(), model.hooks(hooks):
        model(ids.to(next(model.parameters()).device))
    return {lay: (torch.cat([v for v, _ in c], 1), torch.cat([i for _, i in c], 1))  # [H, T, k]
            for lay, c in chunks.items()}, ids[0]


def attention_view(
    source: Any,
    tokens: Any = None,
    *,
    layers: Sequence[int] | None = None,
    n_kv_heads: int | None = None,
    top_k: int = 8,
    min_weight: float = 0.01,
    batch: int = 0,
    title: str | None = None,
) -> AttentionView:
    """An interactive view of attention: hover (or click to pin) a token to colour the keys it attends to;
    pick the layer and the head; heads sharing a K/V head (GQA) are boxed together.

    Args:
        source: an :class:`interp.Transformer` (then ``tokens`` is text or ids, and the model is run once with
            each layer's pattern reduced inside its hook), a :class:`~interp.trace.Trace` with patterns, a
            ``{layer: [H, T, S] or [B, H, T, S]}`` mapping, or a ``[H, T, S]`` / ``[L, H, T, S]`` tensor.
        tokens: with a model: the text or ids; otherwise the token strings (default: the trace's, else positions).
        layers: the layers to include (default all): fewer layers, a smaller page.
        n_kv_heads: K/V heads per layer for a trace or tensors (a model's own config is used otherwise).
        top_k: most keys sent per query (the page can only highlight these).
        min_weight: weights below this are not sent (the heaviest key of each query always is).
        batch: which sequence of a batch.
        title: page heading (default: the model's name).

    Returns:
        An :class:`AttentionView`: displays itself in Jupyter / VS Code; ``.save("view.html")`` writes a file.

    Raises:
        ValueError: bad ``top_k`` / ``min_weight`` / ``layers`` / ``batch``, token labels of the wrong length,
            or ``n_kv_heads`` not dividing a layer's heads.

    Example:
        >>> from interp.viz.attention_view import attention_view
        >>> from interp.zoo.induction import build_induction_model
        >>> model = build_induction_model()
        >>> view = attention_view(model, "t3 t9 t4 t3 t9", top_k=4)
        >>> [round(w, 2) for _, w in view.keys_of(1, 0, 0)]
        [1.0]
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 255:
        raise ValueError(f"top_k={top_k!r} must be an int in [1, 255]")
    if not isinstance(min_weight, (int, float)) or not 0 <= min_weight < 1:
        raise ValueError(f"min_weight={min_weight!r} must be a number in [0, 1)")
    is_model = hasattr(source, "cfg") and hasattr(source, "hooks") and callable(source)
    if is_model:
        if tokens is None:
            raise ValueError("attention_view(model, tokens): pass the text or token ids to run")
        tops, ids = _run_model(source, tokens, layers, top_k, batch)
        labels = (source.to_str_tokens(ids) if getattr(source, "tokenizer", None) is not None
                  else [str(i) for i in ids.tolist()])
        kv_maps = {lay: source.cfg.layer(lay).kv_map for lay in tops}
        n_keys = ids.shape[0]
        title = getattr(source, "name", "") if title is None else title
    else:
        patterns = _patterns_of(source, layers, batch)
        if not patterns:
            raise ValueError("no layers to show")
        n_keys = next(iter(patterns.values())).shape[-1]
        tops = {lay: _top_keys(p, top_k) for lay, p in patterns.items()}
        kv_maps = {lay: _uniform_kv_map(p.shape[0], n_kv_heads, lay) for lay, p in patterns.items()}
        if tokens is None and hasattr(source, "str_tokens") and source.str_tokens is not None:
            tokens = source.str_tokens[batch]
        T = next(iter(patterns.values())).shape[-2]
        labels = token_labels(tokens, T)
        title = "" if title is None else title
    if n_keys != len(labels):
        raise ValueError(f"the view shows self-attention over one sequence: {len(labels)} tokens but {n_keys} keys")
    packed = [_pack(lay, vals, idx, float(min_weight), kv_maps[lay], n_keys) for lay, (vals, idx) in sorted(tops.items())]
    return AttentionView(tokens=list(labels), layers=packed, top_k=top_k, min_weight=float(min_weight), title=title)
