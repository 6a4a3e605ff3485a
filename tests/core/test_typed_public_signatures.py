"""The typed public surface: the keyword lists that wrappers pass on match the functions they call, and the main
entry points (Transformer, Trace, load, classify_heads, activation_patching) take and return no bare ``Any``."""

from __future__ import annotations

import inspect
import re
import typing

import interp
from interp import Transformer
from interp.analysis import activation_patching, classify_heads
from interp.generate import GenerateOptions, generate
from interp.model import ForwardOptions
from interp.streaming import record
from interp.trace import Trace


def _keyword_only(fn) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_forward_options_are_forwards_keywords():
    assert set(typing.get_type_hints(ForwardOptions, include_extras=False)) == _keyword_only(Transformer.forward)


def test_generate_options_are_generates_keywords():
    assert set(GenerateOptions.__annotations__) == _keyword_only(generate)


def test_run_with_cache_takes_records_options_by_name():
    own = _keyword_only(Transformer.run_with_cache)
    assert own == _keyword_only(record)


def _bare_any(annotation: str) -> bool:
    """``Any`` outside every ``[...]``: ``Any``, ``Any | None``, but not ``dict[str, Any]``."""
    depth, top = 0, []
    for ch in annotation:
        depth += ch == "["
        depth -= ch == "]"
        top.append(ch if depth == 0 and ch not in "[]" else " ")
    return re.search(r"\bAny\b", "".join(top)) is not None


def _public(cls) -> list[tuple[str, object]]:
    out = []
    for name, obj in inspect.getmembers(cls):
        if name.startswith("_") and name != "__init__":
            continue
        fn = obj.fget if isinstance(obj, property) else obj
        if callable(fn) and (getattr(fn, "__module__", "") or "").startswith("interp"):
            out.append((f"{cls.__name__}.{name}", fn))
    return out


def test_no_bare_any_in_the_main_signatures():
    fns = [*_public(Transformer), *_public(Trace), ("load", interp.load), ("classify_heads", classify_heads),
           ("activation_patching", activation_patching)]
    assert len(fns) > 40  # the scan reaches the methods (a rename would not empty it silently)
    bad = {f"{name}: {arg}": ann for name, fn in fns for arg, ann in getattr(fn, "__annotations__", {}).items()
           if _bare_any(str(ann))}
    assert not bad, bad


def test_the_bare_any_check_sees_what_it_should():
    assert _bare_any("Any") and _bare_any("Any | None") and _bare_any("int | Any")
    assert not _bare_any("dict[str, Any]") and not _bare_any("list[Any] | None") and not _bare_any("Anything")
