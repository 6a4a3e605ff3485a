"""Where a model's weights live: built straight on its device and dtype, or split layer by layer over devices.

Two jobs, both about placement and nothing else:

- :func:`build` makes a randomly initialised :class:`~interp.model.Transformer` directly on the target device in
  the target dtype. Every parameter is allocated once, where it will stay: no float32 copy on the CPU first, so a
  bf16 1B-parameter model peaks near its 2 GB of weights instead of 4 + 2 GB.
- :func:`plan_layers` and :func:`place` split a model that does not fit one device: the embeddings on the first
  device, consecutive blocks filling each device in turn, the unembedding after the last block (with the
  embedding when the two are tied). Activations hop between devices at block boundaries, each block's hooks see
  tensors on that block's device, the KV cache of a layer lives with its block, and logits come back to the first
  device, where the tokens are. The planner works on the meta device from declared capacities, so it is tested
  without the devices it plans for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .config import ModelConfig

if TYPE_CHECKING:
    from .model import Transformer

DeviceLike = torch.device | str

#: Share of each device's capacity kept free by :func:`plan_layers` for activations, the KV cache and workspace.
DEFAULT_RESERVE = 0.10


class _BuildDefaults(TorchFunctionMode):
    """While a model is built: floating tensors made without a ``dtype`` get ``dtype``, and with ``meta_weights``
    the uninitialised ones (``torch.empty``: every parameter's storage) go to the meta device.

    A torch function mode lives on the calling thread's mode stack, unlike ``torch.set_default_dtype``, which
    is process-wide: two threads building a bf16 and a float32 model at once each get their own dtype, and the
    process default never changes. Tensors made with an explicit dtype (the rotary frequencies in float32, index
    tables in int64) keep it, as they did under a changed default dtype.
    """

    def __init__(self, dtype: torch.dtype | None, meta_weights: bool) -> None:
        super().__init__()
        self.dtype = dtype
        self.meta_weights = meta_weights

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if func in _FLOAT_FACTORIES and kwargs.get("dtype") is None:
            if self.dtype is not None:
                kwargs["dtype"] = self.dtype
            if self.meta_weights and func is torch.empty:
                kwargs["device"] = "meta"
        return func(*args, **kwargs)


# The factories that make a default-dtype floating tensor when given no dtype (what modules build weights with).
_FLOAT_FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn})


def check_dtype(dtype: object, what: str = "dtype") -> None:
    """Refuse a ``dtype`` argument that is not a floating-point ``torch.dtype`` (None is allowed): loaders call it
    before reading anything, so a typo fails at once, not after a full load.

    Args:
        dtype: the argument.
        what: its name, for the message.

    Raises:
        TypeError: ``dtype`` is not None and not a floating ``torch.dtype``.

    Example:
        >>> from interp.placement import check_dtype
        >>> check_dtype("bf16")
        Traceback (most recent call last):
        ...
        TypeError: dtype must be a floating-point torch.dtype (torch.float32, torch.bfloat16, torch.float16), got 'bf16'
    """
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{what} must be a floating-point torch.dtype (torch.float32, torch.bfloat16, "
                        f"torch.float16), got {dtype!r}")


def build(cfg: ModelConfig, *, device: DeviceLike | None = None, dtype: torch.dtype | None = None,
          seed: int | None = None, meta_weights: bool = False) -> Transformer:
    """A randomly initialised model, allocated directly on ``device`` in ``dtype``.

    Parameters are created and initialised where they stay (PyTorch's default initialisers run on the target
    device, in the target dtype), so peak memory is about the weights' own bytes. Buffers that need precision
    (the rotary frequencies, index tables) keep their explicit dtype. No process-wide torch state is changed
    (``torch.set_default_dtype`` is never called), so threads can build models of different dtypes at once.

    Args:
        cfg: the model's configuration.
        device: where to build it (default: the current default device, usually ``"cpu"``).
        dtype: a floating dtype for the parameters (default: float32).
        seed: seed the initialisation for a reproducible model. The draws come from a forked RNG
            (``torch.random.fork_rng``; PyTorch's initialisers take no generator), so the caller's global torch
            RNG state, CPU and the target CUDA device's, is the same after the build as before it.
        meta_weights: leave the parameters on the meta device, uninitialised (buffers are still built on
            ``device``): for loaders that assign every weight afterwards, so none is allocated twice.

    Returns:
        A :class:`~interp.model.Transformer` in eval mode.

    Raises:
        TypeError: ``dtype`` is not a floating-point dtype.

    Example:
        >>> import torch
        >>> from interp.placement import build
        >>> from interp import ModelConfig
        >>> cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=16, positional="rotary")
        >>> build(cfg, dtype=torch.bfloat16, seed=0).W_E.dtype
        torch.bfloat16
    """
    from .model import Transformer

    check_dtype(dtype)
    target = torch.device(device if device is not None else torch.get_default_device())
    if seed is None:
        with target, _BuildDefaults(dtype, meta_weights):
            model = Transformer(cfg)
        return model.eval()
    # the initialisers draw from the global generators: fork the CPU one and the target GPU's, so a seeded
    # build leaves the caller's random stream where it was
    forked = [target.index if target.index is not None else torch.cuda.current_device()] if target.type == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(seed)
        with target, _BuildDefaults(dtype, meta_weights):
            model = Transformer(cfg)
    return model.eval()


def block_bytes(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> tuple[int, list[int], int]:
    """Bytes of the embeddings, of each block and of the final norm + unembedding, measured on the meta device.

    Tied embeddings are counted once, with the embeddings.

    Args:
        cfg: the model's configuration.
        dtype: the dtype the weights will have.

    Returns:
        ``(embedding_bytes, [bytes of block 0, ...], head_bytes)``.

    Example:
        >>> import torch
        >>> from interp.placement import block_bytes
        >>> from interp import ModelConfig
        >>> cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=16, positional="rotary")
        >>> emb, blocks, head = block_bytes(cfg, torch.float32)
        >>> emb, len(blocks)
        (5120, 2)
    """
    model = build(cfg, device="meta", dtype=dtype)
    size = torch.empty((), dtype=dtype).element_size()

    def nbytes(modules: Sequence[nn.Module | None], seen: set[int]) -> int:
        total = 0
        for m in modules:
            if m is None:
                continue
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel() * size
        return total

    seen: set[int] = set()
    emb = nbytes([model.embed, model.pos_embed, model.W_tt, model.embed_ln], seen)
    blocks = [nbytes([b], seen) for b in model.blocks]
    head = nbytes([model.ln_final, model.unembed], seen)
    return emb, blocks, head


def plan_layers(cfg: ModelConfig, capacities: Mapping[DeviceLike, int], *, dtype: torch.dtype = torch.float32,
                reserve: float = DEFAULT_RESERVE,
                sizes: tuple[int, Sequence[int], int] | None = None) -> list[torch.device]:
    """Which device each block goes to: consecutive blocks fill the devices in the order given.

    The embeddings go on the first device, the final norm and unembedding with the last block (with the
    embeddings when they are tied). Each device holds at most ``(1 - reserve) x capacity`` bytes of weights.

    Args:
        cfg: the model's configuration.
        capacities: ``{device: bytes available}``, in the order the layers should flow through them.
        dtype: the weights' dtype.
        reserve: share of each capacity left for activations, the KV cache and workspace.
        sizes: ``(embedding bytes, [bytes per block], head bytes)`` when the weights are not ``dtype`` floats
            (a GGUF file's quantised blocks, :func:`interp.zoo.gguf.stored_sizes`); default
            :func:`block_bytes` ``(cfg, dtype)``.

    Returns:
        One device per block.

    Raises:
        ValueError: no devices, a negative capacity, ``reserve`` outside ``[0, 1)``, or weights that do not fit
            (the message gives the bytes needed and available).

    Example:
        >>> from interp.placement import plan_layers
        >>> from interp import ModelConfig
        >>> cfg = ModelConfig(n_layers=4, d_model=32, n_heads=4, d_vocab=40, n_ctx=16, positional="rotary")
        >>> [d.type for d in plan_layers(cfg, {"cpu": 10**9})]
        ['cpu', 'cpu', 'cpu', 'cpu']
    """
    if not capacities:
        raise ValueError("plan_layers needs at least one device with its capacity")
    if not 0.0 <= reserve < 1.0:
        raise ValueError(f"reserve={reserve!r} must be in [0, 1)")
    devices = [torch.device(d) for d in capacities]
    caps = []
    for d, c in capacities.items():
        if not isinstance(c, int) or isinstance(c, bool) or c < 0:
            raise ValueError(f"capacity of {d!r} must be a non-negative number of bytes, got {c!r}")
        caps.append(int(c * (1.0 - reserve)))
    emb, blocks, head = block_bytes(cfg, dtype) if sizes is None else (sizes[0], list(sizes[1]), sizes[2])
    if len(blocks) != cfg.n_layers:
        raise ValueError(f"sizes gives {len(blocks)} blocks for a model of n_layers={cfg.n_layers}")
    tied = bool(cfg.unembed and cfg.tie_embeddings)
    used = [0] * len(devices)
    used[0] = emb + (head if tied else 0)
    plan: list[torch.device] = []
    i = 0
    for layer, nb in enumerate(blocks):
        last = layer == len(blocks) - 1
        need = nb + (0 if tied else head) * last
        while used[i] + need > caps[i]:
            i += 1
            if i == len(devices):
                total = emb + sum(blocks) + head
                raise ValueError(
                    f"the model's weights ({total:,} bytes in {dtype}) do not fit the devices: capacities "
                    f"{dict(zip(map(str, devices), caps))} after reserving {reserve:.0%} (block {layer} of "
                    f"{nb:,} bytes has no room)")
        used[i] += need
        plan.append(devices[i])
    if used[0] > caps[0]:
        raise ValueError(f"the embeddings ({used[0]:,} bytes) do not fit {devices[0]} ({caps[0]:,} bytes after "
                         f"reserving {reserve:.0%})")
    return plan


@dataclass
class MemoryPlan:
    """What a model needs, from its config alone (:func:`plan_memory`): weights, KV cache, recorded patterns,
    and a split of its layers over devices.

    Byte counts are exact for the weights (measured on the meta device, or the file's stored blocks) and per
    token for the caches; the split keeps ``reserve`` of each device free for activations and workspace.
    """

    embedding_bytes: int  #: token (and position) embeddings, with a tied unembedding
    block_bytes: list[int]  #: weights of each block
    head_bytes: int  #: final norm + unembedding (0 when tied to the embedding)
    weights_label: str  #: what the weights are stored as ("float32", "Q4_0 blocks as stored", ...)
    kv_bytes_per_token: int  #: KV cache per token (all layers) in ``cache_dtype``
    cache_dtype: str
    pattern_bytes_per_token: int  #: recorded attention patterns per query token at ``tokens`` keys (all layers)
    tokens: int
    batch: int
    split: list[torch.device]  #: the device of each block
    capacities: dict[torch.device, int]
    reserve: float

    @property
    def weight_bytes(self) -> int:
        return self.embedding_bytes + sum(self.block_bytes) + self.head_bytes

    @property
    def kv_bytes(self) -> int:
        """KV cache for ``batch`` sequences of ``tokens``."""
        return self.kv_bytes_per_token * self.tokens * self.batch

    @property
    def pattern_bytes(self) -> int:
        """Every layer's pattern ``[batch, heads, tokens, tokens]`` of one recorded pass."""
        return self.pattern_bytes_per_token * self.tokens * self.batch

    def device_weights(self) -> dict[torch.device, tuple[list[int], int]]:
        """``{device: (its blocks, its weight bytes)}`` (embeddings on the first, the head with the last block)."""
        out: dict[torch.device, tuple[list[int], int]] = {d: ([], 0) for d in self.capacities}
        first = next(iter(self.capacities))
        out[first] = ([], self.embedding_bytes)
        for layer, (dev, nb) in enumerate(zip(self.split, self.block_bytes)):
            blocks, total = out[dev]
            out[dev] = ([*blocks, layer], total + nb + (self.head_bytes if layer == len(self.split) - 1 else 0))
        return out


def plan_memory(cfg: ModelConfig, capacities: Mapping[DeviceLike, int], *, dtype: torch.dtype = torch.float32,
                sizes: tuple[int, Sequence[int], int] | None = None, weights_label: str | None = None,
                tokens: int = 2048, batch: int = 1, reserve: float = DEFAULT_RESERVE) -> MemoryPlan:
    """Size a run before renting the hardware: weights per layer, KV cache and recorded patterns per token,
    and a split of the layers over ``capacities`` (:func:`plan_layers`), all from the config.

    Args:
        cfg: the model's configuration.
        capacities: ``{device: bytes}`` in the order the layers flow through them.
        dtype: the weights' (and the KV cache's, and the recorded patterns') dtype.
        sizes: stored sizes when the weights are not ``dtype`` floats (see :func:`plan_layers`).
        weights_label: what the weights are stored as (default: the dtype's name).
        tokens: context length of the KV cache and of a recorded pass.
        batch: sequences per pass.
        reserve: share of each device kept free (:func:`plan_layers`).

    Returns:
        A :class:`MemoryPlan`.

    Raises:
        ValueError: ``tokens`` or ``batch`` < 1, or weights that do not fit (bytes needed and available named).

    Example:
        >>> from interp.placement import plan_memory
        >>> from interp import ModelConfig
        >>> cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=16, positional="rotary")
        >>> p = plan_memory(cfg, {"cpu": 10**9}, tokens=16)
        >>> p.kv_bytes_per_token, p.pattern_bytes_per_token  # 2 layers x K, V x 4 heads x 8 x 4 B; 2 x 4 x 16 x 4 B
        (512, 512)
    """
    for name, value in (("tokens", tokens), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    emb, blocks, head = block_bytes(cfg, dtype) if sizes is None else (sizes[0], list(sizes[1]), sizes[2])
    split = plan_layers(cfg, capacities, dtype=dtype, reserve=reserve, sizes=(emb, blocks, head))
    element = torch.empty((), dtype=dtype).element_size()
    heads = sum(cfg.layer(layer).n_heads for layer in range(cfg.n_layers))
    return MemoryPlan(
        embedding_bytes=emb, block_bytes=list(blocks), head_bytes=head,
        weights_label=weights_label or str(dtype).removeprefix("torch."),
        kv_bytes_per_token=cfg.kv_cache_bytes_per_token(element), cache_dtype=str(dtype).removeprefix("torch."),
        pattern_bytes_per_token=heads * tokens * element, tokens=tokens, batch=batch, split=split,
        capacities={torch.device(d): int(c) for d, c in capacities.items()}, reserve=reserve)


def available_memory(devices: Sequence[DeviceLike] | None = None) -> dict[torch.device, int]:
    """Free bytes on each device: every visible GPU by default, CUDA's free memory, or the host's available RAM.

    Args:
        devices: the devices to ask about (default: every CUDA device, else the CPU).

    Returns:
        ``{device: free bytes}`` in the order given.

    Example:
        >>> from interp.placement import available_memory
        >>> list(available_memory(["cpu"]))[0].type
        'cpu'
    """
    if devices is None:
        devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]
    out: dict[torch.device, int] = {}
    for d in map(torch.device, devices):
        if d.type == "cuda":
            free, _ = torch.cuda.mem_get_info(d)
            out[d] = int(free)
        else:
            out[d] = host_available() or 0
    return out


def host_available() -> int | None:
    """Available host memory in bytes (``MemAvailable`` of ``/proc/meminfo``, else free pages), or None when the
    system tells neither."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def _stored_weight(module: nn.Module) -> object:
    """What holds a layer's weight: its parameter, or the blocks of a quantised layer (whose ``weight`` is a
    fresh dequantised tensor on every read, so neither identity nor device may be read from it)."""
    q = module._modules.get("q")
    return q if q is not None else module.weight


def _weight_device(module: nn.Module) -> torch.device:
    held = _stored_weight(module)
    return held.device  # type: ignore[attr-defined]


def _held_sizes(model: Transformer) -> tuple[int, list[int], int] | None:
    """``(embeddings, [blocks], head)`` bytes the model holds, for a model whose weights are not all ``dtype``
    parameters (quantised blocks); None when :func:`block_bytes` describes it."""
    from .quantized import has_quantized

    if not has_quantized(model):
        return None
    seen: set[int] = set()

    def held(modules: Sequence[nn.Module | None]) -> int:
        total = 0
        for m in modules:
            if m is None:
                continue
            for t in (*m.parameters(), *m.buffers()):
                if id(t) not in seen and t.dtype != torch.bool:
                    seen.add(id(t))
                    total += t.numel() * t.element_size()
        return total

    emb = held([model.embed, model.pos_embed, model.W_tt, model.embed_ln])
    blocks = [held([b]) for b in model.blocks]
    return emb, blocks, held([model.ln_final, model.unembed])


def _to_device_pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Move a module's tensor inputs to the device of its weights (read at call time, so ``.to()`` stays right)."""
    device = next(module.parameters()).device
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return args, kwargs


def _back_to_embedding_hook(model: Transformer):
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.to(_weight_device(model.embed))
    return hook


def layer_devices(model: Transformer) -> list[torch.device]:
    """The device of each block's weights.

    Example:
        >>> from interp.placement import build, layer_devices
        >>> from interp import ModelConfig
        >>> cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=16, positional="rotary")
        >>> layer_devices(build(cfg))
        [device(type='cpu'), device(type='cpu')]
    """
    return [next(b.parameters()).device for b in model.blocks]


def is_split(model: Transformer) -> bool:
    """True when :func:`place` spread the model over several devices (or placed it block by block)."""
    return bool(getattr(model, "_placement_handles", None))


def check_devices(devices: Sequence[DeviceLike] | str) -> list[torch.device] | str:
    """The ``devices`` argument of :func:`place` (and ``interp.load``) checked: ``"auto"`` or a non-empty list of
    real devices. Cheap, so a loader can call it before reading any weight.

    Args:
        devices: ``"auto"`` or a list of devices (strings or ``torch.device``).

    Returns:
        ``"auto"``, or the list as ``torch.device`` objects.

    Raises:
        ValueError: another string, an empty list, an entry that is not a device, or the ``meta`` device (it holds
            no weights: a model placed there would compute nothing); the message names ``devices`` and the entry.

    Example:
        >>> from interp.placement import check_devices
        >>> check_devices(["cpu", "cpu"])
        [device(type='cpu'), device(type='cpu')]
        >>> try:
        ...     check_devices(["meta"])
        ... except ValueError as e:
        ...     print(str(e)[:60])
        devices[0]='meta': the meta device holds no weights (a model
    """
    if isinstance(devices, str):
        if devices != "auto":
            raise ValueError(f"devices={devices!r}: give a list of devices or 'auto'")
        return devices
    if isinstance(devices, torch.device):
        raise ValueError(f"devices={devices!r}: give a list of devices (e.g. [{str(devices)!r}]) or 'auto'")
    try:
        items = list(devices)
    except TypeError:
        raise ValueError(f"devices={devices!r}: give a list of devices or 'auto'") from None
    if not items:
        raise ValueError("devices=[] is empty: give at least one device (a list such as ['cuda:0', 'cuda:1']) "
                         "or 'auto'")
    out = []
    for i, d in enumerate(items):
        try:
            dev = torch.device(d)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"devices[{i}]={d!r} is not a device: {e}") from None
        if dev.type == "meta":
            raise ValueError(f"devices[{i}]={str(d)!r}: the meta device holds no weights (a model placed there "
                             f"computes nothing); give real devices such as 'cpu' or 'cuda:0'")
        out.append(dev)
    return out


def place(model: Transformer, devices: Sequence[DeviceLike] | str = "auto", *,
          capacities: Mapping[DeviceLike, int] | None = None, reserve: float = DEFAULT_RESERVE) -> Transformer:
    """Split ``model`` layer by layer over ``devices`` (in place) and return it.

    Args:
        model: the model to place.
        devices: one device per block (a list as long as ``model.blocks``), a shorter list of devices to fill in
            order by :func:`plan_layers`, or ``"auto"`` to plan over every visible GPU's free memory.
        capacities: ``{device: bytes}`` for the planner instead of the devices' free memory.
        reserve: the planner's headroom (see :func:`plan_layers`).

    Returns:
        ``model``, with the embeddings on the first device, each block on its device, the unembedding after the
        last block (or with tied embeddings), and logits returned on the first device.

    Raises:
        ValueError: a bad ``devices`` (see :func:`check_devices`), or weights that do not fit.

    Example:
        >>> import torch
        >>> from interp.placement import build, place
        >>> from interp import ModelConfig
        >>> cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=16, positional="rotary")
        >>> m = place(build(cfg, seed=0), ["cpu", "cpu"])
        >>> m(torch.tensor([[1, 2, 3]])).shape
        torch.Size([1, 3, 40])
    """
    devices = check_devices(devices)
    dtype = next(model.parameters()).dtype
    n = len(model.blocks)
    if isinstance(devices, str):
        caps = _capacities(capacities, None)
        plan = plan_layers(model.cfg, caps, dtype=dtype, reserve=reserve, sizes=_held_sizes(model))
    else:
        if len(devices) == n:
            plan = [torch.device(d) for d in devices]
        else:
            caps = _capacities(capacities, devices)
            plan = plan_layers(model.cfg, caps, dtype=dtype, reserve=reserve, sizes=_held_sizes(model))
    unplace(model)
    first = plan[0] if plan else (devices[0] if not isinstance(devices, str) else torch.device("cpu"))
    ends: list[nn.Module | None] = [model.embed, model.pos_embed, model.W_tt, model.embed_ln]
    for end in ends:
        if end is not None:
            end.to(first)
    handles = []
    for block, dev in zip(model.blocks, plan):
        block.to(dev)
        handles.append(block.register_forward_pre_hook(_to_device_pre_hook, with_kwargs=True))
    tied = model.unembed is not None and _stored_weight(model.unembed) is _stored_weight(model.embed)
    head_device = first if tied else (plan[-1] if plan else first)
    head = [m for m in (model.ln_final, model.unembed) if m is not None]
    for m in head:
        if not tied or m is not model.unembed:
            m.to(head_device)
        if next(m.parameters(), None) is not None:
            handles.append(m.register_forward_pre_hook(_to_device_pre_hook, with_kwargs=True))
    last = head[-1] if head else (model.blocks[-1] if len(model.blocks) else None)
    if last is not None:
        handles.append(last.register_forward_hook(_back_to_embedding_hook(model)))
    model._placement_handles = handles
    return model


def _capacities(given: Mapping[DeviceLike, int] | None, devices: Sequence[DeviceLike] | None,
                ) -> dict[DeviceLike, int]:
    """The capacities :func:`place` plans with: those given, else what :func:`available_memory` finds."""
    if given is not None:
        return dict(given)
    return {device: free for device, free in available_memory(devices).items()}


def unplace(model: Transformer) -> None:
    """Remove the device hops that :func:`place` installed (the weights stay where they are).

    Example:
        >>> from interp.placement import build, is_split, place, unplace
        >>> from interp import ModelConfig
        >>> cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=16, positional="rotary")
        >>> m = place(build(cfg), ["cpu", "cpu"]); unplace(m); is_split(m)
        False
    """
    for h in getattr(model, "_placement_handles", None) or ():
        h.remove()
    model._placement_handles = []
