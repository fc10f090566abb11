"""`pqloader cache clear` deletes only what it can prove is pqloader's (issue 12, item 2),
and a rewritten source file is never served from stale entries (item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import subprocess_env

MARKER = "PQLOADER_CACHE"


def write(path: Path, n: int = 120, rg: int = 40, offset: int = 0) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": np.arange(offset, offset + n, dtype=np.int64),
                             "x": np.arange(n, dtype=np.float32) + offset}), path,
                   row_group_size=rg)
    return str(path)


def fill(data: str, cache_dir: Path) -> list[int]:
    loader = pqloader.Loader(data, batch_size=32, cache_dir=str(cache_dir))
    return [int(i) for b in loader for i in b["id"]]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pqloader", *args], capture_output=True,
                          text=True, env=subprocess_env(), timeout=120)


def test_clear_refuses_a_directory_that_is_not_a_cache_and_deletes_nothing(tmp_path):
    user = tmp_path / "experiments"
    kept = [Path(write(user / "shard-00" / "part-0.parquet")), user / "records", user / "footers" / "a"]
    kept[1].write_text("my records\n")
    kept[2].parent.mkdir()
    kept[2].write_text("mine")
    with pytest.raises(pqloader.InvalidDataError, match=r"experiments' is not a pqloader cache.*"
                                                        r"PQLOADER_CACHE.*nothing was deleted"):
        pqloader.cache_clear(user)
    done = cli("cache", "clear", str(user))
    assert done.returncode == 1
    assert "is not a pqloader cache directory" in done.stderr and "cleared" not in done.stdout
    assert all(p.exists() for p in kept)
    assert pq.read_table(kept[0]).num_rows == 120


def test_clear_of_an_empty_directory_succeeds_and_of_a_missing_one_fails(tmp_path):
    (tmp_path / "empty").mkdir()
    assert pqloader.cache_clear(tmp_path / "empty")["entries"] == 0
    with pytest.raises(pqloader.IOError, match="not a directory"):
        pqloader.cache_clear(tmp_path / "missing")


def test_clear_deletes_a_real_cache_and_leaves_foreign_files_alone(tmp_path):
    data = write(tmp_path / "data" / "d.parquet")
    cache = tmp_path / "cache"
    expected = fill(data, cache)
    assert (cache / MARKER).read_text().splitlines()[:2] == ["pqloader cache", "format 3"]
    entries = pqloader.cache_stats(cache)["entries"]
    assert entries == 3
    # Things pqloader did not write, placed inside the cache afterwards.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    foreign = [Path(write(cache / "shard-00" / "part-0.parquet")),
               cache / "shard-00" / "notes" / "todo.txt",
               cache / "shard-01" / ("0" * 32 + ".pqc"),  # an entry's name, not its header
               cache / "footers" / "readme.txt",
               cache / "mydata.csv",
               cache / "shard-0f"]  # a symbolic link to a directory of the user's
    foreign[1].parent.mkdir(parents=True)
    foreign[1].write_text("x")
    foreign[2].parent.mkdir(exist_ok=True)
    foreign[2].write_bytes(b"PQLCACHE not really an entry" + bytes(64))
    foreign[3].parent.mkdir(exist_ok=True)
    foreign[3].write_text("x")
    foreign[4].write_text("a,b\n")
    foreign[5].symlink_to(outside, target_is_directory=True)
    report = pqloader.cache_clear(cache)
    assert report["entries"] == entries and report["bytes"] > 0
    assert report["other_files"] >= 1  # footers, locks, usage files, records
    assert report["foreign_count"] == len(foreign)
    assert sorted(report["foreign"]) == sorted(
        str(p if p.name != "todo.txt" else p.parent) for p in foreign)
    assert all(os.path.lexists(p) for p in foreign)
    assert (outside / "precious.txt").read_text() == "keep me"
    assert pq.read_table(foreign[0]).num_rows == 120
    assert pqloader.cache_stats(cache)["entries"] == 1  # stats go by name: the impostor
    assert (cache / MARKER).exists()
    assert not any(p.name.endswith(".thrift") for p in (cache / "footers").iterdir())
    assert fill(data, cache) == expected  # still a working cache
    assert pqloader.cache_stats(cache)["entries"] == entries + 1


def test_clear_reports_a_foreign_file_whose_name_is_not_utf8(tmp_path):
    # The report's names crossed into Python as UTF-8: a clear that had happened then
    # raised UnicodeDecodeError. They are what os.fsdecode makes of the bytes.
    data = write(tmp_path / "data" / "d.parquet")
    cache = tmp_path / "cache"
    fill(data, cache)
    odd = os.path.join(os.fsencode(cache), b"\xff-notes.txt")
    with open(odd, "wb") as f:
        f.write(b"x")
    report = pqloader.cache_clear(cache)
    assert report["entries"] == 3
    assert report["foreign"] == [os.fsdecode(odd)] and os.path.lexists(odd)


def test_cli_clear_reports_what_it_deleted_and_left(tmp_path):
    data = write(tmp_path / "d.parquet")
    cache = tmp_path / "cache"
    fill(data, cache)
    (cache / "mine.txt").write_text("x")
    done = cli("cache", "clear", str(cache))
    assert done.returncode == 0, done.stderr
    assert "3 entries" in done.stdout and "left alone, not pqloader's: 1" in done.stdout
    assert "mine.txt" in done.stdout and (cache / "mine.txt").exists()


def test_a_directory_of_user_files_given_as_cache_dir_is_used_but_never_marked(tmp_path):
    data = write(tmp_path / "d.parquet")
    user = tmp_path / "home"
    user.mkdir()
    (user / "thesis.tex").write_text("keep")
    assert fill(data, user) == list(range(120))
    assert not (user / MARKER).exists()
    with pytest.raises(pqloader.InvalidDataError, match="not a pqloader cache"):
        pqloader.cache_clear(user)
    assert (user / "thesis.tex").read_text() == "keep"


@pytest.mark.parametrize("name", ["records", "records.new"])
@pytest.mark.parametrize("beside", [[], ["thesis.tex"]])
def test_a_users_file_named_records_is_neither_cleared_nor_written_over(tmp_path, name, beside):
    # A directory holding only a file of the user's named `records` was taken for a cache:
    # `cache clear` deleted the file, and a loader given the directory as cache_dir marked
    # it and wrote its counts over the file (also beside other files, unmarked).
    user = tmp_path / "exports"
    user.mkdir()
    mine = user / name
    mine.write_text("my records: 3 of them\n")
    for other in beside:
        (user / other).write_text("keep")
    for call in (pqloader.cache_stats, pqloader.cache_prune, pqloader.cache_clear):
        with pytest.raises(pqloader.InvalidDataError, match="not a pqloader cache"):
            call(user)
    done = cli("cache", "clear", str(user))
    assert done.returncode == 1 and "not a pqloader cache" in done.stderr, done.stdout
    assert mine.read_text() == "my records: 3 of them\n"
    assert fill(write(tmp_path / "d.parquet"), user) == list(range(120))
    assert mine.read_text() == "my records: 3 of them\n"
    assert not (user / MARKER).exists()


def test_cache_made_before_markers_existed_is_marked_when_it_holds_only_cache_files(tmp_path):
    data = write(tmp_path / "d.parquet")
    cache = tmp_path / "cache"
    fill(data, cache)
    (cache / MARKER).unlink()  # as left by a version without markers
    assert (cache / "records").read_text().startswith("corrupt 0\n")  # loaders' own: a cache's
    fill(data, cache)
    assert (cache / MARKER).exists()
    assert pqloader.cache_clear(cache)["entries"] == 3


# -- item 7: the footer's hash is part of every key ----------------------------------------


def fixed_size_file(path: Path, offset: int) -> None:
    """100 int64 ids, uncompressed and plain: the file's size does not depend on values."""
    pq.write_table(pa.table({"id": np.arange(offset, offset + 100, dtype=np.int64)}), path,
                   row_group_size=25, compression="NONE", use_dictionary=False)


def test_file_rewritten_with_same_size_and_mtime_is_not_served_from_stale_entries(tmp_path):
    path = tmp_path / "d.parquet"
    fixed_size_file(path, 0)
    st = path.stat()
    cache = tmp_path / "cache"
    first = pqloader.Loader(str(path), batch_size=50, cache_dir=str(cache))
    assert [int(i) for b in first for i in b["id"]] == list(range(100))
    assert first.stats()["cache_inserts"] == 4
    fixed_size_file(path, 1000)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    second = pqloader.Loader(str(path), batch_size=50, cache_dir=str(cache))
    assert [int(i) for b in second for i in b["id"]] == list(range(1000, 1100))
    assert second.stats()["cache_hits"] == 0
    third = pqloader.Loader(str(path), batch_size=50, cache_dir=str(cache))
    assert [int(i) for b in third for i in b["id"]] == list(range(1000, 1100))
    assert third.stats()["cache_hits"] == 4  # the new entries are used


def test_stats_of_a_directory_that_is_not_a_cache_is_an_error_not_an_empty_cache(tmp_path):
    # Stats of a dataset directory (or any directory without the marker) reported 0
    # entries, exit 0; an empty directory is a cache not used yet.
    user = tmp_path / "data"
    write(user / "part-0.parquet")
    with pytest.raises(pqloader.InvalidDataError, match=r"data' is not a pqloader cache.*PQLOADER_CACHE"):
        pqloader.cache_stats(user)
    done = cli("cache", "stats", str(user))
    assert done.returncode == 1 and "is not a pqloader cache directory" in done.stderr
    (tmp_path / "empty").mkdir()
    assert pqloader.cache_stats(tmp_path / "empty")["entries"] == 0
    cache = tmp_path / "cache"
    fill(str(user), cache)
    assert pqloader.cache_stats(cache)["entries"] == 3


def test_a_loader_keeps_caching_after_cache_clear_runs_beside_it(tmp_path):
    # clear removed the shard directories it emptied: a loader made before it (or running
    # meanwhile) inserted nothing more, each insert a write error.
    import warnings
    pq.write_table(pa.table({"id": np.arange(2000, dtype=np.int64)}), tmp_path / "d.parquet",
                   row_group_size=50)
    path, cache = str(tmp_path / "d.parquet"), tmp_path / "cache"
    kw = dict(batch_size=50, num_epochs=2, shuffle=True, seed=1)
    want = [b["id"].tolist() for b in pqloader.Loader(path, **kw)]
    loader = pqloader.Loader(path, cache_dir=str(cache), **kw)  # made its shard directories
    assert pqloader.cache_clear(cache)["entries"] == 0  # e.g. a cron job's
    assert sorted(p.name for p in cache.glob("shard-*/.lock")) and list(cache.glob("shard-*"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "cannot create a cache file in ...: No such file"
        assert [b["id"].tolist() for b in loader] == want
    s = loader.stats()
    assert (s["cache_inserts"], s["cache_write_errors"], s["cache_hits"]) == (40, 0, 40)
    assert pqloader.cache_stats(cache)["entries"] == 40


def test_an_empty_cache_dir_is_refused_not_taken_as_the_current_directory(tmp_path, monkeypatch):
    # The Loader refuses cache_dir='', but cache_stats/prune/clear (and `pqloader cache
    # clear ""`, a variable left unset) made '' absolute: the current directory. Run in a
    # cache directory, clear deleted its entries.
    cache = tmp_path / "cache"
    ids = fill(write(tmp_path / "d" / "a.parquet"), cache)
    assert len(ids) == 120
    entries = sorted(cache.glob("shard-*/*.pqc"))
    assert entries
    monkeypatch.chdir(cache)
    for fn in (pqloader.cache_stats, pqloader.cache_prune, pqloader.cache_clear):
        with pytest.raises(ValueError, match="must be a directory path, got ''"):
            fn("")
    r = subprocess.run([sys.executable, "-m", "pqloader", "cache", "clear", ""], cwd=cache,
                       capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert r.returncode != 0 and "got ''" in r.stderr, r.stderr
    assert sorted(cache.glob("shard-*/*.pqc")) == entries


@pytest.mark.parametrize("marker,why", [
    (b"", "marker file is empty (damaged)"),
    (b"pqlo\0\0garbage", "marker file is damaged (its first line is not 'pqloader cache')"),
    (None, "marker is not a regular file (damaged)"),
])
def test_stats_prune_and_clear_name_a_damaged_marker_not_a_missing_one(tmp_path, marker, why):
    # A cache holding a file of the user's (so only its marker proves it pqloader's) whose
    # PQLOADER_CACHE was empty or damaged was refused as having "no PQLOADER_CACHE marker
    # file": the user looked for a missing file that was there.
    cache = tmp_path / "cache"
    ids = fill(write(tmp_path / "d.parquet"), cache)
    assert ids == list(range(120))
    (cache / "notes.txt").write_text("mine\n")
    (cache / MARKER).unlink()
    if marker is None:
        (cache / MARKER).mkdir()
    else:
        (cache / MARKER).write_bytes(marker)
    for call in (pqloader.cache_stats, pqloader.cache_prune, pqloader.cache_clear):
        with pytest.raises(pqloader.InvalidDataError) as caught:
            call(cache)
        assert why in str(caught.value) and "has no" not in str(caught.value), str(caught.value)
    for command in ("stats", "prune", "clear"):
        done = cli("cache", command, str(cache))
        assert done.returncode == 1 and why in done.stderr, done.stderr
    assert (cache / "notes.txt").read_text() == "mine\n"
    (cache / MARKER).rmdir() if marker is None else (cache / MARKER).unlink()
    with pytest.raises(pqloader.InvalidDataError, match="it has no PQLOADER_CACHE marker file"):
        pqloader.cache_stats(cache)


def test_symlinks_planted_at_the_caches_lock_and_temp_names_are_not_followed(tmp_path):
    # In a group-shared cache any member can make a name inside it. A dangling symlink at
    # .records.lock, records.new or a shard's .usage.new was followed: the loader created
    # (or truncated and wrote) its target, any file the loader's user may write.
    data = write(tmp_path / "data" / "a.parquet")
    cache = tmp_path / "cache"
    expected = fill(data, cache)
    victims = []
    for name in [".records.lock", "records.new"] + [f"{s.name}/.usage.new" for s in sorted(cache.glob("shard-*"))]:
        (cache / name).unlink(missing_ok=True)
        victims.append(tmp_path / ("victim-" + name.replace("/", "-")))
        (cache / name).symlink_to(victims[-1])
    pqloader.cache_clear(cache)  # every entry inserted again: each shard's usage rewritten
    for name in ["shard-00/.usage.new"]:  # (the clear removes temp names: planted again)
        (cache / name).unlink(missing_ok=True)
        (cache / name).symlink_to(victims[2])
    assert fill(data, cache) == expected
    assert fill(data, cache) == expected
    assert [v.name for v in victims if v.exists() or v.is_symlink()] == []
