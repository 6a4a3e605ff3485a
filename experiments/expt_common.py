"""Helpers shared by the experiment scripts (not part of the interp package)."""

from __future__ import annotations

from pathlib import Path

#: ``../shared/data`` beside the repository (read its README), where the default data sets of the scripts live.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
UD_DEV = SHARED_DATA / "ud-english-ewt" / "en_ewt-ud-dev.conllu"


def load_model(name: str):
    """``interp.zoo.load(name)``, except that a checkpoint written by ``save_induction_model`` (a token-id model
    such as a retrained induction-2l) gets its token-id tokenizer and BOS back."""
    from interp.zoo import load

    path = Path(name)
    if path.suffix == ".safetensors" and path.is_file():
        from interp.zoo.checkpoint import read_checkpoint_metadata

        if read_checkpoint_metadata(path).get("tokenizer_kind") == "token-id":
            from interp.zoo.induction import load_induction_2l

            model = load_induction_2l(path)
            model.name = path.stem
            return model.eval()
    return load(name).eval()
