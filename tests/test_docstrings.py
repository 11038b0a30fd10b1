"""Every public callable says what it does: the names of ``tmaflow.__all__`` (and the public
names of the modules listed there), the public methods and properties of every public class,
and the public callables of ``tmaflow.kernels``."""
from __future__ import annotations

import functools
import inspect
import types

import tmaflow as tf
import tmaflow.kernels


def _documented(obj) -> bool:
    return bool(obj.__doc__ and obj.__doc__.strip())


def _members(cls):
    """(name, function or property) of what ``cls`` itself defines publicly."""
    for name, raw in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if isinstance(raw, (property, functools.cached_property)) or inspect.isfunction(raw):
            yield name, raw


def _public_names(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
            and getattr(v, "__module__", None) == module.__name__]


def undocumented(roots: dict[str, object]) -> list[str]:
    """Qualified names of the public callables under ``roots`` (name -> object) without a
    docstring of their own."""
    missing, seen = [], set()

    def visit(qual: str, obj) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            for n in _public_names(obj):
                visit(f"{qual}.{n}", getattr(obj, n))
            return
        if not callable(obj):
            return
        if not _documented(obj):
            missing.append(qual)
        if inspect.isclass(obj):
            missing.extend(f"{qual}.{n}" for n, m in _members(obj) if not _documented(m))

    for qual, obj in roots.items():
        visit(qual, obj)
    return missing


def test_every_public_callable_has_a_docstring():
    roots = {f"tf.{n}": getattr(tf, n) for n in tf.__all__}
    roots["tmaflow.kernels"] = tmaflow.kernels
    assert undocumented(roots) == []


def test_the_walk_finds_what_lacks_one():
    class Plan:
        """Documented."""

        def described(self):
            """Yes."""

        def bare(self):
            pass

        @property
        def size(self):
            return 1

        def _private(self):
            pass

    def helper():
        pass

    module = types.ModuleType("fake")
    module.__all__ = ["Plan", "helper"]
    module.Plan, module.helper = Plan, helper
    assert undocumented({"fake": module}) == ["fake.Plan.bare", "fake.Plan.size", "fake.helper"]
