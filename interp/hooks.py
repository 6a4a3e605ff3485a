"""Named hooks: identity modules that expose every intermediate of a forward pass.

A :class:`HookPoint` is an ``nn.Module`` that returns its input; it is named after its path in the module
tree (``blocks.0.attn.hook_pattern``), as in TransformerLens. A hook function ``fn(tensor, hook)`` may read
the tensor or return a replacement. Attention's score and pattern hooks may fire once per query chunk
(``model.set_query_chunk``); a hook that needs to know which query rows arrived wraps its function in
:class:`QueryChunkHook` and receives the chunk's first query position as an argument.
:class:`HookedModule` gives a model the ways to attach hooks that always
remove exactly what they added, also when the forward pass raises.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

import torch
from torch import nn

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .model import ForwardOptions

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
NamesFilter = Union[None, str, Sequence[str], Callable[[str], bool]]  # noqa: UP007 - a runtime alias, Python 3.10


class QueryChunkHook:
    """A hook function that also receives the query offset: ``fn(tensor, hook, q_start)``.

    ``q_start`` is the first query position of the rows in ``tensor`` (0 unless attention runs query-chunked;
    non-attention hooks always get 0). Plain ``fn(tensor, hook)`` functions keep the TransformerLens
    signature.

    ``cut_rows=True``: the function accepts a causal chunk's score / pattern rows cut after the chunk's last
    query's key, ``[B, H, c, n]`` with ``n = q_start + c`` keys (without a cache), instead of all ``S`` keys; the
    keys cut are the ones no query of the chunk may see (masked scores, exact zero weights). When every hook on
    a score / pattern point accepts them, attention hands its rows over as it computed them, with no padded
    copy per chunk and layer; a replacement such a hook returns has the cut shape and covers the cut keys only.

    Example:
        >>> from interp.hooks import QueryChunkHook
        >>> from interp.examples import model, tokens
        >>> seen = []
        >>> with model.hooks([("blocks.0.attn.hook_pattern", QueryChunkHook(lambda p, h, q0: seen.append(q0)))]):
        ...     model(tokens)
    """

    __slots__ = ("cut_rows", "fn")

    def __init__(self, fn: Callable[[torch.Tensor, HookPoint, int], torch.Tensor | None], *,
                 cut_rows: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"QueryChunkHook needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.cut_rows = cut_rows

    def __call__(self, x: torch.Tensor, hook: HookPoint, q_start: int = 0) -> torch.Tensor | None:
        return self.fn(x, hook, q_start)


class HookPoint(nn.Module):
    """An identity module that calls the hooks attached to it.

    Attributes:
        name: the module path, set by :class:`HookedModule` (``blocks.0.attn.hook_q``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.name: str = ""
        self._fns: list[HookFn] = []

    @property
    def active(self) -> bool:
        """True when at least one hook is attached (the model uses this to skip optional work)."""
        return bool(self._fns)

    @property
    def takes_cut_rows(self) -> bool:
        """True when hooks are attached and every one is a :class:`QueryChunkHook` with ``cut_rows``: attention
        may then hand a causal chunk's rows over without the keys after its last query."""
        return bool(self._fns) and all(type(fn) is QueryChunkHook and fn.cut_rows for fn in self._fns)

    def add_hook(self, fn: HookFn) -> Callable[[], None]:
        """Attach ``fn``; returns a function that removes exactly this hook."""
        if not callable(fn):
            raise TypeError(f"hook for {self.name!r} must be callable, got {type(fn).__name__}")
        self._fns.append(fn)

        def remove() -> None:
            try:
                self._fns.remove(fn)
            except ValueError:
                pass

        return remove

    def remove_hooks(self) -> None:
        self._fns.clear()

    def forward(self, x: torch.Tensor, q_start: int = 0) -> torch.Tensor:
        for fn in self._fns:
            out = fn(x, self, q_start) if type(fn) is QueryChunkHook else fn(x, self)
            if out is not None:
                if not isinstance(out, torch.Tensor):
                    raise TypeError(
                        f"hook on {self.name!r} returned {type(out).__name__}; return a Tensor or None"
                    )
                if out.shape != x.shape:
                    raise ValueError(
                        f"hook on {self.name!r} returned shape {tuple(out.shape)}, expected {tuple(x.shape)}"
                    )
                if out.dtype != x.dtype:
                    raise TypeError(
                        f"hook on {self.name!r} returned dtype {out.dtype}, expected {x.dtype} "
                        "(cast the replacement with .to(tensor.dtype))"
                    )
                x = out
        return x

    def __call__(self, x: torch.Tensor, q_start: int = 0) -> torch.Tensor:  # skip nn.Module's dispatch: hot path
        return self.forward(x, q_start) if self._fns else x

    def extra_repr(self) -> str:
        return f"name={self.name!r}, hooks={len(self._fns)}"


def resolve_names(names_filter: NamesFilter, all_names: Sequence[str]) -> list[str]:
    """Turn a names filter into the list of hook names it selects.

    Args:
        names_filter: ``None`` (all), a name or glob pattern (``"blocks.*.attn.hook_pattern"``), a list of
            names/patterns, or a predicate ``name -> bool``.
        all_names: the model's hook names.

    Returns:
        The selected names, in model order.

    Raises:
        ValueError: a name or pattern given explicitly matches no hook point (the error lists close names).
        TypeError: the filter is none of the accepted types.
    """
    if names_filter is None:
        return list(all_names)
    if callable(names_filter):
        return [n for n in all_names if names_filter(n)]
    if isinstance(names_filter, str):
        patterns = [names_filter]
    elif isinstance(names_filter, Iterable):
        patterns = list(names_filter)
        for p in patterns:
            if not isinstance(p, str):
                raise TypeError(f"names_filter entries must be str, got {p!r}")
    else:
        raise TypeError(
            f"names_filter must be None, a str, a list of str or a callable, got {type(names_filter).__name__}"
        )
    selected: set[str] = set()
    for p in patterns:
        if any(c in p for c in "*?["):
            rx = re.compile(fnmatch.translate(p))
            hits = [n for n in all_names if rx.match(n)]
        else:
            hits = [p] if p in all_names else []
        if not hits:
            close = [n for n in all_names if p.split(".")[-1] in n][:5]
            raise ValueError(f"hook name {p!r} matches no hook point; similar names: {close}")
        selected.update(hits)
    return [n for n in all_names if n in selected]


_LOCK_INIT = threading.Lock()


class HookedModule(nn.Module):
    """Mixin for a model whose :class:`HookPoint` children are addressable by name.

    Call :meth:`setup_hooks` at the end of ``__init__``.

    Hooks and head gates are state on the model, shared by every thread that uses it. ``model.lock`` (a
    re-entrant lock) makes each hooked or gated run atomic: :meth:`hooks` holds it for its whole ``with``
    block, a forward pass holds it while it runs, and so do the gate contexts of :mod:`interp.pruning`. So
    threads (Streamlit sessions) that share one model take turns instead of seeing each other's hooks.
    """

    hook_dict: dict[str, HookPoint]

    @property
    def lock(self) -> threading.RLock:
        """The model's re-entrant lock: hold it to run several passes under hooks or gates atomically."""
        lock = self.__dict__.get("_interp_lock")
        if lock is None:
            with _LOCK_INIT:
                lock = self.__dict__.setdefault("_interp_lock", threading.RLock())
        return lock

    def __getstate__(self) -> dict[str, Any]:
        # A lock cannot be copied or pickled: a copy (deepcopy, remove_heads) gets a fresh one on first use.
        state = super().__getstate__()
        state.pop("_interp_lock", None)
        return state

    def setup_hooks(self) -> None:
        _ = self.lock  # create it now, before any thread shares the model
        self.hook_dict = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

    @property
    def hook_names(self) -> list[str]:
        return list(self.hook_dict)

    def reset_hooks(self) -> None:
        """Remove every hook from every hook point."""
        for hp in self.hook_dict.values():
            hp.remove_hooks()

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[NamesFilter, HookFn]] = ()) -> Iterator[HookedModule]:
        """Attach hooks for the duration of a ``with`` block.

        Args:
            fwd_hooks: ``(names_filter, fn)`` pairs; the filter is a name, pattern, list or predicate.

        Raises:
            ValueError: a hook name matches no hook point (nothing is attached then).

        Example:
            >>> from interp.examples import model, tokens
            >>> with model.hooks([("blocks.0.attn.hook_pattern", lambda p, hook: print(p.shape))]):
            ...     model(tokens)
        """
        plan = [(resolve_names(f, self.hook_names), fn) for f, fn in fwd_hooks]
        removers: list[Callable[[], None]] = []
        # Held for the whole block: another thread's forward waits instead of firing these hooks.
        with self.lock:
            try:
                for names, fn in plan:
                    for n in names:
                        removers.append(self.hook_dict[n].add_hook(fn))
                yield self
            finally:
                for remove in reversed(removers):
                    remove()

    def run_with_hooks(self, tokens: torch.Tensor, *, fwd_hooks: Sequence[tuple[NamesFilter, HookFn]] = (),
                       **kwargs: Unpack[ForwardOptions]) -> torch.Tensor:
        """Run ``self(tokens, **kwargs)`` with hooks attached; they are removed afterwards, also on error.

        Args:
            tokens: the model's input (``[B, T]`` ids).
            fwd_hooks: ``(names, fn)`` pairs, as :meth:`hooks` takes them.
            kwargs: the keyword arguments of the model's forward (:class:`interp.model.ForwardOptions`).

        Returns:
            What the forward pass returns (the logits).

        Example:
            >>> import torch
            >>> from interp import ModelConfig, Transformer
            >>> model = Transformer(ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=11, n_ctx=4))
            >>> zero = lambda x, hook: x * 0  # the embedding written as zeros
            >>> model.run_with_hooks(torch.tensor([[1, 2]]), fwd_hooks=[("hook_embed", zero)]).shape
            torch.Size([1, 2, 11])
        """
        with self.hooks(fwd_hooks):
            return self(tokens, **kwargs)
