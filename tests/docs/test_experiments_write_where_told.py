"""Experiments write where the user says: no script under experiments/ defaults its output (``--out`` /
``--json``) to a folder of the repository, where a run would overwrite tracked results or packaged files."""

import ast
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
OUTPUT_OPTIONS = {"--out", "--json"}


def _output_defaults(path: Path) -> list[str]:
    """``file:line option default`` for each output option of ``path`` whose default is a path in the repo."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in OUTPUT_OPTIONS):
            continue
        default = next((k.value for k in node.keywords if k.arg == "default"), None)
        if default is None or (isinstance(default, ast.Constant) and default.value in (None, False)):
            continue
        text = ast.unparse(default)
        if "/tmp" in text:  # a scratch file outside the repository
            continue
        found.append(f"{path.name}:{node.lineno} {node.args[0].value} default={text}")
    return found


def test_no_experiment_defaults_its_output_into_the_repository():
    scripts = sorted(EXPERIMENTS.rglob("*.py"))
    assert len(scripts) > 20  # the folder was found
    offenders = [hit for p in scripts for hit in _output_defaults(p)]
    assert offenders == [], offenders


def test_the_check_sees_a_default_into_the_repository(tmp_path):
    script = tmp_path / "x.py"
    script.write_text('ap.add_argument("--out", type=Path, default=ROOT / "results")\n'
                      'ap.add_argument("--json", default=None)\n'
                      'ap.add_argument("--out", default="/tmp/x.json")\n')
    assert _output_defaults(script) == ["x.py:1 --out default=ROOT / 'results'"]
