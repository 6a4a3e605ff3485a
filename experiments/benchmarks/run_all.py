"""Run the side-by-side benchmarks one after another, print their markdown tables, and regenerate RESULTS.md
(``interp bench``).

Each benchmark runs in its own interpreter (so one's memory does not colour the next), and compares its
variants inside that one process (interleaved repetitions, medians, warm-up, fixed torch threads).

    forward       bench_forward.py       interp vs plain PyTorch SDPA (same weights); minilm-l6 vs HF BertModel (sdpa)
    recording     bench_recording.py     recording patterns + per-head writes vs not; vs TransformerLens and HF eager
    long_context  bench_long_context.py  peak memory of head scores at 4k/8k/16k tokens, streaming vs materialising
    remove_heads  bench_remove_heads.py  half the heads removed vs the unpruned model (written by the pruning work)
    concurrency   bench_concurrency.py   the per-model lock: one pass with vs without; 8 threads vs one
    smollm2       bench_smollm2.py       SmolLM2-135M (GGUF) vs HF LlamaForCausalLM: forward, recording, greedy decoding
    analysis      bench_analysis.py      classify_heads on UD EWT dev vs one recorded forward pass over the same batches
    distributed   bench_distributed.py   classify_heads over UD EWT dev: 1 process x 2 threads vs 2 x 1 vs 8 x 1 (torchrun)
    moe            bench_moe.py           Mixtral / DeepSeek-V3-shaped forward vs HF; MLA absorbed vs expanded decode; routing stats
    attention_view bench_attention_view.py viz.attention_view of SmolLM2 at 2,000 tokens: build, page size, open/hover in Chromium
    load_memory    bench_load_memory.py   peak memory of loading a 1B-shaped random model in bf16 vs float32-then-cast
    families       bench_families.py      Llama 3, Qwen3, Gemma 2, OLMo 3, Pythia (~100M random) vs transformers: forward, recording
    dashboard      bench_dashboard.py     SmolLM2 in the dashboard, driven by Chromium: first and second views, a pruning run
    patching       bench_patching.py      SmolLM2: coreference_scores vs a recorded pass; activation_patching vs the old code, nnsight, TL
    gpt_oss        bench_gpt_oss.py       native gpt-oss (~100M random) vs transformers eager: forward, recording patterns + sink mass
    route          bench_route.py         the attention-level route (~100M random OLMo) vs transformers: recording, forward

Each full run that succeeds replaces that benchmark's record (``latest/<name>.json``: its output, date, machine,
load average, time, status) and RESULTS.md is rebuilt from every record (``results_file.py``): the latest figures
per benchmark, not a log; earlier figures live in git. A run that fails, prints nothing or is interrupted (Ctrl-C
stops run_all there) keeps the previous good record and is marked beside it, with the last lines it printed. ``--quick`` runs only print (a quick figure never replaces a
full one), unless ``--record`` says otherwise.

Usage:
    python experiments/benchmarks/run_all.py [NAME ...] [--quick] [--record] [--out FILE.md]
    python experiments/benchmarks/run_all.py --render-only          (rebuild RESULTS.md from the records)
    python experiments/benchmarks/run_all.py --import gpu_check FILE.json --date 2026-12-04 \\
        --machine gpu="NVIDIA H200" --machine torch=2.11.0+cu130 [--note TEXT]
        (a record made on another machine, e.g. gpu_check.py's JSON on a GPU: kept with that machine and date)
    (NAME: the first column above)
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import results_file  # noqa: E402  (beside this script; experiments/ is not a package)

#: The latest record of each benchmark, and the file rendered from them.
RECORDS = HERE / "latest"
RESULTS = HERE / "RESULTS.md"
SCRIPTS = {
    "forward": "bench_forward.py",
    "recording": "bench_recording.py",
    "long_context": "bench_long_context.py",
    "remove_heads": "bench_remove_heads.py",
    "concurrency": "bench_concurrency.py",
    "smollm2": "bench_smollm2.py",
    "analysis": "bench_analysis.py",
    "distributed": "bench_distributed.py",
    "moe": "bench_moe.py",
    "attention_view": "bench_attention_view.py",
    "load_memory": "bench_load_memory.py",
    "families": "bench_families.py",
    "dashboard": "bench_dashboard.py",
    "patching": "bench_patching.py",
    "gpt_oss": "bench_gpt_oss.py",
    "route": "bench_route.py",
}
#: The status of a run stopped by Ctrl-C (run_all stops there; the record of what finished before stays).
INTERRUPTED = "interrupted"
TAKES_QUICK = {"forward", "recording", "long_context", "concurrency", "smollm2", "analysis", "distributed", "moe",
               "attention_view", "families", "patching", "gpt_oss", "route"}


def run_one(name: str, quick: bool) -> results_file.Record:
    """Run one benchmark in its own interpreter and return its record (output, date, machine, load, status)."""
    script = HERE / SCRIPTS[name]
    date, load_start, t0 = results_file.now_utc(), results_file.load_average(), time.perf_counter()
    if not script.is_file():
        body, status = "", f"skipped: {script.name} does not exist yet"
    else:
        cmd = [sys.executable, str(script)] + (["--quick"] if quick and name in TAKES_QUICK else [])
        # stderr (progress bars, library warnings) goes straight to the terminal; the tables come on stdout.
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=HERE) as proc:
            try:
                out, _ = proc.communicate()
                status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
            except KeyboardInterrupt:  # Ctrl-C: keep what the benchmark printed, mark the run interrupted
                proc.kill()
                out, _ = proc.communicate()
                status = INTERRUPTED
        body = out.strip()
        if status == "ok" and not body:
            status = "failed (no output)"  # a benchmark that prints no figures measured nothing
    return results_file.Record(name=name, script=SCRIPTS[name], date=date, machine=results_file.machine(),
                               load_start=load_start, load_end=results_file.load_average(),
                               seconds=time.perf_counter() - t0, status=status, body=body,
                               quick=quick and name in TAKES_QUICK)


def regenerate(records: Path = RECORDS, out: Path = RESULTS) -> Path:
    """Rebuild ``out`` from every record in ``records`` (benchmarks in :data:`SCRIPTS` order), then the
    carried-over earlier figures (``records/carried_over.md``) where there are any."""
    old = records / results_file.CARRIED_OVER
    text = results_file.render(results_file.load_records(records), list(SCRIPTS),
                               old.read_text() if old.is_file() else "")
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return out


def import_record(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """``--import NAME FILE.json``: save the figures as record NAME, with the date and machine given, and
    regenerate RESULTS.md."""
    import json

    name, source = a.import_
    if not a.date:
        p.error("--import needs --date (when it ran there, UTC): the date is the other machine's, not today's")
    machine: dict[str, object] = {}
    for item in a.machine:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--machine {item!r}: expected KEY=VALUE (e.g. gpu=\"NVIDIA H200\")")
        machine[key] = value
    try:
        data = json.loads(Path(source).read_text())
    except (OSError, json.JSONDecodeError) as e:
        p.error(f"--import {source}: cannot read it as JSON: {e}")
    if "device" in data and "gpu" not in machine:
        machine["gpu"] = data["device"]
    record = results_file.imported_record(name, data, source, a.date, machine, a.note)
    print(f"wrote {results_file.save_record(record, a.records)}")
    print(f"wrote {regenerate(a.records, a.results)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default all): {', '.join(SCRIPTS)}")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shorter inputs (printed, not recorded)")
    p.add_argument("--record", action="store_true", help="record a --quick run too (it replaces the full figures)")
    p.add_argument("--render-only", action="store_true", help="run nothing: rebuild RESULTS.md from the records")
    p.add_argument("--out", type=Path, help="also write this run's markdown to this file")
    p.add_argument("--records", type=Path, default=RECORDS, help="folder of the latest record of each benchmark")
    p.add_argument("--results", type=Path, default=RESULTS, help="the file regenerated from the records")
    p.add_argument("--import", dest="import_", nargs=2, metavar=("NAME", "FILE.json"),
                   help="record a JSON of figures made on another machine (e.g. gpu_check.py's) as section NAME")
    p.add_argument("--date", help="with --import: when it ran (UTC, as recorded there)")
    p.add_argument("--machine", action="append", default=[], metavar="KEY=VALUE",
                   help="with --import: where it ran (gpu=..., torch=..., cpu=..., nproc=...); repeatable")
    p.add_argument("--note", default="", help="with --import: markdown shown before its figures")
    a = p.parse_args(argv)
    if a.import_:
        return import_record(p, a)
    unknown = [n for n in a.names if n not in SCRIPTS]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {list(SCRIPTS)}")
    if a.render_only:
        print(f"wrote {regenerate(a.records, a.results)}")
        return 0
    # A kill (SIGTERM: a timeout, a closed session) is handled as Ctrl-C: the run is marked, the records kept.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run(a)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run(a: argparse.Namespace) -> int:
    """Run the benchmarks ``a.names`` (all by default), record each and regenerate RESULTS.md after each."""
    sections, recorded = [], False
    for name in a.names or list(SCRIPTS):
        record = run_one(name, a.quick)
        text = f"## {name}\n\n{record.body or record.status}\n\n({name}: {record.seconds:.0f} s, {record.status})"
        print(text + "\n", flush=True)
        sections.append(text)
        if record.status.startswith("skipped") or (a.quick and not a.record):
            continue
        # A failed or interrupted run does not replace the benchmark's last good record: it is marked beside it.
        results_file.record_run(record, a.records)
        regenerate(a.records, a.results)  # after each benchmark: an interrupted run keeps what finished
        recorded = True
        if record.status == INTERRUPTED:
            print(f"interrupted during {name}: stopped; regenerated {a.results}", file=sys.stderr)
            return 130
    if a.out:
        a.out.write_text("\n\n".join(sections) + "\n")
    if recorded:
        print(f"regenerated {a.results} from {a.records}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
