"""A malformed pruning curve on the dashboard's pruning page: one error line naming the problem, no traceback."""

import json

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from interp.app import DASHBOARD  # noqa: E402
from interp.pruning import CurvePoint, PruningCurve  # noqa: E402


def _curve_dict(fraction=0.5):
    curve = PruningCurve("importance", "accuracy", 8, [CurvePoint(0.0, 0, 0.9), CurvePoint(0.5, 4, 0.7)])
    data = curve.to_dict()
    data["points"][1]["fraction"] = fraction
    return data


@pytest.mark.parametrize("field, value, expected", [
    ("fraction", 2.0, r"point 1: fraction 2.0 must be in \[0, 1\]"),
    ("n_pruned", 9, r"point 1: n_pruned 9 must be an int in \[0, 8\]"),
    ("metric", "high", "point 1: metric 'high' must be a number"),
])
def test_curve_from_dict_refuses_points_outside_the_curve(field, value, expected):
    data = _curve_dict()
    data["points"][1][field] = value
    with pytest.raises(ValueError, match=expected):
        PruningCurve.from_dict(data)


def test_pruning_page_curve_with_fraction_2_shows_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_DASHBOARD_FILES", str(tmp_path))
    path = tmp_path / "bad_curve.json"
    path.write_text(json.dumps(_curve_dict(fraction=2.0)))
    at = AppTest.from_file(str(DASHBOARD), default_timeout=180)
    at.query_params["model"] = "random-tiny"
    at.run()
    at.sidebar.radio(key="page").set_value("Pruning")
    at.run()
    at.radio(key="curve_source").set_value("Load a saved curve")
    at.run()
    at.text_input(key="curve_path").set_value(str(path))
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "bad_curve.json is not a pruning curve" in errors[0] and "fraction 2.0" in errors[0]
