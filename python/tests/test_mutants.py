"""`make mutants-cpp` runs: every hand-made mutant still names code that exists."""

from __future__ import annotations

import importlib.util
import sys

from conftest import REPO_ROOT


def test_every_cpp_mutant_snippet_occurs_once_in_its_file():
    # cpp_mutants.py exits at its first stale mutant, before --list or any build, so a
    # snippet that moved (philox.cc -> philox.h, a renamed variable) breaks `make mutants`.
    spec = importlib.util.spec_from_file_location(
        "cpp_mutants", REPO_ROOT / "tools" / "mutants" / "cpp_mutants.py")
    mutants = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cpp_mutants", mutants)  # dataclasses look their module up
    spec.loader.exec_module(mutants)
    stale = {}
    for m in mutants.MUTANTS:
        n = (REPO_ROOT / mutants.SRC / m.file).read_text().count(m.original)
        if n != 1:
            stale[m.id] = f"{m.file}: {n} occurrences"
    assert not stale, stale
