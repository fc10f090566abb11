"""s3:// sources against a real S3-compatible server process on loopback (moto).

The module's server runs with IAM authentication on, so wrong credentials are refused
as on AWS. Tests that take the server down start their own. Every request goes to
127.0.0.1; the instance metadata service is disabled so no credential or region lookup
leaves the machine.
"""
from __future__ import annotations

import io
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import (
    REPO_ROOT,
    assert_batch_streams_equal,
    assert_columns_equal,
    collect,
    run_with_timeout,
    subprocess_env,
    write_dataset,
)

HOST = "127.0.0.1"
REGION = "us-east-1"
LAYOUT = [[30, 20], [25], [40, 10, 15]]  # row groups per file: 140 rows
# Calls made before authentication is enforced: create_user, create_access_key, put_user_policy.
SETUP_CALLS = 3
ALLOW_ALL = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait until something accepts connections on `port` (a bare connect: no request)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {HOST}:{port} after {timeout}s")


def aws_env() -> dict:
    """The environment of a process that must not reach anything but loopback."""
    env = subprocess_env()
    for k in list(env):
        if k.startswith("AWS_"):
            del env[k]
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
               AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    return env


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    for k, v in aws_env().items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)


def settle(s3, bucket: str) -> None:
    """Wait until the bucket's newest object is 2 s old: pqloader keeps no footer of a
    younger object in a cache_dir (S3 times are whole seconds; see design.md), and tests
    that count footers taken from the cache read objects as a training job does, settled."""
    newest = max(o["LastModified"].timestamp()
                 for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))
    time.sleep(max(0.0, newest + 2.1 - time.time()))


class Moto:
    """A moto S3 server process on loopback; with `auth`, IAM credentials are checked."""

    def __init__(self, port: int | None = None, auth: bool = False) -> None:
        self.port = port or free_port()
        env = aws_env()
        if auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(SETUP_CALLS)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, self.proc)
        self.url = f"http://{HOST}:{self.port}"
        self.keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        if auth:
            iam = boto3.client("iam", endpoint_url=self.url, region_name=REGION, **self.keys)
            iam.create_user(UserName="loader")
            key = iam.create_access_key(UserName="loader")["AccessKey"]
            iam.put_user_policy(UserName="loader", PolicyName="all", PolicyDocument=ALLOW_ALL)
            self.keys = {"aws_access_key_id": key["AccessKeyId"],
                         "aws_secret_access_key": key["SecretAccessKey"]}

    def client(self):
        return boto3.client("s3", endpoint_url=self.url, region_name=REGION, **self.keys)

    def upload(self, bucket: str, prefix: str, paths, settled: bool = False) -> None:
        """Bucket `bucket` holding each file of `paths` under `prefix`/its name."""
        self.put(bucket, {f"{prefix}/{Path(p).name}": Path(p).read_bytes() for p in paths}, settled)

    def put(self, bucket: str, objects: dict[str, bytes], settled: bool = False) -> None:
        """Bucket `bucket` holding `objects` (key: body), put 8 at a time (boto3 clients
        are thread-safe)."""
        s3 = self.client()
        s3.create_bucket(Bucket=bucket)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), objects.items()))
        if settled:
            settle(s3, bucket)

    def options(self, port: int | None = None, **extra) -> dict:
        return {"endpoint_override": f"{HOST}:{port or self.port}", "scheme": "http",
                "region": REGION, "access_key": self.keys["aws_access_key_id"],
                "secret_key": self.keys["aws_secret_access_key"], **extra}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


class Proxy:
    """bench/throttle_proxy.py forwarding `port` (or a free one) to `target`."""

    def __init__(self, target: int, port: int = 0, tmp: Path | None = None,
                 count_file: Path | None = None, rtt_ms: float = 0.0,
                 hold_reads: bool = False) -> None:
        ready = Path(tmp or "/tmp") / f"proxy-{os.getpid()}-{time.monotonic_ns()}.port"
        extra = ["--count-file", str(count_file)] if count_file else []
        extra += ["--rtt-ms", str(rtt_ms)] if rtt_ms else []
        extra += ["--hold-reads"] if hold_reads else []
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "bench" / "throttle_proxy.py"),
             "--listen", f"{HOST}:{port}", "--target", f"{HOST}:{target}",
             "--ready-file", str(ready), *extra], env=aws_env())
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text():
            assert self.proc.poll() is None and time.monotonic() < deadline, "proxy did not start"
            time.sleep(0.02)
        self.port = int(ready.read_text())
        ready.unlink()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A server with authentication, bucket `data` holding `ds/` (3 files), and the files."""
    local = tmp_path_factory.mktemp("s3data") / "ds"
    paths = write_dataset(local, LAYOUT)
    server = Moto(auth=True)
    try:
        server.upload("data", "ds", paths, settled=True)  # footers_from_cache is counted
        yield SimpleNamespace(server=server, local=local, paths=paths,
                              options=server.options())
    finally:
        server.stop()


def s3_and_local(store, s3_source, local_source, **kwargs):
    remote = collect(pqloader.Loader(s3_source, storage_options=store.options, **kwargs))
    local = collect(pqloader.Loader(local_source, **kwargs))
    return remote, local


def test_s3_directory_reads_the_same_values_as_the_local_copy(store):
    remote, local = s3_and_local(store, "s3://data/ds/", str(store.local), batch_size=16)
    assert len(remote["id"]) == 140
    assert_columns_equal(remote, local)


@pytest.mark.parametrize("scheme", ["S3", "s3a", "S3N"])
def test_an_upper_case_scheme_or_hadoops_names_read_the_same(store, scheme):
    # RFC 3986: schemes are case-insensitive; "S3://" was "Unrecognized filesystem type",
    # and so were s3a:// and s3n://, Hadoop's names of the same buckets (Spark's tables).
    remote, local = s3_and_local(store, f"{scheme}://data/ds/", str(store.local), batch_size=16)
    assert_columns_equal(remote, local)
    assert pqloader.inspect(f"{scheme}://data/ds/", storage_options=store.options)["files"] == \
        pqloader.inspect("s3://data/ds/", storage_options=store.options)["files"]


def test_s3_glob_and_explicit_list_keep_their_orders(store):
    remote, local = s3_and_local(store, "s3://data/ds/part-00[02].parquet",
                                 [str(store.paths[0]), str(store.paths[2])], batch_size=7)
    assert_columns_equal(remote, local)
    listed = ["s3://data/ds/part-002.parquet", "s3://data/ds/part-000.parquet"]
    remote, local = s3_and_local(store, listed, [str(store.paths[2]), str(store.paths[0])],
                                 batch_size=7)
    assert_columns_equal(remote, local)
    assert remote["id"][0] == 75  # the first row of part-002


def test_a_trailing_slash_names_the_keys_below_even_beside_an_object_of_that_name(store):
    # `s3://b/p/` lost its slash when resolved, and Arrow found the object `p`: the keys
    # below `p/` were not read.
    store.server.upload("pfx", "pp", store.paths)
    store.server.client().put_object(Bucket="pfx", Key="pp", Body=store.paths[1].read_bytes())
    remote, local = s3_and_local(store, "s3://pfx/pp/", str(store.local), batch_size=7)
    assert_columns_equal(remote, local)
    one, local_one = s3_and_local(store, "s3://pfx/pp", str(store.paths[1]), batch_size=7)
    assert_columns_equal(one, local_one)


def test_a_glob_names_the_keys_below_a_prefix_beside_an_object_of_that_name(store):
    # The glob's root `pg/pp` is an object too: "directory 's3://pfx/pg/pp' does not exist".
    store.server.upload("pfx", "pg/pp", store.paths)
    store.server.client().put_object(Bucket="pfx", Key="pg/pp", Body=store.paths[1].read_bytes())
    for glob in ("s3://pfx/pg/pp/*.parquet", "s3://pfx/pg/pp/part-00[0-2].parquet"):
        remote, local = s3_and_local(store, glob, str(store.local), batch_size=7)
        assert_columns_equal(remote, local)


def test_s3_globs_skip_summaries_and_name_directories_only_with_a_slash(store):
    # `_*` spells the summaries' prefix: _metadata was read as data ("corrupt"); `run*/`
    # also read the file `run-x.parquet` it matches.
    s3 = store.server.client()
    s3.create_bucket(Bucket="globs")
    collector = []
    for i, name in enumerate(["_part-0.parquet", "_part-1.parquet"]):
        table = pa.table({"id": pa.array(range(10 * i, 10 * i + 3), pa.int64())})
        buf = io.BytesIO()
        pq.write_table(table, buf, metadata_collector=collector)
        collector[-1].set_file_path(name)
        s3.put_object(Bucket="globs", Key=f"sm/{name}", Body=buf.getvalue())
    buf = io.BytesIO()
    pq.write_metadata(table.schema, buf, metadata_collector=collector)
    s3.put_object(Bucket="globs", Key="sm/_metadata", Body=buf.getvalue())
    got = collect(pqloader.Loader("s3://globs/sm/_*", storage_options=store.options))
    assert sorted(got["id"].tolist()) == [0, 1, 2, 10, 11, 12]
    for key, path in (("runs/run1/a.parquet", store.paths[0]), ("runs/run2/b.parquet", store.paths[1]),
                      ("runs/run-x.parquet", store.paths[2])):
        s3.put_object(Bucket="globs", Key=key, Body=path.read_bytes())
    remote, local = s3_and_local(store, "s3://globs/runs/run*/", [str(store.paths[0]), str(store.paths[1])],
                                 batch_size=7)
    assert_columns_equal(remote, local)


def test_s3_inspect_lists_the_objects_as_urls(store):
    info = pqloader.inspect("s3://data/ds", storage_options=store.options)
    assert [f["path"] for f in info["files"]] == [
        f"s3://data/ds/part-00{i}.parquet" for i in range(3)]
    assert info["num_rows"] == 140 and info["num_row_groups"] == 6
    assert [f["size_bytes"] for f in info["files"]] == [p.stat().st_size for p in store.paths]
    assert pqloader.inspect("s3://data", storage_options=store.options)["files"] == info["files"]


def test_s3_projection_and_shuffled_shards_equal_local_reads(store):
    for rank in range(3):
        kwargs = dict(columns=["x", "s", "id"], batch_size=9, shuffle=True, seed=11,
                      rank=rank, world_size=3, num_workers=2, io_threads=3)
        remote = list(pqloader.Loader("s3://data/ds", storage_options=store.options, **kwargs))
        local = list(pqloader.Loader(str(store.local), **kwargs))
        assert list(remote[0]) == ["x", "s", "id"]
        assert_batch_streams_equal(remote, local)


def test_s3_stream_does_not_depend_on_io_threads_or_readahead(store):
    streams = [
        list(pqloader.Loader("s3://data/ds", storage_options=store.options, batch_size=8,
                             shuffle=True, seed=3, io_threads=io, readahead=ra, num_epochs=2))
        for io, ra in ((1, 1), (8, 2), (16, None))
    ]
    assert_batch_streams_equal(streams[0], streams[1])
    assert_batch_streams_equal(streams[0], streams[2])


def test_pyarrow_retry_strategy_is_accepted_as_its_max_attempts(store):
    from pyarrow.fs import AwsStandardS3RetryStrategy

    options = {**store.options, "retry_strategy": AwsStandardS3RetryStrategy(max_attempts=5)}
    assert pqloader.inspect("s3://data/ds", storage_options=options)["num_rows"] == 140


def test_aws_endpoint_url_sets_the_endpoint(store, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", store.server.keys["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", store.server.keys["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    assert pqloader.inspect("s3://data/ds")["num_rows"] == 140  # credentials from env too


def test_wrong_credentials_raise_io_error_naming_the_url(store):
    for bad in ({"access_key": "AKIANOTAKEY", "secret_key": "nope"},
                {"secret_key": "not-the-secret"}):
        with pytest.raises(pqloader.IOError, match=r"s3://data/ds.*ACCESS_DENIED") as e:
            pqloader.Loader("s3://data/ds", storage_options={**store.options, **bad})
        assert not isinstance(e.value, pqloader.DataNotFoundError)


def test_missing_key_and_bucket_raise_data_not_found_naming_the_url(store):
    with pytest.raises(pqloader.DataNotFoundError, match="s3://data/ds/nope.parquet"):
        pqloader.Loader("s3://data/ds/nope.parquet", storage_options=store.options)
    with pytest.raises(pqloader.DataNotFoundError, match="s3://no-such-bucket/ds"):
        pqloader.Loader("s3://no-such-bucket/ds", storage_options=store.options)
    with pytest.raises(pqloader.DataNotFoundError, match="matches no files"):
        pqloader.Loader("s3://data/ds/*.csv", storage_options=store.options)


def test_a_prefix_with_a_slash_is_listed_without_asking_for_its_key(store):
    # A policy granting reads below a prefix only (`data/scoped/*`, as AWS policies are
    # commonly scoped) refuses a HEAD of the key `scoped` itself, existing or not (403),
    # and Arrow asked for it first: `s3://data/scoped/` and its globs failed with
    # ACCESS_DENIED, while every object below was readable.
    import json

    store.server.upload("data", "scoped", store.paths)
    iam = boto3.client("iam", endpoint_url=store.server.url, region_name=REGION, **store.server.keys)
    iam.create_user(UserName="scoped")
    key = iam.create_access_key(UserName="scoped")["AccessKey"]
    iam.put_user_policy(UserName="scoped", PolicyName="below", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::data"},
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::data/scoped/*"}]}))
    options = {**store.options, "access_key": key["AccessKeyId"], "secret_key": key["SecretAccessKey"]}
    local = collect(pqloader.Loader(str(store.local), batch_size=16))
    for source in ("s3://data/scoped/", "s3://data/scoped/*.parquet"):
        assert_columns_equal(collect(pqloader.Loader(source, storage_options=options, batch_size=16)), local)


def test_a_prefix_with_nothing_below_is_not_found_naming_it(store):
    # `s3://b/k/` where `k` is an object and no key lies below `k/`: the listing's
    # "Path does not exist 'data/.../a.parquet/'" reached the user as a plain IOError,
    # where a missing prefix is a DataNotFoundError.
    s3 = store.server.client()
    s3.put_object(Bucket="data", Key="lone/a.parquet", Body=store.paths[0].read_bytes())
    for source, said in (("s3://data/lone/a.parquet/", "does not exist"),
                         ("s3://data/lone/a.parquet/*", "matches no files"),
                         ("s3://data/no-such-prefix/", "does not exist"),
                         ("s3://no-such-bucket/ds/", "does not exist")):
        with pytest.raises(pqloader.DataNotFoundError, match=rf"'{re.escape(source)}' {said}"):
            pqloader.Loader(source, storage_options=store.options)

def test_unreachable_endpoint_raises_io_error_without_hanging(store):
    options = {**store.options, "endpoint_override": f"{HOST}:{free_port()}",
               "retry_max_attempts": 2, "retry_base_delay": 0.05}
    with pytest.raises(pqloader.IOError, match=r"s3://data/ds.*NETWORK_CONNECTION"):
        run_with_timeout(lambda: pqloader.Loader("s3://data/ds", storage_options=options), 60)


def test_storage_options_are_checked():
    with pytest.raises(ValueError, match="unknown storage option 'endpoint'.*endpoint_override"):
        pqloader.Loader("s3://data/ds", storage_options={"endpoint": "x"})
    with pytest.raises(ValueError, match="retry_max_attempts"):
        pqloader.inspect("s3://data/ds", storage_options={"retry_max_attempts": 0})
    with pytest.raises(ValueError, match="anonymous"):
        pqloader.inspect("s3://data/ds", storage_options={"anonymous": "perhaps"})
    with pytest.raises(TypeError, match="storage_options"):
        pqloader.Loader("s3://data/ds", storage_options={"region": ["us"]})


def big_dataset(tmp_path):
    """40 row groups of 50 rows: enough that a throttled loader is mid-epoch for a while."""
    return write_dataset(tmp_path / "big", [[50] * 10 for _ in range(4)])


# One unit fetched and decoded at a time, at most a batch ahead: most of the epoch is
# still to be read when the server goes away.
SLOW = dict(batch_size=50, num_workers=1, io_threads=1, readahead=1, prefetch_batches=1,
            max_inflight_bytes=1, shuffle=True, seed=5)


def test_server_killed_mid_epoch_raises_io_error_at_the_consumer(tmp_path):
    paths = big_dataset(tmp_path)
    server = Moto()
    try:
        server.upload("data", "big", paths)
        options = server.options(retry_max_attempts=2, retry_base_delay=0.05,
                                 connect_timeout=1, request_timeout=2)
        loader = pqloader.Loader("s3://data/big", storage_options=options, **SLOW)
        it = iter(loader)
        first = [next(it), next(it)]
        server.stop()
        with pytest.raises(pqloader.IOError, match=r"s3://data/big/part-00\d\.parquet', row group"):
            run_with_timeout(lambda: list(it), 60)
        assert len(first[0]["id"]) == 50
    finally:
        server.stop()


def test_server_restarted_mid_epoch_completes_the_epoch_with_retries(tmp_path):
    """The endpoint goes down (connections reset, then refused) and comes back with the
    same objects; with retries covering the gap the epoch equals an uninterrupted one."""
    paths = big_dataset(tmp_path)
    expected = list(pqloader.Loader(str(tmp_path / "big"), **SLOW))
    first, proxy, second = Moto(), None, None
    try:
        first.upload("data", "big", paths)
        proxy = Proxy(first.port, tmp=tmp_path)
        options = first.options(port=proxy.port, retry_max_attempts=100, retry_base_delay=0.05,
                                retry_max_delay=0.5, connect_timeout=1, request_timeout=5)
        loader = pqloader.Loader("s3://data/big", storage_options=options, **SLOW)
        it = iter(loader)
        got = [next(it), next(it)]
        port = proxy.port
        proxy.stop()
        first.stop()
        second = Moto()  # a new server process; its objects put back before it is reachable
        second.upload("data", "big", paths)
        proxy = Proxy(second.port, port=port, tmp=tmp_path)
        got += run_with_timeout(lambda: list(it), 120)
        assert_batch_streams_equal(got, expected)
    finally:
        for p in (proxy, first, second):
            if p is not None:
                p.stop()


def test_s3_footers_are_kept_in_the_cache_dir_across_runs(store, tmp_path):
    cache_dir = str(tmp_path / "cache")
    kw = dict(storage_options=store.options, batch_size=16, cache_dir=cache_dir, columns=["id"])
    first = pqloader.Loader("s3://data/ds", **kw)
    assert first.stats()["footers_from_cache"] == 0
    first_ids = [b["id"].tolist() for b in first]
    second = pqloader.Loader("s3://data/ds", **kw)
    assert second.stats()["footers_from_cache"] == 3
    assert [b["id"].tolist() for b in second] == first_ids
    # Footers from the cache give the same split cache keys as footers from the source.
    assert second.stats()["cache_hits"] == 6 and second.stats()["cache_misses"] == 0
    # A damaged footer file is ignored (read from the source again).
    for f in (tmp_path / "cache" / "footers").iterdir():
        f.write_bytes(f.read_bytes()[:-3] + b"xyz")
    third = pqloader.Loader("s3://data/ds", **kw)
    assert third.stats()["footers_from_cache"] == 0 and third.num_rows == 140
    assert pqloader.cache_stats(cache_dir)["footers"] >= 3  # counted apart from entries
    report = pqloader.cache_clear(cache_dir)
    assert report["entries"] == 6 and report["foreign_count"] == 0
    assert not list((tmp_path / "cache" / "footers").glob("*.thrift"))  # (its .lock stays)


def test_s3_footers_that_cannot_be_saved_are_counted_and_warned(store, tmp_path):
    # A footer not saved into cache_dir/footers (a full or read-only disk; here footers is
    # a file) was dropped silently, where the cache's other failed writes (entries, a
    # filter's selection) are counted in cache_write_errors and warned once.
    cache = tmp_path / "cache"
    kw = dict(storage_options=store.options, batch_size=16, cache_dir=str(cache), columns=["id"])
    expected = [b["id"].tolist() for b in pqloader.Loader("s3://data/ds", **kw)]
    shutil.rmtree(cache / "footers")
    (cache / "footers").write_bytes(b"")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = pqloader.Loader("s3://data/ds", **kw)
        assert [b["id"].tolist() for b in loader] == expected
    assert loader.stats()["cache_write_errors"] == len(store.paths)
    messages = [str(w.message) for w in caught if "pqloader cache" in str(w.message)]
    assert len(messages) == 1 and "cannot save the footer of 's3://data/ds/" in messages[0], messages


RANK_OPENS = textwrap.dedent("""
    import json, sys, pqloader
    rank, world, cache_dir, options = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    loader = pqloader.Loader("s3://many/ds", storage_options=options, cache_dir=cache_dir or None,
                             rank=rank, world_size=world, use_summary=False, columns=["id"])
    print(json.dumps(loader.stats()["footers_from_cache"]))
""")


def _requests(count_file: Path) -> int:
    import json

    time.sleep(0.3)  # the proxy rewrites its counts every 0.1 s
    return json.loads(count_file.read_text())["requests"]


def test_ranks_of_a_node_fetch_each_footer_once(store, tmp_path):
    """Without a summary, the ranks sharing a cache_dir fetch each footer once between
    them (one rank reads them into footers/, the others wait and read them there)."""
    import json

    files = 24
    paths = []
    for i in range(files):
        paths += write_dataset(tmp_path / "src" / f"f{i}", [[5, 5]])
    server = store.server  # its own bucket; only requests through this test's proxy are counted
    count_file = tmp_path / "count.json"
    proxy = Proxy(server.port, tmp=tmp_path, count_file=count_file)
    try:
        s3 = server.client()
        s3.create_bucket(Bucket="many")
        for i, p in enumerate(paths):
            s3.put_object(Bucket="many", Key=f"ds/part-{i:03d}.parquet", Body=Path(p).read_bytes())
        settle(s3, "many")
        options = json.dumps(server.options(port=proxy.port))

        def ranks(world: int, cache_dir: str) -> list[int]:
            procs = [subprocess.Popen([sys.executable, "-c", RANK_OPENS, str(r), str(world), cache_dir,
                                       options], stdout=subprocess.PIPE, text=True, env=aws_env())
                     for r in range(world)]
            out = [p.communicate(timeout=120)[0] for p in procs]
            assert all(p.returncode == 0 for p in procs)
            return [int(o.strip().splitlines()[-1]) for o in out]

        before = _requests(count_file)
        ranks(1, "")
        one_rank = _requests(count_file) - before  # its listing + every footer
        listing = one_rank - files
        assert listing >= 1
        before = _requests(count_file)
        from_cache = ranks(4, str(tmp_path / "cache"))
        four_ranks = _requests(count_file) - before
        # Each rank lists; the footers are fetched once on the node, not once per rank.
        assert four_ranks <= 4 * listing + files + 2, (four_ranks, one_rank)
        assert sorted(from_cache) == [0, files, files, files]
    finally:
        proxy.stop()


def test_s3_stale_entries_are_told_by_stats_and_deleted_by_prune(store, tmp_path):
    # Its own prefix: the module's other tests read ds/.
    paths = write_dataset(tmp_path / "src", [[20, 20], [30]])
    store.server.upload("data", "stale", paths, settled=True)  # else nothing is kept
    cache_dir = str(tmp_path / "cache")
    kw = dict(storage_options=store.options, batch_size=16, cache_dir=cache_dir)
    assert sum(len(b["id"]) for b in pqloader.Loader("s3://data/stale", **kw)) == 70
    scoped = dict(dataset="s3://data/stale", storage_options=store.options)
    footers = Path(cache_dir) / "footers"
    for f in footers.iterdir():
        f.unlink()
    s = pqloader.cache_stats(cache_dir, **scoped)
    assert s["entries"] == 3 and s["stale_entries"] == 0 and s["unverified_entries"] == 0
    # The check stores the remote files' footers as it goes: counted after it (the count
    # took them in or not by the directory's order).
    assert s["footers"] == len(list(footers.iterdir())) > 0
    # Without a dataset, remote sources are not looked up: kept, unverified.
    assert pqloader.cache_prune(cache_dir)["unverified_entries"] == 3
    time.sleep(1.1)  # S3 modification times have one-second resolution
    write_dataset(tmp_path / "src2", [[35, 35]])
    s3 = store.server.client()
    s3.put_object(Bucket="data", Key="stale/part-000.parquet",
                  Body=(tmp_path / "src2" / "part-000.parquet").read_bytes())
    s3.delete_object(Bucket="data", Key="stale/part-001.parquet")
    s = pqloader.cache_stats(cache_dir, **scoped)
    assert s["stale_entries"] == 3 and s["stale_bytes"] == s["bytes"]
    report = pqloader.cache_prune(cache_dir, **scoped)
    assert report["entries"] == 3 and report["kept"] == 0
    assert pqloader.cache_stats(cache_dir)["entries"] == 0


def run_script(script: str, timeout: float) -> subprocess.CompletedProcess:
    """Run `script` in a new interpreter with this one's path and the AWS environment."""
    env = aws_env()
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_interpreter_exits_cleanly_mid_epoch_on_s3(store):
    script = textwrap.dedent(f"""
        import pqloader
        loader = pqloader.Loader("s3://data/ds", storage_options={store.options!r},
                                 batch_size=4, num_workers=2)
        it = iter(loader)
        next(it)
        print("read one batch")
    """)
    done = run_script(script, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "read one batch" in done.stdout


def test_a_process_forked_while_s3_reads_are_in_flight_reads_s3(store):
    # Arrow's S3 client holds a reader lock for each request; a fork while the parent's
    # read-ahead had requests in flight left the child's first S3 client waiting for
    # that lock forever (DataLoader workers forked after a peek at the loader hung). A
    # fork now waits for the storage tasks in flight (fork_gate.h).
    script = textwrap.dedent(f"""
        import faulthandler, os
        import pqloader
        options = {store.options!r}
        loader = pqloader.Loader("s3://data/ds/", storage_options=options, batch_size=4,
                                 shuffle=True, seed=1, num_workers=2)
        for round in range(6):
            it = iter(loader)
            next(it)  # the read-ahead goes on in the background
            pid = os.fork()
            if pid == 0:
                faulthandler.dump_traceback_later(30, exit=True)
                child = pqloader.Loader("s3://data/ds/", storage_options=options, batch_size=4)
                n = sum(len(b["id"]) for b in child)
                os._exit(0 if n == 140 else 3)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (round, status)
        print("children read s3")
    """)
    done = run_script(script, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "children read s3" in done.stdout


def test_s3_index_then_loaders_read_the_summary_instead_of_the_footers(store):
    # A prefix of its own: the other tests keep reading ds/ without a summary.
    store.server.upload("data", "indexed", store.paths)
    source = "s3://data/indexed"
    before = collect(pqloader.Loader(source, storage_options=store.options, batch_size=16,
                                     shuffle=True, seed=2))
    r = pqloader.write_index(source, storage_options=store.options)
    assert r["metadata_path"] == "s3://data/indexed/_metadata" and r["files"] == len(store.paths)
    keys = {o["Key"] for o in store.server.client().list_objects_v2(
        Bucket="data", Prefix="indexed/")["Contents"]}
    assert {"indexed/_metadata", "indexed/_pqloader_index"} <= keys
    assert not [k for k in keys if ".tmp-" in k]
    loader = pqloader.Loader(source, storage_options=store.options, batch_size=16, shuffle=True,
                             seed=2)
    assert_columns_equal(collect(loader), before)
    assert loader.stats()["footers_from_summary"] == len(store.paths)


def test_s3_an_indexed_object_deleted_since_is_not_found_naming_it(store):
    # use_summary="only" reads the footers' sizes from the index, not a listing: the footer
    # read of a deleted object was an IOError with AWS's bare "RESOURCE_NOT_FOUND during
    # GetObject", where a local read says the file is gone (DataNotFoundError).
    store.server.upload("data", "indexed-gone", store.paths)
    source = "s3://data/indexed-gone"
    pqloader.write_index(source, storage_options=store.options)
    gone = Path(store.paths[1]).name
    store.server.client().delete_object(Bucket="data", Key=f"indexed-gone/{gone}")
    loader = pqloader.Loader(source, storage_options=store.options, use_summary="only")
    with pytest.raises(pqloader.DataNotFoundError, match=rf"{gone}' is gone since the loader listed it"):
        collect(loader)  # its footer is checked against the index when it is first read


def plain_int64_file(path: Path, start: int) -> bytes:
    """2,000 int64 ids from `start` in 2 row groups, uncompressed and PLAIN: a range read
    whose tail is not the object's bytes decodes to values, not to an error."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": np.arange(start, start + 2000, dtype=np.int64)}), path,
                   row_group_size=1000, compression="none", use_dictionary=False)
    return path.read_bytes()


def test_an_object_cut_short_after_listing_is_an_error_naming_it_not_other_values(store, tmp_path):
    # The reader keeps the listed size; Arrow's S3 ReadAt reports the length it asked for
    # when the body is shorter, and the rest of the buffer is whatever the memory pool
    # held before: ids from other reads, handed out as this file's rows.
    import pyarrow.parquet as pq

    data = plain_int64_file(tmp_path / "a.parquet", 0)
    chunk = pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(1).column(0)
    end = chunk.data_page_offset + chunk.total_compressed_size
    s3 = store.server.client()
    s3.put_object(Bucket="data", Key="cut/a.parquet", Body=data)
    loader = pqloader.Loader("s3://data/cut/a.parquet", storage_options=store.options,
                             batch_size=500)
    s3.put_object(Bucket="data", Key="cut/a.parquet", Body=data[:end - 800])  # 100 ids short
    with pytest.raises(pqloader.Error,
                       match=r"s3://data/cut/a\.parquet', row group 1.*changed since the loader listed it"):
        got = collect(loader)["id"]
        print("read instead:", got[1900:1905], "wrong:", int((got != list(range(2000))).sum()))


def test_s3_cache_dir_does_not_serve_an_object_replaced_within_its_second(store, tmp_path):
    # S3 modification times have one-second resolution and the cache keys an object by
    # its size and time: an object replaced by another of the same size within the same
    # second was served from the cache, while a loader without cache_dir read the new one.
    cache_dir = str(tmp_path / "cache")
    old = plain_int64_file(tmp_path / "old.parquet", 0)
    new = plain_int64_file(tmp_path / "new.parquet", 5000)
    assert len(old) == len(new)
    s3 = store.server.client()
    kw = dict(storage_options=store.options, batch_size=1000, cache_dir=cache_dir)
    for attempt in range(20):
        key = f"racy/{attempt}/a.parquet"
        time.sleep(1 - time.time() % 1)  # early in a second: the replacement lands in it
        s3.put_object(Bucket="data", Key=key, Body=old)
        when_old = s3.head_object(Bucket="data", Key=key)["LastModified"]
        assert collect(pqloader.Loader(f"s3://data/{key}", **kw))["id"][0] == 0
        s3.put_object(Bucket="data", Key=key, Body=new)
        if s3.head_object(Bucket="data", Key=key)["LastModified"] == when_old:
            break  # replaced within the second: size and time as the cache knows them
    else:
        pytest.fail("no replacement landed within the second of the object it replaced")
    # The replacement is what a loader without the cache reads: the cached one must agree.
    fresh = collect(pqloader.Loader(f"s3://data/{key}", storage_options=store.options,
                                    batch_size=1000))["id"]
    assert fresh[0] == 5000
    cached = collect(pqloader.Loader(f"s3://data/{key}", **kw))["id"]
    assert cached.tolist() == fresh.tolist()


def test_s3_cache_dir_does_not_serve_an_object_replaced_within_its_second_by_the_same_footer(
        store, tmp_path):
    # As above, but the replacement holds each row group's values in another order: its
    # footer (sizes, offsets, min/max) is byte for byte the old one's, so size, time and
    # footer hash all match, and the cached row groups and a filter's stored selection of
    # the old object were served (ids 0..499 for `id < 500` gave 999..500). Only the
    # object's age when listed can tell: nothing of it is kept then.
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def body(ids) -> bytes:
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), sink, row_group_size=1000,
                       compression="none", use_dictionary=False)
        return sink.getvalue().to_pybytes()

    old = body(np.arange(2000))
    new = body(np.concatenate([np.arange(1000)[::-1], np.arange(1000, 2000)[::-1]]))
    assert len(old) == len(new) and old[-200:] == new[-200:]
    cache_dir = str(tmp_path / "cache")
    s3 = store.server.client()
    for attempt in range(20):
        key = f"racy-same-footer/{attempt}/a.parquet"
        time.sleep(1 - time.time() % 1)
        s3.put_object(Bucket="data", Key=key, Body=old)
        when_old = s3.head_object(Bucket="data", Key=key)["LastModified"]
        for filter in (None, "id < 500"):  # both kinds of entry
            collect(pqloader.Loader(f"s3://data/{key}", storage_options=store.options,
                                    batch_size=1000, cache_dir=cache_dir, filter=filter))
        s3.put_object(Bucket="data", Key=key, Body=new)
        if s3.head_object(Bucket="data", Key=key)["LastModified"] == when_old:
            break
    else:
        pytest.fail("no replacement landed within the second of the object it replaced")
    for filter in ("id < 500", None):
        kw = dict(storage_options=store.options, batch_size=1000, filter=filter)
        fresh = collect(pqloader.Loader(f"s3://data/{key}", **kw))["id"]
        cached = collect(pqloader.Loader(f"s3://data/{key}", cache_dir=cache_dir, **kw))["id"]
        assert cached.tolist() == fresh.tolist(), filter
    # Once settled, it is kept (and served) as before.
    settle(s3, "data")
    first = pqloader.Loader(f"s3://data/{key}", storage_options=store.options, batch_size=1000,
                            cache_dir=cache_dir)
    collect(first)
    again = pqloader.Loader(f"s3://data/{key}", storage_options=store.options, batch_size=1000,
                            cache_dir=cache_dir)
    assert collect(again)["id"].tolist() == fresh.tolist() and again.stats()["cache_hits"] == 2


@pytest.mark.parametrize("rows", [1, 1000])
def test_s3_an_object_deleted_after_listing_is_not_found_naming_it(store, rows):
    # A row-group read of a deleted object: a range shorter than the 404's XML body made
    # the SDK fail to write that body ("INTERNAL_FAILURE ... Failed to flush response
    # stream"), an IOError that did not say the object is gone; a longer one said so, but
    # as an IOError. A local file deleted so is a DataNotFoundError.
    s3 = store.server.client()
    prefix = f"deleted-{rows}"
    for i in range(2):
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": pa.array(range(rows), pa.int64())}), buf, compression="none")
        s3.put_object(Bucket="data", Key=f"{prefix}/p{i}.parquet", Body=buf.getvalue())
    loader = pqloader.Loader(f"s3://data/{prefix}", storage_options=store.options, batch_size=rows)
    s3.delete_object(Bucket="data", Key=f"{prefix}/p1.parquet")
    with pytest.raises(pqloader.DataNotFoundError,
                       match=rf"s3://data/{prefix}/p1\.parquet' is gone since the loader listed it"):
        collect(loader)


@pytest.mark.parametrize("replacement", [b"", b"PAR1" * 25], ids=["empty", "100-bytes"])
def test_s3_a_read_past_the_end_of_an_object_replaced_by_a_shorter_one_says_it_changed(
        store, replacement):
    # A row group whose range starts past the end of the new, shorter object: the store
    # answers 416 InvalidRange, which reached the user as "AWS Error UNKNOWN (HTTP status
    # 416) ... InvalidRange" (an IOError of a failing store), not that the object changed
    # (a row group starting before the new end said so).
    s3 = store.server.client()
    prefix = f"shrunk-{len(replacement)}"
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(range(4000), pa.int64())}), buf,
                   compression="none", row_group_size=1000)
    s3.put_object(Bucket="data", Key=f"{prefix}/p.parquet", Body=buf.getvalue())
    loader = pqloader.Loader(f"s3://data/{prefix}", storage_options=store.options,
                             batch_size=1000, row_groups={f"s3://data/{prefix}/p.parquet": [3]})
    s3.put_object(Bucket="data", Key=f"{prefix}/p.parquet", Body=replacement)
    with pytest.raises(pqloader.Error,
                       match=rf"s3://data/{prefix}/p\.parquet' changed since the loader listed "
                             rf"it \({len(buf.getvalue())} bytes, now {len(replacement)}\)"):
        collect(loader)


def test_s3_a_folder_marker_holding_bytes_is_named(store):
    # Arrow lists key 'marker/sub/' (600 bytes) as the file 'marker/sub', which no GET
    # finds: the whole prefix failed with the SDK's INTERNAL_FAILURE, naming nothing.
    s3 = store.server.client()
    s3.put_object(Bucket="data", Key="marker/a.parquet", Body=store.paths[0].read_bytes())
    s3.put_object(Bucket="data", Key="marker/sub/", Body=b"x" * 600)
    with pytest.raises(pqloader.Error, match=r"folder marker 's3://data/marker/sub/' holding 600 bytes"):
        pqloader.Loader("s3://data/marker", storage_options=store.options)


def test_s3_footer_kept_for_another_object_is_not_used(store, tmp_path):
    # footers/<key>.thrift held the footer's bytes and their checksum, nothing naming the
    # object: one object's footer file in another's place (two files swapped, copied
    # over) verified, and was used as the other object's footer. With one row-group layout
    # its statistics decided the filter's pruning: `id < 100` pruned every row group of
    # the file that holds ids 0-199 (its footer said 1000-1199), 100 rows dropped silently.
    local = tmp_path / "same"
    local.mkdir()
    for name, start in (("a", 0), ("b", 1000)):
        pq.write_table(pa.table({"id": np.arange(start, start + 200, dtype=np.int64)}),
                       local / f"{name}.parquet", row_group_size=50, use_dictionary=False,
                       compression="none")
    store.server.upload("same", "ds", sorted(local.iterdir()), settled=True)
    cache_dir = tmp_path / "cache"
    kw = dict(storage_options=store.options, batch_size=64, cache_dir=str(cache_dir))
    want = collect(pqloader.Loader("s3://same/ds/", filter="id < 100", **kw))
    assert len(want["id"]) == 100
    second = pqloader.Loader("s3://same/ds/", **kw)
    assert second.stats()["footers_from_cache"] == 2
    a, b = sorted((cache_dir / "footers").glob("*.thrift"))
    a_bytes, b_bytes = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_bytes)
    b.write_bytes(a_bytes)
    for f in [*cache_dir.glob("shard-*/*.pqc"), *cache_dir.glob("filters/*.sel")]:
        f.unlink()  # only the footers decide
    got = collect(pqloader.Loader("s3://same/ds/", filter="id < 100", **kw))
    assert_columns_equal(got, want)
    plain = pqloader.Loader("s3://same/ds/", **kw)
    assert plain.stats()["footers_from_cache"] == 2  # the swapped ones were replaced


@pytest.mark.parametrize("summary", [False, True])
def test_a_child_forked_while_another_thread_builds_an_s3_loader_builds_its_own(store, summary):
    # A Loader's build lists the bucket (Arrow's lister, on Arrow's I/O pool) and reads
    # the footers (on the build's threads) outside the fork gate; each request holds
    # Arrow's S3 client lock (a reader lock), so a child forked meanwhile inherited it
    # held, and its first S3 client (a Loader it builds) waited for it for good: about
    # half of such children hung (gdb: BuildClient in pthread_rwlock_wrlock). With an
    # index the build reads the summary and the index instead (summary.cc).
    source = "s3://data/ds"
    if summary:
        store.server.upload("data", "fork-indexed", store.paths)
        source = "s3://data/fork-indexed"
        pqloader.write_index(source, storage_options=store.options)
    script = textwrap.dedent("""
        import os, sys, threading, time
        import pqloader
        options, source = eval(sys.argv[1]), sys.argv[2]
        stop = threading.Event()
        def build():
            while not stop.is_set():
                pqloader.Loader(source, columns=["id"], batch_size=20,
                                storage_options=options)
        threading.Thread(target=build, daemon=True).start()
        time.sleep(0.5)
        for _ in range(12):
            pid = os.fork()
            if pid == 0:
                loader = pqloader.Loader(source, columns=["id"], batch_size=20,
                                         storage_options=options)
                os._exit(0 if len(next(iter(loader))["id"]) == 20 else 3)
            deadline = time.monotonic() + 60
            while not os.waitpid(pid, os.WNOHANG)[0]:
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    print("a child hung")
                    os._exit(4)
                time.sleep(0.02)
        stop.set()
        print("ok")
        os._exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", script, repr(store.options), source], capture_output=True,
                          text=True, timeout=900, env=subprocess_env())
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr[-2000:]
