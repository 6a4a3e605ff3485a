"""interp heads / prune --nproc: a rank count the machine cannot run is refused, naming what --nproc should be."""

import pytest

from interp.cli import CliError, check_nproc, main


def test_nproc_beyond_memory_is_refused_with_the_value_that_fits():
    # 64 ranks of SmolLM2 on 2 cores and 23 GB, as reported
    with pytest.raises(CliError, match=r"--nproc 64 is more than this machine can run.*2 core\(s\).*"
                                       r"64 ranks x ~1.4 GiB.*23.0 GiB are available.*Use --nproc 4 or less"):
        check_nproc(64, "smollm2-135m", cores=2, available=23 << 30)
    with pytest.raises(CliError, match="Use --nproc 2 or less"):
        check_nproc(8, "smollm2-135m", cores=16, available=3 << 30)  # memory is the limit here
    check_nproc(4, "smollm2-135m", cores=2, available=23 << 30)  # what fits runs


def test_nproc_64_from_the_command_line_starts_nothing(capsys):
    assert main(["heads", "--model", "induction-2l", "--nproc", "64"]) != 0
    err = capsys.readouterr().err
    assert "--nproc 64 is more than this machine can run" in err and "Use --nproc" in err


def test_nproc_estimates_a_gguf_from_its_tensor_table(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((1024, 1024), dtype=np.float16))  # 4 MiB once dequantised
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from interp.cli import _weight_bytes

    assert _weight_bytes(str(path)) == 4 * 1024 * 1024
