"""Every compat family against transformers, with the figures kept: what tests/zoo/test_zoo_families.py asserts
(random tiny configs of ``interp.zoo.compat.TABLE``, float32, every parameter re-drawn), printed per row.

Per row: max |logit diff| of the pattern-recording path and of the fast (SDPA) path against HF eager; max |pattern -
HF eager ``output_attentions``|; for sink models, max |sink mass - (1 - HF's row sum)|; 32 greedy tokens equal to
HF ``generate``; cached decoding equal to a full recompute (past every window and chunk of the test configs).
The last lines list the rows over the targets (1e-4 logits, 1e-5 patterns and sink mass) and the largest figures.

Usage:
    python experiments/benchmarks/parity_families.py > parity.jsonl
"""
import json
import time

import torch

from interp.zoo.compat import NEW, PROMPT, SEQ, TABLE, V, hf_test_model
from interp.zoo.hf import from_hf


def _recorded(name: str) -> bool:
    return name.endswith(("hook_pattern", "hook_sink_mass"))


def measure(name: str) -> dict:
    """One row's figures (see the module docstring)."""
    t0 = time.time()
    hf = hf_test_model(name)
    model = from_hf(hf)
    torch.manual_seed(4)
    ids = torch.randint(1, V, (2, SEQ))
    row: dict = {"family": name}
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
        logits, trace = model.run_with_cache(ids, names_filter=_recorded)
        row["logits_recording"] = float((logits - ref.logits).abs().max())
        row["logits_fast"] = float((model(ids) - ref.logits).abs().max())
        patterns, sinks = 0.0, None
        for layer, p in enumerate(ref.attentions):
            patterns = max(patterns, float((trace.pattern(layer) - p).abs().max()))
            if f"blocks.{layer}.attn.hook_sink_mass" in trace:
                d = float((trace.sink_mass(layer) - (1 - p.sum(-1))).abs().max())  # HF's rows leave the sink out
                sinks = d if sinks is None else max(sinks, d)
        row["patterns"], row["sink_mass"] = patterns, sinks
    prompt = ids[:1, :PROMPT]
    want = hf.generate(prompt, max_new_tokens=NEW, do_sample=False, attention_mask=torch.ones_like(prompt),
                       eos_token_id=None, pad_token_id=0)
    got = model.generate(prompt, max_new_tokens=NEW)
    row["greedy_eq_hf"] = bool(torch.equal(got, want))
    row["cached_eq_uncached"] = bool(torch.equal(model.generate(prompt, max_new_tokens=NEW, use_cache=False), got))
    row["seconds"] = round(time.time() - t0, 1)
    return row


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for name in TABLE:
        rows.append(measure(name))
        print(json.dumps(rows[-1]), flush=True)
    over = [r["family"] for r in rows
            if max(r["logits_recording"], r["logits_fast"]) > 1e-4 or r["patterns"] > 1e-5
            or (r["sink_mass"] or 0) > 1e-5 or not (r["greedy_eq_hf"] and r["cached_eq_uncached"])]
    print(f"{len(rows)} rows; over a target: {over or 'none'}")
    print(f"largest: logits {max(max(r['logits_recording'], r['logits_fast']) for r in rows):.1e}, "
          f"patterns {max(r['patterns'] for r in rows):.1e}, "
          f"sink mass {max((r['sink_mass'] or 0) for r in rows):.1e}")


if __name__ == "__main__":
    main()
