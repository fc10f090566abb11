"""One cache_dir used by several UNIX users of a node (the jobs of several users, or one
job whose processes run under other uids): the modes of what the cache creates follow
the umask, a user of a group-shared directory inserts beside another's entries, a user
who may only read the directory gets its hits and a counted, warned-once write error,
and `cache clear`/`prune` go on past another user's files and report them.

Each user is a process started as root that imports what it needs and then drops to
a uid of its own (no account needed: setresuid takes any number) with a umask and
groups. Root only: skipped elsewhere (CI runs as root). The directories live in one
made here, readable by those uids (pytest's own tmp_path is root's alone)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import subprocess_env

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="needs root to run processes as other users")

USER_A, USER_B, GROUP = 54321, 54322, 54320

# Run in the child after the privileges are dropped: `load` reads the dataset through the
# cache and returns the ids in order, the cache counters and the warnings.
_PRELUDE = """
import argparse, gettext, json, locale, os, sys, warnings
import numpy as np
import pqloader, pqloader.cli, pqloader._inspect
# (Imported before the privileges go: the interpreter's library may be unreadable to the
# users, and argparse imports gettext and locale when the CLI first parses.)
pqloader.cli.build_parser()

def load(src, cache_dir, columns=("id", "s"), **kw):
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        loader = pqloader.Loader(src, columns=list(columns), batch_size=64, shuffle=True,
                                 seed=3, cache_dir=cache_dir, **kw)
        ids = [int(v) for b in loader for v in np.asarray(b["id"] if "id" in columns else [])]
        stats = {k: v for k, v in loader.stats().items() if k.startswith("cache_")}
    return {"ids": ids, "stats": stats, "warnings": [str(w.message) for w in ws]}

args = json.loads(sys.argv[1])
os.umask(args["umask"])
os.setgroups(args["groups"])
os.setresgid(args["gid"], args["gid"], args["gid"])
os.setresuid(args["uid"], args["uid"], args["uid"])
"""


def as_user(uid: int, code: str, *, umask: int = 0o022, groups=(), **values):
    """Run `code` (after _PRELUDE; it sets `result`) as `uid`; what it set, from JSON."""
    args = {"uid": uid, "gid": groups[0] if groups else uid, "groups": list(groups),
            "umask": umask, **values}
    script = _PRELUDE + code + "\nprint('RESULT ' + json.dumps(result))\n"
    done = subprocess.run([sys.executable, "-c", script, json.dumps(args)], capture_output=True,
                          text=True, env=subprocess_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture
def shared():
    """A directory every uid may write in (as /tmp), with a dataset of 3 files x 4 row groups."""
    root = Path(tempfile.mkdtemp(prefix="pqloader-multiuser-"))
    try:
        os.chmod(root, 0o1777)  # as /tmp: any user makes its cache here
        data = root / "data"
        data.mkdir()
        for f in range(3):
            n = 200
            pq.write_table(pa.table({"id": pa.array(np.arange(f * 1000, f * 1000 + n), pa.int64()),
                                     "s": pa.array([f"row {i}" for i in range(n)])}),
                           data / f"f{f}.parquet", row_group_size=50)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def uncached(root: Path) -> list[int]:
    return as_user(USER_A, "result = load(args['src'], None)", src=str(root / "data"))["ids"]


def group_dir(path: Path) -> Path:
    """A directory as an administrator prepares one for a group: setgid, group-writable."""
    path.mkdir()
    os.chown(path, 0, GROUP)
    os.chmod(path, 0o2775)
    return path


def test_group_shared_cache_a_second_user_inserts_and_hits(shared):
    """Two users of one group, umask 002, in a setgid group directory. The shard locks
    were created 0644 whatever the umask and opened for writing: the second user could
    lock no shard of the first's, so each of its inserts was a write error (11 of 12),
    and the claim markers it made stayed behind (deleted under the lock it never had)."""
    cache = group_dir(shared / "cache")
    src = str(shared / "data")
    want = uncached(shared)
    first = as_user(USER_A, "result = load(args['src'], args['cache'])", umask=0o002,
                    groups=[GROUP], src=src, cache=str(cache))
    assert first["stats"]["cache_inserts"] == 12 and first["ids"] == want
    # What the first user made is group-writable (its umask), locks and entries included.
    for p in cache.rglob("*"):
        assert p.stat().st_mode & 0o070 == 0o060 or p.is_dir(), (p, oct(p.stat().st_mode))
        assert p.stat().st_gid == GROUP, p
    second = as_user(USER_B, """
hits = load(args['src'], args['cache'])
other = load(args['src'], args['cache'], columns=("s",))
result = {"hits": hits, "other": other}
""", umask=0o002, groups=[GROUP], src=src, cache=str(cache))
    assert second["hits"]["ids"] == want
    assert second["hits"]["stats"]["cache_hits"] == 12
    other = second["other"]
    assert other["warnings"] == []
    assert other["stats"]["cache_write_errors"] == 0
    assert other["stats"]["cache_inserts"] == 12
    assert not list(cache.glob("shard-*/*.fetch")), "claim markers were left behind"
    # ...and the first user reads what the second wrote.
    again = as_user(USER_A, "result = load(args['src'], args['cache'], columns=('s',))",
                    umask=0o002, groups=[GROUP], src=src, cache=str(cache))
    assert again["stats"]["cache_hits"] == 12 and again["stats"]["cache_write_errors"] == 0


def test_a_user_who_may_only_read_the_cache_gets_hits_and_one_warning(shared):
    """A cache made by root (umask 022), used by a user without write permission: hits
    are served, equal to an uncached read; inserts fail, are counted, and warn once,
    naming the directory and the OS's reason; nothing is raised mid-epoch."""
    cache = shared / "cache"
    src = str(shared / "data")
    want = uncached(shared)
    made = as_user(0, "result = load(args['src'], args['cache'])", umask=0o022, src=src,
                   cache=str(cache))
    assert made["stats"]["cache_inserts"] == 12
    got = as_user(USER_B, """
result = {"hits": load(args['src'], args['cache']),
          "misses": load(args['src'], args['cache'], columns=("id",))}
""", src=src, cache=str(cache))
    assert got["hits"]["ids"] == want and got["hits"]["stats"]["cache_hits"] == 12
    assert got["hits"]["warnings"] == []
    misses = got["misses"]
    assert misses["ids"] == want
    # Every miss's insert failed: the epoch's 12, and those of the next epoch's units the
    # loader decoded ahead before stats() (0-12 of them, as the threads ran: a cache's
    # writes are counted as they happen, see Loader::DetachLocked).
    assert 12 <= misses["stats"]["cache_write_errors"] <= 24, misses["stats"]
    assert misses["stats"]["cache_inserts"] == 0 and misses["stats"]["cache_misses"] == 12
    assert len(misses["warnings"]) == 1, misses["warnings"]
    assert str(cache) in misses["warnings"][0] and "Permission denied" in misses["warnings"][0]
    # Nothing of the user's was left in the directory (it could write nothing).
    assert all(p.stat().st_uid == 0 for p in cache.rglob("*"))


def test_a_private_cache_umask_077_is_not_used_by_another_user(shared):
    """Under umask 077 the cache is its creator's alone: another user's loader says so
    once (the directory, 'Permission denied') and reads uncached, the same rows."""
    cache = shared / "cache"
    src = str(shared / "data")
    want = uncached(shared)
    as_user(USER_A, "result = load(args['src'], args['cache'])", umask=0o077, src=src,
            cache=str(cache))
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in cache.rglob("*"))
    other = as_user(USER_B, "result = load(args['src'], args['cache'])", src=src,
                    cache=str(cache))
    assert other["ids"] == want and other["stats"]["cache_hits"] == 0
    assert len(other["warnings"]) == 1
    assert str(cache) in other["warnings"][0] and "Permission denied" in other["warnings"][0]


def test_clear_and_prune_go_on_past_another_users_files(shared):
    """Shard directories with the sticky bit: a user may delete only its own files. A
    clear by another user stopped at the first file it could not delete (an IOError,
    the rest not cleared); it now deletes what it may and reports the others, and the
    command line says so on one line with status 1."""
    cache = group_dir(shared / "cache")
    src = str(shared / "data")
    as_user(USER_A, "result = load(args['src'], args['cache'])", umask=0o002, groups=[GROUP],
            src=src, cache=str(cache))
    as_user(USER_B, "result = load(args['src'], args['cache'], columns=('s',))", umask=0o002,
            groups=[GROUP], src=src, cache=str(cache))
    for shard in cache.glob("shard-*"):
        os.chmod(shard, 0o3775)  # + sticky
    theirs = sorted(p for p in cache.glob("shard-*/*.pqc") if p.stat().st_uid == USER_A)
    mine = [p for p in cache.glob("shard-*/*.pqc") if p.stat().st_uid == USER_B]
    assert theirs and mine
    # Prune: the source of A's entries is gone, so they are stale; B cannot delete them.
    moved = shared / "moved"
    os.rename(shared / "data", moved)
    try:
        pruned = as_user(USER_B, "result = pqloader.cache_prune(args['cache'])", umask=0o002,
                         groups=[GROUP], cache=str(cache))
    finally:
        os.rename(moved, shared / "data")
    assert pruned["entries"] == len(mine)
    assert pruned["not_removed_count"] == len(theirs)
    assert all("Operation not permitted" in line for line in pruned["not_removed"])
    assert sorted(p for p in cache.glob("shard-*/*.pqc")) == theirs
    done = as_user(USER_B, """
import io, contextlib
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    status = pqloader.cli.main(["cache", "clear", args['cache']])
result = {"status": status, "out": out.getvalue(), "err": err.getvalue()}
""", umask=0o002, groups=[GROUP], cache=str(cache))
    assert done["status"] == 1, done
    errors = done["err"].splitlines()
    assert len(errors) == 1 and errors[0].startswith("pqloader: error: cache clear: "), errors
    assert "could not be deleted" in errors[0] and "Operation not permitted" in errors[0]
    assert str(cache) in errors[0]
    # What B could delete is gone; A's entries stay, and A can still clear them.
    assert sorted(cache.glob("shard-*/*.pqc")) == theirs
    cleared = as_user(USER_A, "result = pqloader.cache_clear(args['cache'])", umask=0o002,
                      groups=[GROUP], cache=str(cache))
    assert cleared["entries"] == len(theirs)
    assert not list(cache.glob("shard-*/*.pqc"))


def test_another_users_abandoned_claim_that_cannot_be_deleted_is_not_waited_for(shared):
    """A claim marker of a dead process of another user, in a sticky shard directory:
    abandoned, but this user may not delete it. The worker that needed its split waited
    for the whole wait timeout (counted in cache_wait_timeouts), split after split; it
    now fetches it at once, without a claim, and the rows are the same."""
    import socket

    cache = group_dir(shared / "cache")
    src = str(shared / "data")
    want = uncached(shared)
    as_user(USER_A, "result = load(args['src'], args['cache'])", umask=0o002, groups=[GROUP],
            src=src, cache=str(cache))
    entries = sorted(cache.glob("shard-*/*.pqc"))[:3]
    for entry in entries:  # A's process fetching these died: its markers stay
        entry.unlink()
        marker = entry.with_suffix(".fetch")
        marker.write_text(f"pqloader fetch\npid 999999999\nhost {socket.gethostname()}\n"
                          f"token 999999999-1-1\n")
        os.chown(marker, USER_A, GROUP)
    for shard in cache.glob("shard-*"):
        os.chmod(shard, 0o3775)  # + sticky
        if (shard / ".lock").exists():  # (as umask 002 makes them now: 0644 before 2026-12)
            os.chmod(shard / ".lock", 0o664)
    # (The timeout is a guard: before the fix each of the 3 splits waited for all of it.)
    got = as_user(USER_B, "result = load(args['src'], args['cache'], cache_wait_timeout=3)",
                  umask=0o002, groups=[GROUP], src=src, cache=str(cache))
    assert got["ids"] == want
    assert got["stats"]["cache_wait_timeouts"] == 0, got["stats"]
    assert got["stats"]["cache_hits"] == 12 - len(entries)
