"""Helpers shared by the experiment scripts (not part of the interp package)."""

from __future__ import annotations

from pathlib import Path

#: ``../shared/data`` beside the repository (read its README), where the default data sets of the scripts live.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
UD_DEV = SHARED_DATA / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
