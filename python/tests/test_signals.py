"""Ctrl-C while next() waits for a batch (issue 12, item 4)."""

from __future__ import annotations

from typing import Any

import subprocess
import sys

import numpy as np
import pytest
import pyarrow as pa
import pyarrow.parquet as pq

import pqloader

from test_s3 import _aws_env  # noqa: F401 (autouse: no AWS_* of the machine)


@pytest.fixture(autouse=True)
def _python_ctrl_c():
    """Python's own Ctrl-C handler in this process (and so the default disposition in the
    processes it starts), whatever pytest was started with: bash starts a background job
    of a non-interactive shell (`(make test &)`) with SIGINT ignored, Python then installs
    no handler, and the tests that raise SIGINT here failed for want of a KeyboardInterrupt."""
    import signal
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture(scope="module")
def moto():
    """One moto S3 server for the module (a start per test cost ~1 s each); every test
    keeps to buckets of its own, so none reads what another wrote."""
    from test_s3 import Moto

    server = Moto()
    try:
        yield server
    finally:
        server.stop()


# The engine's workers sleep 60 s before each task (a test hook), so no batch comes for a
# minute; SIGINT arrives after 0.5 s. next() must raise KeyboardInterrupt then, stop the
# workers (their sleep wakes on stop), and leave the loader at its position.
CHILD = r"""
import os, signal, sys, threading, time
import pqloader
loader = pqloader.Loader(sys.argv[1], batch_size=10, num_workers=2, _debug_max_delay_us=60_000_000)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    for batch in loader:
        print("got a batch", flush=True)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t0, 1), "s", flush=True)
state = loader.state_dict()
print("position", state["epoch"], state["batch"], flush=True)
"""


def test_ctrl_c_interrupts_a_waiting_next(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(100)}), path, row_group_size=50)
    # 30 s is half the workers' sleep: finishing at all means the wait was interrupted.
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert "got a batch" not in out.stdout
    assert "interrupted after" in out.stdout, out.stdout + out.stderr
    assert "position 0 0" in out.stdout  # nothing was handed out; resuming starts at batch 0


# The same with a batch_transform: next() waits on the transform thread's queue, and that
# thread in the engine's next(); leaving joined the thread, so Ctrl-C took effect only
# when the batch came (here up to 60 s; against a stalled store, the retry budget).
def test_ctrl_c_interrupts_a_waiting_next_with_a_batch_transform(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(100)}), path, row_group_size=50)
    child = CHILD.replace("_debug_max_delay_us=60_000_000", "_debug_max_delay_us=60_000_000, "
                          "batch_transform=lambda b: b")
    out = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True,
                         timeout=90)
    assert out.returncode == 0, out.stderr
    assert "got a batch" not in out.stdout
    assert "interrupted after" in out.stdout, out.stdout + out.stderr
    assert _interrupted_after(out.stdout) < 30  # ~0.5 s; the batch's 60 s before
    assert "position 0 0" in out.stdout


# Building a Loader: it waits for another process computing the same filter's selection
# (the flock of cache_dir/filters/.lock, held here by a child for 60 s), then would run the
# mask pass. SIGINT after 0.5 s must raise KeyboardInterrupt then (before: after the
# lock's 30-minute limit), and a Loader built afterwards works.
CHILD_LOCK = r"""
import fcntl, os, select, signal, sys, threading, time
import pyarrow.compute as pc
import pqloader
path, cache = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(cache, "filters"), exist_ok=True)
fd = os.open(os.path.join(cache, "filters", ".lock"), os.O_RDWR | os.O_CREAT)
locked, held = os.pipe()
holder = os.fork()
if holder == 0:
    os.close(1), os.close(2)  # (not the parent's output: an error there ended in a timeout)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(held, b"1")
    time.sleep(60)
    os._exit(0)
os.close(fd)  # the lock belongs to the child's open file alone (flock is per open file)
# Once the child holds it (a sleep here raced a slow fork and the Loader took the lock).
assert select.select([locked], [], [], 30)[0], "the forked child did not take the lock"
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    pqloader.Loader(path, batch_size=10, cache_dir=cache, filter=pc.field("x") > 10)
    print("built", flush=True)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t0, 1), "s", flush=True)
os.kill(holder, 9)
os.waitpid(holder, 0)
rows = sum(len(b["x"]) for b in pqloader.Loader(path, batch_size=10, cache_dir=cache,
                                                filter=pc.field("x") > 10))
print("rows", rows, flush=True)
"""

# A Predicate (run on the engine's threads, each call 0.3 s) over 400 row groups: about
# 60 s of mask pass on 2 threads; SIGINT after 0.5 s must end it within a call or two.
CHILD_PREDICATE = r"""
import os, signal, sys, threading, time
import pyarrow.compute as pc
import pqloader
def slow(batch):
    time.sleep(0.3)
    return pc.greater(batch.column("x"), 10)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    pqloader.Loader(sys.argv[1], batch_size=10, num_workers=2,
                    filter=pqloader.Predicate(["x"], slow))
    print("built", flush=True)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t0, 1), "s", flush=True)
"""


def _interrupted_after(stdout: str) -> float:
    line = next(l for l in stdout.splitlines() if l.startswith("interrupted after"))
    return float(line.split()[2])


def test_ctrl_c_interrupts_a_loader_waiting_for_another_processs_filter_lock(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(100)}), path, row_group_size=50)
    out = subprocess.run([sys.executable, "-c", CHILD_LOCK, str(path), str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=45)
    assert out.returncode == 0, out.stderr
    assert "built" not in out.stdout
    assert "interrupted after" in out.stdout, out.stdout + out.stderr
    assert _interrupted_after(out.stdout) < 30  # ~0.5 s; the holder's 60 s before
    assert "rows 89" in out.stdout


def test_ctrl_c_interrupts_a_predicates_mask_pass(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(4000)}), path, row_group_size=10)
    out = subprocess.run([sys.executable, "-c", CHILD_PREDICATE, str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "built" not in out.stdout
    assert "interrupted after" in out.stdout, out.stdout + out.stderr
    # ~1 s; 2.5 s on a loaded 2-core machine, where a bound of 2.5 s against the 6 s of
    # 40 row groups failed: ~60 s without the check.
    assert _interrupted_after(out.stdout) < 20



# inspect and write_index read every file's footer (minutes for 10^5 files, or over a slow
# link) with the GIL released: Ctrl-C used to wait for all of them. 300 objects on a moto
# S3 server on loopback (about 2 s of footers; the files are alike); SIGINT is sent once the first footer is
# read. Each call must raise KeyboardInterrupt before reading the rest (the engine polls
# signals every 0.1 s and stops at its next file), and write_index must leave no summary
# behind; then both run to the end.
CHILD_FOOTERS = r"""
import json, os, signal, sys, threading, time
import pqloader
from pqloader import _core
source, options = sys.argv[1], json.loads(sys.argv[2])
def exists(name):
    import boto3
    s3 = boto3.client("s3", endpoint_url=sys.argv[3], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    return s3.list_objects_v2(Bucket="footers", Prefix=f"ds/{name}")["KeyCount"] > 0
for name, call in (("inspect", lambda p: pqloader.inspect(source, storage_options=options, _progress=p)),
                   ("index", lambda p: pqloader.write_index(source, storage_options=options, _progress=p))):
    progress = _core.Progress()
    def fire():
        while progress.done < 1:
            time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=fire, daemon=True).start()
    try:
        call(progress)
        print(name, "finished", flush=True)
    except KeyboardInterrupt:
        print(name, "interrupted at", progress.done, "of", progress.total, flush=True)
    print(name, "summary", exists("_metadata"), flush=True)
print("files", pqloader.inspect(source, storage_options=options)["num_files"], flush=True)
print("indexed", pqloader.write_index(source, storage_options=options)["files"], flush=True)
"""


def test_ctrl_c_interrupts_inspect_and_write_index(tmp_path, moto):
    import json

    from test_s3 import aws_env

    n = 300
    body = tmp_path / "one.parquet"
    pq.write_table(pa.table({"x": np.arange(3)}), body)
    moto.put("footers", dict.fromkeys([f"ds/f{i:04d}.parquet" for i in range(n)], body.read_bytes()))
    out = subprocess.run([sys.executable, "-c", CHILD_FOOTERS, "s3://footers/ds",
                          json.dumps(moto.options()), moto.url],
                         capture_output=True, text=True, timeout=120, env=aws_env())
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for name in ("inspect", "index"):
        line = next((l for l in lines if l.startswith(f"{name} interrupted at")), None)
        assert line is not None, out.stdout + out.stderr
        done, total = int(line.split()[3]), int(line.split()[5])
        assert total == n and done < n, line  # stopped before the last footer
        assert f"{name} summary False" in lines
    assert f"files {n}" in lines and f"indexed {n}" in lines


# Against an endpoint that refuses connections the S3 client retries for a minute; Ctrl-C
# must not wait for it: write_index's check that the source is a directory did, and any
# second call after an interrupted one did (Arrow makes a new S3 client only once the
# first call's abandoned request, left retrying in the background, is done).
CHILD_REFUSED = r"""
import os, signal, sys, threading, time, pqloader
options = {"endpoint_override": "127.0.0.1:1", "scheme": "http", "region": "us-east-1"}
for name, call in (("inspect", pqloader.inspect), ("index", pqloader.write_index)):
    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        call("s3://bucket/x", storage_options=options)
        print(name, "finished", flush=True)
    except KeyboardInterrupt:
        print(name, "interrupted after", round(time.monotonic() - start, 1), flush=True)
"""


def test_ctrl_c_interrupts_inspect_and_write_index_against_a_refusing_endpoint():
    from test_s3 import aws_env

    out = subprocess.run([sys.executable, "-c", CHILD_REFUSED], capture_output=True, text=True,
                         timeout=240, env=aws_env())
    for name in ("inspect", "index"):
        line = next((l for l in out.stdout.splitlines() if l.startswith(f"{name} interrupted")), None)
        assert line is not None, out.stdout + out.stderr
        assert float(line.split()[-1]) < 30, line  # the second: 55-60 s, the retries' budget


# Listing a directory on S3 takes one request per 1,000 keys: 100 for 10^5 files, each a
# round trip (tens of seconds on a slow link), and before it Arrow checks that the path
# is a directory (up to three requests, or a run of retries against an endpoint that
# does not answer); Ctrl-C used to wait for all of them. 1,200 objects (two pages)
# behind a proxy adding 2 s of round trip (longer trips the AWS SDK's low-speed limit:
# no byte for 3 s). The proxy counts the requests that reach the server, and the S3
# listings among them. SIGINT is sent once the first request of the directory check
# reached the server, then in a second run once the listing's first page request did
# (the check's last request is a listing too): Loader() must raise KeyboardInterrupt
# before that request's answer is back, so no later request has reached the server
# (Arrow goes on in the background, 2 s later at the earliest); it used to raise only
# after the check and both pages.
CHILD_LISTING = r"""
import json, os, signal, sys, threading, time
import pqloader
source, options, count_file, key, at = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def count(what):
    try:
        with open(count_file) as f:
            return json.load(f)[what]
    except (OSError, ValueError, KeyError):
        return 0
def fire():
    while count(key) < at:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=fire, daemon=True).start()
try:
    pqloader.Loader(source, storage_options=options, batch_size=10)
    print("built", flush=True)
except KeyboardInterrupt:
    time.sleep(0.4)  # the proxy rewrites its counts every 0.1 s
    print("interrupted at", key, count(key), flush=True)
"""


def test_ctrl_c_interrupts_a_listing_and_the_check_before_it(tmp_path, moto):
    import json

    from test_s3 import Proxy, aws_env

    body = tmp_path / "one.parquet"
    pq.write_table(pa.table({"x": np.arange(3)}), body)
    moto.put("listing", dict.fromkeys([f"ds/f{i:05d}.parquet" for i in range(1200)], body.read_bytes()))
    # The two runs side by side (they mostly wait out round trips), each through a proxy of
    # its own, which counts only its run's requests.
    runs, proxies, outs = {}, [], {}
    try:
        for key, at in (("requests", 1), ("lists", 2)):
            count = tmp_path / f"count-{key}.json"
            proxies.append(Proxy(moto.port, tmp=tmp_path, count_file=count, rtt_ms=2000))
            runs[key, at] = subprocess.Popen([sys.executable, "-c", CHILD_LISTING, "s3://listing/ds",
                                              json.dumps(moto.options(port=proxies[-1].port)), str(count),
                                              key, str(at)],
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             env=aws_env())
        for run, p in runs.items():
            outs[run] = p.communicate(timeout=120)
    finally:
        for p in runs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for proxy in proxies:
            proxy.stop()
    for (key, at), (stdout, stderr) in outs.items():
        assert runs[key, at].returncode == 0, stderr
        assert "built" not in stdout
        assert f"interrupted at {key} {at}\n" in stdout, stdout + stderr


# A mixture with stop="last" finds its epoch's length by drawing until every source ran
# out, up to 64 draws per row: billions for a large, skewed mixture, seconds to minutes
# with the GIL released and no signal check. The engine's length function (what
# Mixture.epoch_samples calls) on such a mixture, ~10^12 draws without a cancel: SIGINT
# after 0.5 s must raise KeyboardInterrupt at once (it used to run to its end).
CHILD_MIX_LENGTH = r"""
import os, signal, threading, time
from pqloader import _core
cum = _core.mix_cumulative([1e-9, 1.0])
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    n, draws = _core.mix_epoch_length_kept(4, 1, cum, [1000, 1], True, 1 << 40, 1 << 20)
    print("length", n, flush=True)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t0, 1), "s", flush=True)
print("again", _core.mix_epoch_length(4, 1, _core.mix_cumulative([0.6, 0.4]), [600, 100], True, 1 << 20), flush=True)
"""


def test_ctrl_c_interrupts_a_mixtures_epoch_length(tmp_path):
    out = subprocess.run([sys.executable, "-c", CHILD_MIX_LENGTH], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "length" not in out.stdout
    assert "interrupted after" in out.stdout, out.stdout + out.stderr
    assert _interrupted_after(out.stdout) < 60  # ~20 minutes of draws without the check
    assert "again " in out.stdout  # the next call runs to its end


# Ctrl-C while a Loader is made against an endpoint that accepts and never answers:
# KeyboardInterrupt comes at once, and the process must then exit without waiting for
# the abandoned request's retries (S3's shutdown at exit waits for requests in flight;
# with a 60 s retry budget it took ~60 s).
CHILD_STALLED = r"""
import json, os, signal, sys, threading, time
import pqloader
options = json.loads(sys.argv[1])
threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    pqloader.Loader("s3://data/ds/", storage_options=options, batch_size=10)
    print("built", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_against_a_stalled_endpoint_then_exit_does_not_wait_out_the_retries(tmp_path):
    import json
    import socket
    import threading

    from test_s3 import aws_env

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    options = {"endpoint_override": f"127.0.0.1:{server.getsockname()[1]}", "scheme": "http",
               "region": "us-east-1", "access_key": "a", "secret_key": "b",
               "request_timeout": "1", "retry_budget": "60"}
    try:
        out = subprocess.run([sys.executable, "-c", CHILD_STALLED, json.dumps(options)],
                             capture_output=True, text=True, timeout=40, env=aws_env())
    finally:
        server.close()
        for c in held:
            c.close()
    assert "interrupted" in out.stdout and "built" not in out.stdout, out.stdout + out.stderr


# Ctrl-C while a Loader is built against a store that lists its objects but never
# answers a read: each read is retried until its budget (60 s) is spent, and Ctrl-C used
# to wait for that. A proxy holds every request for a byte range; SIGINT once the first
# is held. The read in flight then ends after its attempt (request_timeout 1 s, after a
# retry delay of at most retry_max_delay 1 s), without further retries. Footers are read
# first; for a filter's reads and the lengths pass of packing they come from a cache_dir
# filled beforehand (objects settled: see test_s3.settle), so that those are what stall.
CHILD_STALLED_READS = r"""
import json, os, signal, sys, threading, time
import pqloader
options, (count_file, what, cache_dir, source) = json.loads(sys.argv[1]), sys.argv[2:6]
kw = {"footers": {}, "filter": {"filter": "x > 0"},
      "lengths": {"pack": pqloader.Pack("tokens", seq_len=4)}}[what]
fired = []
def held():
    try:
        with open(count_file) as f:
            return json.load(f)["held"]
    except (OSError, ValueError, KeyError):
        return 0
def fire():
    while held() < 1:
        time.sleep(0.01)
    fired.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=fire, daemon=True).start()
try:
    pqloader.Loader(source, storage_options=options, batch_size=10,
                    cache_dir=cache_dir or None, **kw)
    print("built", flush=True)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - fired[0], 1), "s", flush=True)
"""


@pytest.fixture(scope="module")
def stalling(moto, tmp_path_factory):
    """On the module's server, settled once (2 s) for the tests below, which only read them:
    bucket `stall` (4 files of 3 rows, columns x and tokens) and bucket `admin` (3 files of
    3 rows, column x)."""
    from test_s3 import settle

    tmp = tmp_path_factory.mktemp("stalling")
    for bucket, count, table in (("stall", 4, pa.table({"x": np.arange(3), "tokens": [[1, 2], [3], [4, 5, 6]]})),
                                 ("admin", 3, pa.table({"x": np.arange(3)}))):
        pq.write_table(table, tmp / f"{bucket}.parquet")
        body = (tmp / f"{bucket}.parquet").read_bytes()
        moto.put(bucket, dict.fromkeys([f"ds/f{i}.parquet" for i in range(count)], body))
    s3 = moto.client()
    for bucket in ("stall", "admin"):
        settle(s3, bucket)
    return moto


@pytest.mark.parametrize("what", ["footers", "filter", "lengths"])
def test_ctrl_c_while_reads_stall_does_not_wait_out_their_retries(tmp_path, what, stalling):
    import json

    from test_s3 import Proxy, aws_env

    server = stalling
    cache_dir = ""
    if what != "footers":
        cache_dir = str(tmp_path / "cache")
        warm = pqloader.Loader("s3://stall/ds/", storage_options=server.options(),
                               batch_size=10, cache_dir=cache_dir)
        assert warm.num_rows == 12  # its footers are kept
    count = tmp_path / "count.json"
    proxy = Proxy(server.port, tmp=tmp_path, count_file=count, hold_reads=True)
    try:
        options = dict(server.options(port=proxy.port), request_timeout="1",
                       retry_max_delay="1", retry_budget="60")
        out = subprocess.run([sys.executable, "-c", CHILD_STALLED_READS, json.dumps(options),
                              str(count), what, cache_dir, "s3://stall/ds/"], capture_output=True,
                             text=True, timeout=150, env=aws_env())
    finally:
        proxy.stop()
    assert out.returncode == 0, out.stderr
    assert "built" not in out.stdout
    assert _interrupted_after(out.stdout) < 30, out.stdout  # ~1 s; ~60 s: the retry budget


# `cache stats|prune --dataset s3://...` read the footers of entries whose size and time
# match (their hash decides): against a store that lists but holds reads, Ctrl-C waited
# for the retry budget (59.9 s stats, 61.5 s prune), the lookups being outside any retry
# stop.
CHILD_CACHE_ADMIN = r"""
import json, os, signal, sys, threading, time
import pqloader
options, cache, which, dataset = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
call = pqloader.cache_stats if which == "stats" else pqloader.cache_prune
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    call(cache, dataset=dataset, storage_options=options)
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - start, 1), "s", flush=True)
"""


@pytest.mark.parametrize("which", ["stats", "prune"])
def test_ctrl_c_stops_cache_stats_and_prune_of_an_s3_dataset_whose_reads_stall(tmp_path, which, stalling):
    import json

    from test_s3 import Proxy, aws_env

    server = stalling
    cache = tmp_path / "cache"
    assert sum(len(b["x"]) for b in pqloader.Loader(
        "s3://admin/ds/", storage_options=server.options(), batch_size=10, cache_dir=str(cache))) == 9
    for f in (cache / "footers").glob("*.thrift"):  # so the footers are read from the store
        f.unlink()
    proxy = Proxy(server.port, tmp=tmp_path, count_file=tmp_path / "count.json", hold_reads=True)
    try:
        options = dict(server.options(port=proxy.port), request_timeout="1",
                       retry_max_delay="1", retry_budget="60")
        out = subprocess.run([sys.executable, "-c", CHILD_CACHE_ADMIN, json.dumps(options),
                              str(cache), which, "s3://admin/ds"], capture_output=True, text=True,
                             timeout=150, env=aws_env())
    finally:
        proxy.stop()
    assert out.returncode == 0, out.stderr
    assert _interrupted_after(out.stdout) < 30, out.stdout + out.stderr  # ~1 s; ~60 s: the retry budget


# A request left retrying by a Ctrl-C'd S3 call held Arrow's S3 client lock for the retry
# budget, outside the fork gate: a child forked meanwhile inherited the lock held by a
# thread it lacks, and its first S3 access hung for good.
CHILD_FORK_AFTER_CTRL_C = r"""
import json, os, signal, sys, threading, time
import pqloader
good = json.loads(sys.argv[1])
refusing = {"endpoint_override": "127.0.0.1:1", "scheme": "http", "region": "us-east-1"}
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    pqloader.Loader("s3://bucket/x", storage_options=refusing, batch_size=10)
except KeyboardInterrupt:
    print("interrupted", flush=True)
time.sleep(2)
pid = os.fork()
if pid == 0:
    signal.alarm(30)
    rows = sum(len(b["x"]) for b in pqloader.Loader(sys.argv[2], storage_options=good, batch_size=10))
    print("child rows", rows, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child status", status, flush=True)
"""


def test_a_child_forked_after_a_ctrl_c_d_s3_call_reads_s3(tmp_path, moto):
    import json

    from test_s3 import aws_env

    body = tmp_path / "one.parquet"
    pq.write_table(pa.table({"x": np.arange(3)}), body)
    moto.put("fork", {"ds/f0.parquet": body.read_bytes()})
    out = subprocess.run([sys.executable, "-c", CHILD_FORK_AFTER_CTRL_C, json.dumps(moto.options()),
                          "s3://fork/ds"], capture_output=True, text=True, timeout=150, env=aws_env())
    assert "interrupted" in out.stdout, out.stdout + out.stderr
    assert "child rows 3" in out.stdout and "child status 0" in out.stdout, out.stdout + out.stderr


# Ctrl-C at any instant of handing a batch out: the batch reaches the loop, or the
# position stays before it. A KeyboardInterrupt raised between the position's move and
# the yield (the consumer clock's read there, or the cursor lock's release) lost that
# batch: the next iteration, or a state taken then, resumed after it.
def _interrupt_at(k: int, where: Any) -> Any:
    import signal
    calls = [0]

    def hook() -> None:
        if where(sys._getframe(2)):
            calls[0] += 1
            if calls[0] == k:
                signal.raise_signal(signal.SIGINT)
    return hook


class _InterruptingLock:
    """An RLock whose release inside `method` raises Ctrl-C the k-th time."""

    def __init__(self, lock: Any, k: int, method: str) -> None:
        self._lock, self._hook = lock, _interrupt_at(k, lambda f: f.f_code.co_name == method)

    def __enter__(self) -> Any:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        out = self._lock.__exit__(*exc)
        if exc[0] is None:
            self._hook()
        return out


def _interrupted_run(make: Any, k: int) -> tuple[bool, list[list[int]], list[list[int]]]:
    """Iterate make(k) until Ctrl-C; return whether it came, and the batches received
    then followed by those of the same loader iterated again / of a new one resumed from
    its state."""
    source, got, interrupted = make(k), [], False
    try:
        for b in source:
            got.append(b["x"].tolist())
    except KeyboardInterrupt:
        interrupted = True
    state = source.state_dict()
    again = make(None)
    again.load_state_dict(state)
    return (interrupted, got + [b["x"].tolist() for b in source],
            got + [b["x"].tolist() for b in again])


@pytest.mark.parametrize("at", ["clock", "lock"])
def test_ctrl_c_while_a_batch_is_handed_out_loses_nothing(tmp_path, monkeypatch, at):
    import time
    from pqloader import _iteration

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(30)}), path, row_group_size=10)
    expected = [list(range(i, i + 5)) for i in range(0, 30, 5)]
    hook: list[Any] = [lambda: None]

    def clock() -> float:
        hook[0]()
        return time.perf_counter()
    monkeypatch.setattr(_iteration, "clock", clock)

    def make(k: int | None) -> Any:
        loader = pqloader.Loader(str(path), batch_size=5, num_epochs=1)
        hook[0] = lambda: None
        if k is not None and at == "clock":
            hook[0] = _interrupt_at(k, lambda f: f.f_code.co_name == "hand_out")
        elif k is not None:
            loader._cursor.lock = _InterruptingLock(loader._cursor.lock, k, "advance")
        return loader

    for k in range(1, 7 if at == "lock" else 9):
        interrupted, continued, resumed = _interrupted_run(make, k)
        assert interrupted, k
        assert continued == expected and resumed == expected, k


def test_ctrl_c_while_a_mixtures_batch_is_handed_out_loses_nothing(tmp_path, monkeypatch):
    import time
    from pqloader import _mix

    for n in "ab":
        pq.write_table(pa.table({"x": np.arange(40) + (1000 if n == "b" else 0)}),
                       tmp_path / f"{n}.parquet", row_group_size=10)
    hook: list[Any] = [lambda: None]

    def clock() -> float:
        hook[0]()
        return time.perf_counter()
    monkeypatch.setattr(_mix, "clock", clock)

    def make(k: int | None) -> Any:
        hook[0] = lambda: None
        m = pqloader.mix([pqloader.Loader(str(tmp_path / f"{n}.parquet"), batch_size=5) for n in "ab"],
                         [0.5, 0.5], batch_size=5, seed=1, num_epochs=1, samples_per_epoch=40)
        if k is not None:
            hook[0] = _interrupt_at(k, lambda f: f.f_code.co_name == "_epoch_batches")
        return m

    expected = [b["x"].tolist() for b in make(None)]
    for k in range(1, 9):
        interrupted, continued, resumed = _interrupted_run(make, k)
        assert interrupted, k
        assert continued == expected and resumed == expected, k


def test_ctrl_c_as_the_batch_transform_thread_starts_leaves_no_thread_running(tmp_path, monkeypatch):
    # Ctrl-C inside Thread.start() (its wait for the new thread to run): the thread was
    # started outside threaded_map's try, so nothing stopped or joined it; it went on
    # taking batches from the engine and putting them into a queue nobody read, for good.
    import threading
    import time
    from pqloader import _iteration

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(100)}), path, row_group_size=10)

    class Interrupted(threading.Thread):
        def start(self) -> None:
            super().start()
            raise KeyboardInterrupt

    loader = pqloader.Loader(str(path), batch_size=10, num_workers=2, batch_transform=lambda b: b)
    expected = [b["x"].tolist() for b in loader]
    loader.set_epoch(0)
    monkeypatch.setattr(_iteration, "threading", type("T", (), {"Thread": Interrupted, "Event": threading.Event,
                                                          "current_thread": threading.current_thread}))
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))
    monkeypatch.undo()
    time.sleep(0.3)
    assert not [t for t in threading.enumerate() if t.name == "pqloader-batch-transform"]
    assert loader.state_dict()["batch"] == 0
    assert [b["x"].tolist() for b in loader] == expected


def test_ctrl_c_as_a_read_ahead_batch_is_counted_out_loses_nothing(tmp_path, monkeypatch):
    # With a batch_transform (or torch output), hand_out took the batch's row count off
    # its deque after moving the position: a Ctrl-C raised at that call lost the batch
    # (the position counted it as handed out, the consumer never got it).
    import collections

    from pqloader import _loader

    pq.write_table(pa.table({"id": np.arange(40)}), tmp_path / "a.parquet")

    class Interrupting(collections.deque):
        calls = 0

        def popleft(self):
            Interrupting.calls += 1
            if Interrupting.calls == 2:  # the second batch's
                raise KeyboardInterrupt
            return super().popleft()

    fake = type("collections", (), {"deque": Interrupting})
    monkeypatch.setattr(_loader, "collections", fake)
    loader = pqloader.Loader(str(tmp_path), batch_size=10, batch_transform=lambda b: b)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for b in loader:
            got += b["id"].tolist()
    assert loader.state_dict()["batch"] == 1 and got == list(range(10))
    monkeypatch.undo()
    got += [i for b in loader for i in b["id"].tolist()]
    assert got == list(range(40))


def test_ctrl_c_inside_the_batch_transform_queues_lock_code_never_hangs(tmp_path):
    # A Ctrl-C is handled between two bytecodes: also just after a Python-level lock's
    # __enter__ took its lock, before the `with` block began, which then never releases it.
    # threaded_map's queue.Queue (a Python Condition) was so left with its mutex held, and
    # leaving next() blocked on it for good (its finally's get_nowait), as did the thread's
    # next put. Here a KeyboardInterrupt is raised at the return of each call, in turn, that
    # the consumer's side makes into threading or queue (and those make there).
    import threading
    import time

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(200)}), path, row_group_size=50)
    expected = [list(range(i, i + 20)) for i in range(0, 200, 20)]

    def run(k: int) -> tuple[bool, list[list[int]]]:
        loader = pqloader.Loader(str(path), batch_size=20, num_workers=2, batch_transform=lambda b: b)
        calls = [0]

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            code, caller = frame.f_code, frame.f_back
            if event != "call" or caller is None or not code.co_filename.endswith(("threading.py", "queue.py")):
                return None
            if not caller.f_code.co_filename.endswith(("_iteration.py", "queue.py")):
                return None

            def on_return(f: Any, ev: str, a: Any) -> Any:
                if ev == "return":
                    calls[0] += 1
                    if calls[0] == k:
                        sys.settrace(None)
                        raise KeyboardInterrupt
                return on_return
            return on_return

        got, interrupted = [], False
        sys.settrace(tracer)
        try:
            for b in loader:
                got.append(b["x"].tolist())
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
        if interrupted and len(got) < len(expected):
            got += [b["x"].tolist() for b in loader]  # the rest of the epoch
        return interrupted, got

    for k in range(1, 40):
        box: dict[str, Any] = {}
        t = threading.Thread(target=lambda: box.update(out=run(k)), daemon=True)
        t.start()
        t.join(20)
        assert not t.is_alive(), f"hang: Ctrl-C at call {k}"
        interrupted, got = box["out"]
        assert got == expected, k
        deadline = time.monotonic() + 5
        while any(x.name == "pqloader-batch-transform" for x in threading.enumerate()):
            assert time.monotonic() < deadline, f"a batch_transform thread left running: Ctrl-C at call {k}"
            time.sleep(0.01)
        if not interrupted:  # every call of the iteration was tried
            break
    assert k > 1
