"""The sidebar's model picker: built-ins, a random toy model, a local checkpoint, a Hugging Face or
TransformerLens name; the loaded model is shared by every session (``st.cache_resource``).

A model is named by a key ``(source, ref)``: ``source`` (``builtin``, ``random``, ``checkpoint``, ``hf``, ``tl``)
keeps the cache keys of the sidebar's choices apart and picks the error message; ``ref`` is what
:func:`interp.load` reads. URL query parameter ``?model=random-tiny`` preselects a choice.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

import interp
from interp.app import results_cache, serving
from interp.zoo.hf import FAMILIES

BUILTIN_MODELS = ("induction-2l", "minilm-l6", "smollm2-135m")
RANDOM_TINY = "random-tiny"
CHECKPOINT = "local checkpoint"
HF_NAME = "Hugging Face name"
TL_NAME = "TransformerLens name"
MODEL_CHOICES = (*BUILTIN_MODELS, RANDOM_TINY, CHECKPOINT, HF_NAME, TL_NAME)

ModelKey = tuple[str, str]
#: Session-state flag: this run follows a page switch (which resets every widget, the upload box included).
AFTER_SWITCH = "_after_page_switch"
#: Session-state key of the checkpoint uploaded last (its path in the session folder).
LAST_UPLOAD = "_last_upload"
#: Session-state flag: keep :data:`LAST_UPLOAD` while the upload box is empty (it was emptied by a page switch).
KEEP_UPLOAD = "_keep_upload"


@st.cache_resource(show_spinner="Loading the model ...", max_entries=4)
def load_model(source: str, ref: str) -> interp.Transformer:
    """The model named by ``(source, ref)``: ``interp.load(ref)``, cached across reruns and sessions.

    The weights hash of the results cache is computed here, once per loaded model (a second of hashing for a
    100M-parameter model belongs to loading it, not to the first page that reads a result).

    Args:
        source: the sidebar choice's kind (keeps cache keys apart).
        ref: the :func:`interp.load` name or path.

    Returns:
        The model.

    Raises:
        Exception: whatever :func:`interp.load` raises (:func:`get_model` shows it).
    """
    model = interp.load(ref)
    results_cache.weights_hash(model)
    return model


def model_hash(key: ModelKey) -> str:
    """The weights hash of the model ``key`` names (computed once per loaded model)."""
    return results_cache.weights_hash(load_model(*key))


def _checkpoint_choice() -> ModelKey | None:
    upload = st.sidebar.file_uploader("Upload a checkpoint", type=["safetensors"], key="ckpt_upload")
    path = ""
    if serving.served_folder() is not None:
        path = st.sidebar.text_input("... or a file in the served folder", key="ckpt_path",
                                     help="a path relative to the folder given to interp dashboard --files")
    state = st.session_state
    if upload is not None:
        state[LAST_UPLOAD] = serving.saved_upload(upload.getvalue())
        state.pop(KEEP_UPLOAD, None)
        return "checkpoint", state[LAST_UPLOAD]
    if state.get(AFTER_SWITCH):
        state[KEEP_UPLOAD] = True  # a page switch emptied the upload box, not the user
    if state.get(KEEP_UPLOAD) and state.get(LAST_UPLOAD) and Path(state[LAST_UPLOAD]).is_file():
        st.sidebar.caption("Using the checkpoint uploaded before; upload another to replace it.")
        return "checkpoint", state[LAST_UPLOAD]
    state.pop(LAST_UPLOAD, None)
    if path.strip():
        try:
            return "checkpoint", str(serving.served_file(path))
        except (FileNotFoundError, ValueError) as e:
            st.error(str(e))
            return None
    st.info("Upload an interp checkpoint" + (" or type its path in the sidebar." if serving.served_folder() else "."))
    return None


def _hub_choice(source: str) -> ModelKey | None:
    if source == "tl":
        name = st.sidebar.text_input("Model name or local folder for TransformerBridge.boot_transformers",
                                     key="tl_name", placeholder="gpt2")
        ask = f"Type a model name that TransformerLens can boot ({FAMILIES} convert to interp) in the sidebar."
    else:
        name = st.sidebar.text_input("Hugging Face model name or local folder", key="hf_name",
                                     placeholder="gpt2, bert-base-uncased, ./my-llama")
        ask = f"Type a Hugging Face model name ({FAMILIES}) or a local folder in the sidebar."
    if not name.strip():
        st.info(ask)
        return None
    try:
        return source, serving.served_model_ref(name, f"{source}:")
    except FileNotFoundError as e:
        st.error(str(e))
        return None


def choose_model() -> ModelKey | None:
    """The sidebar model picker.

    Returns:
        ``(source, ref)``, or None while the user still has to give a path or a name (a message says so).
    """
    wanted = st.query_params.get("model")
    if "model" not in st.session_state and wanted in MODEL_CHOICES:
        st.session_state["model"] = wanted
    choice = str(st.sidebar.selectbox("Model", MODEL_CHOICES, key="model",
                                  help="Built-in models, a tiny random model, a local interp checkpoint "
                                       "(.safetensors written by interp.zoo.save_checkpoint), or a Hugging Face "
                                       f"or TransformerLens model ({FAMILIES}; name or local folder; names need "
                                       "internet access)."))
    if choice != CHECKPOINT:
        st.session_state.pop(KEEP_UPLOAD, None)  # another model: a later visit to the upload box starts empty
    if choice in BUILTIN_MODELS:
        return "builtin", choice
    if choice == RANDOM_TINY:
        return "random", RANDOM_TINY  # a built-in of interp.load too
    if choice == CHECKPOINT:
        return _checkpoint_choice()
    return _hub_choice("tl" if choice == TL_NAME else "hf")


def get_model(key: ModelKey) -> interp.Transformer | None:
    """Load the model, turning any failure into a message (never a traceback).

    Args:
        key: ``(source, ref)`` from :func:`choose_model`.

    Returns:
        The model, or None after showing why it could not be loaded.
    """
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
