"""interp dashboard: look inside the attention heads of a model, in the browser.

Run it with ``interp dashboard`` or ``streamlit run`` on ``interp.app.DASHBOARD``. It imports only ``interp`` (plus
Streamlit, numpy, pandas and torch), so a copy of this file works anywhere interp is installed.

Pages (sidebar): attention patterns, head map (taxonomy), induction analysis, pruning, KV-cache & FLOPs
calculator. The sidebar picks the model (built-ins, a random toy model, a local checkpoint, a Hugging Face
name) and the text. All math lives in the library; this file only calls it and lays out the results.

URL query parameters preselect the model and the page: ``?model=random-tiny&page=Head+map``.

Results are cached on disk per (model weights hash, data, options) (:mod:`interp.app.results_cache`; the folder is
``$INTERP_DASHBOARD_CACHE``, default ``~/.cache/interp/dashboard``), so a second visit, also after a restart, reads
them instead of computing. Computations show a progress bar fed by the library's own bars
(:func:`interp.progress.listen`) and draw partial results as they come; pruning runs in a background thread
(:mod:`interp.app.jobs`) while the page stays usable. A large model (SmolLM2-135M) starts from smaller data
(:func:`default_sizes`), said on each page with what the first view cost.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import stat
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st
import torch
from streamlit import config as st_config

import interp
from interp import progress, viz
from interp._io import atomic_write_bytes
from interp.app import FILES_ENV, jobs, results_cache
from interp.flops import (
    DTYPE_BYTES,
    default_kv_groups,
    flops_per_layer,
    format_bytes,
    format_flops,
    gqa_group_options,
    kv_cache_table,
    worked_example_config,
)
from interp.zoo.hf import FAMILIES

PAGES = ("Attention patterns", "Head map", "Induction", "Pruning", "KV cache & FLOPs")
BUILTIN_MODELS = ("induction-2l", "minilm-l6", "smollm2-135m")
RANDOM_TINY = "random-tiny"
CHECKPOINT = "local checkpoint"
HF_NAME = "Hugging Face name"
TL_NAME = "TransformerLens name"
MODEL_CHOICES = (*BUILTIN_MODELS, RANDOM_TINY, CHECKPOINT, HF_NAME, TL_NAME)

EXAMPLE_SENTENCES = {
    "Repetition": "The cat sat on the mat. The cat sat on the mat.",
    "Agreement": "The keys to the old wooden cabinet in the hallway are on the table.",
    "Names": "When Mary and John went to the store, John gave a drink to Mary.",
    "Long sentence": ("Attention heads in a transformer read from and write to the residual stream, and some of "
                      "them specialise: previous-token heads, induction heads, and heads that follow syntax."),
}
#: Sentences for the encoder pruning objective (held-out style data for the cosine metric).
PRUNING_SENTENCES = [
    "A man is playing a guitar on the stage.",
    "The weather was cold, so we stayed inside and read.",
    "She finished the report before the meeting started.",
    "Two dogs are running through a field of grass.",
    "The committee postponed its decision until next week.",
    "He poured coffee into the blue mug on the desk.",
    "Children were building a sandcastle near the water.",
    "The new library opens every day except Sunday.",
]
MAX_GRID_TOKENS = 96  # the layer x head grid draws L*H heatmaps: keep each small enough for the browser


def checkout_results() -> Path | None:
    """``experiments/results`` of the source checkout interp runs from (an editable install), or None: a wheel
    install has no checkout, and the folder above the package is then ``site-packages``, not the project."""
    root = Path(interp.__file__).resolve().parents[1]
    results = root / "experiments" / "results"
    return results if (root / "pyproject.toml").is_file() and results.is_dir() else None


st.set_page_config(page_title="interp dashboard", page_icon="🔍", layout="wide")
# Streamlit runs a full garbage collection (gc.collect(2)) after every script run, fragment reruns included. With a
# 100M-parameter model and its autograd graph in memory, each one holds the GIL for a large part of a second, and a
# background job's progress fragment reruns every POLL_S: a pruning step inside the server took ~700 s for ~40 s
# outside it. Python's own generational collector is enough here.
st_config.set_option("runner.postScriptGC", False, where_defined="interp dashboard")


# --- models -----------------------------------------------------------------------------------------------
@st.cache_resource(show_spinner="Loading the model ...", max_entries=4)
def load_model(source: str, ref: str) -> interp.Transformer:
    """The model named by ``(source, ref)``: ``interp.load(ref)``, cached across reruns and sessions.

    ``source`` (``builtin``, ``random``, ``checkpoint``, ``hf``, ``tl``) only keeps the cache keys of the sidebar's
    choices apart and picks the error message; ``ref`` is a built-in name, a checkpoint path inside the served
    or upload folder, or an ``hf:`` / ``tl:`` name from :func:`served_model_ref`.

    The weights hash of the results cache is computed here, once per loaded model (a second of hashing for a
    100M-parameter model belongs to loading it, not to the first page that reads a result).
    """
    model = interp.load(ref)
    results_cache.weights_hash(model)
    return model


# --- files: uploads in a private folder per session; paths only inside the folder the operator named ------
MAX_FILE_MB = float(os.environ.get("INTERP_DASHBOARD_MAX_FILE_MB", "2048"))
MAX_CURVE_MB = 20.0


def served_folder() -> Path | None:
    """The folder users may read files from by path (``INTERP_DASHBOARD_FILES``), or None."""
    folder = os.environ.get(FILES_ENV, "").strip()
    return Path(folder).resolve() if folder and Path(folder).is_dir() else None


def served_file(typed: str, max_mb: float = MAX_FILE_MB) -> Path:
    """The regular file ``typed`` names inside the served folder.

    Every refusal (no served folder, a path outside it, a missing file, a FIFO or device, a symlink out of
    it) gives the same message, so the box cannot be used to probe which server paths exist.

    Raises:
        FileNotFoundError: the file is not available (one message for every reason).
        ValueError: the file is larger than ``max_mb``.
    """
    folder = served_folder()
    unavailable = FileNotFoundError(
        f"{typed!r} is not available: paths are read only inside the folder the operator serves "
        f"({'none' if folder is None else 'interp dashboard --files'}); upload the file instead")
    if folder is None or not typed.strip():
        raise unavailable
    try:
        path = (folder / typed.strip()).resolve(strict=True)
        info = path.stat()
    except (OSError, RuntimeError):
        raise unavailable from None
    if not path.is_relative_to(folder) or not stat.S_ISREG(info.st_mode):
        raise unavailable
    if info.st_size > max_mb * 2**20:
        raise ValueError(f"{typed!r} is {info.st_size / 2**20:.0f} MB, more than the {max_mb:.0f} MB this "
                         "dashboard reads")
    return path


def served_model_ref(typed: str, prefix: str = "hf:") -> str:
    """The ``interp.load`` name of a Hugging Face / TransformerLens model typed in the sidebar.

    A name that looks like a local path (``/``, ``.`` or ``~`` first, a ``\\`` or a ``..``) must be a folder
    inside the served folder and becomes its absolute path; any other name is a hub id, which ``interp.load``
    takes strictly as one (``tmp/some/folder`` is never a folder relative to the server's working directory).
    Every refused path gets the same message, so the box cannot be used to probe which server paths exist.

    Args:
        typed: what the user typed.
        prefix: ``"hf:"`` or ``"tl:"``.

    Returns:
        ``prefix`` + the hub id or the served folder's absolute path.

    Raises:
        FileNotFoundError: a path outside the served folder, or not a folder (one message for every reason).
    """
    name = typed.strip()
    if not (name.startswith(("/", ".", "~")) or "\\" in name or ".." in name.split("/")):
        return prefix + name  # a hub id such as "gpt2" or "org/model"
    folder = served_folder()
    unavailable = FileNotFoundError(f"{name!r} is not available: local folders are read only inside the folder "
                                    "the operator serves (interp dashboard --files)")
    if folder is None:
        raise unavailable
    try:
        path = (folder / name).resolve(strict=True)
    except (OSError, RuntimeError):
        raise unavailable from None
    if not path.is_relative_to(folder) or not path.is_dir():
        raise unavailable
    return prefix + str(path)


def read_limited(path: Path, max_mb: float) -> bytes:
    """The bytes of a regular file, refusing more than ``max_mb`` (read one byte past the limit to know)."""
    limit = int(max_mb * 2**20)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path.name} is larger than the {max_mb:.0f} MB this dashboard reads")
    return data


class _SessionFolder:
    """A private temporary folder (mode 0700) that is deleted when the Streamlit session that owns it ends."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="interp-session-"))
        # Runs when the session's state is dropped (the browser tab closed) or, at the latest, at exit.
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)


def session_folder() -> Path:
    """This session's private upload folder (created on first use)."""
    if "_upload_dir" not in st.session_state:
        st.session_state["_upload_dir"] = _SessionFolder()
    return st.session_state["_upload_dir"].path


def _saved_upload(data: bytes) -> str:
    """Write an uploaded checkpoint into this session's private folder, named by its hash."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = session_folder() / f"upload-{digest}.safetensors"
    if not path.exists():
        atomic_write_bytes(path, data)  # an interrupted write never leaves a truncated file under the hash
    return str(path)


def choose_model() -> tuple[str, str] | None:
    """Sidebar model picker; returns ``(source, ref)`` or None when the user still has to give a path/name."""
    wanted = st.query_params.get("model")
    if "model" not in st.session_state and wanted in MODEL_CHOICES:
        st.session_state["model"] = wanted
    choice = st.sidebar.selectbox("Model", MODEL_CHOICES, key="model",
                                  help="Built-in models, a tiny random model, a local interp checkpoint "
                                       "(.safetensors written by interp.zoo.save_checkpoint), or a Hugging Face "
                                       f"or TransformerLens model ({FAMILIES}; name or local folder; names need "
                                       "internet access).")
    if choice in BUILTIN_MODELS:
        return "builtin", choice
    if choice == RANDOM_TINY:
        return "random", RANDOM_TINY  # a built-in of interp.load too
    if choice == CHECKPOINT:
        upload = st.sidebar.file_uploader("Upload a checkpoint", type=["safetensors"], key="ckpt_upload")
        path = ""
        if served_folder() is not None:
            path = st.sidebar.text_input("... or a file in the served folder", key="ckpt_path",
                                         help="a path relative to the folder given to interp dashboard --files")
        if upload is not None:
            return "checkpoint", _saved_upload(upload.getvalue())
        if path.strip():
            try:
                return "checkpoint", str(served_file(path))
            except (FileNotFoundError, ValueError) as e:
                st.error(str(e))
                return None
        st.info("Upload an interp checkpoint" + (" or type its path in the sidebar." if served_folder() else "."))
        return None
    if choice == TL_NAME:
        name = st.sidebar.text_input("Model name or local folder for TransformerBridge.boot_transformers",
                                     key="tl_name", placeholder="gpt2")
        if not name.strip():
            st.info(f"Type a model name that TransformerLens can boot ({FAMILIES} convert to interp) in the "
                    "sidebar.")
            return None
        try:
            return "tl", served_model_ref(name, "tl:")
        except FileNotFoundError as e:
            st.error(str(e))
            return None
    name = st.sidebar.text_input("Hugging Face model name or local folder", key="hf_name",
                                 placeholder="gpt2, bert-base-uncased, ./my-llama")
    if not name.strip():
        st.info(f"Type a Hugging Face model name ({FAMILIES}) or a local folder in the sidebar.")
        return None
    try:
        return "hf", served_model_ref(name)
    except FileNotFoundError as e:
        st.error(str(e))
        return None


def get_model(key: tuple[str, str]) -> interp.Transformer | None:
    """Load the model, turning any failure into a message (never a traceback)."""
    try:
        return load_model(*key)
    except FileNotFoundError as e:
        st.error(f"No such file: {e}")
    except ImportError as e:
        st.error(f"A package is missing: {e}")
    except Exception as e:  # noqa: BLE001 - any loader failure is shown to the user, not raised
        what = "checkpoint" if key[0] == "checkpoint" else "model"
        st.error(f"Could not load the {what} {Path(key[1]).name if key[0] == 'checkpoint' else key[1]!r}: {e}")
    return None


# --- text -------------------------------------------------------------------------------------------------
def _is_token_id_model(model: interp.Transformer) -> bool:
    return type(model.tokenizer).__name__ == "TokenIdTokenizer"


def example_texts(model: interp.Transformer) -> dict[str, str]:
    """Examples that suit the model: sentences, or ``t<id>`` strings for token-id models."""
    if not _is_token_id_model(model):
        return dict(EXAMPLE_SENTENCES)
    from interp.data import repeated_sequences

    bos = getattr(model.tokenizer, "bos_id", None)
    half = min(12, (model.cfg.n_ctx - 1) // 2)
    rep = repeated_sequences(1, half, model.cfg.d_vocab, seed=1, bos_id=bos)[0]
    rnd = repeated_sequences(1, half, model.cfg.d_vocab, seed=2, bos_id=bos)[0, : half + 1]
    return {"Repeated random tokens": " ".join(model.tokenizer.to_str_tokens(rep)),
            "Random tokens": " ".join(model.tokenizer.to_str_tokens(rnd))}


def choose_text(model: interp.Transformer) -> str:
    examples = example_texts(model)
    pick = st.sidebar.selectbox("Example", ["(type your own)", *examples], key="example")
    default = examples[pick] if pick in examples else next(iter(examples.values()))
    state = st.session_state
    # The text box follows the example chosen; a typed text stays until another example is picked. Streamlit
    # forgets a widget's value on runs that do not draw it (pages without text), so keep a copy under
    # "text_value" and restore the box from it.
    if state.get("_example_for") != (pick, model.name):
        state["text"] = state["text_value"] = default
        state["_example_for"] = (pick, model.name)
    elif "text" not in state:
        state["text"] = state.get("text_value", default)
    hint = "token ids like `t5 t17 t5` (this model has no text tokenizer)" if _is_token_id_model(model) else "text"
    text = st.sidebar.text_area(f"Input ({hint})", key="text", height=120)
    state["text_value"] = text
    return text


def tokenize(model: interp.Transformer, text: str) -> tuple[torch.Tensor, str | None]:
    """``[1, T]`` ids of ``text``, truncated to the context with a notice.

    Raises:
        ValueError: empty text, a model without tokenizer, or text the tokenizer rejects.
    """
    if not text.strip():
        raise ValueError("The input is empty: type some text or pick an example.")
    if model.tokenizer is None:
        raise ValueError(f"Model {model.name!r} has no tokenizer, so it cannot read text.")
    ids = model.tokenizer.to_tokens(text, max_length=None)  # [1, T], untruncated so we can tell the user
    n_ctx = model.cfg.n_ctx
    if ids.shape[1] > n_ctx:
        note = (f"The input has {ids.shape[1]} tokens, more than the model's context of {n_ctx}: "
                f"only the first {n_ctx} are used.")
        return ids[:, :n_ctx], note
    return ids, None


# --- data sizes: each page's first view of a ~100M-parameter model takes seconds ----------------------------
#: Above this many parameters a model gets the smaller defaults (SmolLM2-135M does; the toy models do not).
LARGE_MODEL_PARAMS = 20_000_000


def default_sizes(model: interp.Transformer) -> dict[str, int]:
    """The data sizes every page starts from: smaller for a large model, so a first view takes seconds.

    ``head_texts``: example sentences of the head map's positional pass; ``head_seqs`` / ``head_half``: its
    repeated random sequences (induction, copying); ``ind_seqs`` / ``ind_half``: the Induction page's;
    ``prune_seqs`` / ``prune_half``: the pruning objective's repeated sequences (train and held out);
    ``prune_points``: about this many pruning steps per curve; ``prune_seeds``: random-pruning seeds;
    ``batch``: sequences per forward pass of the analyses.
    """
    n_params = sum(p.numel() for p in model.parameters())
    half = min(16, (model.cfg.n_ctx - 2) // 2)
    if n_params <= LARGE_MODEL_PARAMS:
        return {"head_texts": len(EXAMPLE_SENTENCES) + len(PRUNING_SENTENCES), "head_seqs": 16, "head_half": 0,
                "ind_seqs": 16, "ind_half": 10, "prune_seqs": 16, "prune_half": half, "prune_points": 8,
                "prune_seeds": 3, "batch": 32}
    # One batch of 8: the progress bar and the partial maps still move layer by layer inside it, and on two
    # cores one pass of 8 sequences is quicker than two of 4.
    return {"head_texts": len(EXAMPLE_SENTENCES), "head_seqs": 8, "head_half": 16,
            "ind_seqs": 8, "ind_half": 10, "prune_seqs": 8, "prune_half": min(half, 12), "prune_points": 4,
            "prune_seeds": 1, "batch": 8}


# --- results on disk (keyed by the model's weights hash, the data and the options) ----------------------
def model_hash(key: tuple[str, str]) -> str:
    """The weights hash of the model ``key`` names (computed once per loaded model)."""
    return results_cache.weights_hash(load_model(*key))


def _partial_none(event: progress.Event) -> None:
    return None


#: Seconds between two progress-bar redraws, and between two partial-result drawings (each partial figure is
#: drawn anew by the browser, which shares the cores with the computation).
BAR_EVERY_S, PARTIAL_EVERY_S = 0.25, 1.0


def run_with_progress(label: str, compute: Callable[[], Any],
                      partial: Callable[[progress.Event], Any] = _partial_none) -> Any:
    """``compute()`` under a progress bar that every library bar inside it moves (interp.progress.listen), with
    ``partial(event)`` drawing partial results as they come; both are removed when it returns.

    The bar is redrawn at most every :data:`BAR_EVERY_S`, partial results at most every :data:`PARTIAL_EVERY_S`
    and not in the first second (a quick computation is not slowed down by drawing what it is about to show)."""
    bar = st.progress(0.0, text=f"{label} ...")
    t0 = time.monotonic()
    last = {"bar": 0.0, "partial": t0}

    def on_event(event: progress.Event) -> None:
        now = time.monotonic()
        if now - last["bar"] < BAR_EVERY_S and event.fraction not in (0.0, 1.0):
            return  # the page, not the computation, would be the bottleneck
        last["bar"] = now
        done = event.fraction
        bar.progress(done if done is not None else 0.0,
                     text=f"{label}: {event.desc} {event.done:.1f}/{event.total or '?'} ({now - t0:.0f} s)")
        if now - last["partial"] >= PARTIAL_EVERY_S:
            last["partial"] = now
            partial(event)

    try:
        with progress.listen(on_event):
            return compute()
    finally:
        bar.empty()


def disk_cached(kind: str, label: str, options: Callable[..., dict[str, Any]] | None = None) -> Callable:
    """Cache a ``fn(key, *args)`` of the dashboard on disk under (weights hash of ``key``'s model, ``options``).

    ``options(*args)`` gives the JSON options of the key (default: the arguments as they are); a miss runs ``fn``
    under :func:`run_with_progress`. The wrapper returns ``{"value", "seconds", "cached"}``; ``.clear()`` drops
    every stored result of the kind.
    """
    def decorate(fn: Callable[..., Any]) -> Callable[..., dict[str, Any]]:
        def wrapper(key: tuple[str, str], *args: Any,
                    partial: Callable[[progress.Event], Any] = _partial_none) -> dict[str, Any]:
            opts = options(*args) if options is not None else {"args": [list(a) if isinstance(a, tuple) else a
                                                                        for a in args]}
            ckey = results_cache.key_of(kind, model_hash(key), opts)

            def compute() -> dict[str, Any]:
                t0 = time.perf_counter()
                value = run_with_progress(label, lambda: fn(key, *args), partial)
                return {"value": value, "seconds": time.perf_counter() - t0}

            out, hit = results_cache.cached(kind, ckey, compute)
            return {**out, "cached": hit}

        wrapper.clear = lambda: results_cache.clear(kind)  # type: ignore[attr-defined]
        wrapper.__name__ = fn.__name__
        wrapper.__doc__ = fn.__doc__
        return wrapper

    return decorate


def cost_caption(result: dict[str, Any], what: str) -> str:
    """One line under a figure: the data it used and what it cost (or that it came from the disk cache)."""
    took = f"computed in {result['seconds']:.1f} s"
    return f"{what}; {took} on its first view" + (", now read from the disk cache" if result["cached"] else "")


def _pattern_data(key: tuple[str, str], ids: tuple[int, ...]) -> dict[str, Any]:
    model = load_model(*key)
    tokens = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        _, trace = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_result")))
    counts = head_counts(model)
    H, T = max(counts, default=0), len(ids)
    # Layers may hold different head counts (a pruned model): a head a layer lacks is NaN (drawn blank).
    patterns = np.full((len(counts), H, T, T), np.nan, dtype=np.float32)  # [L, H_max, T, S]
    norms = np.full((len(counts), H), np.nan)  # [L, H_max]
    for layer, n in enumerate(counts):
        if n:
            patterns[layer, :n] = trace.pattern(layer)[0].float().numpy()  # [H_l, T, S]
            norms[layer, :n] = trace.head_out(layer)[0].float().norm(dim=-1).mean(0).numpy()  # [T, H_l] -> [H_l]
    return {"patterns": patterns, "norms": norms, "n_heads": counts,
            # A checkpoint without a tokenizer still has token ids to label the axes with.
            "str_tokens": model.to_str_tokens(tokens) if model.tokenizer is not None else [f"t{i}" for i in ids]}


_pattern_cached = disk_cached("patterns", "Running the model")(_pattern_data)


def pattern_data(key: tuple[str, str], ids: tuple[int, ...]) -> dict[str, Any]:
    """Attention patterns ``[L, H_max, T, S]`` and per-head write norms ``[L, H_max]`` (NaN for heads a layer lacks),
    heads per layer and token labels of ``ids`` (disk-cached)."""
    return _pattern_cached(key, ids)["value"]


pattern_data.clear = _pattern_cached.clear  # type: ignore[attr-defined]


def _file_option(path: str | None) -> dict[str, Any] | None:
    return None if not path else {"path": str(path), "sha256": results_cache.file_digest(path)}


@disk_cached("head_report", "Classifying heads (positional, induction, copying scores)",
             options=lambda treebank, max_sentences, coref, n_texts, n_seqs, half_len, batch: {
                 "treebank": _file_option(treebank), "max_sentences": max_sentences, "coref": _file_option(coref),
                 "n_texts": n_texts, "n_seqs": n_seqs, "half_len": half_len, "batch": batch})
def head_report(key: tuple[str, str], treebank: str | None, max_sentences: int, coref: str | None,
                n_texts: int, n_seqs: int, half_len: int, batch: int) -> Any:
    from interp.analysis import classify_heads

    model = load_model(*key)
    kwargs: dict[str, Any] = {"n_seqs": n_seqs, "half_len": half_len or None, "batch_size": batch}
    if model.tokenizer is not None and not _is_token_id_model(model):
        kwargs["texts"] = (list(EXAMPLE_SENTENCES.values()) + PRUNING_SENTENCES)[:n_texts]
    if treebank:
        kwargs.update(conllu=treebank, max_sentences=max_sentences)
    if coref:
        kwargs["coref"] = coref
    return classify_heads(model, **kwargs)


@disk_cached("induction", "Scoring heads on repeated sequences")
def induction_data(key: tuple[str, str], n_seqs: int, half_len: int, batch: int = 32) -> dict[str, Any]:
    from interp.analysis import induction_scores, repeated_tokens_for

    model = load_model(*key)
    tokens = repeated_tokens_for(model, n_seqs, half_len, seed=0)
    out: dict[str, Any] = {"scores": induction_scores(model, tokens, batch_size=batch),
                           "example": tokens[0].tolist()}
    cfg = model.cfg
    if cfg.causal and cfg.unembed:
        from interp.analysis import in_context_gain

        bos = tokens.shape[1] == 2 * half_len + 1
        out["losses"] = in_context_gain(model, tokens, half_len, bos=bos)
    return out


def partial_induction_map(model: interp.Transformer, slot: Any) -> Callable[[progress.Event], None]:
    """A progress listener that draws the induction scores folded so far into ``slot`` (an ``st.empty``), layer
    by layer as the pass goes: the layers not reached yet are blank."""
    from interp.analysis.induction import induction_table

    L = model.cfg.n_layers

    def draw(event: progress.Event) -> None:
        if "induction" not in event.desc or not event.state or not event.total:
            return
        reached = L if event.done >= 1 else max(1, round(event.done * L))
        where = f"layers 0-{reached - 1}" if event.done < 1 else f"{event.done:.1f} of {event.total} batches"
        try:
            fig = viz.induction_map(induction_table(model, list(event.state), 0),
                                    title=f"partial results, so far: {where}")
        except Exception:  # noqa: BLE001 - nothing folded yet (all NaN): nothing to draw yet
            return
        slot.plotly_chart(fig, width="stretch", key=f"fig_partial_{time.monotonic_ns()}")

    return draw


def pruning_setup(model: interp.Transformer) -> tuple[Any, list[Any]]:
    """The objective and evaluation batches used for pruning this model: the library's task (``build_task``
    picks repeated sequences for a decoder, the sentences below for an encoder), smaller for the browser."""
    from interp.pruning import build_task

    sizes = default_sizes(model)
    task = build_task(model, data={"n_seqs": sizes["prune_seqs"], "half_len": sizes["prune_half"], "eval_seed": 123,
                                   "texts": PRUNING_SENTENCES, "batch_size": 8})
    return task.objective, task.held_out


@st.cache_data(show_spinner="Evaluating the model with these heads off ...", max_entries=256)
def gated_scores(key: tuple[str, str], heads_off: tuple[tuple[int, int], ...]) -> dict[str, float]:
    """Loss and metric of the model with ``heads_off`` gated to zero."""
    from interp.pruning import head_mask

    model = load_model(*key)
    objective, batches = pruning_setup(model)
    pruned = [torch.zeros(n, dtype=torch.bool) for n in head_counts(model)]  # [H_layer] per layer
    for layer, head in heads_off:
        pruned[layer][head] = True
    with torch.no_grad(), head_mask(model, pruned):
        loss = float(np.mean([float(objective.loss(model, b)) for b in batches]))
        metric = float(objective.metric(model, batches))
    return {"loss": loss, "metric": metric, "metric_name": objective.metric_name}


def pruning_key(key: tuple[str, str], method: str, step: int) -> str:
    """The results-cache key of one pruning curve of the model ``key`` names."""
    sizes = default_sizes(load_model(*key))
    return results_cache.key_of("pruning", model_hash(key), {
        "method": method, "step": step, "seeds": list(range(sizes["prune_seeds"])), "n_seqs": sizes["prune_seqs"],
        "half_len": sizes["prune_half"]})


def run_pruning(model: interp.Transformer, plan: list[tuple[str, str]], step: int,
                report: Callable[[float, str], None]) -> dict[str, Any]:
    """Prune ``model`` with each ``(method, cache key)`` of ``plan``, in a background job (so it touches no
    Streamlit state); every curve lands in the disk cache as soon as it is done. Returns ``{method: curve}``."""
    from interp.pruning import importance_curve, random_curve

    objective, batches = pruning_setup(model)
    n_points = sum(head_counts(model)) // step + 1
    seeds = tuple(range(default_sizes(model)["prune_seeds"]))
    out = {}
    for m_i, (method, ckey) in enumerate(plan):
        hit, curve = results_cache.load("pruning", ckey)
        if not hit:
            t0 = time.monotonic()
            report(m_i / len(plan), f"{method}: starting")
            if method == "importance":
                def tick(curve: Any, m_i: int = m_i, t0: float = t0) -> None:
                    done = min(1.0, len(curve.points) / n_points)  # the growing curve, one point per step
                    report((m_i + done) / len(plan), f"importance: {len(curve.points)} of {n_points} points "
                                                     f"({time.monotonic() - t0:.0f} s)")

                curve = importance_curve(model, batches, objective, step=step, on_point=tick, progress=False)
            else:
                def point_tick(curve: Any, m_i: int = m_i, t0: float = t0) -> None:
                    k = seeds.index(int(curve.config["seed"]))  # seeds run in order: k of them are finished
                    done = (k + min(1.0, len(curve.points) / n_points)) / len(seeds)
                    report((m_i + done) / len(plan), f"random: seed {k + 1} of {len(seeds)}, {len(curve.points)} of "
                                                     f"{n_points} points ({time.monotonic() - t0:.0f} s)")

                curve = random_curve(model, batches, objective, step=step, seeds=seeds, on_point=point_tick,
                                     progress=False)
            results_cache.store("pruning", ckey, curve)
        out[method] = curve
    return out


#: Seconds between two redraws of a background job's progress (each is a script run of its own).
POLL_S = 1.0


def show_job(job: jobs.Job) -> None:
    """The progress of a background job, redrawn every :data:`POLL_S` seconds (only this part of the page reruns,
    so the rest stays usable); the whole page reruns when the job ends, to draw its results."""
    @st.fragment(run_every=POLL_S)
    def poll() -> None:
        fraction, text = job.progress
        st.progress(fraction, text=f"{job.label}: {text} (runs in the background; the other pages stay usable)")
        if job.done:
            st.rerun()

    poll()


# --- pages ------------------------------------------------------------------------------------------------
def page_attention(key: tuple[str, str], model: interp.Transformer, ids: torch.Tensor) -> None:
    result = _pattern_cached(key, tuple(ids[0].tolist()))
    data = result["value"]
    st.caption(cost_caption(result, f"one forward pass over the {ids.shape[1]} tokens of the input"))
    pats, toks = data["patterns"], data["str_tokens"]
    counts = data.get("n_heads") or [pats.shape[1]] * pats.shape[0]
    L, T = pats.shape[0], pats.shape[2]
    uniform = len(set(counts)) == 1
    views = ["One head", "All heads of a layer"] + (["All layers x heads"] if uniform else [])
    view = st.radio("View", views, horizontal=True, key="attn_view")
    if not uniform:
        st.caption(f"Heads per layer: {counts} (a pruned model): the layer x head grid needs equal counts.")
    if view == "One head":
        c1, c2 = st.columns(2)
        layer = c1.selectbox("Layer", [i for i in range(L) if counts[i]], key="attn_layer")
        # Per-layer head counts: one box per count, so a head picked in a wider layer is never out of range.
        head = c2.selectbox("Head", range(counts[layer]), key="attn_head" if uniform else f"attn_head_{counts[layer]}")
        st.plotly_chart(viz.attention_heatmap(pats[layer, head], toks, title=f"layer {layer}, head {head}"),
                        width="stretch", key="fig_attn_head")
        top = pats[layer, head].argmax(-1)
        st.caption("Each query's strongest key: " + ", ".join(
            f"{toks[q]} → {toks[k]}" for q, k in list(enumerate(top))[: min(T, 12)]) + (" ..." if T > 12 else ""))
    elif view == "All heads of a layer":
        layer = st.selectbox("Layer", [i for i in range(L) if counts[i]], key="attn_layer_all")
        st.plotly_chart(viz.layer_heads(pats[layer, :counts[layer]], toks, layer=layer, cols=min(counts[layer], 6),
                                        n_kv_heads=_kv_heads(model)), width="stretch", key="fig_attn_layer")
    else:
        n = min(T, MAX_GRID_TOKENS)
        if n < T:
            st.warning(f"The grid shows the first {n} of {T} tokens (one small heatmap per head).")
        st.plotly_chart(viz.head_grid(pats[:, :, :n, :n], toks[:n], n_kv_heads=_kv_heads(model)), width="stretch",
                        key="fig_attn_grid")


def _kv_heads(model: interp.Transformer) -> int | None:
    """K/V heads per layer when every layer groups its query heads alike (GQA / MQA), else None."""
    cfg = model.cfg
    shapes = {cfg.layer(layer) for layer in range(cfg.n_layers)}
    if cfg.attention != "standard" or len(shapes) != 1:
        return None
    shape = next(iter(shapes))
    return shape.n_kv_heads if shape.uniform_groups and shape.n_kv_heads < shape.n_heads else None


#: Above this many heads the mass-by-target panel shows one layer, or the largest head per layer.
MAX_POSITIONAL_ROWS = 48


def positional_columns(pos: Any) -> list[str]:
    """The mass columns worth drawing: offsets -2..+1 and first / delimiter, minus those no query can reach (the
    +1 column of a causal model is all NaN)."""
    wanted = [f"mass_{t}" for t in ("-2", "-1", "0", "+1", "first", "delimiter")]
    return [c for c in wanted if c in pos.columns and pos[c].notna().any()]

def page_head_map(key: tuple[str, str], model: interp.Transformer, ids: torch.Tensor) -> None:
    st.markdown("Each head is classified from its attention statistics (positional offsets, previous-token, "
                "duplicate-token, induction, copying and, with a treebank, syntactic relations; with coreference data, "
                "coreference).")
    treebank = None
    coref = None
    if model.tokenizer is not None and not _is_token_id_model(model):
        # The treebank and the coreference data are the user's files (for example UD English EWT dev, GAP
        # validation); the app hard-codes no data path.
        ud = st.text_input("CoNLL-U treebank for syntactic heads (path; slower)", key="treebank_path").strip()
        if ud and not Path(ud).is_file():
            st.warning(f"No file at {ud!r}: syntactic heads skipped.")
        elif ud:
            treebank = ud
        gap = st.text_input("Coreference data for coreference heads (GAP .tsv or CorefUD .conllu path; slower)",
                            key="coref_path").strip()
        if gap and not Path(gap).is_file():
            st.warning(f"No file at {gap!r}: coreference heads skipped.")
        elif gap:
            coref = gap
    sizes = default_sizes(model)
    with st.expander("Data sizes", expanded=False):
        c1, c2 = st.columns(2)
        n_texts = sizes["head_texts"]
        if "texts" in _head_data_kinds(model):
            n_texts = c1.slider("Example sentences (positional pass)", 1,
                                len(EXAMPLE_SENTENCES) + len(PRUNING_SENTENCES), sizes["head_texts"], key="head_texts")
        n_seqs = c2.slider("Repeated random sequences (induction, copying)", 4, 64, sizes["head_seqs"], step=4,
                           key="head_seqs")
    slot = st.empty()
    try:
        result = head_report(key, treebank, 200, coref, n_texts, n_seqs, sizes["head_half"], sizes["batch"],
                             partial=partial_induction_map(model, slot))
    except Exception as e:  # noqa: BLE001 - shown to the user
        slot.empty()
        st.error(f"Could not classify the heads: {e}")
        return
    slot.empty()
    report = result["value"]
    data_words = (f"{n_texts} example sentences" if "texts" in _head_data_kinds(model) else "random tokens")
    half = sizes["head_half"] or "default"
    st.caption(cost_caption(result, f"data: {data_words} and {n_seqs} repeated random sequences (half length "
                                    f"{half}){', the treebank' if treebank else ''}"
                                    f"{', the coreference data' if coref else ''}"))
    st.plotly_chart(viz.head_map(report, title=f"head taxonomy of {model.name}"), width="stretch",
                    key="fig_head_map")
    with st.expander("All kinds found (table)", expanded=False):
        st.dataframe(report.df, width="stretch", hide_index=True)
    for name, cor in getattr(report, "details", {}).items():
        if name.startswith("coreference:"):
            st.plotly_chart(viz.coreference_figure(cor, title=f"{name}: pronoun -> antecedent accuracy"),
                            width="stretch", key=f"fig_{name}")
    data = pattern_data(key, tuple(ids[0].tolist()))
    c1, c2 = st.columns(2)
    with c1:
        st.plotly_chart(viz.head_norms_figure(data["norms"], title="residual-write norm on the input text"),
                        width="stretch", key="fig_head_norms")
    pos = report.details.get("positional") if hasattr(report, "details") else None
    with c2:
        if pos is not None:
            cols = positional_columns(pos) or None
            L, n_heads = model.cfg.n_layers, sum(head_counts(model))
            if n_heads <= MAX_POSITIONAL_ROWS:
                fig = viz.positional_map(pos, cols, title="attention mass by target")
            else:
                rows = st.selectbox("Rows", ["largest head of each layer", *(f"layer {i}" for i in range(L))],
                                    key="positional_rows",
                                    help=f"{n_heads} heads do not fit one screen: aggregate, or pick a layer")
                if rows.startswith("layer "):
                    layer = int(rows.split()[1])
                    fig = viz.positional_map(pos, cols, layers=[layer], title=f"attention mass by target, layer {layer}")
                else:
                    fig = viz.positional_map(pos, cols, aggregate=True,
                                             title="attention mass by target (largest head of each layer)")
            st.plotly_chart(fig, width="stretch", key="fig_positional")


def _head_data_kinds(model: interp.Transformer) -> set[str]:
    """What the head map's positional pass reads: example sentences (a text tokenizer) or random tokens."""
    return {"texts"} if model.tokenizer is not None and not _is_token_id_model(model) else {"random"}


def page_induction(key: tuple[str, str], model: interp.Transformer) -> None:
    st.markdown("Random token sequences repeated once: an **induction head** attends from the second copy of a "
                "token to the token after its first copy, and a **previous-token** head feeds it.")
    c1, c2 = st.columns(2)
    max_half = max(2, min(25, (model.cfg.n_ctx - 2) // 2))
    sizes = default_sizes(model)
    half_len = c1.slider("Length of the repeated half", 2, max_half, min(sizes["ind_half"], max_half), key="ind_half")
    n_seqs = c2.slider("Sequences", 4, 64, sizes["ind_seqs"], step=4, key="ind_n")
    slot = st.empty()
    try:
        result = induction_data(key, n_seqs, half_len, sizes["batch"], partial=partial_induction_map(model, slot))
    except Exception as e:  # noqa: BLE001 - shown to the user
        slot.empty()
        st.error(f"Could not score the heads: {e}")
        return
    slot.empty()
    data = result["value"]
    st.caption(cost_caption(result, f"data: {n_seqs} random sequences of {half_len} tokens, each repeated once "
                                    f"(default {sizes['ind_seqs']} for this model)"))
    scores = data["scores"]
    if "losses" in data:
        loss = data["losses"]
        m1, m2, m3 = st.columns(3)
        m1.metric("Loss, first half (nats)", f"{loss['first']:.3f}")
        m2.metric("Loss, repeated half", f"{loss['repeated']:.3f}", delta=f"{-loss['gain']:.3f}",
                  delta_color="inverse")
        m3.metric("In-context gain", f"{loss['gain']:.3f}")
    st.plotly_chart(viz.induction_map(scores), width="stretch", key="fig_induction_map")
    best = scores.sort_values("induction", ascending=False).iloc[0]
    layer, head = int(best["layer"]), int(best["head"])
    st.subheader(f"Strongest induction head: L{layer}H{head} (score {best['induction']:.2f})")
    ex = tuple(data["example"])
    pats = pattern_data(key, ex)
    st.plotly_chart(viz.attention_heatmap(pats["patterns"][layer, head], pats["str_tokens"],
                                          title=f"L{layer}H{head} on a repeated sequence"),
                    width="stretch", key="fig_induction_head")
    with st.expander("Scores (table)"):
        st.dataframe(scores, width="stretch", hide_index=True)


_METRIC_HAS_ARROW = "delta_arrow" in inspect.signature(st.metric).parameters
#: What each pruning metric measures, in words.
METRIC_WORDS = {"accuracy": "next-token accuracy on the repeated half", "neg_loss": "minus the next-token loss",
                "cosine_to_unpruned": "cosine similarity of sentence embeddings to the unpruned model's"}


def metric_delta(change: float, *, higher_is_better: bool, digits: int = 4) -> dict[str, Any]:
    """``st.metric`` delta arguments: green when the change is better, red when worse, grey without an arrow
    when it rounds to zero (a +0.0000 is no change)."""
    if round(change, digits) == 0:
        arrow = {"delta_arrow": "off"} if _METRIC_HAS_ARROW else {}  # Streamlit >= 1.50 can drop the arrow
        return {"delta": f"±{0:.{digits}f}", "delta_color": "off", **arrow}
    return {"delta": f"{change:+.{digits}f}", "delta_color": "normal" if higher_is_better else "inverse"}


def _head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def head_counts(model: interp.Transformer) -> list[int]:
    """Heads in each layer: equal for a model as built, per layer after :func:`interp.pruning.remove_heads`."""
    return [block.attn.n_heads for block in model.blocks]


def head_labels(model: interp.Transformer) -> dict[str, tuple[int, int]]:
    """``"L{layer}H{head}"`` -> ``(layer, head)`` for every head the model has, layer by layer."""
    return {_head_label(layer, head): (layer, head)
            for layer, n in enumerate(head_counts(model)) for head in range(n)}


def saved_curve_files(results: Path | None) -> list[str]:
    """Curve JSON files the pruning experiments wrote (``prune_*/<method>.json`` under ``results``, the checkout's
    ``experiments/results``), relative to ``results``; empty when there is no such folder."""
    if results is None:
        return []
    files = [*results.glob("prune_*.json"), *results.glob("prune_*/*.json")]
    return sorted(str(p.relative_to(results)) for p in files if p.name != "summary.json")


def served_curves(typed: str) -> list[Path]:
    """The curve files ``typed`` names inside the served folder: a curve file, or a run folder written by
    ``interp prune --out DIR`` / ``run_experiment`` (its ``<method>.json`` curves; not ``summary.json`` nor the
    per-point files under ``partial/``).

    Raises:
        FileNotFoundError: the path is not available (see :func:`served_file`), or a folder without curves.
        ValueError: a file larger than :data:`MAX_CURVE_MB`.
    """
    folder = served_folder()
    if folder is not None and typed.strip():
        try:
            path = (folder / typed.strip()).resolve(strict=True)
        except (OSError, RuntimeError):
            path = None
        if path is not None and path.is_dir() and path.is_relative_to(folder):
            files = sorted(f for f in path.glob("*.json") if f.name != "summary.json")
            if not files:
                raise FileNotFoundError(f"{typed!r} holds no pruning curve (<method>.json, as interp prune --out "
                                        "DIR writes)")
            return [served_file(str(f), MAX_CURVE_MB) for f in files]  # each checked: no link out of the folder
    return [served_file(typed, MAX_CURVE_MB)]


def page_pruning(key: tuple[str, str], model: interp.Transformer) -> None:
    from interp.pruning import LanguageModelObjective, PruningCurve, auc_table

    try:
        objective, batches = pruning_setup(model)
    except ValueError as e:
        st.error(str(e))
        return
    what = ("next-token cross-entropy on the repeated half of repeated random sequences"
            if isinstance(objective, LanguageModelObjective)
            else "1 - cosine similarity of sentence embeddings to the unpruned model's")
    metric = METRIC_WORDS.get(objective.metric_name, objective.metric_name)
    st.markdown(f"Loss (lower is better): **{what}**. Metric (higher is better): **{metric}** "
                f"(`{objective.metric_name}`).")

    st.subheader("Switch heads off")
    labels = head_labels(model)
    n_heads = len(labels)
    off = st.multiselect("Heads to switch off", list(labels), key="heads_off")
    heads_off = tuple(labels[x] for x in off if x in labels)
    base = gated_scores(key, ())
    now = gated_scores(key, heads_off)
    c1, c2, c3 = st.columns(3)
    c1.metric("Heads off", f"{len(heads_off)} / {n_heads}")
    c2.metric("Loss (lower is better)", f"{now['loss']:.4f}",
              **metric_delta(now["loss"] - base["loss"], higher_is_better=False))
    c3.metric(f"{now['metric_name']} (higher is better)", f"{now['metric']:.4f}",
              **metric_delta(now["metric"] - base["metric"], higher_is_better=True))

    st.subheader("Pruning curves")
    source = st.radio("Curves", ["Run on this model", "Load a saved curve"], horizontal=True, key="curve_source")
    curves: list[PruningCurve] = []
    if source == "Load a saved curve":
        results = checkout_results()
        found = saved_curve_files(results)
        picked = st.multiselect("Saved curves in experiments/results/", found,
                                key="curve_files") if results is not None and found else []
        upload = st.file_uploader("... or upload a curve (.json from PruningCurve.save)", type=["json"],
                                  key="curve_upload")
        typed = ""
        if served_folder() is not None:
            typed = st.text_input("... or a curve file, or a folder written by interp prune --out, in the served "
                                  "folder", key="curve_path")
        paths = [results / name for name in picked if results is not None and name in found]
        if typed.strip():
            try:
                paths.extend(served_curves(typed))
            except (FileNotFoundError, ValueError) as e:
                st.error(str(e))
        for path in paths:
            try:
                import json

                curves.append(PruningCurve.from_dict(json.loads(read_limited(path, MAX_CURVE_MB))))
            except Exception as e:  # noqa: BLE001 - shown to the user
                st.error(f"{path.name} is not a pruning curve (JSON written by PruningCurve.save): {e}")
        if upload is not None:
            try:
                import json

                curves.append(PruningCurve.from_dict(json.loads(upload.getvalue())))
            except Exception as e:  # noqa: BLE001 - shown to the user
                st.error(f"{upload.name} is not a pruning curve (JSON written by PruningCurve.save): {e}")
    elif len(set(head_counts(model))) != 1:
        st.info(f"This model's layers hold different head counts ({head_counts(model)}, a model reduced by "
                "remove_heads): the pruning methods prune a model with equal counts. Prune the original model, "
                "or load a saved curve.")
    else:
        c1, c2 = st.columns(2)
        methods = c1.multiselect("Methods", ["importance", "random"], default=["importance", "random"],
                                 key="curve_methods")
        sizes = default_sizes(model)
        default_step = max(1, n_heads // sizes["prune_points"])  # about that many points per curve
        steps = sorted({s for s in (1, 2, 4, 8, 16, max(1, n_heads // 4), default_step) if s <= n_heads})
        step = c2.select_slider("Heads pruned per step", options=steps, value=default_step,
                                key="curve_step") if len(steps) > 1 else 1
        plan = [(m, pruning_key(key, m, step)) for m in methods]
        stored = {m: results_cache.load("pruning", k) for m, k in plan}
        job_key = "|".join(k for _, k in plan)
        job = jobs.get(job_key) if plan else None
        running = job is not None and not job.done
        if st.button("Run", key="curve_run", type="primary", disabled=running or not plan):
            job = jobs.start(job_key, f"pruning {model.name}",
                             lambda report, model=model, plan=plan, step=step: run_pruning(model, plan, step, report))
            running = not job.done
        if running and job is not None:
            show_job(job)
        elif job is not None and job.error:
            st.error(f"The pruning run failed: {job.error}")
        curves = [curve for m, (hit, curve) in stored.items() if hit]
        if job is not None and job.done and job.result:
            curves = [job.result[m] for m in methods if m in job.result]
        what_data = (f"{sizes['prune_seqs']} repeated random sequences of 2 x {sizes['prune_half']} tokens"
                     if isinstance(objective, LanguageModelObjective) else f"{len(PRUNING_SENTENCES)} sentences")
        n_points = n_heads // step + 1
        if not curves and not running:
            st.info(f"Press **Run** to prune this model step by step in the background: {n_points} points per curve "
                    f"on {what_data} (importance recomputed at each point, random over {sizes['prune_seeds']} "
                    f"seed{'s' if sizes['prune_seeds'] > 1 else ''}). The curves are "
                    "kept on disk for the next visit.")
        elif curves:
            st.caption(f"{n_points} points per curve on {what_data}; kept in the disk cache")
    if curves:
        st.plotly_chart(viz.pruning_curves(curves, baseline=curves[0].points[0].metric if curves[0].points else None,
                                           y_title=curves[0].metric_name,
                                           title=f"pruning curves of {curves[0].model_name or model.name}"),
                        width="stretch", key="fig_pruning")
        try:
            st.dataframe(auc_table(curves), hide_index=True)
        except Exception as e:  # noqa: BLE001 - a malformed curve only loses its AUC table
            st.caption(f"(no AUC table: {e})")


def _config_from_inputs(prefix: str, preset: interp.ModelConfig) -> interp.ModelConfig:
    c = st.columns(4)
    n_layers = c[0].number_input("Layers", 1, 1000, preset.n_layers, key=f"{prefix}_layers")
    n_heads = c[1].number_input("Query heads", 1, 1024, preset.n_heads, key=f"{prefix}_heads")
    d_head = c[2].number_input("d_head", 1, 4096, preset.d_head, key=f"{prefix}_dhead")
    d_model = c[3].number_input("d_model", 1, 65536, preset.d_model, key=f"{prefix}_dmodel")
    c = st.columns(4)
    kv = c[0].number_input("KV heads (this model)", 1, 1024, preset.n_kv_heads, key=f"{prefix}_kv")
    d_mlp = c[1].number_input("d_mlp (0 = no MLP)", 0, 262144, 0 if preset.attn_only else preset.d_mlp,
                              key=f"{prefix}_dmlp")
    gated = c[2].checkbox("Gated MLP (SwiGLU)", preset.activation in ("swiglu", "geglu"), key=f"{prefix}_gated")
    rotary = c[3].checkbox("Rotary positions", preset.positional == "rotary", key=f"{prefix}_rotary")
    return interp.ModelConfig(
        n_layers=int(n_layers), d_model=int(d_model), n_heads=int(n_heads), d_head=int(d_head), n_kv_heads=int(kv),
        attn_only=d_mlp == 0, d_mlp=int(d_mlp) or None, activation="swiglu" if gated else "gelu",
        positional="rotary" if rotary else "learned", normalization="rms" if rotary else "pre",
        d_vocab=32000, n_ctx=1 << 20)


def page_costs(model: interp.Transformer | None) -> None:
    st.markdown("KV-cache memory per token and FLOPs per layer, from a configuration. The other attention kinds "
                "are derived from it: GQA with fewer KV heads, MQA with one, MLA caching a latent.")
    presets = {}
    if model is not None and model.cfg.attention == "standard":
        presets[f"This model ({model.name})"] = model.cfg  # first: the page starts from the selected model
    presets["Worked example: 80 layers, 64 heads x 128 (Llama-2-70B size)"] = worked_example_config()
    name = st.selectbox("Start from", list(presets), key="cost_preset")
    prefix = "cost" + hashlib.md5(name.encode()).hexdigest()[:6]
    try:
        cfg = _config_from_inputs(prefix, presets[name])
    except (ValueError, TypeError) as e:
        st.error(f"Not a valid configuration: {e}")
        return
    c = st.columns(5)
    dtype = c[0].selectbox("dtype", ["fp16", "bf16", "fp32", "fp8"], key="cost_dtype")
    batch = int(c[1].number_input("Batch", 1, 100000, 32, key="cost_batch"))
    tokens = int(c[2].number_input("Tokens per sequence", 1, 10_000_000, 4096, key="cost_tokens"))
    options = gqa_group_options(cfg.n_heads)
    own = cfg.n_kv_heads if cfg.kind == "gqa" else default_kv_groups(cfg.n_heads)
    groups = c[3].selectbox("GQA KV heads", options, index=options.index(own) if own in options else 0,
                            key=f"cost_groups_{cfg.n_heads}_{cfg.n_kv_heads}") if options else None
    # DeepSeek-V2's proportions: a latent of 4 x d_head (512 for d_head 128) plus a d_head / 2 rotary key. Keyed by
    # the head width so that a new starting model gets its own default, not the last one's.
    latent = int(c[4].number_input("MLA latent", 1, 65536, 4 * cfg.d_head, key=f"cost_latent_{cfg.d_head}",
                                   help="DeepSeek-V2 caches a 512-wide latent for d_head 128 (4 x d_head) plus a "
                                        "64-wide rotary key (d_head / 2); the default keeps those proportions"))
    try:
        table = kv_cache_table(cfg, batch=batch, tokens=tokens, dtype=dtype, n_kv_groups=groups,
                               kv_latent_dim=latent)
    except ValueError as e:
        st.error(str(e))
        return
    this = table[table["this_model"]].iloc[0] if table["this_model"].any() else table.iloc[0]
    m = st.columns(3)
    m[0].metric(f"KV cache per token ({this['kind'].upper()})", format_bytes(this["bytes_per_token"]))
    m[1].metric(f"For {batch} x {tokens} tokens", format_bytes(this["total_bytes"]))
    m[2].metric("Bytes per element", DTYPE_BYTES[dtype])
    per_token = st.toggle("Per token", value=False, key="cost_per_token")
    st.plotly_chart(viz.kv_cache_figure(table, batch=batch, tokens=tokens, per_token=per_token),
                    width="stretch", key="fig_kv")
    show = table.assign(per_token=table["bytes_per_token"].map(format_bytes),
                        total=table["total_bytes"].map(format_bytes))
    st.dataframe(show[["kind", "n_kv_heads", "cached_per_layer", "per_token", "total", "vs_mha", "this_model"]],
                 hide_index=True, width="stretch")

    st.subheader("FLOPs per layer")
    c = st.columns(2)
    mode = c[0].radio("Pass", ["Prefill", "One decoding step"], horizontal=True, key="flops_mode")
    seq = int(c[1].number_input("Context length", 1, 10_000_000, min(tokens, 4096), key="flops_seq"))
    if mode == "Prefill":
        flops = flops_per_layer(cfg, seq_len=seq, batch=batch)
    else:
        flops = flops_per_layer(cfg, seq_len=1, batch=batch, kv_len=seq)
    st.metric("Per layer", format_flops(flops["flops"].sum()),
              help="matrix products only, 2 FLOPs per multiply-add; x layers for the whole stack")
    st.plotly_chart(viz.flops_figure(flops), width="stretch", key="fig_flops")


# --- main -------------------------------------------------------------------------------------------------
def main() -> None:
    st.sidebar.title("interp")
    wanted = st.query_params.get("page")
    if "page" not in st.session_state and wanted in PAGES:
        st.session_state["page"] = wanted  # a link straight to a page: ?page=Head+map
    page = st.sidebar.radio("Page", PAGES, key="page")
    key = choose_model()
    model = get_model(key) if key is not None else None
    st.title(page)
    if page == "KV cache & FLOPs":
        page_costs(model)
        return
    if model is None:
        return
    cfg = model.cfg
    counts = head_counts(model)
    heads = f"x {counts[0]} heads" if len(set(counts)) == 1 else f"with {counts} heads"
    st.sidebar.caption(f"**{model.name}**: {cfg.kind.upper()}, {cfg.n_layers} layers {heads}, "
                       f"d_model {cfg.d_model}, context {cfg.n_ctx}, "
                       f"{'decoder' if cfg.causal else 'encoder'}")
    if page == "Induction":
        page_induction(key, model)
        return
    if page == "Pruning":
        page_pruning(key, model)
        return
    text = choose_text(model)
    try:
        ids, note = tokenize(model, text)
    except ValueError as e:
        if text.strip():
            st.error(f"Cannot read the input: {e}")
        else:
            st.info(str(e))
        return
    if note:
        st.warning(note)
    if page == "Attention patterns":
        page_attention(key, model, ids)
    else:
        page_head_map(key, model, ids)


main()
