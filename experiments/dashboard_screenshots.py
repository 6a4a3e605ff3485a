"""Screenshots of the dashboard on SmolLM2-135M for docs/howto/dashboard.md: the head map (every kind of every head) and the
layers x heads grid (token ticks, K/V-group lines), in headless Chromium driven by Playwright.

Starts ``streamlit run`` on the packaged app on a free localhost port, waits for each page (the head map runs
classify_heads on SmolLM2: minutes on a laptop CPU), screenshots the figure, and writes palette PNGs.

Usage:
    python experiments/dashboard_screenshots.py --out DIR [--timeout 1800]   (docs/howto/dashboard.md shows docs/img)
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from interp.app import DASHBOARD

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.read().decode().strip() == "ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"streamlit did not answer on {url}")


def settle(page, timeout_ms: int) -> None:
    try:
        page.get_by_test_id("stStatusWidget").wait_for(state="attached", timeout=2_000)
    except Exception:  # noqa: BLE001 - the run may already be over
        pass
    page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=timeout_ms)
    page.wait_for_function("() => document.querySelectorAll('[data-stale=\"true\"]').length === 0", timeout=timeout_ms)
    page.wait_for_timeout(1500)  # plotly draws after the run ends


def save_png(raw: bytes, path: Path) -> None:
    """A 256-colour PNG (figures have few colours: a fraction of the size, no visible loss)."""
    from PIL import Image

    img = Image.open(io.BytesIO(raw)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    img.save(path, optimize=True)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} kB, {img.size[0]}x{img.size[1]})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="folder for the PNGs (the docs' are in docs/img)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for a page")
    ap.add_argument("--pages", nargs="+", default=["grid", "head_map"], choices=["grid", "head_map"])
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    a.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(DASHBOARD), "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true",
                             "--server.fileWatcherType", "none"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    ms = int(a.timeout * 1000)
    try:
        wait_healthy(url, proc)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=os.environ.get("INTERP_CHROMIUM", "/usr/bin/chromium"),
                                  args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(ms)
            page.goto(f"{url}/?model=smollm2-135m", wait_until="networkidle")
            settle(page, ms)
            if "grid" in a.pages:  # the Repetition example (14 SmolLM2 tokens: ticks fit), all layers x heads
                page.get_by_text("All layers x heads", exact=True).click()
                settle(page, ms)
                grid = page.locator(".js-plotly-plot").first
                height = page.evaluate("() => document.querySelector('.js-plotly-plot').getBoundingClientRect().height")
                page.set_viewport_size({"width": 1400, "height": int(height) + 400})
                page.wait_for_timeout(1500)
                save_png(grid.screenshot(), a.out / "dashboard_smollm2_grid.png")
                page.set_viewport_size({"width": 1400, "height": 1000})
            if "head_map" not in a.pages:
                b.close()
                return
            t0 = time.monotonic()
            page.get_by_test_id("stSidebar").get_by_text("Head map", exact=True).click()
            settle(page, ms)
            page.locator(".js-plotly-plot").nth(2).wait_for(timeout=ms)
            print(f"head map ready after {time.monotonic() - t0:.0f} s")
            page.set_viewport_size({"width": 1400, "height": 1400})
            page.wait_for_timeout(1500)
            save_png(page.locator(".js-plotly-plot").first.screenshot(), a.out / "dashboard_smollm2_head_map.png")
            row = page.locator(".js-plotly-plot").nth(1)
            row.scroll_into_view_if_needed()
            save_png(page.locator("[data-testid='stHorizontalBlock']").last.screenshot(),
                     a.out / "dashboard_smollm2_norms_positional.png")
            b.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
