"""kill -9 during every writer's save: the old file or the new one stays whole, and the next save leaves no
temporary behind (issue 38, item 9).

For each writer (trace, checkpoint, pruning curve, figure, attention view, dashboard results cache) the script
forks a child that saves two versions of one file in turn, forever; the parent kills it with SIGKILL at a random
moment inside a save (after 2-3 save starts, a random fraction of one save's measured duration later), then

1. reads the file under its real name: it must be one of the two versions, whole;
2. counts the hidden temporaries the killed save left (evidence that the kill landed mid-write);
3. saves once more itself (the "next save") and checks that nothing but the file remains in its folder.

Forking (no re-import per kill) keeps 30 kills of each writer to about a minute on two cores.

Usage:
    OMP_NUM_THREADS=1 python experiments/benchmarks/kill_during_save.py [--kills 30] [--writers trace,checkpoint]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

WRITERS = ("trace", "checkpoint", "curve", "figure", "attention_view", "dashboard_cache")


class Writer:
    """Two versions of one file, how to save one, and how to tell which (whole) version a file holds."""

    def __init__(self, path: Path, versions: list[Any], save: Callable[[Any, Path], None],
                 read: Callable[[Path], int]) -> None:
        self.path, self.versions, self.save, self.read = path, versions, save, read


def _trace(folder: Path) -> Writer:
    from interp import Trace

    def version(v):
        return Trace({"blocks.0.hook_resid_pre": torch.full((64, 256, 256), float(v))}, {"version": v})

    def read(path):
        tr = Trace.load(path)
        v = tr.meta["version"]
        assert bool((tr["blocks.0.hook_resid_pre"] == v).all()), "mixed content"
        return int(v)

    return Writer(folder / "run.safetensors", [version(0), version(1)], lambda t, p: t.save(p), read)


def _checkpoint(folder: Path) -> Writer:
    from interp import ModelConfig, Transformer
    from interp.zoo import load_checkpoint, save_checkpoint

    models = []
    for v in (0, 1):
        torch.manual_seed(v)
        models.append(Transformer(ModelConfig(n_layers=2, d_model=256, n_heads=4, d_mlp=1024, d_vocab=8000,
                                              n_ctx=64)))
    marks = [float(m.embed.weight[0, 0].detach()) for m in models]

    def read(path):
        return marks.index(float(load_checkpoint(path).embed.weight[0, 0]))  # load_checkpoint checks every sha256

    return Writer(folder / "model.safetensors", models, lambda m, p: save_checkpoint(m, p), read)


def _curve(folder: Path) -> Writer:
    from interp.pruning.curve import CurvePoint, PruningCurve

    def version(v):
        rng = np.random.default_rng(v)
        pts = [CurvePoint(fraction=(i % 145) / 144, metric=float(rng.random()), n_pruned=i % 145,
                          mask=(rng.random((12, 12)) > 0.5).tolist()) for i in range(1000)]
        return PruningCurve("importance", "accuracy", 144, pts, model_name=f"version-{v}")

    def read(path):
        c = PruningCurve.load(path)
        assert len(c.points) == 1000
        return int(c.model_name.removeprefix("version-"))

    return Writer(folder / "curve.json", [version(0), version(1)], lambda c, p: c.save(p), read)


def _html_version(path: Path) -> int:
    text = path.read_text(encoding="utf-8")
    assert text.rstrip().endswith("</html>"), "truncated page"
    return 0 if "version-0" in text else 1


def _figure(folder: Path) -> Writer:
    import plotly.graph_objects as go

    from interp.viz.export import save_figure

    figs = [go.Figure(go.Scatter(y=np.arange(20000) * (v + 1)), layout={"title": f"version-{v}"}) for v in (0, 1)]
    return Writer(folder / "figure.html", figs, lambda f, p: save_figure(f, p), _html_version)


def _attention_view(folder: Path) -> Writer:
    from interp.viz import attention_view

    g = torch.Generator().manual_seed(0)
    views = [attention_view(torch.softmax(torch.randn(4, 8, 1000, 1000, generator=g), -1).tril(),
                            title=f"version-{v}") for v in (0, 1)]
    return Writer(folder / "view.html", views, lambda w, p: w.save(p), _html_version)


def _dashboard_cache(folder: Path) -> Writer:
    from interp.app import results_cache

    os.environ[results_cache.CACHE_ENV] = str(folder / "cache")
    key = "0" * 64

    def save(value, _path):
        assert results_cache.store("head_report", key, value)

    def read(_path):
        ok, value = results_cache.load("head_report", key)
        assert ok, "no whole result under the key"
        return int(value["version"])

    values = [{"version": v, "scores": np.full((4_000_000,), v, dtype=np.float64)} for v in (0, 1)]
    return Writer(folder / "cache" / "head_report" / f"{key}.pkl", values, save, read)


BUILDERS = {"trace": _trace, "checkpoint": _checkpoint, "curve": _curve, "figure": _figure,
            "attention_view": _attention_view, "dashboard_cache": _dashboard_cache}


def _child(writer: Writer, wfd: int) -> None:
    """Save the two versions in turn forever, writing ``s`` before and ``d`` after each save to the pipe."""
    try:
        i = 0
        while True:
            os.write(wfd, b"s")
            writer.save(writer.versions[i % 2], writer.path)
            os.write(wfd, b"d")
            i += 1
    finally:
        os._exit(1)


def run(name: str, kills: int, rng: random.Random) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"kill-{name}-"))
    writer = BUILDERS[name](folder)
    t0 = time.perf_counter()
    writer.save(writer.versions[1], writer.path)
    duration = time.perf_counter() - t0
    intact = left_after_kill = left_after_next = 0
    for _ in range(kills):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(writer, w)
        os.close(w)
        starts, target = 0, rng.choice((2, 3))  # the first save completes: a file to overwrite exists
        while starts < target:
            starts += os.read(r, 1) == b"s"
        time.sleep(rng.uniform(0.05, 0.95) * duration)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        writer.read(writer.path)  # raises unless one whole version is there
        intact += 1
        hidden = [p for p in writer.path.parent.iterdir() if p.name != writer.path.name]
        left_after_kill += bool(hidden)
        writer.save(writer.versions[0], writer.path)  # the next save
        left_after_next += len([p for p in writer.path.parent.iterdir() if p.name != writer.path.name])
    return {"writer": name, "kills": kills, "save_s": duration, "intact": intact,
            "kills_that_left_a_temporary": left_after_kill, "temporaries_after_next_save": left_after_next,
            "bytes": writer.path.stat().st_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--writers", default=",".join(WRITERS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    print("| writer | kills | file | one save | old or new file whole | kills that left a temporary | "
          "temporaries after the next save |")
    print("|---|---|---|---|---|---|---|")
    for name in args.writers.split(","):
        res = run(name, args.kills, rng)
        print(f"| {name} | {res['kills']} | {res['bytes'] / 1e6:.1f} MB | {res['save_s'] * 1e3:.0f} ms | "
              f"{res['intact']} of {res['kills']} | {res['kills_that_left_a_temporary']} | "
              f"{res['temporaries_after_next_save']} |", flush=True)


if __name__ == "__main__":
    main()
