"""The dashboard's data: example texts, the sidebar's text box, tokenizing it, and the data sizes each page
starts from (smaller for a large model, so a first view takes seconds)."""

from __future__ import annotations

import streamlit as st
import torch

import interp
from interp.data.batches import reads_text as reads_text  # the views' "sentences make sense as data"

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
#: Above this many parameters a model gets the smaller defaults (SmolLM2-135M does; the toy models do not).
LARGE_MODEL_PARAMS = 20_000_000


def is_token_id_model(model: interp.Transformer) -> bool:
    """Whether the model reads ``t<id>`` strings (a toy model's token-id tokenizer) rather than text."""
    return type(model.tokenizer).__name__ == "TokenIdTokenizer"


def example_texts(model: interp.Transformer) -> dict[str, str]:
    """Examples that suit the model: sentences, or ``t<id>`` strings for token-id models.

    Args:
        model: the model.

    Returns:
        ``{label: text}``.
    """
    if not is_token_id_model(model):
        return dict(EXAMPLE_SENTENCES)
    from interp.data import repeated_sequences

    bos = getattr(model.tokenizer, "bos_id", None)
    half = min(12, (model.cfg.n_ctx - 1) // 2)
    rep = repeated_sequences(1, half, model.cfg.d_vocab, seed=1, bos_id=bos)[0]
    rnd = repeated_sequences(1, half, model.cfg.d_vocab, seed=2, bos_id=bos)[0, : half + 1]
    return {"Repeated random tokens": " ".join(model.tokenizer.to_str_tokens(rep)),
            "Random tokens": " ".join(model.tokenizer.to_str_tokens(rnd))}


def choose_text(model: interp.Transformer) -> str:
    """The sidebar's example picker and text box; returns the text.

    The text box follows the example chosen; a typed text stays until another example is picked. Streamlit
    forgets a widget's value on runs that do not draw it (pages without text), so a copy is kept under
    ``text_value`` and the box is restored from it.
    """
    examples = example_texts(model)
    pick = str(st.sidebar.selectbox("Example", ["(type your own)", *examples], key="example"))
    default = examples[pick] if pick in examples else next(iter(examples.values()))
    state = st.session_state
    if state.get("_example_for") != (pick, model.name):
        state["text"] = state["text_value"] = default
        state["_example_for"] = (pick, model.name)
    elif "text" not in state:
        state["text"] = state.get("text_value", default)
    hint = "token ids like `t5 t17 t5` (this model has no text tokenizer)" if is_token_id_model(model) else "text"
    text = st.sidebar.text_area(f"Input ({hint})", key="text", height=120)
    state["text_value"] = text
    return str(text)


def tokenize(model: interp.Transformer, text: str) -> tuple[torch.Tensor, str | None]:
    """``[1, T]`` ids of ``text``, truncated to the context with a notice.

    Args:
        model: the model (its tokenizer and context).
        text: the input.

    Returns:
        ``(ids, notice)``; the notice is None when nothing was cut.

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


def default_sizes(model: interp.Transformer) -> dict[str, int]:
    """The data sizes every page starts from: smaller for a large model, so a first view takes seconds.

    Args:
        model: the model.

    Returns:
        ``head_texts``: example sentences of the head map's positional pass; ``head_seqs`` / ``head_half``: its
        repeated random sequences (induction, copying); ``ind_seqs`` / ``ind_half``: the Induction page's;
        ``prune_seqs`` / ``prune_half``: the pruning objective's repeated sequences (train and held out);
        ``prune_points``: about this many pruning steps per curve; ``prune_seeds``: random-pruning seeds;
        ``circuit_prompts``: the Circuits page's prompts; ``batch``: sequences per forward pass.
    """
    n_params = sum(p.numel() for p in model.parameters())
    half = min(16, (model.cfg.n_ctx - 2) // 2)
    if n_params <= LARGE_MODEL_PARAMS:
        return {"head_texts": len(EXAMPLE_SENTENCES) + len(PRUNING_SENTENCES), "head_seqs": 16, "head_half": 0,
                "ind_seqs": 16, "ind_half": 10, "prune_seqs": 16, "prune_half": half, "prune_points": 8,
                "prune_seeds": 3, "circuit_prompts": 16, "batch": 32}
    # One batch of 8: the progress bar and the partial maps still move layer by layer inside it, and on two
    # cores one pass of 8 sequences is quicker than two of 4.
    return {"head_texts": len(EXAMPLE_SENTENCES), "head_seqs": 8, "head_half": 16,
            "ind_seqs": 8, "ind_half": 10, "prune_seqs": 8, "prune_half": min(half, 12), "prune_points": 4,
            "prune_seeds": 1, "circuit_prompts": 8, "batch": 8}
