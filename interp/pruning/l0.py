"""L0 head gates (Voita et al. 2019, "Analyzing Multi-Head Self-Attention"; Louizos et al. 2018).

Every head gets a Hard-Concrete gate; the model's own weights are frozen and only the gates' ``log_alpha`` train,
on the objective's loss plus a sparsity term:

* a fixed ``lam``: loss + lam * sum_h P(gate_h != 0) (Voita et al.'s expected-L0 penalty), or
* a ``target`` sparsity t reached with a Lagrangian (CoFiPruning, Xia et al. 2022):
  loss + lambda1 (s - t) + lambda2 (s - t)^2, where s is the expected fraction of closed gates and lambda1,
  lambda2 are trained by gradient *ascent*; t ramps up linearly over the first ``warmup`` steps, and lambda2
  starts at ``init_lambda2`` (see :func:`train_l0_gates`).

At evaluation the gates are deterministic: binarised masks, or the papers' continuous test-time gates
(see :meth:`HardConcreteGate.test_gates`). With ``level="group"`` one gate serves a whole K/V group of a GQA model
(its query heads share it), so the sparsity and the target count K/V groups, and every closed gate frees cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..interventions import gates_only, head_mask
from ..progress import enabled as progress_enabled
from .curve import PruningCurve
from .gates import LOUIZOS_TEMPERATURE, TEST_GATES, HardConcreteGate, uniform_heads
from .importance import make_point, masked_metric, unit_matrix
from .objectives import Batch, Objective, check_batches


@dataclass
class L0Result:
    """What :func:`train_l0_gates` learnt.

    Attributes:
        pruned: ``[L, H]`` bool, True = head gated off by the test-time gates (gate exactly 0).
        log_alpha: ``[L, H]`` the trained gate parameters.
        expected_sparsity: the expected fraction of closed gates of the test-time log_alpha (the post-warmup
            average with ``average=True`` and a target; otherwise the last step's).
        last_step_sparsity: the last training step's expected sparsity.
        target, lam: the setting it was trained with.
        history: per logged step: step, loss, expected_sparsity, lambda1, lambda2.
        gates: ``[L, H]`` float test-time gates (0/1 for the binarised modes, in [0, 1] for "continuous").
        level: ``"head"`` or ``"group"``; pruned_units: ``[L, U]`` bool, the closed gates (heads or K/V groups).
    """

    pruned: torch.Tensor
    log_alpha: torch.Tensor
    expected_sparsity: float
    target: float | None
    lam: float | None
    history: list[dict] = field(default_factory=list)
    last_step_sparsity: float | None = None
    # Omitted (None), they resolve in __post_init__ to the binarised gates of ``pruned`` and, at head level, the
    # heads themselves: typed as what they hold after construction, as ModelConfig's derived fields.
    gates: torch.Tensor = None  # type: ignore[assignment]
    level: str = "head"
    pruned_units: torch.Tensor = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.gates is None:
            self.gates = (~self.pruned).float()  # [L, H] 1 = open
        if self.pruned_units is None:
            if self.level != "head":
                raise ValueError(f"L0Result at level={self.level!r} needs pruned_units (its closed K/V groups)")
            self.pruned_units = self.pruned

    @property
    def n_pruned(self) -> int:
        return int(self.pruned.sum())


def check_target(target: float) -> float:
    """A target sparsity must be a number in [0, 1].

    Raises:
        TypeError: not a number. ValueError: outside [0, 1].
    """
    if isinstance(target, bool) or not isinstance(target, (int, float)):
        raise TypeError(f"target sparsity must be a number in [0, 1], got {target!r}")
    if not 0.0 <= float(target) <= 1.0:
        raise ValueError(f"target sparsity {target} is outside [0, 1] (it is the fraction of heads to prune)")
    return float(target)


def train_l0_gates(model, batches: Sequence[Batch], objective: Objective, *, target: float | None = None,
                   lam: float | None = None, steps: int = 200, lr: float = 0.1, lagrangian_lr: float = 0.3,
                   warmup: float = 0.5, temperature: float = LOUIZOS_TEMPERATURE,
                   limits: tuple[float, float] = (-0.1, 1.1), init_log_alpha: float = 2.0, init_lambda2: float = 10.0,
                   deterministic: str = "expected", level: str = "head", seed: int = 0,
                   average: bool = False, progress: bool | None = None) -> L0Result:
    """Train one Hard-Concrete gate per head with the rest of the model frozen.

    Args:
        model: a Transformer with equal head counts per layer (its weights and gates are left as they were).
        batches: training data, cycled through for ``steps`` steps.
        objective: gives the differentiable loss.
        target: target sparsity in [0, 1] (Lagrangian); exactly one of ``target`` and ``lam``.
        lam: fixed penalty weight on the expected number of open gates (Voita et al.).
        steps: optimisation steps; lr: Adam learning rate of log_alpha; lagrangian_lr: Adam learning rate of the
            ascended multipliers (0.3: with 0.05, induction-2l, whose last heads the loss defends hard, stayed
            1-2 heads short of targets 0.5-0.875 after 200 steps; 0.3 and 300 steps land within one head).
        warmup: fraction of the steps over which the target ramps from 0 to ``target``.
        init_lambda2: starting value of the quadratic multiplier. CoFiPruning starts both multipliers at 0; then
            lambda1 winds up while the sparsity lags and the sparsity overshoots and oscillates. Starting
            lambda2 at 10 adds a restoring force from step one, so the expected sparsity tracks the ramped target
            (on induction-2l: within 0.01 of targets 0.25 / 0.5 / 0.75 after 150 steps, against up to 0.2 off).
        temperature, limits, init_log_alpha: Hard-Concrete settings (see :class:`HardConcreteGate`; beta is
            Louizos et al.'s 2/3 by default, Voita et al. use 0.33: ``temperature=VOITA_TEMPERATURE``).
        deterministic: test-time gates, ``"expected"`` / ``"threshold"`` (binary) or ``"continuous"``
            (the papers' clip(sigmoid(log_alpha)(r - l) + l, 0, 1); only gates at exactly 0 count as pruned).
        level: ``"head"`` (one gate per head) or ``"group"`` (one gate per K/V group; target = fraction of groups).
        seed: seeds the gate noise.
        average: with a ``target``, test log_alpha averaged over the steps after the warmup (Polyak averaging)
            instead of the last step's. Gradient descent on the gates and ascent on the multipliers is a
            saddle-point search that can cycle: on SmolLM2 (90 K/V groups, target 0.2) the expected sparsity
            swung 0.12 -> 0.27 -> 0.17 with a period of ~140 steps, and the last step landed wherever the cycle
            was (34, 12 and 15 groups in three runs for a target of 18; with averaging over 150 post-warmup
            steps, 17). Use it for long runs that cycle; in a short run the iterates right after the warmup still
            lag the ramp and drag the average below the target (induction-2l, 30 steps: 2 heads for a target of
            4), so it is off by default. Fixed-``lam`` runs are never averaged.
        progress: show a tqdm bar (None: in terminals and notebooks).

    Returns:
        :class:`L0Result`.

    Raises:
        ValueError: both or neither of target/lam, target outside [0, 1], lam < 0, steps < 1, empty data, an
            unknown deterministic mode or level.

    Example:
        >>> from interp.pruning.l0 import train_l0_gates
        >>> from interp.examples import model, objective, batches
        >>> res = train_l0_gates(model, batches, objective, target=0.5, steps=20)
        >>> res.n_pruned   # within one head of 0.5 * L * H
    """
    batches = check_batches(batches)
    if (target is None) == (lam is None):
        raise ValueError(f"give exactly one of target (sparsity) and lam (penalty), got target={target}, lam={lam}")
    if target is not None:
        target = check_target(target)
    if lam is not None and lam < 0:
        raise ValueError(f"lam={lam} must be >= 0")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an int >= 1")
    if deterministic not in TEST_GATES:
        raise ValueError(f"deterministic={deterministic!r} is not one of {TEST_GATES}")
    L, H = uniform_heads(model)
    units = unit_matrix(model, level)  # [L, H, U]
    U = units.shape[2]
    p = next(model.parameters())
    units = units.to(device=p.device, dtype=p.dtype)

    def to_heads(g: torch.Tensor) -> torch.Tensor:
        return torch.einsum("lhu,lu->lh", units, g.to(units))  # [L, U] -> [L, H]: a group gate on its heads

    gate = HardConcreteGate(L, U, temperature=temperature, limits=limits, init_log_alpha=init_log_alpha,
                            seed=seed).to(p.device)
    opt = torch.optim.Adam(gate.parameters(), lr=lr)
    lambdas = torch.tensor([0.0, float(init_lambda2)], device=p.device, requires_grad=True)
    lag_opt = torch.optim.Adam([lambdas], lr=lagrangian_lr, maximize=True)  # ascent on the multipliers
    gen = torch.Generator().manual_seed(seed)
    lam_value = 0.0 if lam is None else lam  # the fixed penalty (given when target is not)
    history: list[dict] = []
    logged: list[tuple[int, torch.Tensor]] = []
    avg_log_alpha, n_avg = torch.zeros_like(gate.log_alpha.detach()), 0
    with gates_only(model):  # the model is frozen (and locked) for the whole training
        bar = tqdm(range(steps), desc=f"L0 gates ({'t=' + str(target) if target is not None else 'lam=' + str(lam)})",
                   disable=not progress_enabled(progress), leave=False)
        for step in bar:
            batch = batches[step % len(batches)]
            model.set_head_gates(to_heads(gate.sample(gen)))
            loss = objective.loss(model, batch)
            s = gate.expected_sparsity()
            if target is not None:
                t = target * min(1.0, (step + 1) / max(1.0, warmup * steps))
                penalty = lambdas[0] * (s - t) + lambdas[1] * (s - t) ** 2
            else:
                penalty = lam_value * gate.expected_l0().sum()
            opt.zero_grad()
            lag_opt.zero_grad()
            (loss + penalty).backward()
            opt.step()
            if target is not None:
                lag_opt.step()
                if average and step >= warmup * steps:  # running mean of the post-warmup iterates
                    n_avg += 1
                    avg_log_alpha += (gate.log_alpha.detach() - avg_log_alpha) / n_avg
            if step % max(1, steps // 20) == 0 or step == steps - 1:
                # Kept on the device ([loss, sparsity, lambda1, lambda2]) and read once after the loop: no
                # host sync per step, except to show them on a progress bar the user asked for.
                logged.append((step, torch.stack([loss.detach().float(), s.detach().float(),
                                                  *lambdas.detach().float()])))
                if not bar.disable:
                    # the sparsity and multipliers on the bar: a run that will miss its target shows it early
                    now = logged[-1][1].tolist()
                    bar.set_postfix(loss=f"{now[0]:.3f}", s=f"{now[1]:.3f}", l1=f"{now[2]:.2f}", refresh=False)
    if logged:
        values = torch.stack([v for _, v in logged]).cpu().tolist()  # [n logged, 4], one move to the host
        history = [{"step": step, "loss": v[0], "expected_sparsity": v[1], "lambda1": v[2], "lambda2": v[3]}
                   for (step, _), v in zip(logged, values)]
    last_sparsity = float(gate.expected_sparsity().detach())
    if n_avg:
        with torch.no_grad():
            gate.log_alpha.copy_(avg_log_alpha)
    unit_gates = gate.test_gates(deterministic)  # [L, U]
    gates = to_heads(unit_gates).detach().cpu()  # [L, H]
    return L0Result(pruned=gates == 0, log_alpha=gate.log_alpha.detach().cpu(),
                    expected_sparsity=float(gate.expected_sparsity().detach()), target=target, lam=lam, history=history,
                    gates=gates, level=level, pruned_units=unit_gates == 0, last_step_sparsity=last_sparsity)


def gated_metric(model, batches: Sequence[Batch], objective: Objective, gates: torch.Tensor) -> float:
    """The objective's metric with float head gates ``[L, H]`` (e.g. continuous test-time gates); restores the
    gates set before."""
    p = next(model.parameters())
    with head_mask(model, None):
        model.set_head_gates(gates.to(device=p.device, dtype=p.dtype))
        return float(objective.metric(model, batches))


def l0_curve(model, batches: Sequence[Batch], objective: Objective, *, targets: Sequence[float] | None = None,
             lams: Sequence[float] | None = None, eval_batches: Sequence[Batch] | None = None,
             resume: Sequence[PruningCurve] = (), on_point: Callable[[PruningCurve], None] | None = None,
             progress: bool | None = None, **train_kwargs) -> PruningCurve:
    """A sweep of L0 runs (one per target sparsity, or per lambda), each evaluated with its deterministic gates.

    Args:
        model, batches, objective: as :func:`train_l0_gates`.
        targets: target sparsities (default 0.1, 0.2, ... 0.9 when ``lams`` is None); or
        lams: fixed penalty weights.
        eval_batches: held-out data for the metric (default: ``batches``).
        resume: single-point curves already computed (``config["target"]`` / ``config["lam"]``); skipped.
        on_point: called with each finished single-point curve (to save partial results).
        progress: tqdm bars; train_kwargs: passed to :func:`train_l0_gates` (steps, lr, ...).

    Returns:
        A :class:`PruningCurve` ``method="l0"`` (``"l0-group"`` with ``level="group"``), points sorted by the fraction
        actually pruned, the unpruned model's metric as the first point.

    Raises:
        ValueError: both targets and lams given, a target outside [0, 1], empty data.

    Example:
        >>> from interp.pruning.l0 import l0_curve
        >>> from interp.examples import model, train, held_out, objective
        >>> curve = l0_curve(model, train, objective, targets=[0.25, 0.5], eval_batches=held_out, steps=20)
    """
    batches = check_batches(batches)
    eval_batches = batches if eval_batches is None else check_batches(eval_batches, "eval_batches")
    if targets is not None and lams is not None:
        raise ValueError("give targets or lams, not both")
    key = "lam" if lams is not None else "target"
    values = list(lams) if lams is not None else list(targets if targets is not None else
                                                       [round(0.1 * i, 1) for i in range(1, 10)])
    if key == "target":
        values = [check_target(t) for t in values]
    L, H = uniform_heads(model)
    name = getattr(model, "name", "")
    method = "l0" if train_kwargs.get("level", "head") == "head" else "l0-group"
    done = {float(c.config[key]): c for c in resume if key in c.config}
    parts = []
    zero = torch.zeros(L, H, dtype=torch.bool)
    base = PruningCurve(method, objective.metric_name, L * H, model_name=name, config={key: None})
    base.points.append(make_point(model, zero, masked_metric(model, eval_batches, objective, zero)))
    parts.append(base)
    for v in tqdm(values, desc=f"L0 sweep ({key})", disable=not progress_enabled(progress)):
        if float(v) in done:
            parts.append(done[float(v)])
            continue
        res = train_l0_gates(model, batches, objective, progress=progress, **{key: v}, **train_kwargs)
        if train_kwargs.get("deterministic") == "continuous":
            metric = gated_metric(model, eval_batches, objective, res.gates)
        else:
            metric = masked_metric(model, eval_batches, objective, res.pruned)
        part = PruningCurve(method, objective.metric_name, L * H, model_name=name, config={key: v, **train_kwargs})
        part.points.append(make_point(model, res.pruned, metric, **{key: v},
                                      expected_sparsity=res.expected_sparsity, history=res.history,
                                      last_step_sparsity=res.last_step_sparsity,
                                      units_pruned=int(res.pruned_units.sum()), units_total=res.pruned_units.numel()))
        parts.append(part)
        if on_point:
            on_point(part)
    curve = PruningCurve.merge(parts)
    curve.config = {key + "s": values, **train_kwargs}
    return curve
