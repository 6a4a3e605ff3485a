"""The dashboard on SmolLM2-135M, timed in a real browser: `streamlit run` of interp/app/dashboard.py driven by
Playwright in headless Chromium, as a new user would use it.

1. start-up: the server loads SmolLM2 (and hashes its weights) for the first page (the KV-cache calculator, which
   computes nothing else);
2. first view of the Attention patterns, Head map and Induction pages, with an empty results cache: from the click
   in the sidebar to the page's figures drawn and the run finished (target <= 20 s each);
3. second view of each page in a new browser session (a new tab: target <= 2 s), and again after restarting the
   server on the same cache folder (the model loads again; the pages then read the disk cache);
4. a pruning run with the page's defaults: Run, then the progress bar's texts as they change, until the curves are
   drawn; meanwhile the Attention page is opened and timed (the run is in the background).

The results cache is a fresh temporary folder (INTERP_DASHBOARD_CACHE), removed at the end. Needs the playwright
Python package, a system Chromium (/usr/bin/chromium or $INTERP_CHROMIUM) and SmolLM2 (interp.load fetches it).
Not a timed test: the figures are a benchmark's, and depend on the machine's load.

Usage:
    python experiments/benchmarks/bench_dashboard.py [--model smollm2-135m] [--pages "Head map,Induction"]
        [--no-pruning] [--no-restart] [--pruning-timeout 900] [--out dashboard.md]

Progress goes to stderr as it happens (each view, each pruning progress text with its time); the markdown section
goes to stdout and, with --out, to a file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from benchutil import machine_info

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "interp" / "app" / "dashboard.py"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: page -> plotly figures its first screen draws (the Head map page: head map, write norms, positional mass)
PAGES = {"Attention patterns": 1, "Head map": 3, "Induction": 2}
FIRST_TARGET_S, SECOND_TARGET_S = 20.0, 2.0


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


class Server:
    """`streamlit run` of the dashboard on a free port, with the results cache in ``cache``."""

    def __init__(self, cache: Path, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, INTERP_DASHBOARD_CACHE=str(cache), STREAMLIT_BROWSER_GATHER_USAGE_STATS="false",
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.log = open(log, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(self.port),
             "--server.address", "127.0.0.1", "--server.headless", "true", "--server.fileWatcherType", "none",
             "--browser.gatherUsageStats", "false"], cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with code {self.proc.returncode} (log: {log})")
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2) as r:
                    if r.read().decode().strip() == "ok":
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"streamlit did not answer on {self.url} (log: {log})")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _settled(page, n_figures: int, timeout_s: float) -> None:
    """Wait until the run the last action started has finished and the page shows ``n_figures`` plots."""
    ms = int(timeout_s * 1000)
    try:
        page.get_by_test_id("stStatusWidget").wait_for(state="attached", timeout=700)
    except Exception:  # noqa: BLE001 - a fast run may be over already
        pass
    page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=ms)
    page.wait_for_function("() => document.querySelectorAll('[data-stale=\"true\"]').length === 0", timeout=ms)
    if n_figures:
        page.locator(".js-plotly-plot").nth(n_figures - 1).wait_for(timeout=ms)
    if page.get_by_test_id("stException").count():
        raise RuntimeError(f"the page shows an exception: {page.get_by_test_id('stException').first.inner_text()}")


def open_page(page, name: str, timeout_s: float = 600) -> float:
    """Click ``name`` in the sidebar; seconds until its figures are drawn."""
    t0 = time.perf_counter()
    page.get_by_test_id("stSidebar").get_by_text(name, exact=True).click()
    _settled(page, PAGES.get(name, 0), timeout_s)
    return time.perf_counter() - t0


def start_session(browser, server: Server, model: str) -> tuple[object, float]:
    """A new tab on the KV-cache page (the model loads, nothing else is computed); seconds until ready."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    query = urllib.parse.urlencode({"model": model, "page": "KV cache & FLOPs"})
    t0 = time.perf_counter()
    page.goto(f"{server.url}/?{query}", wait_until="domcontentloaded", timeout=600_000)
    page.get_by_test_id("stSidebar").wait_for(timeout=600_000)
    _settled(page, 2, 600)
    return page, time.perf_counter() - t0


def captions(page) -> list[str]:
    return [c.inner_text() for c in page.get_by_test_id("stCaptionContainer").all()]


def views(browser, server: Server, model: str, pages: list[str]) -> tuple[float, dict[str, float], dict[str, str]]:
    """One new tab: start-up on the KV-cache page, then each of ``pages`` in turn (seconds, captions)."""
    page, startup = start_session(browser, server, model)
    times, notes = {}, {}
    for name in pages:
        times[name] = open_page(page, name)
        notes[name] = next((c for c in captions(page) if "computed in" in c), "")
        print(f"  {name}: {times[name]:.2f} s ({notes[name]})", file=sys.stderr, flush=True)
    page.close()
    return startup, times, notes


_PROGRESS_TEXTS = "() => Array.from(document.querySelectorAll('[data-testid=\"stProgress\"]')).map(e => e.innerText)"


def progress_texts(page) -> list[str]:
    """The texts of the progress bars on the page now, read in one go (a bar can vanish between two reads)."""
    try:
        return [t.strip() for t in page.evaluate(_PROGRESS_TEXTS) if t.strip()]
    except Exception:  # noqa: BLE001 - the page is being redrawn: no bar this time
        return []


def pruning_run(browser, server: Server, model: str, timeout_s: float) -> dict[str, object]:
    """Run the Pruning page with its defaults: the progress texts as they change (with the seconds since Run),
    until the curves are drawn or ``timeout_s`` passes; meanwhile the Attention page is opened in another tab."""
    page, _ = start_session(browser, server, model)
    open_page(page, "Pruning")
    t0 = time.perf_counter()
    page.get_by_role("button", name="Run").click()
    seen: list[tuple[float, str]] = []
    attention_s = None
    done = False
    while time.perf_counter() - t0 < timeout_s:
        texts = progress_texts(page)
        if texts and (not seen or seen[-1][1] != texts[0]):
            seen.append((time.perf_counter() - t0, texts[0]))
            print(f"  pruning {seen[-1][0]:.0f} s: {texts[0]}", file=sys.stderr, flush=True)
        if attention_s is None and len(seen) >= 2:
            # The run is in the background: another tab's page answers meanwhile.
            other, _ = start_session(browser, server, model)
            attention_s = open_page(other, "Attention patterns")
            other.close()
        if not texts and page.locator(".js-plotly-plot").count() and page.get_by_test_id("stStatusWidget").count() == 0:
            done = not page.get_by_test_id("stException").count() and not page.get_by_text("pruning run failed").count()
            break
        page.wait_for_timeout(500)
    took = time.perf_counter() - t0
    page.close()
    return {"seconds": took, "done": done, "progress": seen, "attention_meanwhile_s": attention_s}


def forward_seconds(model) -> float:
    """One plain forward pass over 8 x 33 tokens (the Head map's induction batch on SmolLM2): the machine's speed
    at the time, to scale the page timings by. Timed in a worker thread, as the server computes (in its script
    threads): on this machine a pass in the main thread with two intra-op threads was up to 15x slower than the
    same pass in a worker thread, or in the main thread with one, so a main-thread reference would mislead."""
    import threading

    import torch

    tokens = torch.randint(0, model.cfg.d_vocab, (8, 33))
    took: list[float] = []

    def run() -> None:
        with torch.no_grad():
            model(tokens[:1, :4])
            t0 = time.perf_counter()
            model(tokens)
            took.append(time.perf_counter() - t0)

    worker = threading.Thread(target=run, name="bench-reference")
    worker.start()
    worker.join()
    return took[0]


def _mark(seconds: float, target: float) -> str:
    return "ok" if seconds <= target else "MISS"


def report(a: argparse.Namespace, pages: list[str], reference: list[float], startup: float, first: dict,
           notes: dict, second: dict, restart: tuple | None, prune: dict | None) -> str:
    """The markdown section: machine line, reference forward pass, the page table and the pruning run."""
    lines = [f"## dashboard ({a.model}, headless Chromium through Playwright)", "", machine_info(), "",
             f"Command: `{' '.join(['python experiments/benchmarks/bench_dashboard.py', *a.argv])}`",
             "",
             "Reference, one plain forward pass of 8 x 33 tokens in this process (before / after the run, the server "
             f"idle): {' / '.join(f'{r:.2f}' for r in reference)} s", "",
             f"Server start-up, first page (model load and weights hash): {startup:.1f} s", ""]
    if pages:
        lines += ["| page | first view (s) | target | second view, new tab (s) | target | after a restart (s) | "
                  "what the first view computed |", "|---|---:|---:|---:|---:|---:|---|"]
        for name in pages:
            again = f"{restart[1][name]:.2f}" if restart else "-"
            lines.append(f"| {name} | {first[name]:.1f} {_mark(first[name], FIRST_TARGET_S)} | <= {FIRST_TARGET_S:g} | "
                         f"{second[name]:.2f} {_mark(second[name], SECOND_TARGET_S)} | <= {SECOND_TARGET_S:g} | "
                         f"{again} | {notes[name]} |")
        lines.append("")
    if restart:
        lines += [f"After the restart the server loaded the model again in {restart[0]:.1f} s; the pages then read "
                  "the disk cache.", ""]
    if prune is not None:
        shown = " / ".join(f"{t:.0f} s `{text}`" for t, text in prune["progress"][:16])
        more = " ..." if len(prune["progress"]) > 16 else ""
        meanwhile = prune["attention_meanwhile_s"]
        lines += [f"Pruning with the defaults: {'completed' if prune['done'] else 'NOT completed'} in "
                  f"{prune['seconds']:.0f} s (timeout {a.pruning_timeout:.0f} s); the Attention page opened in another "
                  f"tab meanwhile in {'-' if meanwhile is None else f'{meanwhile:.1f}'} s. Progress texts seen, with "
                  f"the seconds since Run ({len(prune['progress'])}): {shown}{more}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--pages", default=",".join(PAGES),
                   help=f"comma-separated pages to time (default all: {','.join(PAGES)}; 'none' for none)")
    p.add_argument("--no-pruning", action="store_true", help="skip the pruning run")
    p.add_argument("--no-restart", action="store_true", help="skip the views after a server restart")
    p.add_argument("--pruning-timeout", type=float, default=900.0, help="give up on the pruning run after (s)")
    p.add_argument("--out", type=Path, help="also write the markdown section to this file")
    a = p.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    pages = [] if a.pages.strip().lower() == "none" else [x.strip() for x in a.pages.split(",") if x.strip()]
    unknown = [x for x in pages if x not in PAGES]
    if unknown:
        p.error(f"unknown page(s) {unknown}: choose from {list(PAGES)}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("## dashboard\n\nskipped: the playwright Python package is not installed")
        return 0
    exe = _chromium()
    if exe is None:
        print("## dashboard\n\nskipped: no system Chromium (/usr/bin/chromium or $INTERP_CHROMIUM)")
        return 0
    import interp

    model = interp.load(a.model)  # fetched and converted once, outside the timings (the server loads it from the cache)
    reference = [forward_seconds(model)]
    cache = Path(tempfile.mkdtemp(prefix="interp-bench-dashboard-"))
    log = cache.parent / f"{cache.name}.log"
    first: dict[str, float] = {}
    second: dict[str, float] = {}
    notes: dict[str, str] = {}
    restart, prune = None, None
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
            server = Server(cache / "results", log)
            try:
                print("first views", file=sys.stderr, flush=True)
                startup, first, notes = views(browser, server, a.model, pages)
                if pages:
                    print("second views (a new tab)", file=sys.stderr, flush=True)
                    _, second, _ = views(browser, server, a.model, pages)
                if not a.no_pruning:
                    print("pruning", file=sys.stderr, flush=True)
                    try:
                        prune = pruning_run(browser, server, a.model, a.pruning_timeout)
                    except Exception as e:  # noqa: BLE001 - reported in the table, the other figures still print
                        prune = {"seconds": float("nan"), "done": False, "progress": [(float("nan"), f"failed: {e}"[:300])],
                                 "attention_meanwhile_s": None}
            finally:
                server.stop()
            if pages and not a.no_restart:
                print("after a server restart", file=sys.stderr, flush=True)
                server = Server(cache / "results", log)
                try:
                    restart = views(browser, server, a.model, pages)
                finally:
                    server.stop()
            browser.close()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        print(f"(server log: {log})", file=sys.stderr, flush=True)
    reference.append(forward_seconds(model))
    text = report(a, pages, reference, startup, first, notes, second, restart, prune)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
