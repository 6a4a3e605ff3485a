"""Function-vector heads (Todd et al. 2024, "Function vectors in large language models"): heads whose mean output
on in-context-learning (ICL) prompts carries the task, so that patching it into prompts whose demonstrations were
scrambled brings the correct answer back.

Score: the average indirect effect (AIE) of each head. For every task, the head's *task-mean output* is its z at
the last position averaged over the clean prompts of the task (:func:`task_mean_z`; z times ``W_O`` is the head's
write, so patching z patches the output). On each corrupted prompt (the same prompt with its labels moved,
:func:`interp.data.icl.icl_prompts`) the head's z at the last position is replaced by that mean, and the gain in
the probability of the correct answer's first token over the unpatched corrupted prompt is the prompt's indirect
effect (:func:`function_vector_effects`). The AIE is the mean over prompts (every task contributes the same number
of prompts, so it is also the mean of the per-task means). The patch changes the last position only, so each
head costs one decoding step over a KV cache holding the corrupted prompt's other positions, not a full forward.

Threshold ``function_vector_threshold = 0.01``: Todd et al. rank heads by AIE and keep the top ten of GPT-J; an
absolute cut-off lets the report compare models: a head is a function-vector head when its mean output alone
restores at least one point of the correct answer's probability, averaged over every task's prompts. Heads
without a role in the task change nothing (AIE ~0, either sign); the per-prompt bootstrap interval marks a head
near the cut-off as uncertain.

Causal check (:func:`icl_accuracy`): mean-ablating the function-vector heads on the clean prompts should lower
ICL accuracy (the first answer token is the top logit) more than random head sets of the same size
(:func:`~interp.analysis.kind_causal.paired_random_test`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import pandas as pd
import torch

from ..data.batches import reads_text
from ..data.icl import ICLPrompts, icl_prompts, icl_token_pairs
from ..streaming import Reducer
from ._stream import head_counts, state_device
from .ablate import ablate_heads, head_z_means
from .kinds import HeadKind, KindRun, not_measured, register_kind
from .ov_circuit import has_unembedding

if TYPE_CHECKING:
    from ..model import Transformer

__all__ = ["function_vector_effects", "icl_accuracy", "task_mean_z"]

_Z = "blocks.{}.attn.hook_z"


def _stack(prompts: ICLPrompts, group: list[int], corrupted: bool, device: torch.device) -> torch.Tensor:
    rows = prompts.corrupted if corrupted else prompts.clean
    return torch.stack([rows[i] for i in group]).to(device)  # [B, T]: one group holds one length


def _device(model: Transformer) -> torch.device:
    return state_device(model)  # a pipeline stage's first parameter may be another rank's, on the meta device


def _call(model: Transformer, tokens: torch.Tensor, hooks: list[tuple[Any, Any]],
          reduce: Callable[[torch.Tensor], torch.Tensor] | None = None, **kwargs: Any) -> torch.Tensor | None:
    """``reduce(model(tokens, **kwargs))`` with ``hooks`` attached (None without ``reduce``). On a pipeline stage
    (:meth:`Pipeline.routed <interp.pipeline.Pipeline.routed>`) the call runs over every rank, each hook on the
    rank of its layer, and ``reduce`` on the last rank, which holds the logits: every rank gets its value."""
    route = getattr(model, "call_route", None)
    if route is not None:
        return route(tokens, hooks, reduce=reduce, **kwargs)
    with model.hooks(hooks):
        out = model(tokens, **kwargs)
    return None if reduce is None else reduce(out)


@torch.no_grad()
def task_mean_z(model: Transformer, prompts: ICLPrompts) -> dict[str, dict[int, torch.Tensor]]:
    """Each head's z at the last position of the clean prompts, averaged per task.

    Args:
        model: an interp Transformer.
        prompts: from :func:`interp.data.icl.icl_prompts`.

    Returns:
        ``{task: {layer: [H, D]}}`` float32 on the model's device (layers without heads are left out, and on a
        pipeline stage the layers another rank holds).

    Example:
        >>> from interp.analysis.function_vector import task_mean_z
        >>> from interp.examples import model
        >>> from interp.data.icl import icl_prompts
        >>> prompts = icl_prompts({"succ": [(i, i + 1) for i in range(2, 12)]}, 2, 3, bos_id=0)
        >>> task_mean_z(model, prompts)["succ"][0].shape      # [H, D]
        torch.Size([4, 32])
    """
    counts = head_counts(model)
    layers = [layer for layer, H in enumerate(counts) if H]
    dev = _device(model)
    sums: dict[str, dict[int, torch.Tensor]] = {}
    n: dict[str, int] = {}
    for group in prompts.groups():
        last: dict[int, torch.Tensor] = {}

        def keep(z: torch.Tensor, hook: Any, last: dict[int, torch.Tensor] = last) -> None:
            last[int(hook.name.split(".")[1])] = z[:, -1].float()  # [B, H, D]

        _call(model, _stack(prompts, group, False, dev), [([_Z.format(layer) for layer in layers], keep)],
              stop_at_layer=max(layers) + 1)
        for row, i in enumerate(group):
            task = prompts.tasks[i]
            acc = sums.setdefault(task, {layer: torch.zeros_like(z[0]) for layer, z in sorted(last.items())})
            for layer in acc:  # the layers whose hooks fired here: all of them, or a pipeline stage's own
                acc[layer] += last[layer][row]
            n[task] = n.get(task, 0) + 1
    return {task: {layer: s / n[task] for layer, s in acc.items()} for task, acc in sums.items()}


def _last_step(model: Transformer, tokens: torch.Tensor, answers: torch.Tensor
               ) -> Callable[[list[tuple[str, Any]]], torch.Tensor]:
    """``run(hooks) -> [B]`` the probability of each row's answer at the last position of ``tokens`` ``[B, T]``
    with ``hooks`` attached, on the CPU.

    A causal model without sliding windows or chunks prefills the first ``T - 1`` positions once into a KV cache and each
    run decodes only the last one (hooks that change the last position alone give the same logits as a full
    pass); other models run the full prompt each time.
    """
    cfg = model.cfg
    B, T = tokens.shape

    def p_answer(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1].float().softmax(-1).gather(-1, answers[:, None])[:, 0].cpu()  # [B]

    if not cfg.causal or T < 2 or any(cfg.cache_bounded(layer) for layer in range(cfg.n_layers)):
        def full(hooks: list[tuple[str, Any]]) -> torch.Tensor:
            return cast(torch.Tensor, _call(model, tokens, hooks, p_answer))
        return full
    cache = model.make_cache(batch_size=B, max_len=T)
    # The prompt but its last position into the cache (no output head: nothing reads those logits).
    _call(model, tokens[:, :-1], [], kv_cache=cache, stop_at_layer=cfg.n_layers)

    def step(hooks: list[tuple[str, Any]]) -> torch.Tensor:
        cache.rewind(T - 1)
        return cast(torch.Tensor, _call(model, tokens[:, -1:], hooks, p_answer, kv_cache=cache))  # [B]
    return step


@torch.no_grad()
def function_vector_effects(model: Transformer, prompts: ICLPrompts,
                            means: dict[str, dict[int, torch.Tensor]] | None = None) -> torch.Tensor:
    """Per head and corrupted prompt, the gain in the correct answer's probability when the head's z at the last
    position is replaced by its task-mean z (the module docstring).

    The heads of one layer are patched in one pass: the corrupted prompts are repeated once per head (rows
    ``h * B .. (h + 1) * B`` patch head ``h``).

    Args:
        model: an interp Transformer.
        prompts: from :func:`interp.data.icl.icl_prompts`.
        means: :func:`task_mean_z` of ``prompts`` (computed when not given).

    Returns:
        ``[L, H_max, N]`` float32 (NaN for heads a pruned layer lacks); the AIE of a head is the mean over the last
        axis.

    Raises:
        ValueError: a prompt's task has no mean in ``means``.

    Example:
        >>> from interp.analysis.function_vector import function_vector_effects
        >>> from interp.examples import model
        >>> from interp.data.icl import icl_prompts
        >>> prompts = icl_prompts({"succ": [(i, i + 1) for i in range(2, 12)]}, 2, 3, bos_id=0)
        >>> function_vector_effects(model, prompts).mean(-1).shape     # [L, H]: the AIE of every head
        torch.Size([2, 4])
    """
    means = task_mean_z(model, prompts) if means is None else means
    missing = sorted(set(prompts.tasks) - set(means))
    if missing:
        raise ValueError(f"means has no task-mean z for the tasks {missing}")
    counts = head_counts(model)
    H_max = max(counts, default=0)
    dev = _device(model)
    out = torch.full((model.cfg.n_layers, H_max, len(prompts)), torch.nan)
    for group in prompts.groups():
        idx = torch.tensor(group)
        B = len(group)
        corrupted = _stack(prompts, group, True, dev)  # [B, T]
        answers = prompts.answers[idx].to(dev).repeat(H_max)  # [H_max * B]
        run = _last_step(model, corrupted.repeat(H_max, 1), answers)  # [H_max * B, T]: a copy per head

        base = run([])[:B]  # [B]: every copy is the same unpatched prompt
        for layer, H in enumerate(counts):
            if not H:
                continue
            heads = torch.arange(H, device=dev)

            def patch(z: torch.Tensor, hook: Any, layer: int = layer, H: int = H, B: int = B,
                      group: list[int] = group, heads: torch.Tensor = heads) -> torch.Tensor:
                # The means are read where the hook fires: on a pipeline stage only the layer's rank has them.
                mean = torch.stack([means[prompts.tasks[i]][layer] for i in group]).to(dev)  # [B, H, D]
                z = z.clone()
                last = z[:, -1].view(H_max, B, H, -1)  # [H_max, B, H, D]: copy h of the batch patches head h
                last[heads, :, heads] = mean.transpose(0, 1).to(z.dtype)  # [H, B, D]
                return z
            gain = run([(_Z.format(layer), patch)]).view(H_max, B)[:H] - base  # [H, B]
            out[layer, :H, idx] = gain
    return out


@torch.no_grad()
def icl_accuracy(model: Transformer, prompts: ICLPrompts, *, method: str = "mean",
                 reference: Any = None) -> Callable[[list[tuple[int, int]]], torch.Tensor]:
    """ICL accuracy per clean prompt with heads ablated: ``per_example(heads) -> [N]`` (1.0 where the answer's
    first token is the top logit at the last position), for :func:`~interp.analysis.kind_causal.paired_random_test`.

    Args:
        model: an interp Transformer.
        prompts: from :func:`interp.data.icl.icl_prompts` (the clean prompts are scored).
        method: ``"mean"`` (z replaced by its mean over ``reference``'s positions) or ``"zero"``.
        reference: mean ablation's reference (default: the clean prompts, one batch per length).

    Returns:
        ``per_example(heads) -> [N]`` float64 (``[]``: nothing ablated).

    Raises:
        ValueError: a method other than ``"mean"`` / ``"zero"``.

    Example:
        >>> from interp.analysis.function_vector import icl_accuracy
        >>> from interp.examples import model
        >>> from interp.data.icl import icl_prompts
        >>> prompts = icl_prompts({"succ": [(i, i + 1) for i in range(2, 12)]}, 2, 3, bos_id=0)
        >>> per = icl_accuracy(model, prompts)
        >>> per([]).shape, per([(1, 0)]).shape
        (torch.Size([2]), torch.Size([2]))
    """
    if method not in ("mean", "zero"):
        raise ValueError(f"method={method!r}: ICL accuracy ablates with 'mean' or 'zero'")
    dev = _device(model)
    groups = prompts.groups()
    batches = [_stack(prompts, g, False, dev) for g in groups]
    values = head_z_means(model, batches if reference is None else reference) if method == "mean" else None

    def per_example(heads: list[tuple[int, int]]) -> torch.Tensor:
        out = torch.zeros(len(prompts), dtype=torch.float64)
        for group, tokens in zip(groups, batches):
            if heads:
                with ablate_heads(model, heads, method, reference=tokens, values=values):
                    top = model(tokens)[:, -1].argmax(-1).cpu()  # [B]
            else:
                top = model(tokens)[:, -1].argmax(-1).cpu()
            out[torch.tensor(group)] = (top == prompts.answers[torch.tensor(group)]).double()
        return out

    return per_example


# --- the registry entry -------------------------------------------------------------------------------------------
def _prompts(run: KindRun) -> ICLPrompts | None:
    """The ICL prompts of a run: ``options["icl_prompts"]`` if given, else :data:`~interp.data.icl.ICL_TASKS`
    through the model's tokenizer as ``"input: output\\n"`` lines (None: no tokenizer)."""
    given = run.given("icl_prompts", ICLPrompts, "interp.data.icl.icl_prompts")
    if given is not None:
        return given
    if not reads_text(run.model):
        return None
    tok = run.model.tokenizer
    colon, newline = (icl_token_pairs(tok, {"sep": [(":", "\n")]}, output_prefix="")["sep"][0])
    return icl_prompts(icl_token_pairs(tok), run["icl_n_prompts"], run["icl_shots"], seed=run["seed"],
                       bos_id=getattr(tok, "bos_token_id", None), between=colon, after=newline)


def _rows(run: KindRun, reducers: list[Reducer]) -> list[dict[str, Any]]:
    if not has_unembedding(run.model):
        return not_measured(run, "function-vector", "the model has no unembedding (no answer probability)")
    prompts = _prompts(run)
    if prompts is None:
        return not_measured(run, "function-vector", "no text tokenizer and no icl_prompts")
    tasks = list(dict.fromkeys(prompts.tasks))
    run.probes["function-vector"] = (f"{len(prompts)} ICL prompts ({len(prompts) // len(tasks)} per task, "
                                     f"{prompts.n_shots} shots) of the tasks {tasks}, labels shuffled")
    effects = function_vector_effects(run.model, prompts)  # [L, H, N]
    threshold = run["function_vector_threshold"]
    task_of = pd.Series(prompts.tasks)
    rows, table = [], []
    for layer, H in enumerate(head_counts(run.model)):
        for head in range(H):
            s = effects[layer, head]
            score = float(s.mean())
            per_task = {t: float(s[torch.tensor((task_of == t).values)].mean()) for t in tasks}
            table.append({"layer": layer, "head": head, "aie": score, **{f"aie:{t}": v for t, v in per_task.items()}})
            best = max(per_task, key=lambda t: per_task[t])
            rows.append({"layer": layer, "head": head, "kind": "function-vector", "score": score,
                         "evidence": f"its task-mean output raises the answer's probability on shuffled-label "
                                     f"prompts by {score:+.3f} on average ({len(s)} prompts; most on {best!r}: "
                                     f"{per_task[best]:+.3f})",
                         "samples": s, "threshold": threshold, "passed": score >= threshold})
    run.details["function-vector"] = pd.DataFrame(table)
    return rows


register_kind(HeadKind(
    "function-vector", ("function-vector",), "icl", None, _rows,
    threshold="function_vector_threshold=0.01",
    reason="the head's task-mean output alone restores at least one point of the correct answer's probability on "
           "shuffled-label prompts, averaged over every task (heads without a role sit at ~0; Todd et al. keep "
           "the top-ranked heads, an absolute cut-off compares models)",
    source="Todd et al. 2024, Function vectors in large language models",
    default=False, colour="#7d6608", data_builder=_prompts,
    defaults={"function_vector_threshold": 0.01, "icl_prompts": None, "icl_n_prompts": 8, "icl_shots": 5}))
