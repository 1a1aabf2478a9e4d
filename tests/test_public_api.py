"""The public API: lazy names resolve to the library objects, and the package docstring example runs."""
from __future__ import annotations

import doctest

import eagleforensics

from .realdata import ROOT


def test_lazy_names_are_the_functions_even_after_submodule_imports():
    import eagleforensics.alignment  # noqa: F401  (a submodule import must not shadow the function)

    assert callable(eagleforensics.align) and eagleforensics.align.__module__ == "eagleforensics.alignment"
    assert set(eagleforensics.__all__) >= {"align", "load_training", "load_capture", "ForensicsError", "Position"}


def test_package_docstring_example(monkeypatch):
    monkeypatch.chdir(ROOT)
    failures, tried = doctest.testmod(eagleforensics, verbose=False)
    assert tried >= 2 and failures == 0
