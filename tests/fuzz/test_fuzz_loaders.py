"""Fuzz every loader of untrusted bytes: GGUF, safetensors checkpoints, traces, CoNLL-U, GAP and CorefUD.

hypothesis mutates a valid small file of each kind (bit flips anywhere or in the header, truncations,
header words set to extreme values, numbers in a text header replaced by extremes, blocks of 0x00 / 0xFF).
Each input is loaded in a forked child of one long-lived worker process (tests/fuzz/fuzz_worker.py) under a
memory cap (``RLIMIT_AS``: the address space after imports + a fixed allowance + a small multiple of the
file size) and a time cap. The property: the input loads, and a second read of the same bytes gives the
same model / trace / records, or the loader raises its documented exception (ValueError, GGUFError for
GGUF) with the file named. A hang, a crash, a MemoryError under the cap or any other exception type fails.

Examples per loader: ``INTERP_FUZZ_EXAMPLES`` (default 12, deterministic: hypothesis runs derandomized).
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from helpers import tiny_model  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
EXAMPLES = int(os.environ.get("INTERP_FUZZ_EXAMPLES", "12"))
SECONDS = 20  # per input (the worker kills a child 10 s after its alarm)
EXTRA_FIXED = 96 << 20  # allowance over the imported interpreter: one small model's construction
EXTRA_PER_BYTE = 20  # plus 20 x the file size (a Q8_0 GGUF dequantises to ~4x, two copies in flight)
DOCUMENTED = {"gguf": {"GGUFError", "ValueError"}, "checkpoint": {"ValueError"}, "trace": {"ValueError"},
              "conllu": {"ValueError"}, "gap": {"ValueError"}, "corefud": {"ValueError"}}
STATS: dict[str, list[float]] = {}


# --- valid seeds --------------------------------------------------------------------------------------------
def _tiny_gguf(path: Path) -> int:
    """A 1-layer llama GGUF (d_model 32, 2 heads, byte-level vocabulary); returns where tensor data starts."""
    gguf = pytest.importorskip("gguf")
    from interp.zoo.gguf import _bytes_to_unicode

    tokens = ["<|endoftext|>", *_bytes_to_unicode().values(), "Ġt", "he"]
    M, F, V = 32, 32, len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in ((w.add_block_count, 1), (w.add_context_length, 16), (w.add_embedding_length, M),
                   (w.add_feed_forward_length, F), (w.add_head_count, 2), (w.add_head_count_kv, 2),
                   (w.add_vocab_size, V), (w.add_bos_token_id, 0), (w.add_eos_token_id, 0)):
        add(v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (V - 1))
    w.add_token_merges(["Ġ t", "h e"])
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (V, M), "output_norm": (M,)}
    shapes.update({f"blk.0.{n}": s for n, s in (("attn_norm", (M,)), ("ffn_norm", (M,)), ("attn_q", (M, M)),
                                                ("attn_k", (M, M)), ("attn_v", (M, M)), ("attn_output", (M, M)),
                                                ("ffn_gate", (F, M)), ("ffn_up", (F, M)), ("ffn_down", (M, F)))})
    q8 = gguf.GGMLQuantizationType.Q8_0
    for i, (name, shape) in enumerate(shapes.items()):
        a = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2 and i % 2:
            w.add_tensor(name + ".weight", gguf.quants.quantize(a, q8), raw_dtype=q8)
        else:
            w.add_tensor(name + ".weight", a.astype(np.float16) if len(shape) == 2 else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from interp.zoo.gguf_file import read_gguf

    return read_gguf(path).data_offset


def _safetensors_header_end(path: Path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def _lines(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        return b"".join(f.readline() for _ in range(n))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, tuple[bytes, int]]:
    """loader -> (valid file bytes, length of its header region)."""
    from interp.zoo import save_checkpoint

    d = tmp_path_factory.mktemp("seeds")
    out = {}
    end = _tiny_gguf(d / "s.gguf")
    out["gguf"] = ((d / "s.gguf").read_bytes(), end)
    model = tiny_model(0, n_layers=1, d_model=16, n_heads=2, d_mlp=32, d_vocab=40, n_ctx=8)
    save_checkpoint(model, d / "m.safetensors")
    out["checkpoint"] = ((d / "m.safetensors").read_bytes(), _safetensors_header_end(d / "m.safetensors"))
    _, tr = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]), names_filter="*hook_pattern")
    tr.save(d / "t.safetensors")
    out["trace"] = ((d / "t.safetensors").read_bytes(), _safetensors_header_end(d / "t.safetensors"))
    ewt, gap, gum = (DATA / "ud-english-ewt" / "en_ewt-ud-dev.conllu", DATA / "gap" / "gap-development.tsv",
                     DATA / "gum-coref" / "en_gum-ud-dev.ccby.conllu")
    if not (ewt.is_file() and gap.is_file() and gum.is_file()):
        pytest.skip(f"shared data missing under {DATA}")
    text = _lines(ewt, 60)
    out["conllu"] = (text[:text.rindex(b"\n\n") + 2], 1 << 30)
    out["gap"] = (_lines(gap, 4), 1 << 30)
    text = _lines(gum, 80)
    out["corefud"] = (text[:text.rindex(b"\n\n") + 2], 1 << 30)
    return out


# --- the worker ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def worker():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fuzz_worker.py"))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def ask(loader: str, path: Path) -> dict:
        size = path.stat().st_size
        req = {"loader": loader, "path": str(path), "seconds": SECONDS,
               "extra_bytes": EXTRA_FIXED + EXTRA_PER_BYTE * size}
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"the fuzz worker died (exit {proc.poll()})"
        return json.loads(line)

    yield ask
    proc.stdin.close()
    proc.wait(timeout=60)


# --- mutations ----------------------------------------------------------------------------------------------
EXTREME_WORDS = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
EXTREME_NUMBERS = [b"0", b"-1", b"1e308", b"99999999999999999999", b"4294967296", b"-9223372036854775809"]


@st.composite
def mutated(draw, seed: bytes, header: int) -> bytes:
    data = bytearray(seed)
    header = max(8, min(header, len(data)))
    for _ in range(draw(st.integers(1, 3))):
        if not data:
            break
        kind = draw(st.sampled_from(["flip", "flip_header", "truncate", "word", "number", "block"]))
        if kind in ("flip", "flip_header"):
            pos = draw(st.integers(0, (header if kind == "flip_header" else len(data)) - 1)) % len(data)
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            data = data[:draw(st.integers(0, len(data) - 1))]
        elif kind == "word":  # a header field (count, length, dimension, offset) set to an extreme value
            width = draw(st.sampled_from([4, 8]))
            pos = draw(st.integers(0, max(0, min(header, len(data)) - width)))
            value = draw(st.sampled_from(EXTREME_WORDS)) % (1 << (8 * width))
            data[pos:pos + width] = value.to_bytes(width, "little")
        elif kind == "number":  # a number written as text in a header (JSON, TSV, CoNLL-U) set to an extreme
            runs = [m.span() for m in re.finditer(rb"\d+", bytes(data[:min(header, len(data))]))]
            if runs:
                a, b = runs[draw(st.integers(0, len(runs) - 1))]
                data[a:b] = draw(st.sampled_from(EXTREME_NUMBERS))
        else:
            pos = draw(st.integers(0, len(data) - 1))
            n = draw(st.integers(1, 4096))
            data[pos:pos + n] = draw(st.sampled_from([b"\x00", b"\xff"])) * len(data[pos:pos + n])
    return bytes(data)


def _check(loader: str, path: Path, ask) -> None:
    t = time.perf_counter()
    res = ask(loader, path)
    STATS.setdefault(loader, []).append(time.perf_counter() - t)
    assert res["status"] in ("ok", "error"), f"{loader} on {path.name}: {res}"
    if res["status"] == "ok":
        assert res["same"], f"{loader}: two reads of the same bytes differ"
        return
    assert res["type"] in DOCUMENTED[loader], f"{loader}: undocumented {res['type']}: {res['message'][:300]}"
    assert str(path) in res["message"] or path.name in res["message"], f"{loader}: file not named: {res['message']}"


@pytest.mark.parametrize("loader", ["gguf", "checkpoint", "trace", "conllu", "gap", "corefud"])
def test_fuzz_loader_loads_or_raises_its_documented_error(loader, seeds, worker, tmp_path):
    seed, header = seeds[loader]
    suffix = {"gguf": ".gguf", "checkpoint": ".safetensors", "trace": ".safetensors", "gap": ".tsv"}.get(loader, ".conllu")
    valid = tmp_path / f"valid{suffix}"
    valid.write_bytes(seed)
    res = worker(loader, valid)
    assert res == {"status": "ok", "same": True}, res  # the seed itself loads under the caps
    counter = iter(range(10**9))

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=mutated(seed, header))
    def run(data):
        path = tmp_path / f"in{next(counter)}{suffix}"
        path.write_bytes(data)
        _check(loader, path, worker)
        path.unlink()

    run()


def test_fuzz_report():
    """Inputs per loader and time (printed with -s or -rA; the report in the test log)."""
    lines = [f"{k}: {len(v)} inputs, {sum(v):.1f} s" for k, v in STATS.items()]
    print("\nfuzz: " + "; ".join(lines))
