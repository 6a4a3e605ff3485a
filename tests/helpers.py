"""Shared by the tests of every layer: tiny models of each attention variant and one way to run the CLI.

``tests/`` is on ``sys.path`` (its conftest's folder), so any test imports these with ``from helpers import ...``.
"""

from __future__ import annotations

import torch

from interp import ModelConfig, Transformer

#: Config fields of each attention variant, over :data:`TINY`'s (or a test's own) sizes.
VARIANTS: dict[str, dict] = {
    "mha": dict(),
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "mla": dict(attention="latent", kv_latent_dim=12, q_latent_dim=20, rope_dim=4, positional="rotary"),
    "mla-noq": dict(attention="latent", kv_latent_dim=12, positional="learned"),
    "gqa-rotary": dict(n_kv_heads=4, positional="rotary", normalization="rms", activation="swiglu",
                       attn_bias=False, out_bias=False, mlp_bias=False),
}

#: The default sizes of :func:`tiny_model`: 2 layers x 4 heads of width 8, 20 tokens, context 32.
TINY = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=20, n_ctx=32)


def tiny_model(seed: int = 0, *, variant: str = "mha", dtype: torch.dtype | None = None, **config) -> Transformer:
    """A randomly initialised model in eval mode: ``torch.manual_seed(seed)``, then ``Transformer`` of
    :data:`TINY`'s sizes, the ``variant``'s fields and ``config`` (later ones win).

    Args:
        seed: the global seed set before the weights are drawn (the same seed gives the same weights).
        variant: a key of :data:`VARIANTS`.
        dtype: cast the model (``torch.float64`` for tests that compare gradients or sums tightly).
        config: any other ModelConfig fields.
    """
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**{**TINY, **VARIANTS[variant], **config})).eval()
    return model if dtype is None else model.to(dtype)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``interp.cli.main(argv)`` -> (exit status, stdout, stderr); argparse's SystemExit becomes a status."""
    from interp import cli

    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def word_tokenizer(vocab_size: int):
    """A Hugging Face fast tokenizer that needs no download: words ``w0 .. w{vocab_size-1}`` split on spaces, with
    ``w0`` as unknown, padding, BOS and EOS token (ids equal the word's number)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0", bos_token="w0",
                                                eos_token="w0")
