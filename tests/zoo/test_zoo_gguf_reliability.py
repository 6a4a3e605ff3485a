"""Corrupt and hostile GGUF files, and the SmolLM2 cache's integrity: each is refused by name, fast.

Files are written here: a tiny llama with the ``gguf`` package's writer (``write_tiny_llama`` of the GGUF
tests) with one metadata value changed, or raw bytes laid out by hand from the GGUF specification, so the
reader under test is never its own reference.
"""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from test_zoo_gguf import write_tiny_llama  # noqa: E402  (tests/zoo is on sys.path)

from interp.zoo import gguf as zgguf  # noqa: E402
from interp.zoo import smollm2  # noqa: E402
from interp.zoo.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


# --- raw GGUF bytes, laid out by hand ---------------------------------------------------------------------
def s(text: bytes | str) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_u32(key, value) -> bytes:
    return s(key) + struct.pack("<II", 4, value)


def kv_str(key, value) -> bytes:
    return s(key) + struct.pack("<I", 8) + s(value)


def raw(kvs: list[bytes], tensors: list[bytes] = (), *, version=3, n_kv=None, n_tensors=None, data=b"") -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


def tensor_info(name, dims, ttype=0, offset=0) -> bytes:
    return s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ttype, offset)


ARCH = kv_str("general.architecture", "llama")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_llama(path)
    return path


def rewrite(src: Path, dst: Path, *, drop=(), set_=None, extra_tensors=None, arch: str = "llama") -> Path:
    """A copy of ``src`` (of architecture ``arch``) with metadata keys dropped or set (typed as the writer
    types them)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch)
    skip = {"general.architecture", *drop, *(set_ or {})}
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in skip:
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), vtype)
    for key, (value, vtype) in (set_ or {}).items():
        w.add_key_value(key, value, vtype, **({"sub_type": gguf.GGUFValueType.STRING}
                                              if vtype == gguf.GGUFValueType.ARRAY else {}))
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=np.array(t.data).shape, raw_dtype=t.tensor_type)
    for name, array in (extra_tensors or {}).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


U32, U64, STR, ARR = (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.UINT64, gguf.GGUFValueType.STRING,
                      gguf.GGUFValueType.ARRAY)


# --- the header memory bomb -------------------------------------------------------------------------------
BOMB_SCRIPT = """
import resource, sys
from interp.zoo.gguf import load_gguf
def vm():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize"):
            return int(line.split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm() + (1 << 30), resource.RLIM_INFINITY))  # 1 GiB more
for path in sys.argv[1:]:
    try:
        load_gguf(path)
        print("LOADED", path)
    except ValueError as e:
        print("REFUSED", e)
"""


def test_gguf_declared_sizes_are_checked_against_the_tensor_table_before_allocating(tiny, tmp_path):
    """block_count 1e6, vocab 1e9, feed_forward 1e9, embedding 1e6: refused by name within 1 GiB of memory
    (the subprocess's timeout catches the minutes-long build of a million layers)."""
    cases = {"llama.block_count": 10**6, "llama.vocab_size": 10**9, "llama.feed_forward_length": 10**9,
             "llama.embedding_length": 10**6}
    paths = [str(rewrite(tiny, tmp_path / f"{k}.gguf", set_={k: (v, U32)})) for k, v in cases.items()]
    res = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, *paths], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    lines = [line for line in res.stdout.splitlines() if line.startswith(("REFUSED", "LOADED"))]
    assert res.returncode == 0 and len(lines) == 4, (res.stdout, res.stderr[-2000:])
    for line, path in zip(lines, paths):
        assert line.startswith("REFUSED") and path in line, line
    assert "block_count = 1000000" in lines[0]
    assert "W_E.weight" in lines[1] or "token_embd" in lines[1] or "vocab" in lines[1], lines[1]
    assert "mlp" in lines[2], lines[2]
    assert "embedding_length" in lines[3] or "W_E.weight" in lines[3], lines[3]


def test_gguf_extra_layer_tensors_are_an_error_naming_them(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "one.gguf", set_={"llama.block_count": (1, U32)})
    with pytest.raises(ValueError, match=r"block_count = 1.*layer\(s\) \[1\].*blk\.1\.") as e:
        zgguf.load_gguf(path)
    assert str(path) in str(e.value)
    extra = rewrite(tiny, tmp_path / "extra.gguf", extra_tensors={"blk.0.attn_q.bias.x": np.zeros(4, np.float32)})
    with pytest.raises(ValueError, match="blk.0.attn_q.bias.x"):
        zgguf.load_gguf(extra)


# --- every GGUF error names the file and the key or tensor ------------------------------------------------
def _raw_cases(tiny: Path) -> dict[str, tuple[bytes, str]]:
    good = tiny.read_bytes()
    big_endian = bytearray(good)
    big_endian[4:8] = struct.pack(">I", 3)
    kv_bomb = bytearray(good)
    kv_bomb[16:24] = struct.pack("<Q", 2**62)
    tensor_bomb = bytearray(good)
    tensor_bomb[8:16] = struct.pack("<Q", 2**62)
    string_bomb = bytearray(good)
    string_bomb[24:32] = struct.pack("<Q", 2**60)
    return {
        "4 bytes": (b"GGUF", "too short"),
        "big-endian version": (bytes(big_endian), "big-endian"),
        "kv count bomb": (bytes(kv_bomb), "GGUF.kv_count"),
        "tensor count bomb": (bytes(tensor_bomb), "GGUF.tensor_count"),
        "string length bomb": (bytes(string_bomb), "metadata key #0"),
        "array count bomb": (raw([ARCH, s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 0, 2**61)]),
                             "'tokenizer.ggml.tokens' declares 2305843009213693952 items"),
        "200 dimensions": (raw([ARCH], [tensor_info("output_norm.weight", [1] * 200)]),
                           "'output_norm.weight' declares 200 dimensions"),
        "non-UTF-8 key": (raw([s(b"gen\xffarch") + struct.pack("<II", 4, 1)]), "metadata key #0 is not valid UTF-8"),
        "non-UTF-8 value": (raw([ARCH, s("general.name") + struct.pack("<I", 8) + s(b"\xc3\x28")]),
                            "'general.name' is not valid UTF-8"),
        "tensor past the end": (raw([ARCH], [tensor_info("output_norm.weight", [1 << 20])]),
                                "'output_norm.weight'.*outside the file"),
    }


RAW_CASES = ["4 bytes", "big-endian version", "kv count bomb", "tensor count bomb", "string length bomb",
             "array count bomb", "200 dimensions", "non-UTF-8 key", "non-UTF-8 value", "tensor past the end"]


@pytest.mark.parametrize("case", RAW_CASES)
def test_gguf_corrupt_header_error_names_file_and_field(tiny, tmp_path, case):
    data, expected = _raw_cases(tiny)[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=expected) as e:
        zgguf.load_gguf(path)
    assert str(path) in str(e.value)



def _tokens(tiny):
    return gguf.GGUFReader(str(tiny)).fields["tokenizer.ggml.tokens"].contents()


@pytest.mark.parametrize("case", ["head_count 0", "BOS out of range", "merge without a space", "duplicate token",
                                  "wrong embedding_length"])
def test_gguf_bad_metadata_error_names_file_and_key(tiny, tmp_path, case):
    tokens = _tokens(tiny)
    changes, expected = {
        "head_count 0": ({"llama.attention.head_count": (0, U32)}, r"'llama.attention.head_count' = 0"),
        "BOS out of range": ({"tokenizer.ggml.bos_token_id": (10**6, U32)}, r"'tokenizer.ggml.bos_token_id' = 1000000"),
        "merge without a space": ({"tokenizer.ggml.merges": (["Ġt he", "hello"], ARR)},
                                  r"'tokenizer.ggml.merges'\[1\] = 'hello'"),
        "duplicate token": ({"tokenizer.ggml.tokens": ([*tokens[:-1], tokens[1]], ARR)},
                            r"'tokenizer.ggml.tokens' holds .* twice"),
        "wrong embedding_length": ({"llama.embedding_length": (128, U32)}, r"embedding_length|token_embd|W_E"),
    }[case]
    path = rewrite(tiny, tmp_path / "bad.gguf", set_=changes)
    with pytest.raises(ValueError, match=expected) as e:
        zgguf.load_gguf(path)
    assert str(path) in str(e.value)
    if case == "wrong embedding_length":
        assert "token_embd.weight" in str(e.value) and "rotary" not in str(e.value), e.value


def test_gguf_non_finite_weights_are_refused_after_dequantisation(tiny, tmp_path):
    r = gguf.GGUFReader(str(tiny))
    f32 = next(t for t in r.tensors if t.tensor_type == gguf.GGMLQuantizationType.F32 and t.data.size > 64)
    data = bytearray(tiny.read_bytes())
    data[f32.data_offset:f32.data_offset + 64] = b"\xff" * 64  # 16 NaN floats
    (tmp_path / "nan.gguf").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"tensor '{f32.name}'.*NaN or infinite"):
        zgguf.load_gguf(tmp_path / "nan.gguf")


# --- the SmolLM2 cache: verified sources only, an integrity record, a writable folder checked first -----
def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def smol_env(tiny, tmp_path, monkeypatch):
    """SmolLM2's loader pointed at the tiny file, whose sha256 stands in for the real one."""
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("INTERP_SMOLLM2_GGUF", str(tiny))
    monkeypatch.setattr(smollm2, "GGUF_SHA256", _sha(tiny))
    return tmp_path


def test_smollm2_gguf_sha256_is_checked_before_converting_and_nothing_is_cached(smol_env, tiny, monkeypatch):
    damaged = smol_env / "damaged.gguf"
    data = bytearray(tiny.read_bytes())
    data[-4096:] = bytes(4096)  # tensor data replaced: still parses, loads with wrong weights
    damaged.write_bytes(bytes(data))
    monkeypatch.setenv("INTERP_SMOLLM2_GGUF", str(damaged))
    with pytest.raises(ValueError, match=f"{damaged}.*sha256"):
        smollm2.load_smollm2(progress=False)
    assert not smollm2.converted_path().exists()


def test_smollm2_cached_weights_have_an_integrity_record_and_damage_is_detected(smol_env):
    model = smollm2.load_smollm2(progress=False)
    target = smollm2.converted_path()
    assert target.is_file()
    again = smollm2.load_smollm2(progress=False)
    tokens = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        ref = model(tokens)
        assert torch.equal(again(tokens), ref)
    data = bytearray(target.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 4096] = b"\xff" * 4096  # 4 KiB of NaN in the middle of the float weights
    target.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged"):
        load_checkpoint(target)
    with pytest.warns(UserWarning, match="cached weights are unusable"):
        fixed = smollm2.load_smollm2(progress=False)
    with torch.no_grad():
        assert torch.equal(fixed(tokens), ref)
    assert load_checkpoint(target).checkpoint_verified  # the cache entry was written again, whole


def test_checkpoint_overwritten_bytes_are_detected(tmp_path):
    from interp import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=1, d_model=64, n_heads=4, d_mlp=128, d_vocab=200, n_ctx=16))
    path = save_checkpoint(model, tmp_path / "m.safetensors")
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 4096] = b"\x00\x00\xc0\x7f" * 1024
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{path} is damaged.*sha256"):
        load_checkpoint(path)


def test_smollm2_cache_that_is_a_file_is_named_before_conversion_and_the_model_kept(smol_env, monkeypatch):
    not_a_folder = smol_env / "cachefile"
    not_a_folder.write_text("x")
    monkeypatch.setenv("INTERP_CACHE", str(not_a_folder))
    with pytest.warns(UserWarning, match="INTERP_CACHE=.*cachefile.*not a writable folder"):
        model = smollm2.load_smollm2(progress=False)
    assert model.cfg.n_layers == 2
    # the file must be fetched into that cache: refused at once, naming INTERP_CACHE
    monkeypatch.delenv("INTERP_SMOLLM2_GGUF")
    monkeypatch.setattr(smollm2, "_installed_gguf", lambda: None)
    with pytest.raises(OSError, match="INTERP_CACHE=.*cachefile"):
        smollm2.load_smollm2(progress=False, fetch=False)


def test_smollm2_cache_write_failure_warns_and_keeps_the_model(smol_env, monkeypatch):
    import interp.zoo.checkpoint as ckpt

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save_checkpoint", full_disk)
    with pytest.warns(UserWarning, match="could not cache.*No space left"):
        model = smollm2.load_smollm2(progress=False)
    assert model.cfg.n_layers == 2 and not smollm2.converted_path().exists()


def test_gguf_errors_are_one_documented_type():
    assert issubclass(zgguf.GGUFError, ValueError)
