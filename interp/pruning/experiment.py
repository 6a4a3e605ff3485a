"""Scripted pruning experiments: one config -> curves for several methods, saved and resumable.

``run_experiment(config)`` is what ``experiments/prune_curves.py`` and ``interp prune`` call. With an ``out_dir``
every finished point is written at once (importance: the growing curve; random: one file per seed; L0: one file
per target) into ``partial/``, each stamped with a hash of the model's weights, the data, the metric and the
method's options (``config["run_key"]``); a restarted run loads the files of its own configuration and skips what
is done, and recomputes (and overwrites) those of another configuration.

Config (a dict, or a JSON/YAML file path), every key optional except ``model``::

    {
      "name": "induction-2l",                      # label of the results
      "model": "induction-2l",                     # interp.zoo.load name or checkpoint path
      "methods": ["importance", "random", "l0"],
      "data": {"kind": "repeated", "n_seqs": 64, "half_len": 25, "batch_size": 16, "seed": 1, "eval_seed": 2}
          or  {"kind": "ud", "path": "path/to/en_ewt-ud-dev.conllu",
               "n_train": 64, "n_eval": 64, "batch_size": 16, "max_length": 64},   # see pruning.task.build_task
      "metric": "accuracy",                        # LM objective: "accuracy" or "neg_loss"
      "importance": {"step": 0.1, "threshold": null, "normalize_layers": true, "recompute": true},
      "random": {"seeds": [0, 1, 2, 3, 4], "step": 0.1},
      "l0": {"targets": [0.1, 0.3, 0.5, 0.7, 0.9], "steps": 200, "lr": 0.1},   # or "lams": [...]
      "out_dir": "experiments/results/prune_induction-2l"
    }
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._io import atomic_write_text
from .baseline import random_curve
from .curve import PruningCurve, auc_table
from .importance import importance_curve
from .l0 import check_target, l0_curve
from .task import build_task

if TYPE_CHECKING:
    from ..model import Transformer

METHODS = ("importance", "random", "l0")


def load_config(config: dict | str | Path) -> dict[str, Any]:
    """A config dict, or one read from a ``.json`` / ``.yaml`` file.

    Raises:
        ValueError: unknown method, missing model, unknown top-level key, or a bad target.
        TypeError: config of another type.
    """
    if isinstance(config, (str, Path)):
        path = Path(config)
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            config = yaml.safe_load(text)
        else:
            config = json.loads(text)
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict or a JSON/YAML path, got {type(config).__name__}")
    config = copy.deepcopy(config)
    known = {"name", "model", "methods", "data", "metric", "importance", "random", "l0", "out_dir", "device"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; known keys are {sorted(known)}")
    if "model" not in config:
        raise ValueError("config needs 'model' (a zoo name such as 'induction-2l' or a checkpoint path)")
    methods = config.setdefault("methods", list(METHODS))
    if isinstance(methods, str):
        methods = config["methods"] = [methods]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; choose from {METHODS}")
    l0 = config.setdefault("l0", {})
    for t in l0.get("targets") or []:
        check_target(t)
    config.setdefault("name", Path(str(config["model"])).stem)
    return config


def run_experiment(config: dict | str | Path, *, model: Transformer, out_dir: str | Path | None = None,
                   fresh: bool = False, progress: bool = True) -> dict[str, PruningCurve]:
    """Run the configured pruning methods and return one curve per method.

    Args:
        config: a dict or a JSON/YAML path (see the module docstring).
        model: the loaded model (``interp.load(config["model"])``; loading is the caller's job, so that this
            layer does not depend on the zoo).
        out_dir: where to write results (default: ``config["out_dir"]``; None = write nothing, no resume).
        fresh: ignore partial results from an earlier run.
        progress: tqdm bars.

    Returns:
        ``{method: PruningCurve}``. With an out_dir it also writes ``<method>.json`` / ``.csv``, ``curves.html``
        (plotly), ``curves.png`` (when kaleido is available) and ``summary.json`` (AUCs on [0, 1]).

    Raises:
        ValueError: a bad config (see :func:`load_config`) or empty data.

    Example:
        >>> from interp.pruning.experiment import run_experiment
        >>> from interp.examples import model
        >>> curves = run_experiment({"model": "induction-2l", "methods": ["importance", "random"]}, model=model)
        >>> curves["importance"].auc() > curves["random"].auc()
    """
    config = load_config(config)
    data = dict(config.get("data", {}))
    if "metric" in config:
        data.setdefault("metric", config["metric"])
    train, held, objective = build_task(model, data=data)
    out = out_dir if out_dir is not None else config.get("out_dir")
    out = None if out is None else Path(out)
    part = None if out is None else out / "partial"
    if part is not None:
        part.mkdir(parents=True, exist_ok=True)
        if fresh:
            for f in part.glob("*.json"):
                f.unlink()
    weights = model_fingerprint(model)

    curves: dict[str, PruningCurve] = {}
    for method in config["methods"]:
        opts = dict(config.get(method, {}))
        # Every partial result carries a hash of what produced it (model weights, data, metric, the method's
        # options); a resumed run takes only those of its own configuration and recomputes the rest.
        run_key = config_hash({"model": weights, "data": data, "method": method, "options": opts})

        def keyed(save, run_key=run_key):
            def wrapped(c: PruningCurve) -> None:
                c.config["run_key"] = run_key
                save(c)
            return wrapped

        def ours(paths, run_key=run_key) -> list[PruningCurve]:
            loaded = [PruningCurve.load(f) for f in paths]
            return [c for c in loaded if c.config.get("run_key") == run_key]

        def saver(name: str):
            return None if part is None else keyed(lambda c: c.save(part / f"{name}.json"))

        if method == "importance":
            done = ours([part / "importance.json"] if part is not None and (part / "importance.json").exists()
                        else [])
            curves[method] = importance_curve(model, train, objective, eval_batches=held,
                                              resume=done[0] if done else None,
                                              on_point=saver("importance"), progress=progress, **opts)
        elif method == "random":
            seeds = opts.pop("seeds", [0, 1, 2, 3, 4])
            resume = ours(part.glob("random_seed*.json")) if part is not None else []
            curves[method] = random_curve(
                model, held, objective, seeds=seeds, resume=resume, progress=progress,
                on_seed=None if part is None else keyed(
                    lambda c: c.save(part / f"random_seed{c.config['seed']}.json")),
                **opts)
        else:
            resume = ours(part.glob("l0_*.json")) if part is not None else []
            curves[method] = l0_curve(model, train, objective, eval_batches=held, resume=resume,
                                      on_point=None if part is None else keyed(_l0_saver(part)), progress=progress,
                                      **opts)
        curves[method].model_name = config["name"]
    if out is not None:
        write_results(curves, out, config)
    return curves


def _l0_saver(folder: Path) -> Callable[[PruningCurve], None]:
    """Saves each point of an L0 sweep as ``l0_<target|lam><value>.json`` in ``folder``."""
    def save(c: PruningCurve) -> None:
        key = "target" if "target" in c.config else "lam"
        c.save(folder / f"l0_{key}{c.config[key]}.json")
    return save


def config_hash(obj: Any) -> str:
    """A short, stable hash of a JSON-able configuration (key order does not matter).

    Example:
        >>> from interp.pruning.experiment import config_hash
        >>> config_hash({"a": 1, "b": [2, 3]}) == config_hash({"b": [2, 3], "a": 1})
        True
    """
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_fingerprint(model) -> str:
    """A hash of a model's config and weights: partial results of another checkpoint are not reused."""
    h = hashlib.sha256(model.cfg.to_json().encode())
    with torch.no_grad():
        for name, t in model.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def write_results(curves: dict[str, PruningCurve], out: Path, config: dict | None = None) -> dict[str, Any]:
    """Write each curve (JSON + CSV), the figure (HTML, and PNG when possible) and a summary with AUCs."""
    out.mkdir(parents=True, exist_ok=True)
    for method, c in curves.items():
        c.save(out / f"{method}.json")
        c.save(out / f"{method}.csv")
    from ..viz import pruning_curves, save_figure  # figures live in viz; imported only when results are written

    fig = pruning_curves(list(curves.values()))
    save_figure(fig, out / "curves.html")  # plotly.js embedded: opens offline
    png = "curves.png"
    try:
        save_figure(fig, out / png, width=800, height=500)
    except (ImportError, RuntimeError) as err:  # kaleido / Chrome missing: the HTML figure is still there
        png = f"not written: {err}"
    summary = {"config": config, "auc": auc_table(list(curves.values())).to_dict(orient="records"), "png": png}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str))
    return summary
