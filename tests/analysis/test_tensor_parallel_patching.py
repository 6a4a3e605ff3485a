"""activation_patching over heads across ranks (interp.tensor_parallel) against one process (issue 37).

Two gloo ranks each hold half of every layer's heads and half of each dense MLP; both must return the table one
process computes on the whole model, within float32 rounding of the reordered sums.
"""

import sys
from pathlib import Path

import pandas as pd
import pytest

from interp.analysis import activation_patching
from interp.tensor_parallel import HeadParallel, shard_heads

sys.path.insert(0, str(Path(__file__).parent))
import tp_worker  # noqa: E402 - the ranks' models and data, shared with the reference computed here
from test_distributed import launch, read  # noqa: E402 - the one launcher of local ranks


@pytest.mark.slow
def test_patching_tables_across_two_ranks_equal_one_process(tmp_path):
    launch(2, ["patching"], tmp_path, worker=Path(tp_worker.__file__))
    got = read(tmp_path, "patching", 2)
    model = tp_worker.model("gqa")
    for act, by in tp_worker.PATCH_SITES:
        ref = tp_worker.patch(model, act, by)
        assert ref["normalized"].abs().max() > 0.05 and ref["metric"].std() > 1e-3  # the patches move the metric
        for r in range(2):
            pd.testing.assert_frame_equal(got[r][act + by], ref, check_exact=False, rtol=0, atol=1e-5)
            attrs = got[r][act + by].attrs
            assert {k: v for k, v in attrs.items() if not isinstance(v, float)} == \
                {k: v for k, v in ref.attrs.items() if not isinstance(v, float)}
            for k in ("metric_clean", "metric_corrupted"):
                assert attrs[k] == pytest.approx(ref.attrs[k], abs=1e-5), k


def test_per_head_patching_over_ranks_is_refused_by_name():
    tp = HeadParallel(shard_heads(tp_worker.model("gqa"), 0, 1))  # one rank: no process group needed
    clean = tp_worker.tokens()
    with pytest.raises(ValueError, match=r"act='z' is per head; over a HeadParallel's ranks patch a per-layer"):
        activation_patching(tp, clean, (clean + 1) % 40, act="z", answer_tokens=clean[:, :2])
