"""Every long library call shows a per-batch progress bar by default where someone watches (stderr a terminal),
and ``progress=False`` prints nothing."""

from __future__ import annotations

import io
import sys

import pytest
import torch
from helpers import tiny_model
from toy_coref import hand_built_coref_model, toy_gap_lines

from interp.analysis import activation_patching, attribution_patching, coreference_scores
from interp.pruning import (
    LanguageModelObjective,
    head_importance,
    importance_curve,
    l0_curve,
    random_curve,
    train_l0_gates,
)

pytestmark = pytest.mark.usefixtures("one_thread")


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal, so ``progress=None`` turns the bars on."""

    def isatty(self) -> bool:
        return True


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 20, (2, 8), generator=g) for _ in range(2)]


def _patching_inputs():
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 20, (1, 6), generator=g)
    corrupted = clean.clone()
    corrupted[0, 2] = (clean[0, 2] + 1) % 20
    return clean, corrupted, torch.tensor([[1, 2]])


def _coref(tmp_path, **kw):
    path = tmp_path / "toy-gap.tsv"
    path.write_text("\n".join(toy_gap_lines()) + "\n", encoding="utf-8")
    return coreference_scores(hand_built_coref_model(), path, n_boot=0, batch_size=4, **kw)


def _patch(fn, **kw):
    clean, corrupted, answers = _patching_inputs()
    return fn(tiny_model(), clean, corrupted, answer_tokens=answers, **kw)


CALLS = {
    "coreference_scores": lambda tmp, **kw: _coref(tmp, **kw),
    "activation_patching": lambda tmp, **kw: _patch(activation_patching, **kw),
    "attribution_patching": lambda tmp, **kw: _patch(attribution_patching, **kw),
    "importance": lambda tmp, **kw: head_importance(tiny_model(attn_only=True), _batches(),
                                                    LanguageModelObjective(), **kw),
    "importance pruning": lambda tmp, **kw: importance_curve(tiny_model(attn_only=True), _batches(),
                                                            LanguageModelObjective(), step=0.5, **kw),
    "random pruning": lambda tmp, **kw: random_curve(tiny_model(attn_only=True), _batches(), LanguageModelObjective(),
                                                     seeds=(0,), step=0.5, **kw),
    "L0 gates": lambda tmp, **kw: train_l0_gates(tiny_model(attn_only=True), _batches(), LanguageModelObjective(),
                                                 target=0.5, steps=2, **kw),
    "L0 sweep": lambda tmp, **kw: l0_curve(tiny_model(attn_only=True), _batches(), LanguageModelObjective(),
                                           targets=[0.5], steps=2, **kw),
}


@pytest.mark.parametrize("desc", list(CALLS))
def test_the_default_shows_a_bar_and_progress_false_prints_nothing(desc, tmp_path, monkeypatch):
    loud = _Terminal()
    monkeypatch.setattr(sys, "stderr", loud)
    CALLS[desc](tmp_path)
    assert desc in loud.getvalue(), loud.getvalue()[:300]
    quiet = _Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    CALLS[desc](tmp_path, progress=False)
    assert quiet.getvalue() == ""
