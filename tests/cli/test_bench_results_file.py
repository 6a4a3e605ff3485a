"""RESULTS.md is regenerated from the latest run of each benchmark (experiments/benchmarks/run_all.py and
results_file.py), never appended to: checked on fake records and on fake benchmark scripts."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "experiments" / "benchmarks"


def _module(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # run_all imports results_file from beside it
    spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses read their module's namespace
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rf():
    return _module("results_file")


MACHINE = {"cpu": "Fake CPU", "nproc": 2, "ram_gib": 23.0, "torch": "9.9", "python": "3.11.7"}


def _record(rf, name, date, body, *, status="ok", load=(1.0, 2.0, 3.0), quick=False):
    return rf.Record(name=name, script=f"bench_{name}.py", date=date, machine=dict(MACHINE), load_start=list(load),
                     load_end=[4.5, 2.0, 3.0], seconds=12.3, status=status, body=body, quick=quick)


def test_render_keeps_the_latest_run_per_benchmark_with_machine_date_and_load(rf):
    records = [_record(rf, "recording", "2026-12-01 10:00", "## bench_recording\n| a | b |\n|---|---|\n| 1 | 2 |"),
               _record(rf, "forward", "2026-12-01 09:00", "old figure 1.50x"),
               _record(rf, "forward", "2026-12-04 11:00", "## bench_forward\nnew figure 1.10x\n```\n# a comment\n```",
                       load=(0.5, 0.25, 0.0)),
               _record(rf, "moe", "2026-12-02 08:00", "", status="failed (exit 1)")]
    text = rf.render(records, ["forward", "recording", "long_context", "moe"])
    assert text.startswith("# Benchmark results\n")
    assert "old figure" not in text and text.count("new figure 1.10x") == 1
    # Sections in the given order, each with its own heading; the benchmark's headings nest one level deeper.
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert heads == ["## forward", "## recording", "## moe"]
    assert "### bench_forward" in text and "### bench_recording" in text and "\n# a comment\n" in text  # fence kept
    # The table of latest runs: date, machine, load at start / end, time, status.
    row = next(line for line in text.splitlines() if line.startswith("| [forward]"))
    assert "2026-12-04 11:00" in row and "Fake CPU, 2 cores, 23.0 GiB, torch 9.9, python 3.11.7" in row
    assert "0.50 0.25 0.00 / 4.50 2.00 3.00" in row and "12 s" in row and row.endswith("| ok |")
    assert next(line for line in text.splitlines() if line.startswith("| [moe]")).endswith("| failed (exit 1) |")
    assert "Not re-measured by run_all yet: long_context." in text
    assert "(no output)" in text  # the failed benchmark printed nothing
    assert rf.render(list(reversed(records)), ["forward", "recording", "long_context", "moe"]) == text


def test_records_round_trip_and_a_bad_record_is_named(rf, tmp_path):
    r = _record(rf, "forward", "2026-12-04 11:00", "x")
    rf.save_record(r, tmp_path)
    rf.save_record(_record(rf, "forward", "2026-12-04 12:00", "y"), tmp_path)  # replaces, not appends
    (loaded,) = rf.load_records(tmp_path)
    assert loaded.body == "y" and loaded.machine == MACHINE
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken.json is not a benchmark record"):
        rf.load_records(tmp_path)
    assert rf.load_records(tmp_path / "missing") == []


def test_run_all_regenerates_the_file_instead_of_appending(tmp_path, monkeypatch):
    run_all = _module("run_all")
    script = tmp_path / "bench_fake.py"
    counter = tmp_path / "runs"
    script.write_text("from pathlib import Path\n"
                      f"p = Path({str(counter)!r})\n"
                      "n = int(p.read_text()) + 1 if p.exists() else 1\n"
                      "p.write_text(str(n))\n"
                      "print(f'## bench_fake\\n| run | speed |\\n|---|---|\\n| {n} | {n}.0x |')\n")
    failing = tmp_path / "bench_broken.py"
    failing.write_text("import sys\nprint('partial table')\nsys.exit(3)\n")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    monkeypatch.setattr(run_all, "SCRIPTS", {"fake": script.name, "broken": failing.name, "absent": "bench_absent.py"})
    records, results = tmp_path / "latest", tmp_path / "RESULTS.md"
    args = ["--records", str(records), "--results", str(results)]
    assert run_all.main(args) == 0
    first = results.read_text()
    assert "| 1 | 1.0x |" in first and "failed (exit 3)" in first and "partial table" in first
    assert "Not re-measured by run_all yet: absent." in first  # a missing script is not recorded
    assert run_all.main(["fake", *args]) == 0
    second = results.read_text()
    assert "| 2 | 2.0x |" in second and "| 1 | 1.0x |" not in second  # replaced, not appended
    assert second.count("## fake") == 1 and "partial table" in second  # the other benchmark's record stays
    assert run_all.main(["fake", "--quick", *args]) == 0  # a quick run prints but records nothing
    assert results.read_text() == second
    results.unlink()
    assert run_all.main(["--render-only", *args]) == 0
    assert results.read_text() == second


def test_an_imported_record_keeps_its_own_machine_and_date_and_old_figures_are_marked_carried_over(tmp_path):
    run_all = _module("run_all")
    figures = tmp_path / "gpu_check.json"
    figures.write_text('{"device": "Fake GPU", "decode ratio, batch 1": 1.01585, "equal to HF": true, '
                       '"tokens/s": {"interp": 27.94, "hf": 27.51}, "total seconds": 88.4}')
    records, results = tmp_path / "latest", tmp_path / "RESULTS.md"
    records.mkdir()
    (records / "carried_over.md").write_text("# Benchmark results\n\n## 2026-11-29: old forward\n\nforward 1.23x\n")
    args = ["--records", str(records), "--results", str(results)]
    assert run_all.main(["--import", "gpu_check", str(figures), "--date", "2026-12-04 12:00",
                         "--machine", "torch=2.11.0+cu130", "--note", "uncompiled HF decode", *args]) == 0
    text = results.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| [gpu_check]"))
    # The other machine's date and GPU, not this machine's CPU or today's date; no load average was recorded.
    assert "2026-12-04 12:00 | Fake GPU, torch 2.11.0+cu130 |" in row and "n/a / n/a" in row and "88 s" in row
    assert "| decode ratio, batch 1 | 1.016 |" in text and "| tokens/s | interp 27.94, hf 27.51 |" in text
    assert "uncompiled HF decode" in text and f"Imported from `{figures}`" in text
    # Old figures stay findable, below a heading that says they were not re-measured, with their own dates.
    assert text.index("## gpu_check") < text.index("## Carried over: earlier figures, not re-measured by run_all")
    assert "### 2026-11-29: old forward\n\nforward 1.23x" in text and text.count("# Benchmark results") == 1
    assert "Not re-measured by run_all yet (their latest figures are carried over at the end" in text
    with pytest.raises(SystemExit):  # the date is the other machine's: it must be given
        run_all.main(["--import", "gpu_check", str(figures), *args])


def test_a_failed_or_interrupted_run_keeps_the_last_good_record_and_is_marked_beside_it(tmp_path, monkeypatch):
    run_all = _module("run_all")
    mode = tmp_path / "mode"  # what the fake benchmark does on its next run
    script = tmp_path / "bench_fake.py"
    script.write_text("import sys, time\nfrom pathlib import Path\n"
                      f"mode = Path({str(mode)!r}).read_text()\n"
                      "if mode == 'ok':\n    print('## bench_fake\\n| speed | 1.23x |')\n"
                      "elif mode == 'fail':\n    print('half a table'); sys.exit(2)\n")  # 'silent': no output
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    monkeypatch.setattr(run_all, "SCRIPTS", {"fake": script.name})
    records, results = tmp_path / "latest", tmp_path / "RESULTS.md"
    args = ["fake", "--records", str(records), "--results", str(results)]
    mode.write_text("ok")
    assert run_all.main(args) == 0
    assert "1.23x" in results.read_text()

    mode.write_text("fail")
    assert run_all.main(args) == 0
    text = results.read_text()
    assert "| speed | 1.23x |" in text  # the good figures stay
    row = next(line for line in text.splitlines() if line.startswith("| [fake]"))
    assert "| ok; **the run of " in row and "failed (exit 2)**: figures from the run before |" in row
    assert "failed (exit 2)** after" in text and "    half a table" in text  # the failure and its last output
    (kept,) = _module("results_file").load_records(records)
    assert kept.status == "ok" and kept.extra["failed_run"]["status"] == "failed (exit 2)"

    mode.write_text("silent")  # exit 0 but no figures printed: a failure too
    assert run_all.main(args) == 0
    (kept,) = _module("results_file").load_records(records)
    assert kept.status == "ok" and kept.extra["failed_run"]["status"] == "failed (no output)"
    assert "| speed | 1.23x |" in results.read_text() and "half a table" not in results.read_text()

    # Ctrl-C while the benchmark runs: run_all stops, the good record stays, the run is marked interrupted.
    def interrupted(self, *a, **kw):
        if not getattr(self, "_interrupted_once", False):
            self._interrupted_once = True
            raise KeyboardInterrupt
        return ("## bench_fake\npartial", None)

    mode.write_text("ok")
    monkeypatch.setattr(run_all.subprocess.Popen, "communicate", interrupted)
    assert run_all.main(args) == 130
    (kept,) = _module("results_file").load_records(records)
    assert kept.status == "ok" and kept.extra["failed_run"]["status"] == "interrupted"
    assert "    partial" in results.read_text()

    # A kill (SIGTERM) is handled the same way, and run_all's own handler is removed afterwards.
    def terminated(self, *a, **kw):
        if not getattr(self, "_terminated_once", False):
            self._terminated_once = True
            os.kill(os.getpid(), signal.SIGTERM)
        return ("## bench_fake\nkilled here", None)

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(run_all.subprocess.Popen, "communicate", terminated)
    assert run_all.main(args) == 130
    assert "    killed here" in results.read_text() and "interrupted" in results.read_text()
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.undo()

    monkeypatch.setattr(run_all, "HERE", tmp_path)
    monkeypatch.setattr(run_all, "SCRIPTS", {"fake": script.name})
    assert run_all.main(args) == 0  # a good run replaces the record and clears the mark
    text = results.read_text()
    assert "the run of" not in text and "did not replace" not in text and "1.23x" in text
    (kept,) = _module("results_file").load_records(records)
    assert kept.status == "ok" and "failed_run" not in kept.extra


def test_a_failed_first_run_is_recorded_and_a_later_failure_replaces_it(rf, tmp_path):
    # With no good record to keep, the failure itself is the record (visible in RESULTS.md); a later failure
    # replaces an earlier one rather than piling up.
    rf.record_run(_record(rf, "moe", "2026-12-04 10:00", "first", status="failed (exit 1)"), tmp_path)
    rf.record_run(_record(rf, "moe", "2026-12-04 11:00", "second", status="interrupted"), tmp_path)
    (r,) = rf.load_records(tmp_path)
    assert (r.body, r.status, r.extra) == ("second", "interrupted", {})
    rf.record_run(_record(rf, "moe", "2026-12-04 12:00", "good"), tmp_path)
    rf.record_run(_record(rf, "moe", "2026-12-04 13:00", "", status="failed (exit 9)"), tmp_path)
    (r,) = rf.load_records(tmp_path)
    assert r.body == "good" and r.extra["failed_run"]["date"] == "2026-12-04 13:00"
    assert "It printed nothing." in rf.render([r], ["moe"])
