"""Where a hub name's files are: the one place a hub id is turned into a local folder (a downloaded snapshot)."""

from __future__ import annotations

from pathlib import Path


def hub_source(ref: str, prefix: str = "hf:", *, revision: str | None = None) -> str:
    """Where a hub name's files are: an absolute local folder as given, or a hub id's downloaded snapshot.

    A hub id is never looked up as a folder relative to the working directory (``"tmp/some/folder"`` is the
    repository ``tmp/some/folder`` of the hub, not a folder on this machine), so a name cannot reach local
    files by accident, and a server that passes names on cannot be made to read them.

    Args:
        ref: the name without its prefix: ``"org/model"``, ``"gpt2"`` or ``"/abs/folder"``.
        prefix: ``"hf:"`` or ``"tl:"``, for messages.
        revision: the hub revision to download (a branch, tag or commit); a local folder takes none.

    Returns:
        A local folder holding the model's ``config.json`` and weights.

    Raises:
        ValueError: ``ref`` is neither an absolute path nor a valid hub repository id.
        FileNotFoundError: an absolute path that is not a model folder.
        ImportError: ``huggingface_hub`` is missing (``pip install 'interp[hf]'``).

    Example:
        >>> from interp.zoo import hub_source
        >>> hub_source("../secret")
        Traceback (most recent call last):
        ...
        ValueError: 'hf:../secret' is not a hub repository id (org/name) or an absolute folder path
    """
    ref = ref.strip()
    if Path(ref).is_absolute():
        if revision is not None:
            raise ValueError(f"{prefix}{ref}: revision={revision!r} selects a hub version; a local folder has one "
                             "version (check out the revision there, or give its hub id)")
        if not (Path(ref) / "config.json").is_file():
            raise FileNotFoundError(f"{prefix}{ref}: no Hugging Face model folder (config.json) there")
        return ref
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError as e:
        raise ImportError(f"{prefix}{ref} needs huggingface_hub (pip install 'interp[hf]'): {e}") from e
    try:
        validate_repo_id(ref)
    except HFValidationError:
        raise ValueError(f"{prefix + ref!r} is not a hub repository id (org/name) or an absolute folder path"
                         ) from None
    # Only what a conversion reads: config, tokenizer, safetensors / torch weights (no ONNX, TF, Flax copies).
    return snapshot_download(ref, revision=revision,
                             ignore_patterns=["*.h5", "*.msgpack", "*.ot", "*.onnx", "*.tflite", "onnx/*", "openvino/*",
                                              "coreml/*", "*.gguf"])


__all__ = ["hub_source"]
