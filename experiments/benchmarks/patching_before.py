"""Benchmark-only reference: ``activation_patching`` as it was before patched runs resumed at the patched layer.

Taken from the package's history (``interp/analysis/patching.py`` on main just before the change that resumes
every patched run at the patched layer, and at the patched position with the base run's keys and values):
every patched copy of the batch recomputes the whole model from the embedding. Kept here, outside the
package, so that ``bench_patching.py`` can time today's code beside it in one process. It reuses the package's
private helpers that the old code called (the checked inputs, the recorded source run, the sites, the table).
"""

from __future__ import annotations

import torch

from interp.analysis import patching_checks as checks
from interp.analysis.patching import _frame, _sites, _source_run
from interp.interventions import patch_sites_hook


def activation_patching_before(model, clean, corrupted, *, act="z", by="head", metric=None, answer_tokens=None,
                               direction="noising", attention_mask=None, batch_size=256, max_runs=None):
    """The old ``activation_patching`` (same arguments and table).

    ``max_runs`` (benchmark only) stops after that many patched passes, to time a slice of a long run; the
    sites after it get NaN. Every pass of the old code costs the same (``batch_size`` copies of the whole
    model), so the full time is the slice's time scaled by ``passes / max_runs``.
    """
    batch_size = checks.check_batch_size(batch_size)
    checks.check_clean_corrupted(clean, corrupted)
    checks.check_answer_tokens(answer_tokens, clean, model.cfg.d_vocab)
    metric = checks.checked_metric(metric)
    metric, names, base, src, m_src = _source_run(model, clean, corrupted, act, by, metric, answer_tokens,
                                                  direction, attention_mask)
    with torch.no_grad():
        m_base = float(metric(model(base, attention_mask=attention_mask)))
        n_units = [t.shape[2] if by.startswith("head") else 1 for t in src]
        sites = _sites(by, n_units, base.shape[1])
        values = []
        B = base.shape[0]
        per_run = max(1, batch_size // B)  # several patched copies of the batch share one forward pass
        for n_run, start in enumerate(range(0, len(sites), per_run)):
            if max_runs is not None and n_run >= max_runs:
                values += [float("nan")] * (len(sites) - len(values))
                break
            chunk = sites[start:start + per_run]
            tokens = base.repeat(len(chunk), 1)  # [n B, T]
            mask = None if attention_mask is None else attention_mask.repeat(len(chunk), 1)
            hook = patch_sites_hook(names, src, chunk, B)
            logits = model.run_with_hooks(tokens, attention_mask=mask,
                                          fwd_hooks=[(sorted({names[s[0]] for s in chunk}), hook)])
            values += [float(metric(logits[j * B:(j + 1) * B])) for j in range(len(chunk))]
    m_clean, m_corr = (m_base, m_src) if direction == "noising" else (m_src, m_base)
    return _frame(by, sites, values, m_clean, m_corr, {"act": act, "direction": direction, "method": "activation"})


def n_passes(n_sites: int, batch: int, batch_size: int = 256) -> int:
    """How many patched passes the old code runs for ``n_sites`` sites."""
    per_run = max(1, batch_size // batch)
    return -(-n_sites // per_run)
