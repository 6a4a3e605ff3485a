"""viz.attention_view in headless Chromium: hovering a token highlights exactly the keys of the pattern.

Needs the `playwright` Python package and a system Chromium (Debian: `apt-get install -y chromium`); without
them the test skips and says why. It never downloads a browser.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from interp import viz
from interp.config import ModelConfig
from interp.model import Transformer

pytestmark = [pytest.mark.browser]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def _chromium() -> str | None:
    for candidate in (os.environ.get("INTERP_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def page():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    exe = _chromium()
    if exe is None:
        pytest.skip("no system Chromium found (/usr/bin/chromium); `apt-get install -y chromium` runs this test")
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        except Exception as e:  # noqa: BLE001 - any launch failure means "no usable browser here"
            pytest.skip(f"Chromium at {exe} does not start: {e}")
        pg = browser.new_page()
        yield pg
        browser.close()


@pytest.fixture(scope="module")
def gqa_run():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=36, n_heads=6, n_kv_heads=2, d_vocab=50, n_ctx=64, positional="rotary")
    model = Transformer(cfg).eval()
    ids = torch.randint(0, 50, (1, 48), generator=torch.Generator().manual_seed(3))
    _, trace = model.run_with_cache(ids, names_filter="*hook_pattern")
    tokens = [f"w{i} " for i in range(48)]
    return trace, viz.attention_view(trace, tokens, n_kv_heads=2, top_k=6, min_weight=0.02)


def _highlighted(page) -> dict[int, float]:
    pairs = page.evaluate("""() => [...document.querySelectorAll('.av-tok.av-hl')]
                             .map(s => [Number(s.dataset.i), Number(s.dataset.w)])""")
    return {int(i): w for i, w in pairs}


def _check(trace, page, layer, head, query, top_k=6, min_weight=0.02):
    page.hover(f".av-tok[data-i='{query}']")
    got = _highlighted(page)
    vals, idx = trace.pattern(layer)[0, head, query].topk(top_k)
    keep = vals >= min_weight
    keep[0] = True
    want = dict(zip(idx[keep].tolist(), vals[keep].tolist()))
    assert set(got) == set(want), (layer, head, query)
    assert all(abs(got[k] - want[k]) <= 0.5 / 255 + 1e-4 for k in want)
    assert page.get_attribute(f".av-tok[data-i='{query}']", "class").split().count("av-q") == 1


@pytest.mark.parametrize("source", ["content", "file"])
def test_hover_highlights_the_pattern_keys(page, gqa_run, tmp_path, source):
    trace, view = gqa_run
    if source == "content":
        page.set_content(view.to_html(full_page=True))
    else:
        page.goto(view.save(tmp_path / "view.html").as_uri())
    page.wait_for_selector(".av-root[data-ready='1']")
    assert page.locator(".av-tok").count() == 48
    # K/V groups: two boxes of three heads each
    assert page.locator(".av-group").count() == 2
    assert page.locator(".av-group[data-kv='1'] button.av-head").count() == 3
    _check(trace, page, 0, 0, 30)
    page.select_option("select.av-layer", "1")
    page.click("button.av-head[data-h='4']")
    _check(trace, page, 1, 4, 47)
    _check(trace, page, 1, 4, 5)
    assert "L1 H4 (K/V head 1)" in page.inner_text(".av-info")
    # a click pins the query: hovering elsewhere keeps its keys
    page.click(".av-tok[data-i='20']")
    pinned = _highlighted(page)
    page.hover(".av-tok[data-i='40']")
    assert _highlighted(page) == pinned
