"""viz.attention_view on SmolLM2-135M at 2,000 tokens (30 layers x 9 heads = 270 heads), opened in headless Chromium.

1. building the view: one forward pass with every layer's pattern reduced to its top keys inside the hook, beside
   the plain forward pass (nothing hooked) on the same tokens; interleaved, medians (``--quick``: one run each).
2. the page: HTML size, against the float32 patterns it would carry if it sent everything; the time from loading
   the page to the view being ready; a hover (colouring the keys of one query, measured inside the page over many
   queries); switching the layer (decodes that layer's arrays).

The text is UD EWT dev (../shared/data) cut to 2,000 SmolLM2 tokens, or a repeated paragraph if it is absent.
Needs the playwright package and a system Chromium (/usr/bin/chromium) for part 2; without them part 2 says so.

Usage:
    python experiments/benchmarks/bench_attention_view.py [--quick] [--tokens N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from benchutil import fix_threads, machine_info, ratio_table, time_interleaved

EWT = Path(__file__).resolve().parents[3] / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
PARAGRAPH = ("The committee met on Tuesday to discuss the budget. Several members argued that the proposal was too "
             "expensive, while others said it did not go far enough. ")

HOVER_JS = """async (n) => {
  const spans = [...document.querySelectorAll('.av-tok')];
  const box = document.querySelector('.av-tokens');
  const times = [];
  for (let r = 0; r < n; r++) {
    const s = spans[Math.floor((r + 0.5) * spans.length / n)];
    const t0 = performance.now();
    s.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
    box.offsetHeight;  // force style and layout, as a real frame would
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return {median: times[Math.floor(times.length / 2)], max: times[times.length - 1],
          lit: document.querySelectorAll('.av-tok.av-hl').length};
}"""

LAYER_JS = """async (layers) => {
  const sel = document.querySelector('select.av-layer');
  const times = [];
  for (const v of layers) {
    const t0 = performance.now();
    sel.value = String(v);
    sel.dispatchEvent(new Event('change'));
    document.querySelector('.av-tokens').offsetHeight;
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return {median: times[Math.floor(times.length / 2)], max: times[times.length - 1]};
}"""


def text_of(n_tokens: int, model) -> str:
    if EWT.is_file():
        lines = [ln[len("# text = "):] for ln in EWT.read_text(encoding="utf-8").splitlines() if ln.startswith("# text = ")]
        text = " ".join(lines)
    else:
        text = PARAGRAPH * 200
    ids = model.to_tokens(text, max_length=n_tokens)
    assert ids.shape[1] == n_tokens, f"the text gives only {ids.shape[1]} tokens"
    return ids


def chromium() -> str | None:
    for c in (os.environ.get("INTERP_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if c and os.path.isfile(c):
            return c
    return None


def browser_figures(html_path: Path, n_layers: int, hovers: int) -> str:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "part 2 skipped: the playwright package is not installed"
    exe = chromium()
    if exe is None:
        return "part 2 skipped: no Chromium at /usr/bin/chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = b.new_page(viewport={"width": 1280, "height": 900})
        opens = []
        for _ in range(3):
            t0 = time.perf_counter()
            page.goto(html_path.as_uri())
            page.wait_for_selector(".av-root[data-ready='1']")
            opens.append(time.perf_counter() - t0)
        hover = page.evaluate(HOVER_JS, hovers)
        layer = page.evaluate(LAYER_JS, [i % n_layers for i in range(1, 2 * n_layers + 1)])
        b.close()
    opens.sort()
    return "\n".join([
        "| page | median ms | max ms |", "|---|---:|---:|",
        f"| open the saved file until the view is ready (3 loads) | {opens[1] * 1e3:.0f} | {opens[-1] * 1e3:.0f} |",
        f"| hover a token: colour its keys ({hovers} queries; {hover['lit']} keys lit on the last) "
        f"| {hover['median']:.2f} | {hover['max']:.2f} |",
        f"| switch layer (decode its arrays, rebuild the head buttons) | {layer['median']:.2f} | {layer['max']:.2f} |",
    ])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--tokens", type=int, default=2000)
    a = ap.parse_args()
    fix_threads()
    import interp
    from interp import viz

    model = interp.load("smollm2-135m")
    ids = text_of(a.tokens, model)
    with torch.inference_mode():
        if a.quick:  # one timing each (a 2,000-token pass of SmolLM2 takes a while on a shared CPU)
            medians = {}
            for name, fn in (("forward (nothing hooked)", lambda: model(ids)),
                             ("attention_view(model, ids)", lambda: viz.attention_view(model, ids))):
                t0 = time.perf_counter()
                fn()
                medians[name] = time.perf_counter() - t0
        else:
            medians = time_interleaved({"forward (nothing hooked)": lambda: model(ids),
                                        "attention_view(model, ids)": lambda: viz.attention_view(model, ids)},
                                       reps=3, warmup=1)
        view = viz.attention_view(model, ids)
    with tempfile.TemporaryDirectory() as tmp:
        path = view.save(Path(tmp) / "view.html")
        size = path.stat().st_size
        page = browser_figures(path, len(view.layers), 200 if a.quick else 1000)
    L, H, T = model.cfg.n_layers, model.cfg.n_heads, ids.shape[1]
    dense = L * H * T * T * 4
    print(f"## attention_view: SmolLM2-135M, {T} tokens, {L} x {H} = {L * H} heads\n")
    print(machine_info() + "\n")
    print(ratio_table(medians, "forward (nothing hooked)") + "\n")
    print(f"page: {size / 2**20:.1f} MB of HTML ({view.nbytes / 2**20:.1f} MB of attention data, top_k={view.top_k}, "
          f"min_weight={view.min_weight}); all patterns as float32 would be {dense / 2**30:.1f} GB "
          f"({dense / size:.0f}x)\n")
    print(page)


if __name__ == "__main__":
    main()
