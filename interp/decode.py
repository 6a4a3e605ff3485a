"""Decoding's fast paths: weights laid out for few-row products, and the hook-free decode step.

A decode step multiplies one row per sequence by every weight: a matrix-vector product bound by memory
bandwidth, plus a few dozen small operations per layer whose Python and dispatch cost is not small beside it
(on SmolLM2-135M, one row: ~6 ms of a ~50 ms step alone, about twice that in the loop, where streaming the
weights evicts the interpreter's working set from the caches). Two things here make it cheaper:

- :class:`DecodeLayout`: how each float32 CPU ``nn.Linear`` weight is laid out for ``rows``-row products.
  Below ``PACK_MIN_ROWS`` rows the weight is stored transposed (``[in, out]`` contiguous, which MKL streams
  faster than ``F.linear``'s ``[out, in]``): inside :func:`decoding` the parameters' own storage is
  transposed in place (the same values, read live, so no edit can be missed), and a single
  :func:`interp.generate.generate` call makes transposed copies for its own run. From ``PACK_MIN_ROWS``
  rows a copy is MKL-packed (MKL's sgemm otherwise repacks the weight on every call, which at 4-16 rows costs
  about as much as the multiply itself); a packed copy held across calls is checked against the live weight
  before every run (:meth:`DecodeLayout.stale`).
- :class:`LeanDecoder`: the decode step of the model's own blocks, traced once with ``torch.fx`` while no
  hook is attached (a :class:`~interp.hooks.HookPoint` without hooks returns its input, so hooks vanish from
  the trace), and run as one flat function with the layout's products in place of the linear layers. There
  is no second forward to maintain: a change to a block changes the trace. :func:`interp.generate.generate`
  uses it only while nothing can observe the difference: no hook or head gate, no torch module hook, no
  module replaced since the trace, no autograd. Otherwise every step runs the hooked forward pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .attention import AttnMask
from .kv_cache import KVCache
from .moe import MoE
from .norms import RMSNorm
from .rotary import Rotary

if TYPE_CHECKING:
    from .model import Transformer

# generate() multiplies each decode step's B rows by MKL-packed weights from this many rows (measured on a
# Xeon, 1 thread, SmolLM2-135M: 4-16 rows run ~1.5x faster) and for runs of at least this many steps (packing
# takes ~0.3 s there, one step saves ~30-50 ms at 4-8 rows). Fewer rows get the transposed layout (see
# TRANSPOSE_MIN_STEPS); decoding() builds either once for many generate() calls.
PACK_MIN_ROWS = 4
PACK_MIN_STEPS = 8
# Below PACK_MIN_ROWS, generate() builds the transposed copies by itself for runs of at least this many steps:
# with the lean step they save ~14 ms a step on SmolLM2-135M (one row, one thread: 46 against 60 ms) and cost
# ~0.7 s to build, so they pay from ~50 steps; the margin keeps noisy hosts on the right side.
TRANSPOSE_MIN_STEPS = 96
# ... and only when the copy (about the size of the weights) is small: a 7B float32 model is not doubled.
PACK_MAX_BYTES = 2 * 2**30


def _mkl_packing_available() -> bool:
    """True when this torch build has MKL's packed sgemm ops (x86 CPU builds); otherwise nothing is packed."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        return callable(torch.ops.mkl._mkl_reorder_linear_weight) and callable(torch.ops.mkl._mkl_linear)
    except (AttributeError, RuntimeError):
        return False


def _eligible(mod: nn.Module) -> TypeGuard[nn.Linear]:
    # Inference tensors (a model built under torch.inference_mode) can be neither re-laid-out in place nor
    # checked by version: they keep their own layout.
    if type(mod) is not nn.Linear:
        return False
    w = mod.weight
    return w.dtype == torch.float32 and w.device.type == "cpu" and not w.is_inference()


def _linears(model: nn.Module) -> list[nn.Linear]:
    """Every eligible linear layer, each weight once (a tied unembedding shares its embedding's weight)."""
    seen: set[int] = set()
    out = []
    for mod in model.modules():
        if _eligible(mod) and id(mod.weight) not in seen:
            seen.add(id(mod.weight))
            out.append(mod)
    return out


def _fingerprint(weight: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """``weight @ probe``: one read of every element. An edit of any kind (through ``.data`` too, which no
    version counter sees) changes it, except for an edit orthogonal to a random probe."""
    return torch.mv(weight.detach(), probe[:weight.shape[1]])  # [out, in] @ [in] -> [out]


@dataclass
class _Packed:
    """One linear layer's MKL-packed copy, of ``weight`` as it was at ``version``/``ptr`` (and ``print``)."""

    weight: torch.Tensor
    version: int
    ptr: int
    copy: torch.Tensor
    print: torch.Tensor | None = None  # the fingerprint, for copies held across generate() calls


@dataclass
class DecodeLayout:
    """How a ``rows``-row decode step multiplies by each linear layer.

    Attributes:
        rows: the row count (sequences) the layout serves.
        packed: per layer, its MKL-packed copy (from ``PACK_MIN_ROWS`` rows).
        transposed: per layer, a transposed ``[in, out]`` copy of its weight (a single generate call's own).
        relaid: parameters whose own storage was transposed in place (inside :func:`decoding`); restored to
            contiguous ``[out, in]`` storage when the layout is released.
    """

    rows: int
    packed: dict[nn.Linear, _Packed] = field(default_factory=dict)
    transposed: dict[nn.Linear, tuple[torch.Tensor, int, int, torch.Tensor]] = field(default_factory=dict)
    relaid: list[torch.Tensor] = field(default_factory=list)
    probe: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.packed) + len(self.transposed) + len(self.relaid)

    @classmethod
    def plain(cls, model: nn.Module, rows: int) -> DecodeLayout:
        """No copies: every linear layer multiplies by its own weight as ``F.linear`` does."""
        return cls(rows=rows)

    @classmethod
    def build(cls, model: nn.Module, rows: int, *, held: bool = False) -> DecodeLayout:
        """Lay out ``model``'s float32 CPU linear weights for ``rows``-row products (nothing without MKL).

        Args:
            rows: the decode step's row count.
            held: the layout outlives one generate() call (:func:`decoding`): below ``PACK_MIN_ROWS`` the
                parameters themselves are transposed in place (so they are always the live weights), and
                packed copies get a fingerprint that :meth:`stale` compares before every run.
        """
        layout = cls(rows=rows)
        if not _mkl_packing_available():
            return layout
        linears = _linears(model)
        if rows >= PACK_MIN_ROWS:
            if held and linears:
                gen = torch.Generator().manual_seed(0)
                layout.probe = torch.randn(max(m.in_features for m in linears), generator=gen)
            for mod in linears:
                w = mod.weight
                packed = torch.ops.mkl._mkl_reorder_linear_weight(w.detach(), rows)
                fp = None if layout.probe is None else _fingerprint(w, layout.probe)
                layout.packed[mod] = _Packed(w, w._version, w.data_ptr(), packed, fp)
        elif held:
            try:
                for mod in linears:
                    w = mod.weight
                    if w.stride(-1) == 1:  # not yet transposed (an untied copy of a tied weight is seen once)
                        with torch.no_grad():
                            w.data = w.data.t().contiguous().t()  # the same [out, in] values, [in, out] storage
                        layout.relaid.append(w)
            except BaseException:
                layout.release()
                raise
        else:
            for mod in linears:
                w = mod.weight
                layout.transposed[mod] = (w, w._version, w.data_ptr(), w.detach().t().contiguous())  # [in, out]
        return layout

    def release(self) -> None:
        """Give the parameters transposed in place their contiguous storage back (edits made meanwhile kept)."""
        with torch.no_grad():
            for w in self.relaid:
                if not w.is_contiguous():
                    w.data = w.data.contiguous()
        self.relaid.clear()
        self.packed.clear()
        self.transposed.clear()

    def stale(self, mod: nn.Linear) -> bool:
        """True when ``mod``'s copy no longer is its current weight: the parameter replaced, edited in place,
        given other storage, or (held copies) its values changed behind the version counter (``.data``)."""
        laid = self.packed.get(mod)
        if laid is not None:
            w = mod.weight
            if w is not laid.weight or w._version != laid.version or w.data_ptr() != laid.ptr:
                return True
            return (laid.print is not None and self.probe is not None
                    and not torch.equal(_fingerprint(w, self.probe), laid.print))
        t = self.transposed.get(mod)
        if t is not None:
            w = mod.weight
            return w is not t[0] or w._version != t[1] or w.data_ptr() != t[2]
        return False

    def product(self, mod: nn.Linear, rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x -> mod(x)`` for ``rows``-row inputs: over the layout's copy when there is a fresh one, else
        ``F.linear`` of the live weight (which, relaid in place, is already stored transposed)."""
        if rows == self.rows and not self.stale(mod):
            laid = self.packed.get(mod)
            if laid is not None:
                return functools.partial(_packed_mm, laid.copy, laid.weight, mod.bias, rows)
            t = self.transposed.get(mod)
            if t is not None:
                return functools.partial(F.linear, weight=t[3].t(), bias=mod.bias)  # x @ [in, out] (+ b)
        return functools.partial(F.linear, weight=mod.weight, bias=mod.bias)


def _packed_mm(packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int,
               x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def layout_for_generate(model: nn.Module, rows: int, new_tokens: int, *, use_cache: bool,
                        pack_weights: bool | None) -> DecodeLayout:
    """The layout a ``rows``-sequence generate() of ``new_tokens`` builds for itself (plain when it would not pay).

    ``pack_weights=None`` lays the weights out when it pays: with the cache, at least ``PACK_MIN_STEPS`` new
    tokens from ``PACK_MIN_ROWS`` sequences (``TRANSPOSE_MIN_STEPS`` below), and at most ``PACK_MAX_BYTES``
    of weights; ``True`` always, ``False`` never.

    Raises:
        TypeError: ``pack_weights`` is not a bool or None.
    """
    if pack_weights is not None and not isinstance(pack_weights, bool):
        raise TypeError(f"pack_weights={pack_weights!r} must be True, False or None")
    pack = pack_weights
    if pack is None:  # the weights' size is summed only when the rest says it would pay
        min_steps = PACK_MIN_STEPS if rows >= PACK_MIN_ROWS else TRANSPOSE_MIN_STEPS
        pack = (use_cache and new_tokens >= min_steps
                and sum(m.weight.numel() * m.weight.element_size() for m in _linears(model)) <= PACK_MAX_BYTES)
    return DecodeLayout.build(model, rows) if pack else DecodeLayout.plain(model, rows)


@contextlib.contextmanager
def decoding(model: Transformer, batch_size: int = 1) -> Iterator[Transformer]:
    """Lay the weights out for decoding ``batch_size`` sequences once, for every generate() in the block.

    Below ``PACK_MIN_ROWS`` sequences every float32 CPU linear weight is stored transposed (``[in, out]``
    contiguous, the same values) for the block: the parameters themselves, so the model needs no extra memory
    and every edit, through ``.data`` or not, is the weight the next step reads. From ``PACK_MIN_ROWS`` an
    MKL-packed copy of each weight is built once (about one extra copy of the weights, ~0.3 s for SmolLM2-135M)
    and checked against the live weight before every generate() (identity, version, storage and a one-pass
    fingerprint); a stale copy is not used. Results are those of generate() outside the block up to float
    rounding (the summation order of a GEMM kernel). Nothing is changed on models that are not float32 on CPU,
    or on torch builds without MKL. A block inside another reuses the outer block's layout. Inside the block
    the weights are not contiguous: call ``.contiguous()`` before handing them to code that needs it (such as
    safetensors' ``save_file``).

    Args:
        model: an :class:`interp.Transformer`.
        batch_size: how many sequences each generate() call inside the block decodes.

    Yields:
        the model itself.

    Raises:
        TypeError: ``batch_size`` is not an int.
        ValueError: ``batch_size`` < 1.

    Example:
        >>> import torch
        >>> from interp.decode import decoding
        >>> from interp import ModelConfig, Transformer
        >>> model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=11, n_ctx=16,
        ...                                 positional="rotary", normalization="rms"))
        >>> with decoding(model, batch_size=1):
        ...     model.generate(torch.tensor([[1, 2, 3]]), 4).shape
        torch.Size([1, 7])
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size={batch_size!r} must be an int")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    with model.lock:  # no pass of another thread sees half the layers switched
        outer = model._decode_layout is not None  # nested: the outer block's layout serves
        if not outer:
            model._decode_layout = DecodeLayout.build(model, batch_size, held=True)
    if outer:
        yield model
        return
    try:
        yield model
    finally:
        with model.lock:
            layout, model._decode_layout = model._decode_layout, None
            if layout is not None:
                layout.release()


# --- the traced decode step ----------------------------------------------------------------------------------
class _StepMask(AttnMask):
    """The mask of one decode step without padding: the new token sees every cached key, so the mask is
    trivial whatever the position. Its ``start`` and ``S`` change every step and are not known when tracing:
    reading them raises, so a block whose decode step depends on them fails to trace and keeps
    the hooked path instead of freezing one step's numbers into the trace."""

    def __init__(self, positions: torch.Tensor) -> None:
        super().__init__(T=1, S=0, start=0, causal=True)
        self.step_positions = positions  # [1]: the step's absolute position, an input of the trace

    def query_positions(self, T: int, device: torch.device) -> torch.Tensor:
        return self.step_positions.to(torch.float32)  # [1]

    def __getattribute__(self, name: str) -> Any:
        if name in ("start", "S"):
            raise _Untraceable("the decode step reads the mask's positions")
        return super().__getattribute__(name)

    def for_keys(self, window: int | None, n_keys: int, chunk: int | None = None) -> AttnMask:
        # A sliding-window layer's cache keeps only its last W - 1 positions, a chunked layer's only its current
        # chunk's (WindowLayerKVCache; a latent cache keeps all, so such MLA is refused in
        # LeanDecoder.unsupported): the new token's keys are exactly those it may see, and it sees them all.
        return self

    @property
    def trivial(self) -> bool:
        return True

    @property
    def sdpa_is_causal(self) -> bool:
        return False


class _Untraceable(Exception):
    """Raised while tracing: the block does something a trace cannot hold."""


# The ModelConfig fields the traced step covers at any value: each is exercised by tests/core/test_lean_decode.py,
# whose steps equal the hooked forward's. Every other field must keep its default: a new config field is left to
# the hooked pass until it is added here (with a test), never trusted by omission. The step root embeds and
# unembeds through the model's own methods, so the embedding and output-head fields are covered with the blocks.
_LEAN_COVERED = frozenset({
    # sizes and head layout, per-layer head counts of a pruned model
    "n_layers", "d_model", "n_heads", "d_head", "n_kv_heads", "d_vocab", "n_ctx", "d_mlp", "layer_n_heads",
    "layer_n_kv_heads", "layer_kv_map", "v_head_dim",
    # attention kinds and rotary (Rotary is called at each step, not traced: its scaling runs its own code)
    "attention", "kv_latent_dim", "q_latent_dim", "rope_dim", "positional", "rotary_base", "rotary_dim",
    "rope_scaling",
    # learned sinks: the fused path's extra key (tests/core/test_attn_sinks.py)
    "attn_sinks",
    # ALiBi: the attention computes its distances from the query and key counts, not the pass's positions
    "alibi_slopes",
    # sliding windows and attention chunks: such a layer's cache returns just the keys the new token sees
    # (_StepMask.for_keys); Gemma 3's local layers' own RoPE base; Llama 4's temperature on its NoPE layers
    "sliding_window", "local_rotary_base", "attention_chunk", "nope_temperature",
    # norms, MLPs and biases; where the norms stand, the block's layout, QK norms, the score scale, layers
    # without rotation, gpt-oss's clamped gated unit
    "normalization", "norm_eps", "precision", "attn_only", "activation", "attn_bias", "out_bias",
    "mlp_bias", "sublayer_norm", "parallel_block", "qk_norm", "attn_scale", "nope_layers", "swiglu_alpha",
    "swiglu_limit",
    # mixtures of experts: the MoE module is called at each step, not traced (its routing branches on data)
    "n_experts", "n_experts_per_token", "d_expert", "router_score", "sparsemixer_eps", "router_renormalize",
    "router_groups", "router_topk_groups", "router_group_score", "router_choice_bias", "routed_scaling",
    "d_shared_expert", "shared_expert_gate", "router_logit_bias", "expert_bias", "expert_input_weighting",
    "dense_mlp_layers",
    # the ends of the model: Transformer._embed and Transformer.unembed_residual
    "embed_scale", "embed_norm", "n_token_types", "tie_embeddings", "final_softcap",
    # OPT's positions counted over real tokens: a step runs unpadded rows, where they are the absolute positions
    "positions_from_mask",
    # read by no forward pass
    "pad_token_id",
})


def _submodule(root: nn.Module, path: str) -> nn.Module:
    """The module at ``path`` through the registered children (a model's ``W_E`` / ``W_U`` attributes are
    TransformerLens-style tensors; the modules of those names are reached through ``_modules``)."""
    mod = root
    for part in path.split("."):
        child = mod._modules[part]
        if child is None:  # a name registered as None holds no module
            raise KeyError(f"{path}: {part!r} is None")
        mod = child
    return mod


def _attr(root: nn.Module, node: Any) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node of the trace reads (``None`` for any other argument)."""
    if not (isinstance(node, torch.fx.Node) and node.op == "get_attr" and isinstance(node.target, str)):
        return None
    path, _, name = node.target.rpartition(".")
    try:
        return getattr(_submodule(root, path) if path else root, name)
    except (KeyError, AttributeError):
        return None


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, mod: nn.Module, qualname: str) -> bool:
        # Rotary memoises its angles by comparing position values, a branch on data: it is called, not traced.
        # RMSNorm picks its rounding order by dtype, a branch a trace cannot hold: called, not traced.
        # A mixture of experts runs only the experts its tokens chose, a branch on data: called, not traced.
        return isinstance(mod, (Rotary, RMSNorm, MoE)) or type(mod).__module__ == Rotary.__module__


class _StepRoot(nn.Module):
    """What the trace runs: the model's own embedding (``Transformer._embed``: scale, positions, token types,
    embedding norm), every block as its own forward defines it, and the model's own output head
    (``Transformer.unembed_residual``: final norm, unembedding, soft-cap) on the last position."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, caches: list) -> torch.Tensor:
        m = self.model
        x = m._embed(tokens, positions, None)  # [B, 1, M]
        mask = _StepMask(positions)
        for i, block in enumerate(m.blocks):
            x = block(x, mask=mask, positions=positions, cache=caches[i], context=None, context_mask=None)
        return m.unembed_residual(x)[:, -1]  # [B, 1, V] -> [B, V]


_PLAIN = (bool, int, float, str, type(None))


def _settings(model: nn.Module) -> tuple:
    """Each module's plain settings (flags, numbers, strings, its config): what a forward branches on besides its
    submodules and tensors, and so what a trace freezes. A trace is reused only while they are unchanged (an MLA
    block's ``decode_path`` switched, say, gets a new trace)."""
    return tuple(tuple((k, v) for k, v in vars(mod).items()
                       if not k.startswith("_") and (isinstance(v, _PLAIN) or dataclasses.is_dataclass(v)))
                 for mod in model.modules())  # private names hold memos (rotary angles), not settings


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


@dataclass
class _Traced:
    """The traced step as a flat function ``run(tokens, positions, caches, params, products, leaves)`` and
    what to bind to it: the parameter and buffer paths, the linear layers and the leaf modules it calls."""

    run: Callable[..., torch.Tensor]
    param_paths: list[str]
    linears: list[nn.Linear]
    leaves: list[nn.Module]
    modules: tuple[nn.Module, ...]
    settings: tuple  # every module's plain settings when traced (see _settings)


def _trace(model: Transformer) -> _Traced:
    """Trace the decode step of ``model``'s blocks and rewrite it to take everything it reads as arguments."""
    root = _StepRoot(model)
    with torch.no_grad():  # the blocks' no-autograd branches (the in-place MLP) are the ones a step runs
        graph = _Tracer().trace(root)
    ph = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    last_ph = list(ph.values())[-1]
    with graph.inserting_after(last_ph):
        leaves_ph = graph.placeholder("leaves")
    with graph.inserting_after(last_ph):
        products_ph = graph.placeholder("products")
    with graph.inserting_after(last_ph):
        params_ph = graph.placeholder("params")
    param_paths: list[str] = []
    linears: list[nn.Linear] = []
    leaves: list[nn.Module] = []
    owners = {id(m.weight): m for m in root.modules() if type(m) is nn.Linear}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in (torch._C._nn.linear, F.linear):
            x, w = node.args[0], node.args[1]
            bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
            # The layer whose product this is, found by its weight tensor: a tied unembedding's weight is traced
            # under the embedding's name (the first a shared parameter is registered under).
            mod = owners.get(id(_attr(root, w)))
            bias_t = None if bias is None else _attr(root, bias)
            if mod is None or bias_t is not mod.bias or (bias is not None and bias_t is None):
                # Not a linear layer's own product: it stays a plain F.linear of the live tensors, which the loop
                # below passes in as parameters.
                continue
            with graph.inserting_before(node):
                prod = graph.call_function(operator.getitem, (products_ph, len(linears)))
                new = graph.call_function(_call, (prod, x))
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            linears.append(mod)
        elif node.op == "call_module":
            with graph.inserting_before(node):
                leaf = graph.call_function(operator.getitem, (leaves_ph, len(leaves)))
                new = graph.call_function(_call, (leaf, *node.args), node.kwargs)
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            leaves.append(_submodule(root, node.target))
    for node in list(graph.nodes):
        if node.op == "get_attr":
            if not node.users:
                graph.erase_node(node)
                continue
            with graph.inserting_before(node):
                new = graph.call_function(operator.getitem, (params_ph, len(param_paths)))
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            param_paths.append(node.target)
    graph.lint()
    module = torch.fx.GraphModule(nn.Module(), graph)  # nothing is read from the root: all comes as arguments
    return _Traced(run=module.forward, param_paths=param_paths, linears=linears, leaves=leaves,
                   modules=tuple(model.modules()), settings=_settings(model))


class LeanDecoder:
    """The hook-free decode step of a model: its own blocks traced once, run over a :class:`DecodeLayout`.

    One step embeds the last token of each sequence, runs every block's forward as the flat sequence of
    tensor operations the trace recorded (no module call, no hook point, no wrapper: a hook point without
    hooks returns its input, so it leaves nothing in the trace) and returns the next-token logits. Its
    numbers are the hooked forward pass's, up to the summation order of a laid-out product.

    Build with :meth:`build` (``None`` for a model it does not cover); check :meth:`usable` before each run.

    Example:
        >>> import torch
        >>> from interp.decode import DecodeLayout, LeanDecoder
        >>> from interp import ModelConfig, Transformer
        >>> model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=11, n_ctx=16,
        ...                                 positional="rotary", normalization="rms")).eval()
        >>> decoder = LeanDecoder.build(model, DecodeLayout.plain(model, 1))
        >>> cache = model.make_cache(1)
        >>> with torch.no_grad():
        ...     _ = model(torch.tensor([[1, 2, 3]]), kv_cache=cache)
        ...     decoder.step(torch.tensor([4]), cache).shape
        torch.Size([1, 11])
    """

    def __init__(self, model: Transformer, layout: DecodeLayout, traced: _Traced) -> None:
        self.model, self.layout, self.rows, self.traced = model, layout, layout.rows, traced
        root = _StepRoot(model)
        self._params = [getattr(_submodule(root, path.rsplit(".", 1)[0]), path.rsplit(".", 1)[1])
                        for path in traced.param_paths]
        self._products = [layout.product(mod, layout.rows) for mod in traced.linears]
        self._leaves = [leaf.forward for leaf in traced.leaves]  # usable() made sure no torch hook is skipped

    @staticmethod
    def unsupported(model: Transformer) -> str | None:
        """Why :class:`LeanDecoder` does not cover ``model`` (``None`` when it does; a model that fails to
        trace is refused by :meth:`build` too)."""
        cfg = getattr(model, "cfg", None)
        if cfg is None or not hasattr(model, "blocks"):
            return "not an interp Transformer"
        others = tuple(f.name for f in dataclasses.fields(cfg) if f.name not in _LEAN_COVERED)
        checks = [
            (cfg.causal and cfg.unembed, "not a causal decoder with an unembedding"),
            (not cfg.cross_attention, "cross-attention"),
            (cfg.attention != "latent" or (cfg.sliding_window is None and cfg.attention_chunk is None),
             "sliding windows or chunks on latent attention (its cache keeps every position)"),
            (cfg.use_sdpa, "use_sdpa=False"),
            (not (uncovered := cfg.set_features(others)), f"settings the traced step does not cover: {uncovered}"),
            (not getattr(model, "_placement_handles", None), "layers placed on several devices"),
        ]
        for ok, why in checks:
            if not ok:
                return why
        return None

    @classmethod
    def build(cls, model: Transformer, layout: DecodeLayout, traced: _Traced | None = None) -> LeanDecoder | None:
        """A decoder over ``layout``, or ``None`` when the model is not covered (see :meth:`unsupported`) or
        its blocks do not trace."""
        if cls.unsupported(model) is not None:
            return None
        if traced is None or not cls._same_modules(model, traced):
            try:
                traced = _trace(model)
            except Exception:  # noqa: BLE001 - any block the trace cannot hold keeps the hooked path
                return None
        return cls(model, layout, traced)

    @classmethod
    def for_generate(cls, model: Transformer, layout: DecodeLayout, rows: int) -> LeanDecoder | None:
        """The decoder a ``rows``-sequence generate() runs past its prompt (over ``layout`` where it serves
        ``rows`` rows, else over the weights themselves); ``None`` when the model is not covered or a step
        could be observed (see :meth:`usable`). The trace is kept on the model for the next call (tracing costs
        far more than a step), and made again once a module or a module's setting has changed."""
        if cls.unsupported(model) is not None or not _unobserved(model):
            return None
        if layout.rows != rows:
            layout = DecodeLayout.plain(model, rows)
        decoder = cls.build(model, layout, model._decode_trace)
        if decoder is None:
            return None
        model._decode_trace = decoder.traced
        return decoder if decoder.usable(rows) else None

    @staticmethod
    def _same_modules(model: nn.Module, traced: _Traced) -> bool:
        mods = tuple(model.modules())
        return (len(mods) == len(traced.modules) and all(a is b for a, b in zip(mods, traced.modules))
                and _settings(model) == traced.settings)

    def usable(self, rows: int) -> bool:
        """True when a step may skip the hooked forward: ``rows`` sequences, no autograd, no hook, head gate
        or torch module hook attached, and no module replaced since the trace."""
        return (rows == self.rows and not torch.is_grad_enabled() and _unobserved(self.model)
                and self._same_modules(self.model, self.traced))

    def step(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One decode step: ``ids`` ``[rows]`` (each sequence's last token) -> logits ``[rows, d_vocab]``;
        every layer's cache appends its K/V at its own position."""
        position = cache.length
        positions = torch.arange(position, position + 1, device=ids.device)  # as the hooked pass builds them
        try:
            return self.traced.run(ids[:, None], positions, cache.layers, self._params, self._products,
                                   self._leaves)
        except BaseException:
            cache.rewind(position)
            raise


def _unobserved(model: Transformer) -> bool:
    """No interp hook, head gate or torch module hook anywhere: nothing could see a step skip the modules."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return False
    if any(hp._fns for hp in model.hook_dict.values()):
        return False
    for mod in model.modules():
        if mod._forward_hooks or mod._forward_pre_hooks or getattr(mod, "gate", None) is not None:
            return False
    return True
