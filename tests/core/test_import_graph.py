"""The import graph follows the layer order of DESIGN.md, checked two ways.

core (config, hooks, rotary, norms, attention, kv_cache, decode, generate, model, flops, weights, placement, quantized) -> data -> trace (trace, trace_views, streaming, interventions, pipeline) -> analysis / pruning ->
viz -> cli / app; zoo/ (models and their loading) sits on core, data and trace; training uses zoo and
analysis; families/ (one file per model family, :mod:`interp.families`) sits on core only, and zoo's drivers
look families up there. Every import statement of every module under interp/ is parsed (function-level imports included;
``if TYPE_CHECKING:`` blocks excluded, they never run), and fresh interpreters check what importing a layer
really loads.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "interp"

CORE = {"config", "hooks", "rotary", "attention", "kv_cache", "decode", "generate", "model", "flops", "weights",
        "moe", "norms", "precision", "progress", "placement", "quantized", "distributed",  # distributed imports nothing of interp's: trace and pruning call it
        "_io"}  # atomic writes, for every layer that writes files
# pipeline and tensor_parallel: a Trace gathered over ranks
TRACE = {"trace", "trace_views", "streaming", "interventions", "pipeline", "tensor_parallel"}
ALLOWED = {
    "core": {"core"},
    "data": {"core", "data"},
    "trace": {"core", "data", "trace"},
    "families": {"core", "families"},
    "zoo": {"core", "data", "trace", "families", "zoo"},
    "analysis": {"core", "data", "trace", "analysis"},
    "pruning": {"core", "data", "trace", "pruning"},
    # circuits sits beside analysis; it reuses pruning's Hard-Concrete gates for Edge Pruning.
    "circuits": {"core", "data", "trace", "analysis", "pruning", "circuits"},
    "training": {"core", "data", "trace", "analysis", "families", "zoo", "training"},
    "viz": {"core", "data", "trace", "analysis", "pruning", "circuits", "viz"},
    "cli": {"core", "data", "trace", "families", "zoo", "analysis", "pruning", "circuits", "training", "viz", "cli", "package"},
    "package": {"core", "data", "trace", "families", "zoo", "analysis"},
    "app": {"core", "data", "trace", "families", "zoo", "analysis", "pruning", "circuits", "training", "viz", "cli", "package",
            "app"},
    # interp.examples: the ready-made inputs of the docstring examples (a model, its tokens, a pruning task...).
    "examples": {"core", "data", "trace", "zoo", "analysis", "pruning", "package", "examples"},
}
# Deliberate deferred imports, each inside a function body and named here with its reason:
DEFERRED = {
    ("core", "trace"): "Transformer.run_with_cache is the TransformerLens-style entry point to streaming.record",
    ("analysis", "viz"): "result types' one-line .figure() methods",
    ("pruning", "viz"): "result types' one-line .figure() methods",
    ("circuits", "viz"): "result types' one-line .figure() methods",
    ("cli", "app"): "interp dashboard reads the app script's path (interp.app itself imports nothing)",
}

# Single deferred imports allowed module by module (importer, imported), each with its reason:
DEFERRED_MODULES: dict[tuple[str, str], str] = {
    ("interp.tensor_parallel", "interp.pruning.surgery"): "a rank's shard is remove_heads of the model, one surgery",
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    assert parts[0] == "interp", module
    if len(parts) == 1:
        return "package"
    head = parts[1]
    if head in CORE:
        return "core"
    if head in TRACE:
        return "trace"
    if head == "__main__":  # ``python -m interp`` (torchrun's entry) is the CLI
        return "cli"
    return head


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(path: Path) -> list[tuple[str, bool, int]]:
    """``(imported module, inside a function, line)`` for every runtime import of ``path``."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, in_func)
                continue
            func = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, in_func, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if child.module is None and child.level:
                    out.extend((f"{target}.{a.name}", in_func, child.lineno) for a in child.names)
                else:
                    out.append((target, in_func, child.lineno))
            visit(child, func)

    visit(ast.parse(path.read_text()), False)
    return out


def test_every_interp_import_goes_down_the_layers():
    bad = []
    files = sorted(PKG.rglob("*.py"))
    assert len(files) > 30
    for path in files:
        src = layer_of(module_name(path))
        for target, in_func, line in imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if target.split(".")[0] == "plotly" and src in {"analysis", "pruning", "core", "data", "trace",
                                                             "zoo", "training"}:
                bad.append(f"{where} imports plotly (figures live in interp.viz)")
            if not target.startswith("interp"):
                continue
            dst = layer_of(target)
            if dst in ALLOWED[src] or (in_func and ((src, dst) in DEFERRED
                                                    or (module_name(path), target) in DEFERRED_MODULES)):
                continue
            bad.append(f"{where}: {src} imports {target} ({dst})")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_upward_imports(tmp_path):
    # The parser must find imports at module level, in functions and behind relative dots.
    probe = PKG / "zoo" / "induction.py"
    found = {t for t, _, _ in imports(probe)}
    assert "interp.config" in found and "interp.zoo.checkpoint" in found
    fake = PKG / "analysis" / "_probe_upward.py"
    try:
        fake.write_text("def f():\n    from ..zoo import load\n    import plotly\n")
        assert ("interp.zoo", True, 2) in imports(fake)
        with pytest.raises(AssertionError, match="analysis imports interp.zoo"):
            test_every_interp_import_goes_down_the_layers()
    finally:
        fake.unlink()


def _loaded(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(sorted(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return set(res.stdout.split())


def test_zoo_loads_neither_analysis_nor_pruning():
    mods = _loaded("import interp.zoo")
    assert "interp.zoo" in mods
    assert not {m for m in mods if m.startswith(("interp.analysis", "interp.pruning", "interp.viz"))}


def test_analysis_and_pruning_load_no_plotly():
    mods = _loaded("import interp.analysis, interp.pruning")
    assert "interp.analysis.taxonomy" in mods and "interp.pruning.curve" in mods
    assert not {m for m in mods if m.split(".")[0] == "plotly"}


def test_gguf_expert_loader_loads_only_core_and_zoo():
    mods = _loaded("import interp.zoo.gguf")
    assert "interp.families._gguf_experts" in mods
    assert not {m for m in mods if m.startswith(("interp.analysis", "interp.pruning", "interp.viz", "interp.training"))}


# --- no import circles inside the model-loading packages ------------------------------------------------------
CIRCLE_FREE = ("interp.zoo", "interp.families")


def _module_of(target: str, modules: set[str]) -> str:
    """The module an import statement loads: ``interp.zoo.hub_source`` (a name) is ``interp.zoo`` (a module)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target


def import_circles(packages: tuple[str, ...] = CIRCLE_FREE, root: Path = PKG) -> list[list[str]]:
    """Groups of modules under ``packages`` that import each other, directly or through others (strongly
    connected components of the import graph with more than one module, or a module importing itself).

    Every runtime import counts, function-level ones included: a deferred import still makes two modules depend
    on each other (what the old ``hf.py`` / ``hf_families.py`` pair did). A submodule's implicit import of its
    parent package is not an edge (every package would then be a circle with its ``__init__``).
    """
    paths = {module_name(p): p for p in root.rglob("*.py")}
    modules = set(paths)
    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        if not mod.startswith(packages):
            continue
        graph[mod] = {dst for t, _, _ in imports(path) if t.startswith("interp")
                      for dst in [_module_of(t, modules)] if dst.startswith(packages)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = [stack.pop()]
            while comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1 or v in graph.get(v, ()):
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circle_inside_zoo_or_families():
    assert len([m for m in map(module_name, PKG.rglob("*.py")) if m.startswith("interp.families.")]) >= 20
    assert import_circles() == []


def test_the_circle_checker_finds_a_deferred_circle():
    # hf.py and hf_families.py used to import each other, one of the two deferred: such a pair must be found.
    a, b = PKG / "zoo" / "_probe_circle_a.py", PKG / "zoo" / "_probe_circle_b.py"
    try:
        a.write_text("from . import _probe_circle_b\n")
        b.write_text("def f():\n    from ._probe_circle_a import x\n")
        assert ["interp.zoo._probe_circle_a", "interp.zoo._probe_circle_b"] in import_circles()
    finally:
        a.unlink()
        b.unlink()
