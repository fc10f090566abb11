"""Fault injection: every fault ends in an exact, documented outcome (issue 12).

Object store (a moto S3 server on loopback, behind a TCP proxy that can be stopped or
replaced): killed, stalled, throttled and restarted servers. Cache: a full disk, cache
writers killed mid-write, entries damaged on disk. Each test asserts the outcome exactly:
the error class and the parts of its message that name the fault and the place, or
batches identical to an undisturbed run. What each guarantees is in docs/reliability.md.

Timing: where a test is about a timeout, it asserts generous bounds around the documented
time (no test depends on a race to pass).
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import assert_batch_streams_equal, run_with_timeout, subprocess_env
from test_s3 import HOST, SLOW, Moto, Proxy, _aws_env, big_dataset  # noqa: F401 (_aws_env: autouse)

# -- helpers ----------------------------------------------------------------------------------


class SlowDownFront:
    """A TCP front for `target` that answers every new connection with S3's throttling
    reply (503 SlowDown) while throttling is on, and forwards connections otherwise."""

    REPLY_BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                  b"<Message>Please reduce your request rate.</Message></Error>")

    def __init__(self, target: int) -> None:
        self.target = target
        self.until = 0.0
        self.throttled = 0
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind((HOST, 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def throttle(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def close(self) -> None:
        self.closed = True
        self.server.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        if time.monotonic() < self.until:
            self.throttled += 1
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            body = b"" if data.startswith(b"HEAD") else self.REPLY_BODY
            conn.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(self.REPLY_BODY) + body)
            conn.close()
            return
        try:
            upstream = socket.create_connection((HOST, self.target))
        except OSError:
            conn.close()
            return

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        threading.Thread(target=pipe, args=(conn, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A moto server holding `big/` (40 row groups of 50 rows) and the local reference,
    started once for the module: no test writes to it or stops it (faults are injected
    by a proxy or a front of each test's own; a test that kills the server starts its own)."""
    root = tmp_path_factory.mktemp("served")
    paths = big_dataset(root)
    server = Moto()
    try:
        server.upload("data", "big", paths)
        yield server, root / "big"
    finally:
        server.stop()


def timed(fn):
    start = time.monotonic()
    try:
        return fn(), time.monotonic() - start
    except Exception as e:  # noqa: BLE001 - re-raised with its duration
        e.elapsed = time.monotonic() - start
        raise


# -- object store: stalled, throttled, restarted, killed ----------------------------------


def test_stalled_server_fails_each_request_after_request_timeout(served, tmp_path):
    """A server that accepts connections and never answers (its proxy stopped with
    SIGSTOP): with request_timeout=1 and no retries the loader fails in about 1 s,
    naming the URL and the timeout; with a 2 s budget, within budget + timeout (1.4 s
    and 3.5 s on a loaded 2-core machine: the upper bounds only tell these from the
    default budget's minute)."""
    server, _ = served
    proxy = Proxy(server.port, tmp=tmp_path)
    try:
        os.kill(proxy.proc.pid, signal.SIGSTOP)
        for budget, low, high in ((0, 0.9, 20.0), (2, 2.0, 30.0)):
            options = server.options(port=proxy.port, request_timeout=1, retry_budget=budget)
            with pytest.raises(pqloader.IOError, match=r"s3://data/big.*(Timeout was reached|too slow)") as e:
                timed(lambda: run_with_timeout(lambda: pqloader.Loader("s3://data/big", storage_options=options), 60))
            assert low <= e.value.elapsed < high, (budget, e.value.elapsed)
    finally:
        os.kill(proxy.proc.pid, signal.SIGCONT)
        proxy.stop()


def test_server_stalled_mid_epoch_raises_io_error_naming_file_and_row_group(served, tmp_path):
    server, _ = served
    proxy = Proxy(server.port, tmp=tmp_path)
    try:
        options = server.options(port=proxy.port, request_timeout=1, retry_budget=1)
        it = iter(pqloader.Loader("s3://data/big", storage_options=options, **SLOW))
        first = next(it)
        os.kill(proxy.proc.pid, signal.SIGSTOP)
        with pytest.raises(pqloader.IOError, match=r"s3://data/big/part-00\d\.parquet', row group \d+"):
            run_with_timeout(lambda: list(it), 60)
        assert len(first["id"]) == 50
    finally:
        os.kill(proxy.proc.pid, signal.SIGCONT)
        proxy.stop()


def test_throttling_is_ridden_out_by_the_default_retries(served):
    """Four seconds of 503 SlowDown on every request (the old default gave up after
    0.6 s): the loader opens and the epoch equals a local read."""
    server, local = served
    front = SlowDownFront(server.port)
    try:
        expected = list(pqloader.Loader(str(local), **SLOW))
        front.throttle(4)
        loader = run_with_timeout(lambda: pqloader.Loader(
            "s3://data/big", storage_options=server.options(port=front.port), **SLOW), 120)
        got = run_with_timeout(lambda: list(loader), 120)
        assert front.throttled >= 3  # requests were refused and retried
        assert_batch_streams_equal(got, expected)
    finally:
        front.close()


def test_throttling_beyond_the_retry_budget_raises_io_error_naming_slowdown(served):
    server, _ = served
    front = SlowDownFront(server.port)
    try:
        front.throttle(120)
        options = server.options(port=front.port, retry_budget=1)
        with pytest.raises(pqloader.IOError, match=r"s3://data/big.*(SlowDown|SLOW_DOWN|503)"):
            run_with_timeout(lambda: pqloader.Loader("s3://data/big", storage_options=options), 60)
        assert front.throttled >= 2
    finally:
        front.close()


def test_server_restarted_mid_epoch_is_ridden_out_by_the_default_retries(served, tmp_path):
    """The endpoint refuses connections for about 5 s (a restart), with default retry
    options: the epoch equals an uninterrupted one."""
    server, local = served
    expected = list(pqloader.Loader(str(local), **SLOW))
    proxy = Proxy(server.port, tmp=tmp_path)
    try:
        it = iter(pqloader.Loader("s3://data/big", storage_options=server.options(port=proxy.port), **SLOW))
        got = [next(it), next(it)]
        port = proxy.port
        proxy.stop()

        def come_back():
            time.sleep(5)
            nonlocal proxy
            proxy = Proxy(server.port, port=port, tmp=tmp_path)

        t = threading.Thread(target=come_back)
        t.start()
        got += run_with_timeout(lambda: list(it), 120)
        t.join()
        assert_batch_streams_equal(got, expected)
    finally:
        proxy.stop()


def test_server_killed_mid_epoch_raises_io_error_then_a_new_epoch_after_restart_works(tmp_path):
    paths = big_dataset(tmp_path)
    server = Moto()
    second = None
    try:
        server.upload("data", "big", paths)
        options = server.options(retry_budget=1, connect_timeout=1, request_timeout=2)
        loader = pqloader.Loader("s3://data/big", storage_options=options, **SLOW)
        it = iter(loader)
        next(it)
        server.stop()
        with pytest.raises(pqloader.IOError, match=r"s3://data/big/part-00\d\.parquet', row group \d+: "):
            run_with_timeout(lambda: list(it), 60)
        second = Moto(port=server.port)  # the same endpoint, the same objects
        second.upload("data", "big", paths)
        expected = list(pqloader.Loader(str(tmp_path / "big"), **SLOW))
        loader.set_epoch(0)  # the loader that failed is still usable
        assert_batch_streams_equal(run_with_timeout(lambda: list(loader), 120), expected)
    finally:
        server.stop()
        if second is not None:
            second.stop()


def test_dropping_a_loader_whose_reads_retry_against_a_dead_endpoint_does_not_wait_out_the_budget(
        served, tmp_path):
    """The endpoint goes away mid-epoch with the default retries (a 60 s budget per
    request) and the loader is dropped while its reads ahead retry: the drop ends after
    the attempt in progress (at most one retry delay of 5 s and a connect), not after
    the budget. It used to wait out the budget, twice over."""
    server, _ = served
    proxy = Proxy(server.port, tmp=tmp_path)
    try:
        loader = pqloader.Loader("s3://data/big", storage_options=server.options(port=proxy.port),
                                 **SLOW)
        it = iter(loader)
        next(it)
        proxy.stop()  # connections refused from now on
        time.sleep(1.5)  # the reads ahead fail and start retrying
        start = time.monotonic()
        done = threading.Event()

        def drop():
            nonlocal it, loader
            del it, loader
            gc.collect()
            done.set()

        threading.Thread(target=drop, daemon=True).start()
        assert done.wait(45), "dropping the loader waited for its reads' retry budget"
        assert time.monotonic() - start < 45
    finally:
        proxy.stop()


# -- cache: full disk, killed writers, damaged entries ------------------------------------


def blob_dataset(root: Path, rows: int = 96, row_bytes: int = 4096, rg: int = 8) -> str:
    """`rows` rows of `row_bytes` random bytes (incompressible) in row groups of `rg`."""
    rng = np.random.default_rng(3)
    path = root / "blobs.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": np.arange(rows, dtype=np.int64),
                             "b": pa.FixedSizeListArray.from_arrays(
                                 pa.array(rng.integers(0, 255, rows * row_bytes, dtype=np.uint8)), row_bytes)}),
                   path, row_group_size=rg, compression="NONE")
    return str(path)


def read(data: str, cache_dir: str | None, **kw):
    loader = pqloader.Loader(data, batch_size=10, shuffle=True, seed=8, cache_dir=cache_dir, **kw)
    return list(loader), loader.stats()


FULL_DISK = textwrap.dedent("""
    import json, resource, signal, sys, warnings, pqloader
    data, cache, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if limit:  # no tmpfs: a file size limit makes writes fail with EFBIG instead
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = pqloader.Loader(data, batch_size=10, shuffle=True, seed=8, cache_dir=cache, num_epochs=2)
        ids = [int(i) for b in loader for i in b["id"]]
        sums = [int(b["b"].astype("int64").sum()) for b in pqloader.Loader(
            data, batch_size=10, shuffle=True, seed=8, cache_dir=cache)]
    print(json.dumps({"ids": ids, "sums": sums, "stats": loader.stats(),
                      "warnings": [str(x.message) for x in w]}))
""")


def test_full_disk_keeps_loading_identical_data_and_never_leaves_a_partial_entry(tmp_path):
    """The cache on a 192 KiB tmpfs (or, where mounting is not allowed, under a 24 KiB file
    size limit): some entries fit, the next write fails mid-entry with ENOSPC (EFBIG)."""
    import json

    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mount)],
                             capture_output=True).returncode == 0
    # Without a tmpfs: 12 entries of about 33 KiB and a last one of about 17 KiB, of which
    # only the last fits under the file size limit (a limit of 64 KiB, above every entry,
    # made no write fail).
    data = blob_dataset(tmp_path / "data") if mounted else blob_dataset(tmp_path / "data", rows=100)
    try:
        cache = mount / "cache"
        done = subprocess.run([sys.executable, "-c", FULL_DISK, data, str(cache), "0" if mounted else "24576"],
                              capture_output=True, text=True, timeout=120, env=subprocess_env())
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        plain = list(pqloader.Loader(data, batch_size=10, shuffle=True, seed=8, num_epochs=2))
        assert out["ids"] == [int(i) for b in plain for i in b["id"]]
        assert out["sums"] == [int(b["b"].astype("int64").sum()) for b in plain[:len(out["sums"])]]
        s = out["stats"]
        assert s["cache_write_errors"] > 0 and s["cache_inserts"] > 0 and s["cache_corrupt"] == 0
        assert any("cache" in w and "continuing without caching" in w for w in out["warnings"])
        names = [p.name for p in cache.rglob("*") if p.is_file()]
        assert not [n for n in names if n.startswith(".tmp-")], names  # a failed write removes its temp file
        if mounted:  # what was published verifies
            with pytest.warns(RuntimeWarning, match="No space left on device"):
                again, st = read(data, str(cache))  # what did not fit fails to fit again
            assert_batch_streams_equal(again, list(pqloader.Loader(data, batch_size=10, shuffle=True, seed=8)))
            assert st["cache_corrupt"] == 0 and st["cache_hits"] == pqloader.cache_stats(cache)["entries"] > 0
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)])


WRITER = textwrap.dedent("""
    import sys, pqloader
    data, cache = sys.argv[1], sys.argv[2]
    while True:
        pqloader.cache_clear(cache)
        for _ in pqloader.Loader(data, batch_size=64, cache_dir=cache, num_workers=2):
            pass
""")


def test_cache_writers_killed_mid_write_leave_only_temp_files_and_readers_get_identical_data(tmp_path):
    """Writers of 8 MiB entries are SIGKILLed the moment a temp file appears (so, while
    writing it), six times: a temp file is left, never an entry; readers afterwards get
    batches identical to an uncached run with no corrupt entry; `cache clear` removes
    the temp files."""
    data = blob_dataset(tmp_path / "data", rows=64, row_bytes=1 << 20, rg=8)
    reference, _ = read(data, None)
    cache = tmp_path / "cache"
    cache.mkdir()
    killed_mid_write = 0
    for _ in range(6):
        p = subprocess.Popen([sys.executable, "-c", WRITER, data, str(cache)], env=subprocess_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                temps = [e.name for shard in os.scandir(cache) if shard.is_dir()
                         for e in os.scandir(shard.path) if e.name.startswith(".tmp-")]
                if temps:
                    p.send_signal(signal.SIGKILL)
                    killed_mid_write += 1
                    break
        except FileNotFoundError:
            pass  # a shard listed while the writer cleared it
        finally:
            p.kill()
            p.wait()
        got, stats = read(data, str(cache))
        assert_batch_streams_equal(got, reference)
        assert stats["cache_corrupt"] == 0
    assert killed_mid_write >= 5
    left = pqloader.cache_stats(cache)["temp_files"]
    assert left >= 1  # what the killed writers were writing
    report = pqloader.cache_clear(cache)
    assert report["foreign_count"] == 0 and report["other_files"] >= left
    assert pqloader.cache_stats(cache)["temp_files"] == 0


def test_damaged_and_swapped_entries_are_detected_dropped_and_rewritten(tmp_path):
    data = blob_dataset(tmp_path / "data")
    reference, _ = read(data, None)
    cache = tmp_path / "cache"
    read(data, str(cache))
    entries = sorted(cache.glob("shard-*/*.pqc"))
    assert len(entries) == 12
    size = entries[0].stat().st_size

    def flip(p: Path, at: int) -> None:
        b = bytearray(p.read_bytes())
        b[at] ^= 0x40
        p.write_bytes(bytes(b))

    flip(entries[0], size // 2)                                         # a data byte
    flip(entries[1], 30)                                                # the stored key
    entries[2].write_bytes(entries[2].read_bytes()[: size // 2])        # truncated
    entries[3].write_bytes(b"")                                         # emptied
    entries[4].write_bytes(entries[4].read_bytes() + b"garbage")        # grown
    a, b = entries[5].read_bytes(), entries[6].read_bytes()             # swapped: both valid
    entries[5].write_bytes(b)
    entries[6].write_bytes(a)
    damaged = 7
    got, stats = read(data, str(cache))
    assert_batch_streams_equal(got, reference)
    assert stats["cache_corrupt"] == damaged
    assert stats["cache_hits"] == 12 - damaged and stats["cache_inserts"] == damaged
    again, stats = read(data, str(cache))  # rewritten: all hits now
    assert_batch_streams_equal(again, reference)
    assert stats["cache_corrupt"] == 0 and stats["cache_hits"] == 12


def test_exit_with_a_read_retrying_does_not_wait_out_the_budget_when_pyarrow_fs_came_after(served):
    """`import pyarrow.fs` after pqloader registers pyarrow's S3 shutdown after pqloader's
    exit hooks, so atexit ran it first: where pqloader shares pyarrow's Arrow, it waited
    for the live loader's retrying read for the whole retry_budget (~60 s). The exit now
    ends after the attempt in progress (one 503 answer and a retry delay)."""
    server, _ = served
    front = SlowDownFront(server.port)
    script = textwrap.dedent(f"""
        import sys, threading
        import pqloader
        import pyarrow.fs  # noqa: F401 (after pqloader: its atexit hook comes later)
        loader = pqloader.Loader("s3://data/big/", storage_options={server.options(front.port)!r},
                                 batch_size=50, num_workers=1, io_threads=1, readahead=1)
        print("made", flush=True)
        sys.stdin.readline()
        it = iter(loader)
        threading.Thread(target=lambda: next(it, None), daemon=True).start()
        sys.stdin.readline()  # once a read was refused: it is retrying
        print("exiting", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        assert proc.stdout.readline().strip() == "made"
        front.throttle(600)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while front.throttled == 0:  # (a sleep of 2 s here could end before the first read)
            assert time.monotonic() < deadline, "no read reached the throttling store"
            time.sleep(0.01)
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "exiting"
        proc.wait(40)  # ~5 s (one 503 and a retry delay); the whole budget (~60 s) before
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()
        front.close()


def test_close_stops_the_retries_of_reads_in_flight(served):
    """close() says nothing more is read after it returns: a read in flight against a
    throttling store was retried, unread, for its whole retry_budget (60 s). Now it ends
    after its current attempt; the loader still reads anew afterwards. Retries wait at
    most retry_max_delay=1 s here, so a read still retrying shows in the 3 s watched."""
    server, local = served
    front = SlowDownFront(server.port)
    try:
        loader = run_with_timeout(lambda: pqloader.Loader(
            "s3://data/big", storage_options=server.options(port=front.port, retry_max_delay=1),
            batch_size=50, num_workers=1, io_threads=1, readahead=1), 60)
        front.throttle(120)
        it = iter(loader)
        # How the pending next() ended: the iterator is stale once closed. (The error's
        # type and message only: the exception itself, through its traceback's frames,
        # would keep the iterator and so the loader alive after the test, its next
        # epoch's reads retrying against the closed front, and a fork in a later test of
        # this process would wait for them, 10 s.)
        ended = []

        def pending():
            try:
                ended.append(next(it, None))
            except RuntimeError as e:
                ended.append((type(e), str(e)))

        waiter = threading.Thread(target=pending, daemon=True)
        waiter.start()
        deadline = time.monotonic() + 30
        while front.throttled < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert front.throttled >= 2  # a read is retrying
        run_with_timeout(loader.close, 30)
        waiter.join(30)
        assert not waiter.is_alive() and ended
        # stale, never an epoch's end (a training loop would go on as if it had read it all)
        assert isinstance(ended[0], tuple) and ended[0][0] is RuntimeError and "closed" in ended[0][1], ended
        time.sleep(3)  # past the attempt in flight and the retry delay it may be sleeping (max 1 s)
        after = front.throttled
        time.sleep(3)  # three retry delays or more
        assert front.throttled == after, (after, front.throttled)  # no request since
        front.throttle(0)
        assert_batch_streams_equal(run_with_timeout(lambda: list(loader), 120),
                                   list(pqloader.Loader(str(local), batch_size=50)))
    finally:
        front.close()
