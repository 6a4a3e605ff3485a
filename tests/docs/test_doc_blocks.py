"""Every ```python block of README.md and docs/**/*.md runs, as written, in order.

Blocks of one page share one namespace (a page reads top to bottom like a notebook). They run from the
repository root, so the relative data paths the pages use (``../shared/data/...``) resolve as they do for a
reader of a checkout. A block that needs SmolLM2-135M (``"smollm2-135m"``) or a data file that is not there is
skipped with the reason, and so are the later blocks of its page, which may build on it; so is every block after
one that failed. No block writes
outside a temporary folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
DATA_PATH = re.compile(r"""["'](\.\./shared/data/[^"']+)["']""")


def blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, source)`` of each python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    return [(text[:m.start()].count("\n") + 2, m.group(1)) for m in FENCE.finditer(text)]


CASES = [(page, i, line, src) for page in PAGES for i, (line, src) in enumerate(blocks(page))]


def _smollm2_file_present() -> bool:
    if os.environ.get("INTERP_SMOLLM2_GGUF") and os.path.isfile(os.environ["INTERP_SMOLLM2_GGUF"]):
        return True
    cache = os.environ.get("INTERP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "interp")
    folder = os.path.join(cache, "smollm2-135m")
    return any(os.path.isfile(os.path.join(folder, f)) for f in
               ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m.float32.safetensors"))


def missing(src: str) -> str | None:
    """Why ``src`` cannot run here, or None."""
    for path in DATA_PATH.findall(src):
        if not (ROOT / path).exists():
            return f"data file {path} not found beside the project"
    if "smollm2-135m" in src and not _smollm2_file_present():
        return "SmolLM2-135M is not in interp's cache (interp.load would download 98 MB)"
    return None


_namespaces: dict[Path, dict] = {}
_stopped: dict[Path, str] = {}


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("page,index,line,src", CASES,
                         ids=[f"{p.relative_to(ROOT)}:{line}" for p, _, line, _ in CASES])
def test_block_runs(page, index, line, src):
    where = f"{page.relative_to(ROOT)}:{line}"
    if page in _stopped:
        pytest.skip(f"{where}: {_stopped[page]}")
    why = missing(src)
    if why is not None:
        _stopped[page] = f"an earlier block of this page was skipped ({why})"
        pytest.skip(f"{where}: {why}")
    ns = _namespaces.setdefault(page, {"__name__": f"doc_{page.stem}"})
    try:
        exec(compile(src, where, "exec"), ns)  # noqa: S102 - the docs' own code, run as a reader would
    except BaseException:
        _stopped[page] = f"the block at line {line} failed"
        raise
