"""The ``interp`` command line: head classification, pruning, the induction model, the dashboard, a KV-cache
calculator and the benchmarks, each a thin layer over the library (no math lives here).

Commands::

    interp heads --model NAME [--text TEXT ... | --conllu FILE] [--max-sentences N] [--coref FILE ...] [--nproc N]
                 [--no-progress] [--json]
    interp prune --model NAME --method importance|l0|random [--target F ...] [--step F] [--seed S] [--seeds N]
                 [--l0-steps N] [--n-seqs N] [--out DIR [--fresh]] [--nproc N] [--no-progress] [--json]
    interp train-induction [--steps N] [--seed S] [--batch-size B] [--out PATH.safetensors] [--no-progress]
    interp dashboard [--port P] [--host ADDR] [--files FOLDER] [--headless] [--dry-run]
    interp kv-cache --layers L --heads H [--kv-heads K] --d-head D [--dtype fp16] [--batch B] [--tokens T]
                    [--latent C] [--rope-dim R] [--json]
    interp plan --model CONFIG.json|FILE.gguf|FOLDER [--devices cpu,cuda:0] [--memory 64GB,80GB] [--dtype D]
                [--tokens T] [--batch B] [--dequantized] [--reserve F] [--json]
    interp bench [NAME ...] [--quick]   (interp bench --help lists the benchmarks)

``--json`` output (stable keys; new keys may be added, these will not change meaning):

* ``interp heads --json``: a JSON list, one object per (head, kind) found:
  ``{"layer": int, "head": int, "kind": str, "score": float}``; ``kind`` is the classifier's label
  (``previous-token``, ``induction``, ``positional:-1``, ``syntactic:nsubj``, ``coreference:gap``...).
* ``interp prune --json``: a JSON list, one object per point of the pruning curve:
  ``{"method": str, "fraction_pruned": float, "metric": float}``; ``metric`` is the pruning objective
  (for decoders, next-token accuracy on the repeated half of repeated random sequences, the in-context
  copying that induction heads do; for MiniLM, cosine of pruned to unpruned sentence embeddings).
  With ``--out DIR`` the whole curve is also written there: ``DIR/<method>.json`` (read it back with
  :meth:`interp.pruning.PruningCurve.load`, or open DIR on the dashboard's "Load a saved curve"), a CSV table,
  ``curves.html`` and ``summary.json``; every finished point is saved at once under ``DIR/partial/``, and a
  second run with the same model, data and options resumes from it (``--fresh`` starts over).
* ``interp kv-cache --json``: a JSON list, one object per attention variant (computed by
  :func:`interp.flops.kv_cache_table`): ``{"kind": "mha"|"gqa"|"mqa"|"mla", "n_kv_heads": int,
  "bytes_per_token": int, "batch": int, "tokens": int, "total_bytes": int, "vs_mha": float}`` (for MLA,
  ``n_kv_heads`` is the number of heads rebuilt from the cached latent).

* ``interp plan --json``: one object ``{"weights_bytes": int, "weights": str, "embedding_bytes": int,
  "block_bytes": [int, ...], "head_bytes": int, "kv_bytes_per_token": int, "kv_bytes": int,
  "pattern_bytes_per_token": int, "pattern_bytes": int, "tokens": int, "batch": int, "devices": [{"device": str,
  "capacity": int, "layers": [int, ...], "weights_bytes": int}, ...]}`` (computed by
  :func:`interp.placement.plan_memory`).

Data parallel: ``heads`` and ``prune --method importance`` run under ``torchrun`` (``torchrun --nproc_per_node N
-m interp heads ...``, several nodes with ``--nnodes`` and ``--rdzv-endpoint``), or ``--nproc N`` launches
torchrun on this machine for you. Each rank runs its share of the batches, the statistics are all-reduced, and
rank 0 prints; the output is the single-process output (see :mod:`interp.distributed`).

Progress bars (tqdm) go to stderr, results to stdout. Bad input exits with status 2 (a usage error) or 1 (the
library rejected a value) and one line ``interp: error: ...`` on stderr, never a traceback.

Example:
    $ interp kv-cache --layers 80 --heads 64 --kv-heads 8 --d-head 128 --batch 32 --tokens 4096
    $ interp heads --model induction-2l --json
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1  # the library rejected a value, or a needed part is missing
EXIT_USAGE = 2  # the command line itself is wrong (argparse's convention)

HEADS_JSON_KEYS = ("layer", "head", "kind", "score")
PRUNE_JSON_KEYS = ("method", "fraction_pruned", "metric")
KV_JSON_KEYS = ("kind", "n_kv_heads", "bytes_per_token", "batch", "tokens", "total_bytes", "vs_mha")
PLAN_JSON_KEYS = ("weights_bytes", "weights", "embedding_bytes", "block_bytes", "head_bytes", "kv_bytes_per_token",
                  "kv_bytes", "pattern_bytes_per_token", "pattern_bytes", "tokens", "batch", "devices")
PRUNE_METHODS = ("importance", "l0", "random")
BENCHMARKS = ("forward", "recording", "long_context", "remove_heads", "concurrency", "smollm2", "analysis",
              "distributed", "moe", "attention_view", "load_memory", "families", "dashboard",
              "patching", "gpt_oss", "route")


class CliError(Exception):
    """A problem to report as one line and exit status 1 (no traceback)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (plus the exit status), not the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# --- helpers ---------------------------------------------------------------------------------------------
def _require(module: str, attr: str | None = None, what: str = "") -> Any:
    """Import ``module`` (and ``attr`` from it) or raise CliError naming what is missing."""
    try:
        mod = importlib.import_module(module)
        return getattr(mod, attr) if attr else mod
    except (ImportError, AttributeError) as e:
        name = f"{module}.{attr}" if attr else module
        raise CliError(f"{what or name} is not available ({name}: {e})") from e


def _load_model(name: str):
    load = _require("interp.zoo", "load", "the model zoo (interp.zoo.load)")
    from .distributed import rank_device

    return load(name, device=rank_device())  # under nccl each rank on its own GPU


def repo_root() -> Path:
    """The folder above this package: the source checkout for an editable install (``interp bench`` runs
    ``experiments/benchmarks/`` from there), ``site-packages`` for a wheel install."""
    import interp

    return Path(interp.__file__).resolve().parents[1]


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


# --- data parallel: launching and its memory limits live in interp.distributed ------------------------------
# Rough float32 weight bytes of the built-ins, for the --nproc memory check (knowing the zoo's names and file
# formats is the CLI's job; distributed.check_ranks_fit does the arithmetic).
_BUILTIN_WEIGHT_BYTES = {"induction-2l": 1 << 20, "minilm-l6": 90 << 20, "smollm2-135m": 540 << 20}


def _weight_bytes(model: str) -> int:
    """Estimated float32 weight bytes of ``--model`` without loading it (0 when unknown)."""
    if model in _BUILTIN_WEIGHT_BYTES:
        return _BUILTIN_WEIGHT_BYTES[model]
    path = Path(model)
    try:
        if path.is_file() and path.suffix == ".gguf":
            from .zoo.gguf_file import read_gguf

            return 4 * sum(t.n_elements for t in read_gguf(path).tensors)  # dequantised to float32
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(f.stat().st_size for f in path.glob("*.safetensors")) or \
                sum(f.stat().st_size for f in path.glob("*.bin"))
    except (OSError, ValueError):
        return 0  # the command itself reports the bad file
    return 0


def check_nproc(nproc: int, model: str, *, cores: int | None = None, available: int | None = None) -> None:
    """Refuse a ``--nproc`` that this machine cannot run (see :func:`interp.distributed.check_ranks_fit`).

    Args:
        nproc: the ``--nproc`` asked for.
        model: the ``--model`` value (its size is estimated without loading it).
        cores: usable cores (default: this process's CPU affinity).
        available: available memory in bytes (default: ``MemAvailable`` of ``/proc/meminfo``).

    Raises:
        CliError: too many ranks; the message says what ``--nproc`` should be at most, and why.

    Example:
        >>> from interp.cli import check_nproc
        >>> check_nproc(2, "induction-2l", cores=2, available=8 << 30)
    """
    from .distributed import check_ranks_fit

    try:
        check_ranks_fit(nproc, _weight_bytes(model), what=model, cores=cores, available=available)
    except ValueError as e:
        raise CliError(str(e)) from None


def _maybe_launch(args: argparse.Namespace) -> int | None:
    """With ``--nproc N > 1`` outside torchrun: run the same command under torchrun and return its status."""
    if getattr(args, "nproc", 1) <= 1:
        return None
    check_nproc(args.nproc, args.model)
    from .distributed import torchrun_command

    # Replaced, not a child: a Ctrl-C (or kill PID) reaches the launcher itself, which stops the ranks and ends
    # with one line; a parent that exited at once would leave torchrun running and printing its traceback.
    return _exec(torchrun_command(args.nproc, args.argv))


# --- heads -----------------------------------------------------------------------------------------------
def _heads(args: argparse.Namespace) -> int:
    launched = _maybe_launch(args)
    if launched is not None:
        return launched
    if args.conllu is not None and not Path(args.conllu).is_file():
        raise CliError(f"--conllu file {args.conllu!r} does not exist")
    for f in args.coref or []:
        if not Path(f).is_file():
            raise CliError(f"--coref file {f!r} does not exist")
    if args.text is not None and not any(t.strip() for t in args.text):
        raise CliError(f"--text {args.text!r} is empty")
    classify_heads = _require("interp.analysis", "classify_heads", "head classification (interp.analysis)")
    kwargs: dict[str, Any] = {}
    if args.kinds is not None:
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        if not kinds:
            raise CliError(f"--kinds {args.kinds!r} names no head kind")
        known = _require("interp.analysis.kinds", "head_kinds", "the head-kind registry")()
        unknown = [k for k in kinds if k not in known and k != "all"]
        if unknown:
            raise CliError(f"--kinds: unknown head kind(s) {unknown}; the known kinds are {list(known)}")
        kwargs["kinds"] = "all" if kinds == ["all"] else kinds
    model = _load_model(args.model)
    if args.text is not None:
        kwargs["texts"] = list(args.text)
    if args.conllu is not None:
        kwargs["conllu"] = args.conllu
        if args.max_sentences is not None:
            kwargs["max_sentences"] = args.max_sentences
    if args.coref:
        kwargs["coref"] = list(args.coref)
    report = classify_heads(model, progress=not args.no_progress, **kwargs)
    df = report.df if hasattr(report, "df") else report
    rows = heads_records(df)
    if args.json:
        _print_json(rows)
    else:
        import pandas as pd

        cols = [c for c in (*HEADS_JSON_KEYS, "evidence") if c in df.columns]  # evidence: for people only
        table = pd.DataFrame(df[cols]).reset_index(drop=True)
        print(table.to_string(index=False, max_colwidth=60) if len(table) else "no head matched any kind")
    return EXIT_OK


def heads_records(df) -> list[dict[str, Any]]:
    """Rows of a HeadReport DataFrame as ``{"layer", "head", "kind", "score"}`` dicts (the JSON contract).

    Args:
        df: a DataFrame with at least the columns layer, head, kind, score.

    Returns:
        One dict per row, with plain Python ints, str and float.

    Raises:
        CliError: a column is missing.
    """
    missing = [c for c in HEADS_JSON_KEYS if c not in df.columns]
    if missing:
        raise CliError(f"classify_heads returned a table without columns {missing}: {list(df.columns)}")
    return [{"layer": int(r.layer), "head": int(r.head), "kind": str(r.kind), "score": float(r.score)}
            for r in df[list(HEADS_JSON_KEYS)].itertuples(index=False)]


# --- prune -----------------------------------------------------------------------------------------------
def prune_config(args: argparse.Namespace) -> dict[str, Any]:
    """The ``interp.pruning.run_experiment`` config for ``interp prune`` arguments."""
    config: dict[str, Any] = {"model": args.model, "methods": [args.method]}
    if args.method == "l0":
        config["l0"] = {"targets": list(args.target) if args.target else [0.1, 0.3, 0.5, 0.7, 0.9]}
        if args.l0_steps is not None:
            config["l0"]["steps"] = args.l0_steps
    elif args.method == "random":
        config["random"] = {"seeds": list(range(args.seed, args.seed + args.seeds)), "step": args.step}
    else:
        config["importance"] = {"step": args.step}
    if args.n_seqs is not None:
        # interp.pruning.build_task reads the size its data kind needs (n_seqs, or n_train / n_eval).
        config["data"] = {"n_seqs": args.n_seqs, "n_train": args.n_seqs, "n_eval": args.n_seqs,
                          "batch_size": min(16, args.n_seqs)}
    return config


def _prune(args: argparse.Namespace) -> int:
    if not 0.0 < args.step <= 1.0:
        raise CliError(f"--step {args.step} must be in (0, 1]")
    if args.fresh and args.out is None:
        raise CliError("--fresh starts a saved run over: it needs --out DIR")
    if args.out is not None:
        from .distributed import launched_by_torchrun

        if args.nproc > 1 or launched_by_torchrun():
            # Each rank would resume from what it finds in DIR/partial while rank 0 is writing there: the ranks
            # could skip different points and wait on each other's collectives forever.
            raise CliError("--out (a saved, resumable run) works in one process only; drop --nproc / torchrun, "
                           "or drop --out")
        check_out_folder(Path(args.out), "--out")
    launched = _maybe_launch(args)
    if launched is not None:
        return launched
    run_experiment = _require("interp.pruning", "run_experiment", "head pruning (interp.pruning.run_experiment)")
    model = _load_model(args.model)
    config = prune_config(args)
    if args.conllu:
        config.setdefault("data", {})["path"] = args.conllu
    if not model.cfg.unembed and "path" not in config.get("data", {}):
        raise CliError(f"{args.model} is an encoder: its pruning task scores sentences; pass --conllu PATH "
                       "(for example ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu)")
    result = run_experiment(config, model=model, out_dir=args.out, fresh=args.fresh, progress=not args.no_progress)
    rows = prune_records(result, default_method=args.method)
    if args.target and args.method != "l0":
        rows = _nearest_points(rows, args.target)
    if args.json:
        _print_json(rows)
    else:
        import pandas as pd

        print(pd.DataFrame(rows, columns=list(PRUNE_JSON_KEYS)).to_string(index=False))
    return EXIT_OK


def check_out_folder(folder: Path, option: str) -> None:
    """Fail now, not after minutes of pruning, when ``folder`` cannot hold the results.

    Args:
        folder: the output folder (created when absent, with its parents).
        option: the command-line option that named it, for the message.

    Raises:
        CliError: ``folder`` is a file, or cannot be created or written (the OS reason is quoted).

    Example:
        >>> from pathlib import Path
        >>> from interp.cli import check_out_folder
        >>> import tempfile
        >>> check_out_folder(Path(tempfile.mkdtemp()) / "prune_run", "--out")
    """
    if folder.exists() and not folder.is_dir():
        raise CliError(f"{option} {str(folder)!r} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"{option} {str(folder)!r} cannot be created: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"{option} {str(folder)!r} is not writable")


def _nearest_points(rows: list[dict[str, Any]], targets: Sequence[float]) -> list[dict[str, Any]]:
    """For importance/random curves, keep the point nearest to each requested fraction (in target order)."""
    picked = []
    for t in targets:
        best = min(rows, key=lambda r: abs(r["fraction_pruned"] - t))
        if best not in picked:
            picked.append(best)
    return picked


def prune_records(result: Any, default_method: str = "") -> list[dict[str, Any]]:
    """Points of PruningCurves as JSON rows.

    Args:
        result: a :class:`interp.pruning.PruningCurve`, a ``{method: curve}`` dict (what
            ``run_experiment`` returns) or a list of curves.
        default_method: the method name used when a curve carries none.

    Returns:
        ``[{"method", "fraction_pruned", "metric"}, ...]`` in curve order.

    Raises:
        CliError: the result has no curve points.
    """
    if isinstance(result, dict):
        return [row for name, curve in result.items() for row in prune_records(curve, str(name))]
    if isinstance(result, (list, tuple)):
        return [row for curve in result for row in prune_records(curve, default_method)]
    fr, me = getattr(result, "fractions", None), getattr(result, "metrics", None)
    if fr is None or me is None:
        raise CliError(f"cannot read curve points from a {type(result).__name__}")
    method = str(getattr(result, "method", "") or default_method)
    return [{"method": method, "fraction_pruned": float(f), "metric": float(m)} for f, m in zip(fr, me)]


# --- train-induction -------------------------------------------------------------------------------------
def _train_induction(args: argparse.Namespace) -> int:
    if args.steps <= 0:
        raise CliError(f"--steps {args.steps} must be > 0")
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise CliError(f"--out {str(out)!r} must end in .safetensors")
    if not out.parent.is_dir():
        raise CliError(f"--out directory {str(out.parent)!r} does not exist")
    check_writable(out, "--out")
    train = _require("interp.training", "train_induction_model", "induction training")
    save = _require("interp.zoo.induction", "save_induction_model", "induction checkpoint saving")
    model, history = train(steps=args.steps, seed=args.seed, batch_size=args.batch_size,
                           eval_every=min(args.eval_every, args.steps), progress=not args.no_progress)
    save(model, out, metadata={"steps": args.steps, "seed": args.seed})
    print(f"saved {out} after {args.steps} steps (seed {args.seed}); load it with interp.load({str(out)!r})")
    last = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in history.iloc[-1].items()}
    if last:
        print("final: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items()))
    return EXIT_OK


def check_writable(path: Path, option: str) -> None:
    """Fail now, not after minutes of work, when ``path`` cannot be written.

    Args:
        path: the output file (it is created and removed again when it did not exist).
        option: the command-line option that named it, for the message.

    Raises:
        CliError: the file cannot be opened for writing (the OS reason is quoted).

    Example:
        >>> from pathlib import Path
        >>> from interp.cli import check_writable
        >>> check_writable(Path("model.safetensors"), "--out")
    """
    existed = path.exists()
    if existed and not path.is_file():
        raise CliError(f"{option} {str(path)!r} is not a regular file")
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise CliError(f"{option} {str(path)!r} is not writable: {e.strerror or e}") from None
    if not existed:
        path.unlink(missing_ok=True)


# --- dashboard -------------------------------------------------------------------------------------------
def dashboard_path() -> Path:
    """The dashboard script inside the installed package (``interp/app/dashboard.py``).

    Raises:
        CliError: the file is absent (a broken install).
    """
    from .app import DASHBOARD

    if not DASHBOARD.is_file():
        raise CliError(f"dashboard app not found at {str(DASHBOARD)!r}; reinstall interp with the app extra "
                       "(pip install 'interp[app]')")
    return DASHBOARD


def dashboard_command(port: int | None = None, headless: bool = False) -> list[str]:
    """The ``streamlit run`` command line that ``interp dashboard`` executes (the listening address and the
    files folder travel in its environment: :func:`dashboard_env`)."""
    # No usage statistics: nothing leaves the machine (and offline machines do not wait on it).
    cmd = [sys.executable, "-m", "streamlit", "run", str(dashboard_path()), "--browser.gatherUsageStats", "false"]
    if port is not None:
        cmd += ["--server.port", str(port)]
    if headless:
        cmd += ["--server.headless", "true"]
    return cmd


def _exec(cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Replace this process with ``cmd``: a signal sent to ``interp``'s PID then reaches the program itself
    (a child started with subprocess would keep running after ``kill PID``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if env is None:
            os.execv(cmd[0], cmd)
        os.execve(cmd[0], cmd, env)
    except OSError as e:
        raise CliError(f"cannot start {cmd[0]!r}: {e.strerror or e}") from None
    return EXIT_FAILED  # pragma: no cover - exec does not return


def dashboard_env(host: str = "127.0.0.1", files: str | Path | None = None) -> dict[str, str]:
    """The environment variables ``interp dashboard`` sets for Streamlit.

    Args:
        host: the address to listen on (``STREAMLIT_SERVER_ADDRESS``); the default serves this machine only.
        files: the one folder whose files users may open by path (``INTERP_DASHBOARD_FILES``); None: none.

    Returns:
        Variable -> value (without the rest of the environment).

    Raises:
        CliError: ``files`` is not a folder.

    Example:
        >>> from interp.cli import dashboard_env
        >>> dashboard_env()
        {'STREAMLIT_SERVER_ADDRESS': '127.0.0.1'}
    """
    env = {"STREAMLIT_SERVER_ADDRESS": host}
    if files is not None:
        folder = Path(files).expanduser()
        if not folder.is_dir():
            raise CliError(f"--files {str(folder)!r} is not a folder")
        from .app import FILES_ENV

        env[FILES_ENV] = str(folder.resolve())
    return env


def _dashboard(args: argparse.Namespace) -> int:
    if args.port is not None and not 0 < args.port < 65536:
        raise CliError(f"--port {args.port} is not a TCP port (1..65535)")
    extra = dashboard_env(args.host, args.files)
    env = {**os.environ, **extra}
    cmd = dashboard_command(args.port, args.headless)
    if args.dry_run:
        print(" ".join(cmd))
        print("environment: " + " ".join(f"{k}={v}" for k, v in extra.items()), file=sys.stderr)
        return EXIT_OK
    _require("streamlit", what="streamlit (pip install interp[app])")
    return _exec(cmd, env)


# --- kv-cache --------------------------------------------------------------------------------------------
#: kv-cache's options by the argument names of interp.flops that its errors quote ("d_head=7" -> "--d-head 7").
_KV_OPTIONS = {"layers": "--layers", "heads": "--heads", "kv_heads": "--kv-heads", "d_head": "--d-head",
               "rope_dim": "--rope-dim"}
_KV_ARG_RX = re.compile(r"\b(kv_heads|d_head|rope_dim|heads|layers)=(-?\d+)")


def kv_cache_table(*, layers: int, heads: int, d_head: int, kv_heads: int | None = None, dtype: str = "fp16",
                   batch: int = 1, tokens: int = 1, latent: int | None = None, rope_dim: int | None = None
                   ) -> list[dict[str, Any]]:
    """KV-cache sizes of MHA, GQA, MQA and MLA for one shape of model (rows of :func:`interp.flops.kv_cache_table`).

    Args:
        layers, heads, d_head: the model's layers, query heads and head width (a rotary decoder).
        kv_heads: K/V heads of the GQA row (default: the divisor of ``heads`` nearest ``heads / 8``).
        dtype: cache element type (``fp16``, ``bf16``, ``fp32``, ``fp8``...).
        batch, tokens: the cache holds ``batch x tokens`` positions.
        latent, rope_dim: MLA latent width and decoupled rotary width (defaults ``4 * d_head``, ``d_head // 2``).

    Returns:
        One dict per variant with the keys of ``KV_JSON_KEYS``.

    Raises:
        ValueError: a value :func:`interp.flops.rotary_decoder_config`, :func:`interp.flops.kv_variants` or
            ModelConfig rejects (quoted), an unknown dtype, or batch/tokens < 1.

    Example:
        >>> from interp.cli import kv_cache_table
        >>> kv_cache_table(layers=80, heads=64, d_head=128)[0]["bytes_per_token"]
        2621440
    """
    from interp.flops import kv_cache_table as table
    from interp.flops import rotary_decoder_config

    try:
        base = rotary_decoder_config(layers=layers, heads=heads, d_head=d_head, kv_heads=kv_heads)
        df = table(base, batch=batch, tokens=tokens, dtype=dtype,
                   n_kv_groups=kv_heads if kv_heads != heads else None, kv_latent_dim=latent, rope_dim=rope_dim)
    except ValueError as e:  # the library names its arguments; the user typed options
        raise ValueError(_KV_ARG_RX.sub(lambda m: f"{_KV_OPTIONS[m.group(1)]} {m.group(2)}", str(e))) from None
    return [{"kind": str(r.kind), "n_kv_heads": int(r.n_kv_heads), "bytes_per_token": int(r.bytes_per_token),
             "batch": batch, "tokens": tokens, "total_bytes": int(r.total_bytes), "vs_mha": float(r.vs_mha)}
            for r in df.itertuples(index=False)]


def _kv_cache(args: argparse.Namespace) -> int:
    rows = kv_cache_table(layers=args.layers, heads=args.heads, d_head=args.d_head, kv_heads=args.kv_heads,
                          dtype=args.dtype, batch=args.batch, tokens=args.tokens, latent=args.latent,
                          rope_dim=args.rope_dim)
    if args.json:
        _print_json(rows)
        return EXIT_OK
    import pandas as pd

    from interp.flops import format_bytes

    table = pd.DataFrame([{
        "kind": r["kind"], "kv heads": r["n_kv_heads"] if r["kind"] != "mla" else "latent",
        "per token": format_bytes(r["bytes_per_token"]),
        f"batch {r['batch']} x {r['tokens']} tokens": format_bytes(r["total_bytes"]),
        "vs MHA": f"{1 / r['vs_mha']:.3g}x smaller" if r["vs_mha"] != 1 else "1x",
    } for r in rows])
    print(f"KV cache, {args.layers} layers x {args.heads} heads x d_head {args.d_head}, {args.dtype}")
    print(table.to_string(index=False))
    return EXIT_OK


# --- plan ------------------------------------------------------------------------------------------------
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30, "TIB": 2**40}


def _byte_size(text: str) -> int:
    """``"80GB"`` / ``"24GiB"`` / ``"512MB"`` / ``"1e9"`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 80GB, 24GiB, 512MB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _reserve(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is outside [0, 1) (a share of each device kept free)")
    return v


def _plan(args: argparse.Namespace) -> int:
    import torch

    from interp.flops import format_bytes
    from interp.placement import available_memory, plan_memory
    from interp.zoo.sizes import model_sizes

    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if not devices:
        raise CliError(f"--devices {args.devices!r} names no device")
    if args.memory is not None:
        sizes = [_byte_size(m) for m in args.memory.split(",")]
        if len(sizes) != len(devices):
            raise CliError(f"--memory gives {len(sizes)} size(s) for {len(devices)} device(s) {devices}")
        capacities = dict(zip(devices, sizes))
    else:
        absent = [d for d in devices if torch.device(d).type == "cuda"
                  and (not torch.cuda.is_available() or (torch.device(d).index or 0) >= torch.cuda.device_count())]
        if absent:
            raise CliError(f"{absent} not on this machine: give each device's memory with --memory "
                           f"(e.g. --memory {','.join('80GB' for _ in devices)})")
        capacities = {str(d): c for d, c in available_memory(devices).items()}
    dtype = getattr(torch, args.dtype)
    cfg, sizes_, label = model_sizes(args.model, dtype=dtype, keep_quantized=not args.dequantized)
    plan = plan_memory(cfg, capacities, dtype=dtype, sizes=sizes_, weights_label=label, tokens=args.tokens,
                       batch=args.batch, reserve=args.reserve)
    per_device = plan.device_weights()
    if args.json:
        _print_json({
            "weights_bytes": plan.weight_bytes, "weights": plan.weights_label, "embedding_bytes": plan.embedding_bytes,
            "block_bytes": plan.block_bytes, "head_bytes": plan.head_bytes,
            "kv_bytes_per_token": plan.kv_bytes_per_token, "kv_bytes": plan.kv_bytes,
            "pattern_bytes_per_token": plan.pattern_bytes_per_token, "pattern_bytes": plan.pattern_bytes,
            "tokens": plan.tokens, "batch": plan.batch,
            "devices": [{"device": str(d), "capacity": plan.capacities[d], "layers": layers, "weights_bytes": nb}
                        for d, (layers, nb) in per_device.items()]})
        return EXIT_OK
    blocks = plan.block_bytes
    print(f"{args.model}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads / {cfg.n_kv_heads} KV "
          f"heads, d_head {cfg.d_head}, vocabulary {cfg.d_vocab}")
    print(f"weights ({plan.weights_label}): {format_bytes(plan.weight_bytes)} = embeddings "
          f"{format_bytes(plan.embedding_bytes)} + {len(blocks)} layers x {format_bytes(min(blocks))}"
          + (f"..{format_bytes(max(blocks))}" if max(blocks) != min(blocks) else "")
          + f" + final norm / unembedding {format_bytes(plan.head_bytes)}")
    print(f"KV cache ({plan.cache_dtype}): {format_bytes(plan.kv_bytes_per_token)} per token; "
          f"{format_bytes(plan.kv_bytes)} for batch {plan.batch} x {plan.tokens} tokens")
    print(f"recorded patterns ({plan.cache_dtype}): {format_bytes(plan.pattern_bytes_per_token)} per query token at "
          f"{plan.tokens} keys; {format_bytes(plan.pattern_bytes)} for one pass of batch {plan.batch} x "
          f"{plan.tokens} tokens")
    print(f"split (keeping {plan.reserve:.0%} of each device for activations and workspace):")
    for d, (layers, nb) in per_device.items():
        span = f"layers {layers[0]}-{layers[-1]} ({len(layers)})" if layers else "no layers"
        print(f"  {str(d):<8} {format_bytes(plan.capacities[d]):>10}  {span:<20} weights {format_bytes(nb)}")
    return EXIT_OK


# --- bench -----------------------------------------------------------------------------------------------
def _bench(args: argparse.Namespace) -> int:
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        raise CliError(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    runner = repo_root() / "experiments" / "benchmarks" / "run_all.py"
    if not runner.is_file():
        raise CliError("interp bench needs a source checkout (the benchmarks in experiments/benchmarks/ are not part "
                       "of the installed package): clone the interp repository, pip install -e . in it, and run "
                       f"interp bench there (looked for {str(runner)!r})")
    cmd = [sys.executable, str(runner), *args.names]
    if args.quick:
        cmd.append("--quick")
    return _exec(cmd)


# --- parser ----------------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is outside [0, 1] (a fraction of heads to prune)")
    return v


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their line breaks; an option's help shows its default unless it already says one
    (flags and options without a default show none)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def plain_text(rst: str) -> str:
    """Docstring reST made readable in a terminal: ``code`` -> code, :func:`a.b` -> a.b, ``::`` -> ``:``.

    Example:
        >>> from interp.cli import plain_text
        >>> plain_text("see :func:`interp.load` and ``--json``::")
        'see interp.load and --json:'
    """
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", rst)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return re.sub(r"::$", ":", text, flags=re.M)


def _version() -> str:
    import interp

    return f"interp {interp.__version__}"


# --- interp circuit (a self-contained block: its parser, its command) ----------------------------------------
CIRCUIT_METHODS = ("eap", "eap-ig", "acdc", "edge-pruning")


def _circuit(args: argparse.Namespace) -> int:
    circuits = _require("interp.circuits", None, "circuit discovery (interp.circuits)")
    from .circuits.tasks import circuit_task

    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"--out {str(out)!r} cannot be created: {e.strerror or e}") from None
    check_writable(out / "circuit.json", "--out")
    model = _load_model(args.model)
    task = circuit_task(model, args.task, n=args.n, seed=args.seed)
    n_edges = circuits.build_graph(model).n_edges
    n_keep = args.edges or max(1, round(args.fraction * n_edges))
    if not 1 <= n_keep <= n_edges:
        raise CliError(f"--edges {n_keep} must be in [1, {n_edges}] (the edges of {args.model})")
    run = circuits.find_circuit(model, task, args.method, n_keep=n_keep, steps=args.steps, threshold=args.threshold,
                                train_steps=args.steps_train, n_random=args.n_random,
                                progress=not args.no_progress)
    found, faith, curve = run.circuit, run.faithfulness, run.curve
    found.info["model"] = args.model
    found.save(out / "circuit.json")
    from ._io import atomic_path

    with atomic_path(out / "curve.csv") as tmp:
        curve.to_csv(tmp, index=False)
    summary = {"method": args.method, "task": args.task, "model": args.model, "n_edges": len(found),
               "n_edges_total": run.n_edges_total, "faithfulness": faith.get("faithfulness"),
               "normalized": faith.get("normalized"), "completeness": faith.get("completeness"),
               "ablation": task.ablation, "circuit": str(out / "circuit.json"),
               "curve": str(out / "curve.csv")}
    if args.json:
        _print_json(summary)
    else:
        for k, v in summary.items():
            print(f"{k}: {v}")
    return EXIT_OK


def _add_output_flags(p: argparse.ArgumentParser, *, json_instead_of: str | None, progress: bool = True) -> None:
    """The flags of every command that reports: ``--no-progress`` (its bars go to stderr) and ``--json`` (print
    JSON instead of ``json_instead_of``; None: the command prints no report)."""
    if progress:
        p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    if json_instead_of is not None:
        p.add_argument("--json", action="store_true", help=f"print JSON instead of {json_instead_of}")


def _add_circuit_parser(sub: Any, fmt: Any) -> None:
    ci = sub.add_parser("circuit", help="find a task's circuit (edges between heads, MLPs, embedding, logits)",
                        formatter_class=fmt, description="Score the edges of a model on a task, keep a circuit, "
                        "measure its faithfulness and a curve beside random circuits; writes circuit.json and "
                        "curve.csv to --out.",
                        epilog="--json prints {\"method\", \"task\", \"model\", \"n_edges\", \"n_edges_total\", "
                               "\"faithfulness\", \"normalized\", \"completeness\", \"ablation\", \"circuit\", "
                               "\"curve\"}.")
    ci.add_argument("--model", required=True, help="a built-in name (induction-2l, smollm2-135m...), a checkpoint, "
                                                   "a .gguf file or a Hugging Face folder")
    ci.add_argument("--task", required=True, choices=("induction", "ioi", "greater-than", "agreement", "docstring"),
                    help="the generated task (text tasks need a text tokenizer)")
    ci.add_argument("--method", required=True, choices=CIRCUIT_METHODS,
                    help="eap, eap-ig (top edges by score), acdc (greedy, --threshold) or edge-pruning (gates)")
    ci.add_argument("--out", required=True, help="folder for circuit.json and curve.csv")
    ci.add_argument("--edges", type=_positive_int, help="edges to keep (eap, eap-ig, edge-pruning)")
    ci.add_argument("--fraction", type=_fraction, default=0.1, help="fraction of the edges to keep if no --edges")
    ci.add_argument("--threshold", type=float, default=0.05, help="acdc: largest metric change of a removed edge")
    ci.add_argument("--steps", type=_positive_int, default=5, help="eap-ig: integrated-gradient steps m")
    ci.add_argument("--steps-train", type=_positive_int, default=100, help="edge-pruning: gate training steps")
    ci.add_argument("--n", type=_positive_int, default=16, help="prompts")
    ci.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    ci.add_argument("--n-random", type=int, default=20, help="random circuits per size on the curve")
    _add_output_flags(ci, json_instead_of="lines")
    ci.set_defaults(func=_circuit)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``interp`` command (sub-commands heads, prune, train-induction, dashboard,
    kv-cache, plan, bench)."""
    fmt = _HelpFormatter
    p = _Parser(prog="interp", description=plain_text(__doc__.split("\nExample:")[0]), formatter_class=fmt,
                epilog="Run 'interp COMMAND --help' for the JSON keys of each command.")
    p.add_argument("--version", action="version", version=_version(), help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    h = sub.add_parser("heads", help="classify attention heads (positional, induction, syntactic...)",
                       formatter_class=fmt, description="Classify the attention heads of a model.",
                       epilog="--json prints a list of {\"layer\": int, \"head\": int, \"kind\": str, \"score\": float},"
                              " one per (head, kind).")
    h.add_argument("--model", required=True,
                   help="a built-in name (induction-2l, minilm-l6, smollm2-135m, random-tiny), a checkpoint, a .gguf "
                        "file, a Hugging Face folder, or a hub name hf:ID / tl:ID")
    src = h.add_mutually_exclusive_group()
    src.add_argument("--text", action="append",
                     help="text to run on (repeat for several texts; default: random tokens)")
    src.add_argument("--conllu", help="a CoNLL-U treebank: adds syntactic heads (gold dependency trees)")
    h.add_argument("--max-sentences", type=_positive_int, help="use at most this many CoNLL-U sentences (default: all)")
    h.add_argument("--coref", action="append", metavar="FILE",
                   help="coreference data (GAP .tsv or CorefUD .conllu): adds coreference:gap / coreference:corefud "
                        "heads (repeat for several files)")
    h.add_argument("--kinds", metavar="K1,K2",
                   help="registered head kinds to run, comma-separated, or 'all' (default: positional, "
                        "previous-token, duplicate-token, induction, and syntactic / coreference with their data); "
                        "the registry (interp.analysis.kinds.head_kinds) also holds sink, copy-suppression, "
                        "successor, retrieval and induction:natural (with --text)")
    _add_output_flags(h, json_instead_of="a table")
    h.add_argument("--nproc", type=_positive_int, default=1,
                   help="processes on this machine: launches torchrun --nproc_per_node N (data parallel)")
    h.set_defaults(func=_heads)

    pr = sub.add_parser("prune", help="a head-pruning curve (importance, L0 gates or random)", formatter_class=fmt,
                        description="Prune attention heads and print the metric against the fraction pruned.",
                        epilog="--json prints a list of {\"method\": str, \"fraction_pruned\": float, "
                               "\"metric\": float}, one per curve point.")
    pr.add_argument("--model", required=True,
                    help="a built-in name (e.g. smollm2-135m), a checkpoint, a .gguf path or a hub name hf:ID")
    pr.add_argument("--method", required=True, choices=PRUNE_METHODS,
                    help="importance (Michel et al.), l0 (Hard-Concrete gates) or random (baseline)")
    pr.add_argument("--target", type=_fraction, nargs="+",
                    help="fractions of heads to prune, in [0, 1]: L0's target sparsities (default 0.1 0.3 0.5 0.7 "
                         "0.9); for importance and random, the curve points nearest to these fractions are printed")
    pr.add_argument("--step", type=float, default=0.1, help="importance/random: fraction of heads per step")
    pr.add_argument("--seed", type=int, default=0, help="random: first seed")
    pr.add_argument("--seeds", type=_positive_int, default=3, help="random: number of seeds averaged")
    pr.add_argument("--l0-steps", type=_positive_int, help="L0: gate training steps per target (default: the "
                                                           "experiment's)")
    pr.add_argument("--n-seqs", type=_positive_int,
                    help="sequences (sentences) used to prune and to evaluate (default: the experiment's)")
    pr.add_argument("--conllu", help="CoNLL-U sentences for an encoder's pruning task (decoders use repeated random sequences)")
    pr.add_argument("--out", metavar="DIR",
                    help="write the curve to DIR (<method>.json, .csv, curves.html, summary.json; the dashboard's "
                         "'Load a saved curve' opens DIR) and resume from DIR/partial when run again")
    pr.add_argument("--fresh", action="store_true", help="with --out: ignore DIR's partial results and start over")
    _add_output_flags(pr, json_instead_of="a table")
    pr.add_argument("--nproc", type=_positive_int, default=1,
                    help="processes on this machine: launches torchrun --nproc_per_node N (importance is data parallel)")
    pr.set_defaults(func=_prune)

    t = sub.add_parser("train-induction", help="train the 2-layer attention-only induction model",
                       formatter_class=fmt, description="Train the 2-layer attention-only induction model on "
                       "repeated random sequences and save it as a checkpoint.")
    t.add_argument("--steps", type=int, default=3000, help="training steps")
    t.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    t.add_argument("--batch-size", type=_positive_int, default=64, help="sequences per step")
    t.add_argument("--eval-every", type=_positive_int, default=250, help="evaluate every this many steps")
    _add_output_flags(t, json_instead_of=None)
    t.add_argument("--out", default="induction-2l.safetensors", help="checkpoint to write (safetensors)")
    t.set_defaults(func=_train_induction)

    d = sub.add_parser("dashboard", help="start the Streamlit dashboard (interp/app/dashboard.py)", formatter_class=fmt,
                       description="Start the Streamlit dashboard. It reads files by path only inside the folder "
                                   "given with --files (uploads always work), and listens on --host.")
    d.add_argument("--port", type=int, help="server port (streamlit's --server.port; default 8501)")
    d.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; 0.0.0.0 serves every network interface (only on a trusted network)")
    from .app import FILES_ENV

    d.add_argument("--files", metavar="FOLDER",
                   help=f"the folder whose checkpoints and curves users may open by path (sets {FILES_ENV}; "
                        "default: none, uploads only)")
    d.add_argument("--headless", action="store_true", help="do not open a browser (--server.headless true)")
    d.add_argument("--dry-run", action="store_true", help="print the streamlit command instead of running it")
    d.set_defaults(func=_dashboard)

    k = sub.add_parser("kv-cache", help="KV-cache bytes per token and per batch x context (MHA/GQA/MQA/MLA)",
                       formatter_class=fmt, description="KV-cache sizes of MHA, GQA, MQA and MLA for one model shape.",
                       epilog="--json prints a list of {\"kind\", \"n_kv_heads\", \"bytes_per_token\", \"batch\", "
                              "\"tokens\", \"total_bytes\", \"vs_mha\"}, one per variant (MHA, GQA, MQA, MLA).")
    k.add_argument("--layers", type=_positive_int, required=True, help="number of layers")
    k.add_argument("--heads", type=_positive_int, required=True, help="query heads per layer")
    k.add_argument("--kv-heads", type=_positive_int,
                   help="K/V heads of the GQA row (divides --heads; default: the divisor nearest heads/8)")
    k.add_argument("--d-head", type=_positive_int, required=True, help="width of one head (even: rotary)")
    k.add_argument("--dtype", default="fp16", choices=["bf16", "fp16", "fp32", "fp8", "int8"],
                   help="element type of the cache")
    k.add_argument("--batch", type=_positive_int, default=1, help="sequences held in the cache")
    k.add_argument("--tokens", type=_positive_int, default=1, help="context length held in the cache")
    k.add_argument("--latent", type=_positive_int, help="MLA: K/V latent width (default 4 x d_head)")
    k.add_argument("--rope-dim", type=int, help="MLA: decoupled rotary key width, even (default d_head / 2)")
    _add_output_flags(k, json_instead_of="a table", progress=False)
    k.set_defaults(func=_kv_cache)

    pl = sub.add_parser("plan", help="size a run from the config: weights per layer, KV cache and patterns per "
                                     "token, a split over devices", formatter_class=fmt,
                        description="Size a run before renting the hardware, from the model's config (or a GGUF "
                                    "file's header) alone: nothing is loaded.",
                        epilog="--json prints one object {" + ", ".join(f'"{k}"' for k in PLAN_JSON_KEYS) + "}.")
    pl.add_argument("--model", required=True, help="a Hugging Face config.json, a folder holding one, or a .gguf file")
    pl.add_argument("--devices", default="cpu", help="comma-separated devices the layers flow through, in order")
    pl.add_argument("--memory", help="comma-separated capacity of each device (80GB, 24GiB, ...; default: the free "
                                     "memory of devices on this machine)")
    pl.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="dtype of the float weights, the KV cache and recorded patterns")
    pl.add_argument("--tokens", type=_positive_int, default=2048, help="context length")
    pl.add_argument("--batch", type=_positive_int, default=1, help="sequences per pass")
    pl.add_argument("--dequantized", action="store_true",
                    help="a GGUF file's quantised weights counted as dtype floats (default: kept quantised)")
    pl.add_argument("--reserve", type=_reserve, default=0.1, help="share of each device kept free, in [0, 1)")
    _add_output_flags(pl, json_instead_of="text", progress=False)
    pl.set_defaults(func=_plan)

    b = sub.add_parser("bench", help="run the side-by-side benchmarks in experiments/benchmarks/",
                       formatter_class=fmt, description="Run the side-by-side benchmarks of experiments/benchmarks/.")
    b.add_argument("names", nargs="*", metavar="NAME",
                   help=f"benchmarks to run (default: all): {', '.join(BENCHMARKS)}")
    b.add_argument("--quick", action="store_true", help="fewer repetitions and shorter inputs")
    b.set_defaults(func=_bench)
    _add_circuit_parser(sub, fmt)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``interp`` console script.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 when the library rejected a value, 2 on a usage error, 130 when
        interrupted (Ctrl-C, also during the start-up imports).

    Example:
        >>> from interp.cli import main
        >>> main(["kv-cache", "--layers", "2", "--heads", "4", "--d-head", "8"])
        KV cache, 2 layers x 4 heads x d_head 8, fp16
        ...
        0
    """
    called_as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    where = ""
    ok = False
    previous = _exit_on_sigint()
    try:
        args = build_parser().parse_args(argv)
        args.argv = argv
        if args.command in ("heads", "prune"):
            where = _start_distributed(args)
        status = args.func(args)
        ok = True
        return status
    except BaseException as e:
        status = _report(e, where)
        if where:
            from . import distributed

            if isinstance(e, distributed.DistributedError):  # a peer is gone: its broken connections can abort
                distributed.exit_after_failure(status)      # gloo's teardown, so leave with this status now
        return status
    finally:
        # Called as the program (argv None: the console script, ``python -m interp``, each torchrun rank), the
        # one-line Ctrl-C exit stays to the end: Python's default would turn a Ctrl-C during the distributed
        # teardown or the exit into a KeyboardInterrupt traceback. A caller passing argv gets its handler back.
        if previous is not None and not called_as_program:
            signal.signal(signal.SIGINT, previous)
        if where:
            from . import distributed

            distributed.shutdown(wait=ok)  # after a failure the other ranks may never reach a barrier


def _exit_on_sigint() -> Any:
    """Make Ctrl-C end the command at once with one line and status 130; returns the previous handler.

    Python's default raises KeyboardInterrupt, which libraries can swallow: an interrupt that lands inside
    numpy's or torch's import guards leaves a half-imported module and an unrelated error later. Exiting from the
    handler cannot be swallowed. (Returns None and changes nothing outside the main thread.)
    """
    def on_sigint(signum: int, frame: Any) -> None:
        sys.stderr.write("interp: interrupted\n")
        sys.stderr.flush()
        os._exit(130)

    try:
        return signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread
        return None


def _report(e: BaseException, where: str) -> int:
    """One line on stderr for what ended the command; returns the exit status.

    Raises:
        SystemExit: argparse's usage errors and ``--help`` pass through; anything else too with INTERP_DEBUG=1.
    """
    if isinstance(e, SystemExit) or (os.environ.get("INTERP_DEBUG") and not isinstance(e, CliError)):
        raise e
    if isinstance(e, CliError):
        print(f"interp: error: {where}{e}", file=sys.stderr)
    elif isinstance(e, BrokenPipeError):  # stdout closed early (``interp ... | head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    elif isinstance(e, KeyboardInterrupt):
        print("interp: interrupted", file=sys.stderr)
        return 130
    elif isinstance(e, (ValueError, TypeError, KeyError, ImportError, OSError)):
        print(f"interp: error: {where}{type(e).__name__}: {_first_line(e)}", file=sys.stderr)
    elif isinstance(e, (RuntimeError, MemoryError)):  # torch reports a failed allocation as RuntimeError
        print(f"interp: error: {where}{type(e).__name__}: {_first_line(e)} (too large for this machine? try "
              "smaller sizes)", file=sys.stderr)
    elif isinstance(e, Exception):  # the CLI promises one line; INTERP_DEBUG=1 shows the traceback
        print(f"interp: error: {where}unexpected {type(e).__name__}: {_first_line(e)} (INTERP_DEBUG=1 shows the "
              "traceback)", file=sys.stderr)
    else:
        raise e
    return EXIT_FAILED


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _start_distributed(args: argparse.Namespace) -> str:
    """Under torchrun: open the process group; ranks other than 0 print nothing on stdout and show no progress.

    Returns:
        ``"rank R/N: "`` (prefix for error lines) under torchrun, ``""`` for a single process.
    """
    from . import distributed

    if not distributed.launched_by_torchrun():
        return ""
    if getattr(args, "nproc", 1) > 1:
        raise CliError(f"--nproc {args.nproc} given inside torchrun (WORLD_SIZE={os.environ.get('WORLD_SIZE')}): "
                       "use torchrun's --nproc_per_node instead")
    torch_threads = os.environ.get("OMP_NUM_THREADS")
    if torch_threads and torch_threads.isdigit():
        import torch

        torch.set_num_threads(int(torch_threads))
    distributed.init_from_env()
    r, n = distributed.rank(), distributed.world_size()
    if r != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - rank 0 writes the report; the others stay silent
        args.no_progress = True
    return f"rank {r}/{n}: "


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
