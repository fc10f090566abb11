"""Random option sets, from fixed seeds, checked for determinism and exactness (fuzz_loader.py).

Four modes, each test one seed (a tiny random dataset and a few option sets over it):
``base`` (Loader options), ``mix`` (pqloader.mix, a broken row group's error position),
``ext`` (pack, row_groups, use_summary, schema, decimals, tensors, the torch DataLoader,
a file rewritten under a cache), ``drift`` (numeric columns whose type differs between files,
absent or all null in some, schema= declaring wider types, random pc filters over them,
against pyarrow's dataset read in the loaded schema). The seeds are fixed, so a run checks the same option
sets every time; a failure names its mode, seed and option set.

More or other seeds, through the environment:

    PQLOADER_FUZZ_SEEDS=ext:17           # replay one seed (or base:3,mix:40,ext:17; a bare
                                         # number runs that seed in every mode)
    PQLOADER_FUZZ_COUNT=500              # seeds 0..499 of every mode (a long search;
    PQLOADER_FUZZ_FIRST=1000             # ... starting at 1000)

e.g. ``PQLOADER_FUZZ_COUNT=300 python -m pytest -q -n 2 python/tests/test_fuzz.py``.
"""

from __future__ import annotations

import os

import pytest

from fuzz_loader import Fail, run_draw

# Seeds per mode in an ordinary run: 22-46 s in all with -n 2 on 2 busy cores (docs/testing.md).
DEFAULT_COUNT = {"base": 20, "mix": 60, "ext": 8, "drift": 30}


def seeds(mode: str) -> list[int]:
    chosen = os.environ.get("PQLOADER_FUZZ_SEEDS")
    if chosen:
        out = []
        for item in chosen.replace(" ", "").split(","):
            m, _, s = item.rpartition(":")
            if m in ("", mode):
                out.append(int(s))
        return out
    first = int(os.environ.get("PQLOADER_FUZZ_FIRST", "0"))
    return list(range(first, first + int(os.environ.get("PQLOADER_FUZZ_COUNT", DEFAULT_COUNT[mode]))))


def replay(mode: str, seed: int, tmp_path) -> None:
    try:
        run_draw(mode, seed, tmp_path)
    except Fail as e:
        raise Fail(f"fuzz {mode} seed {seed}: {e}\n    replay: PQLOADER_FUZZ_SEEDS={mode}:{seed} "
                   f"python -m pytest python/tests/test_fuzz.py") from e.__cause__


@pytest.mark.parametrize("seed", seeds("base"))
def test_loader_options(seed, tmp_path):
    replay("base", seed, tmp_path)


@pytest.mark.parametrize("seed", seeds("mix"))
def test_mixtures(seed, tmp_path):
    replay("mix", seed, tmp_path)


@pytest.mark.parametrize("seed", seeds("ext"))
def test_pack_schema_summary_torch_and_stale_files(seed, tmp_path):
    replay("ext", seed, tmp_path)


@pytest.mark.parametrize("seed", seeds("drift"))
def test_type_drift_between_files_and_filters(seed, tmp_path):
    replay("drift", seed, tmp_path)
