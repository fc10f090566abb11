"""cache_policy="plan" (issue 18): evict the row groups the plans read furthest in the
future. The cache never changes what a loader yields, whatever the policy and size."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pqloader
from test_cache import TRANSFORMS, assert_same, write


@pytest.fixture()
def data(tmp_path):
    return write(tmp_path / "d.parquet", n=400, rg=20)  # 20 row groups


def run(data, cache_dir, n=4, **kw):
    kw.setdefault("batch_size", 32)
    kw.setdefault("shuffle", True)
    kw.setdefault("seed", 11)
    kw.setdefault("transforms", TRANSFORMS)
    loader = pqloader.Loader(data, num_epochs=n, cache_dir=cache_dir, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a full cache says so
        batches = list(loader)
    return batches, loader.stats()


def entries_bytes(data, tmp_path) -> int:
    probe = tmp_path / "probe"
    run(data, str(probe), n=1)
    return pqloader.cache_stats(probe)["bytes"]


@pytest.mark.parametrize("policy", ["keep", "lru", "plan"])
@pytest.mark.parametrize("where", ["disk", "memory"])
def test_batches_are_bit_identical_with_and_without_a_cache_under_every_policy(
        data, tmp_path, policy, where):
    size = entries_bytes(data, tmp_path)
    for rank, world in ((0, 1), (1, 2)):
        plain, _ = run(data, None, rank=rank, world_size=world)
        for fraction in (0.3, 0.7):
            cache_dir = str(tmp_path / f"{where}-{policy}-{rank}-{fraction}") if where == "disk" \
                else ":memory:"
            limit = int(size * fraction)
            cached, s = run(data, cache_dir, rank=rank, world_size=world, cache_policy=policy,
                            cache_size_limit=limit, cache_shards=1, num_workers=3)
            assert_same(plain, cached)
            assert s["cache_hits"] + s["cache_misses"] > 0
            if where == "disk":
                assert pqloader.cache_stats(cache_dir)["bytes"] <= limit


def test_plan_keeps_more_hits_than_lru_on_reshuffled_epochs(data, tmp_path):
    size = entries_bytes(data, tmp_path)
    hits = {}
    for policy in ("keep", "lru", "plan"):
        _, s = run(data, str(tmp_path / policy), n=5, cache_policy=policy,
                   cache_size_limit=size // 2, cache_shards=1, num_workers=1)
        hits[policy] = s["cache_hits"]
        if policy == "plan":
            assert s["cache_refused_later"] > 0 and s["cache_refused_full"] == 0
            assert s["cache_skipped_full"] == s["cache_refused_later"]
    # Every row group is read once per epoch: a slot gives at most one hit per epoch, so
    # the optimum is what keep gets (half the row groups per epoch after the first).
    assert hits["plan"] >= 0.95 * hits["keep"]
    assert hits["plan"] > hits["lru"]


def test_plan_evicts_entries_its_loader_never_reads(data, tmp_path):
    # A cache filled by another loader (other columns): keep stays full of entries this
    # loader never reads; plan evicts them first.
    size = entries_bytes(data, tmp_path)
    for policy in ("keep", "plan"):
        cache_dir = str(tmp_path / policy)
        run(data, cache_dir, n=1, columns=["id", "x"], transforms=None,
            cache_size_limit=size // 4, cache_shards=1)
        _, s = run(data, cache_dir, n=3, cache_policy=policy, cache_size_limit=size // 4,
                   cache_shards=1)
        if policy == "keep":
            assert s["cache_hits"] == 0 and s["cache_evictions"] == 0
        else:
            assert s["cache_hits"] > 0 and s["cache_evictions"] > 0


def test_plan_warns_once_when_it_leaves_row_groups_out(data, tmp_path):
    size = entries_bytes(data, tmp_path)
    loader = pqloader.Loader(data, batch_size=32, shuffle=True, seed=1, num_epochs=3, transforms=TRANSFORMS,
                             cache_dir=str(tmp_path / "c"), cache_policy="plan",
                             cache_size_limit=size // 3, cache_shards=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(loader)
    later = [w for w in caught if "read later than all it holds" in str(w.message)]
    assert len(later) == 1 and later[0].category is RuntimeWarning
    assert "policy 'plan'" in str(later[0].message)
