"""Insert the imports each public docstring example of interp lacks, so it runs in a fresh namespace.

Run from the repository root (``python experiments/add_docstring_imports.py``) after adding examples, then check
with ``tests/docs/test_docstring_examples_fresh.py``. A name an example reads without defining it is imported from
``interp.examples`` (model, tokens, trace...), from the standard modules (torch, numpy as np...), or from the
example's own module (``from interp import X`` when the package exports it). It edits the files in place and
prints the names it could not place (usually a comprehension's variable, which needs nothing). Idempotent.
"""

import ast
import builtins
import collections
import doctest
import importlib
import inspect
import os
import pkgutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.chdir(ROOT)
import interp  # noqa: E402 - from this checkout (sys.path above)

PROTECTED = ("interp.app.dashboard",)
ORDER = [
    "model",
    "tokens",
    "trace",
    "clean",
    "corrupted",
    "answers",
    "metric",
    "train",
    "held_out",
    "objective",
    "batches",
    "moe_model",
    "moe_tokens",
    "tok",
    "tmp",
]
#: The names interp.examples provides, in the order an example imports them.
FIXTURES = set(ORDER)
STD = {
    "torch": "import torch",
    "np": "import numpy as np",
    "pd": "import pandas as pd",
    "F": "import torch.nn.functional as F",
    "nn": "from torch import nn",
    "go": "import plotly.graph_objects as go",
    "interp": "import interp",
    "math": "import math",
    "json": "import json",
    "os": "import os",
    "re": "import re",
    "Path": "from pathlib import Path",
    "dataclasses": "import dataclasses",
    "tempfile": "import tempfile",
    "warnings": "import warnings",
    "plotly": "import plotly",
    "pytest": "import pytest",
    "time": "import time",
    "functools": "import functools",
    "itertools": "import itertools",
    "threading": "import threading",
}


def protected(name):
    return any(
        name == p or name.startswith(p + ".") or (p == "interp.zoo.gguf" and name.startswith("interp.zoo.gguf"))
        for p in PROTECTED
    )


class Names(ast.NodeVisitor):
    def __init__(self):
        self.load, self.bound = [], set()

    def visit_Name(self, n):
        if isinstance(n.ctx, ast.Load):
            if n.id not in self.bound:
                self.load.append(n.id)
        else:
            self.bound.add(n.id)

    def visit_Assign(self, n):
        self.visit(n.value)
        for t in n.targets:
            self.visit(t)

    def visit_AugAssign(self, n):
        self.visit(n.value)
        self.visit(n.target)

    def visit_AnnAssign(self, n):
        if n.value is not None:
            self.visit(n.value)
        self.visit(n.target)

    def visit_arg(self, n):
        self.bound.add(n.arg)

    def visit_alias(self, n):
        self.bound.add((n.asname or n.name).split(".")[0])

    def visit_FunctionDef(self, n):
        self.bound.add(n.name)
        self.generic_visit(n)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, n):
        self.bound.add(n.name)
        self.generic_visit(n)

    def visit_ExceptHandler(self, n):
        if n.name:
            self.bound.add(n.name)
        self.generic_visit(n)


def undefined(src):
    v = Names()
    try:
        v.visit(ast.parse(src))
    except SyntaxError:
        return None
    seen, out = set(), []
    for n in v.load:
        if not hasattr(builtins, n) and n not in seen:
            seen.add(n)
            out.append(n)
    return out


def imports_for(names, module):
    fix = [n for n in ORDER if n in names]
    std, frm, unresolved = [], collections.defaultdict(list), []
    for n in names:
        if n in FIXTURES:
            continue
        if n in STD:
            std.append(STD[n])
            continue
        if hasattr(module, n):
            obj = getattr(module, n)
            if inspect.ismodule(obj):
                std.append(f"import {obj.__name__}" if obj.__name__ == n else f"import {obj.__name__} as {n}")
            elif getattr(interp, n, None) is obj and n in getattr(interp, "__all__", dir(interp)):
                frm["interp"].append(n)
            else:
                frm[module.__name__].append(n)
            continue
        unresolved.append(n)
    lines = sorted(set(std), key=lambda l: (not l.startswith("import"), l))
    for mod in sorted(frm, key=lambda m: (m != "interp", m)):
        lines.append(f"from {mod} import {', '.join(sorted(frm[mod]))}")
    if fix:
        lines.append(f"from interp.examples import {', '.join(fix)}")
    return lines, unresolved


finder = doctest.DocTestFinder(exclude_empty=True)
edits = collections.defaultdict(dict)  # file -> {line index: lines}
unres = []
mods = [interp]
for info in pkgutil.walk_packages(interp.__path__, "interp."):
    if protected(info.name) or info.name.endswith("__main__") or info.name == "interp.examples":
        continue
    mods.append(importlib.import_module(info.name))
n_doc = 0
for m in mods:
    path = inspect.getsourcefile(m)
    for t in finder.find(m, m.__name__):
        parts = t.name.split(".")[len(m.__name__.split(".")) :]
        if any(p.startswith("_") for p in parts) or not t.examples:
            continue
        if t.filename != path:
            continue  # re-exported objects: their own module handles them
        src = "\n".join(e.source for e in t.examples)
        names = undefined(src)
        if names is None:
            unres.append((t.name, "syntax"))
            continue
        lines, un = imports_for(names, m)
        if un:
            unres.append((t.name, un))
        if not lines:
            continue
        content = open(path).read()
        first = t.examples[0].source.splitlines()[0].strip()
        idx = (t.lineno if t.lineno is not None else -(10**6)) + t.examples[0].lineno
        file_lines = content.split("\n")
        if not (0 <= idx < len(file_lines) and file_lines[idx].strip() == ">>> " + first):
            at = content.find(t.docstring) if t.docstring else -1
            if at < 0 or content.find(t.docstring, at + 1) >= 0:
                unres.append((t.name, "docstring not located"))
                continue
            idx = content[:at].count("\n") + t.examples[0].lineno
            if file_lines[idx].strip() != ">>> " + first:
                unres.append((t.name, "docstring not located", idx))
                continue
        edits[path][idx] = lines
        n_doc += 1
for path, by_line in edits.items():
    text = open(path).read().split("\n")
    for idx in sorted(by_line, reverse=True):
        line = text[idx]
        assert ">>>" in line, (path, idx, line)
        indent = line[: line.index(">>>")]
        text[idx:idx] = [f"{indent}>>> {l}" for l in by_line[idx]]
    open(path, "w").write("\n".join(text))
print("docstrings edited:", n_doc, "files:", len(edits))
for u in unres:
    print("UNRESOLVED", u)
