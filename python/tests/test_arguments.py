"""Bad arguments are refused with an error naming the argument and what is accepted.

Every case here used to be misread by the engine (a crash, ``std::bad_cast``, a hang, a
silently wrong value) or accepted by Python although meaningless. A refused
``load_state_dict`` must leave the loader exactly as it was.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import stat

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import assert_batch_streams_equal, run_with_timeout, write_dataset, write_parquet

LAYOUT = [[40, 25], [35]]  # 100 rows, 3 row groups
BS = 16


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("arguments")
    write_dataset(root, LAYOUT)
    return str(root)


@pytest.fixture(scope="module")
def typed_ds(tmp_path_factory):
    """One column per kind a fill value must suit, each with a null."""
    path = tmp_path_factory.mktemp("typed") / "t.parquet"
    write_parquet(path, pa.table({
        "f64": pa.array([1.5, None, 3.5], pa.float64()),
        "i32": pa.array([1, None, 3], pa.int32()),
        "u8": pa.array([1, None, 3], pa.uint8()),
        "text": pa.array(["a", None, "c"], pa.string()),
        "blob": pa.array([b"a", None, b"c"], pa.binary()),
    }), [3])
    return str(path)


# ---------------------------------------------------------------------------
# constructor arguments
# ---------------------------------------------------------------------------

BAD_ARGUMENTS = [
    # (keyword arguments, exception, words the message must contain)
    (dict(num_workers=10**6), ValueError, ["num_workers", "1024"]),
    (dict(num_workers=0), ValueError, ["num_workers"]),
    (dict(io_threads=2**31), ValueError, ["io_threads", "1024"]),
    (dict(batch_size=2**63), ValueError, ["batch_size", str(2**62)]),
    (dict(batch_size=1.5), TypeError, ["batch_size", "int"]),
    (dict(shuffle_window=2**63), ValueError, ["shuffle_window"]),
    (dict(max_inflight_bytes=2**64), ValueError, ["max_inflight_bytes"]),
    (dict(seed=2**64), ValueError, ["seed", str(2**64 - 1)]),
    (dict(seed=-1), ValueError, ["seed"]),
    (dict(seed="7"), TypeError, ["seed"]),
    (dict(num_epochs=2**63), ValueError, ["num_epochs"]),
    (dict(num_epochs=-1), ValueError, ["num_epochs"]),
    (dict(rank=2, world_size=2), ValueError, ["rank", "world_size"]),
    (dict(world_size=2**63), ValueError, ["world_size"]),
    (dict(cache_shards=1000), ValueError, ["cache_shards", "256"]),
    (dict(readahead=0), ValueError, ["readahead"]),
    (dict(prefetch_batches=2**63), ValueError, ["prefetch_batches"]),
    (dict(_debug_max_delay_us=-1), ValueError, ["_debug_max_delay_us"]),
    (dict(columns=[]), ValueError, ["columns", "None"]),
    (dict(columns=["id", "x", "id"]), ValueError, ["columns", "'id'", "twice"]),
    (dict(columns="id"), TypeError, ["columns", "list"]),
    (dict(columns=["id", 3]), TypeError, ["columns", "str"]),
    (dict(shuffle="no"), TypeError, ["shuffle", "True or False", "'no'"]),
    (dict(shuffle=1), TypeError, ["shuffle", "True or False"]),
    (dict(drop_last="yes"), TypeError, ["drop_last", "True or False"]),
    (dict(verify_checksums=0), TypeError, ["verify_checksums", "True or False"]),
    (dict(output="torch", pin_memory="yes"), TypeError, ["pin_memory"]),
    (dict(shard_policy="even"), ValueError, ["shard_policy", "'drop' or 'pad'"]),
    (dict(on_decode_error="ignore"), ValueError, ["on_decode_error", "'raise' or 'skip'"]),
    (dict(cache_policy="fifo"), ValueError, ["cache_policy", "'keep' or 'lru' or 'plan'"]),
    (dict(cache_dir=""), ValueError, ["cache_dir"]),
    (dict(cache_wait_timeout=-1), ValueError, ["cache_wait_timeout", "between 0"]),
    (dict(cache_wait_timeout=True), TypeError, ["cache_wait_timeout", "seconds"]),
    (dict(cache_wait_timeout=7 * 24 * 3600 + 1), ValueError, ["cache_wait_timeout", "604800"]),
    (dict(cache_size_limit=0), ValueError, ["cache_size_limit"]),
    (dict(prefetch_batches=0), ValueError, ["prefetch_batches"]),
    (dict(cache_shards=0), ValueError, ["cache_shards"]),
    (dict(world_size=0), ValueError, ["world_size", "[1,"]),
    (dict(null_mask=["id", 3]), TypeError, ["null_mask", "str"]),
    (dict(row_groups={3: [0]}), TypeError, ["row_groups", "keys"]),
    (dict(storage_options={1: "x"}), TypeError, ["storage_options", "str"]),
    (dict(storage_options={"region": 5}), TypeError, ["storage_options['region']", "str", "int"]),
    (dict(storage_options={"anonymous": 0.5}), TypeError, ["storage_options['anonymous']", "bool"]),
    (dict(storage_options={"connect_timeout": True}), TypeError,
     ["storage_options['connect_timeout']", "int or float"]),
    (dict(storage_options={"retry_max_attempts": 2.5}), TypeError,
     ["storage_options['retry_max_attempts']", "int"]),
    (dict(storage_options={"secret_key": b"hunter2"}), TypeError, ["storage_options['secret_key']", "bytes"]),
    (dict(null_mask="id"), TypeError, ["null_mask", "list of column names"]),
    (dict(io_threads=0), ValueError, ["io_threads"]),
    (dict(shuffle_window=0), ValueError, ["shuffle_window"]),
    (dict(device_prefetch=0), ValueError, ["device_prefetch"]),
    (dict(pin_memory=True), ValueError, ["pin_memory", "output='torch'"]),
    (dict(fill_null=2**64), ValueError, ["fill_null", "int64"]),
    (dict(fill_null={"x": [0]}), TypeError, ["fill_null['x']", "list"]),
    (dict(fill_null={1: 0}), TypeError, ["fill_null", "str"]),
    (dict(transforms={"s": "not a list of ops"}), TypeError, ["transforms['s']"]),
    (dict(batch_transform=3), TypeError, ["batch_transform", "callable"]),
]


@pytest.mark.parametrize("kwargs,exc,words", BAD_ARGUMENTS,
                         ids=[",".join(f"{k}={v!r:.20}" for k, v in c[0].items()) for c in BAD_ARGUMENTS])
def test_bad_argument_is_refused_naming_it_and_the_accepted_values(ds, kwargs, exc, words):
    with pytest.raises(exc) as ei:
        pqloader.Loader(ds, **kwargs)
    msg = str(ei.value)
    for word in words:
        assert word in msg, f"{word!r} not in {msg!r}"


@pytest.mark.parametrize("kwargs,name", [
    (dict(columns=["id", "\ud800"]), "columns"),
    (dict(fill_null="\udcff"), "fill_null"),
    (dict(fill_null={"id": 0, "x": "\ud800"}), "fill_null['x']"),
    (dict(fill_null={"\ud800": 0}), "fill_null"),
    (dict(null_mask=["\ud800"]), "null_mask"),
    (dict(stack={"f": ["id", "\ud800"]}), "stack['f']"),
    (dict(lists={"\ud800": pqloader.Ragged()}), "lists"),
    (dict(cache_dir="/tmp/not-utf8-\udcff"), "cache_dir"),
    (dict(storage_options={"region": "\ud800"}), "storage_options['region']"),
    (dict(filter="x == '\ud800'"), "filter"),
    (dict(row_groups={"/tmp/\ud800.parquet": [0]}), "source '/tmp/\\ud800.parquet'"),
], ids=["columns", "fill_null", "fill_null-dict", "fill_null-key", "null_mask", "stack", "lists",
        "cache_dir", "storage_options", "filter", "row_groups"])
def test_text_that_is_not_utf8_is_refused_naming_the_argument(ds, kwargs, name):
    # A str with a lone surrogate (os.fsdecode of bytes that are not UTF-8) reached the
    # engine, which raised a bare RuntimeError("std::bad_cast") naming nothing.
    with pytest.raises(ValueError) as ei:
        pqloader.Loader(ds, **kwargs)
    assert name in str(ei.value) and "UTF-8" in str(ei.value), ei.value


@pytest.mark.parametrize("kwargs", [dict(num_workers=1024), dict(io_threads=1024), dict(cache_shards=256),
                                    dict(seed=2**64 - 1, shuffle=True), dict(batch_size=2**62)],
                         ids=lambda kw: ",".join(kw))
def test_largest_accepted_values_build_a_loader_that_reads_every_row(ds, kwargs):
    loader = pqloader.Loader(ds, columns=["id"], **kwargs)
    ids = sorted(int(i) for b in loader for i in b["id"])
    assert ids == list(range(100))


@pytest.mark.parametrize("kwargs", [dict(prefetch_batches=1), dict(cache_shards=1), dict(readahead=1),
                                    dict(io_threads=1), dict(max_inflight_bytes=1), dict(world_size=1),
                                    dict(cache_wait_timeout=0), dict(cache_wait_timeout=7 * 24 * 3600),
                                    dict(fill_null=-(2**63)), dict(fill_null=2**63 - 1)],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_smallest_accepted_values_build_a_loader_that_reads_every_row(ds, kwargs):
    loader = pqloader.Loader(ds, columns=["id"], **kwargs)
    ids = sorted(int(i) for b in loader for i in b["id"])
    assert ids == list(range(100))


def test_a_declared_schemas_metadata_does_not_change_the_state(ds):
    # The state records the schema without its metadata: a state taken with one loads into
    # a loader whose schema differs only there (and resumes its stream).
    schema = pa.schema([("id", pa.int64())])
    kw = dict(columns=["id"])
    ref = list(_loader(ds, schema=schema.with_metadata({"a": "1"}), **kw))
    state = _state(ds, schema=schema.with_metadata({"a": "1"}), **kw)
    loader = _loader(ds, schema=schema.with_metadata({"a": "2"}), **kw)
    loader.load_state_dict(state)
    assert_batch_streams_equal(list(loader), ref[3:])


def test_zero_epochs_is_accepted_and_reads_nothing(ds):
    assert list(pqloader.Loader(ds, num_epochs=0)) == []


def test_null_mask_false_adds_no_mask_and_true_adds_one(typed_ds):
    def keys(**kw):
        return set(next(iter(pqloader.Loader(typed_ds, columns=["f64"], fill_null=0.0, **kw))))

    assert keys() == keys(null_mask=False) == keys(null_mask=None) == {"f64"}
    assert keys(null_mask=True) == {"f64", "f64_valid"}


def test_every_loader_argument_is_a_loader_options_field_with_the_same_default():
    from pqloader._options import LoaderOptions

    params = list(inspect.signature(pqloader.Loader).parameters.values())[1:]  # after source
    fields = {f.name: f.default for f in LoaderOptions.__dataclass_fields__.values()}
    assert [p.name for p in params] == list(fields)
    for p in params:
        assert p.default == fields[p.name], p.name


def test_rank_from_the_environment_must_be_an_integer(ds, monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK"):
        pqloader.Loader(ds)


# ---------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["", [""], ["{ds}", ""], []], ids=["empty", "list-of-empty", "one-empty", "no-entries"])
def test_empty_source_is_refused_instead_of_reading_the_current_directory(ds, source):
    source = [s.format(ds=ds) for s in source] if isinstance(source, list) else source
    with pytest.raises(ValueError, match="source"):
        pqloader.Loader(source)


def test_fifo_source_is_refused_instead_of_blocking(tmp_path):
    fifo = tmp_path / "pipe.parquet"
    os.mkfifo(fifo)
    with pytest.raises(ValueError) as ei:
        run_with_timeout(lambda: pqloader.Loader(str(fifo)), timeout=30)
    assert str(fifo) in str(ei.value) and "FIFO" in str(ei.value)
    with pytest.raises(ValueError, match="FIFO"):
        run_with_timeout(lambda: pqloader.Loader("file://" + str(fifo)), timeout=30)
    with pytest.raises(ValueError, match="FIFO"):
        run_with_timeout(lambda: pqloader.inspect(str(fifo)), timeout=30)


def test_a_set_or_bytes_source_is_a_type_error_naming_the_fix(tmp_path):
    # A set was read in hash order (the batch order changed with PYTHONHASHSEED from run
    # to run); bytes were iterated as ints ("got int").
    files = []
    for i in range(3):
        files.append(str(tmp_path / f"f{i}.parquet"))
        pq.write_table(pa.table({"x": [i]}), files[-1])
    for source in (set(files), frozenset(files)):
        for make in (pqloader.Loader, pqloader.inspect):
            with pytest.raises(TypeError, match="got a set.*sorted"):
                make(source)
    with pytest.raises(TypeError, match="got bytes .*os.fsdecode"):
        pqloader.Loader(os.fsencode(files[0]))
    with pytest.raises(TypeError, match="got bytes .*os.fsdecode"):
        pqloader.inspect(os.fsencode(files[0]))
    assert [b["x"].tolist() for b in pqloader.Loader(sorted(set(files)), shuffle=False)] == [[0, 1, 2]]


def test_a_mapping_source_is_a_type_error_not_its_keys(tmp_path, monkeypatch):
    # A dict was iterated as its keys: {"train": path} read a file named "train" (here one
    # that exists, so the keys' rows came back as the dataset's).
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"x": [1]}), "train")
    pq.write_table(pa.table({"x": [2]}), "data.parquet")
    for make in (pqloader.Loader, pqloader.inspect):
        with pytest.raises(TypeError, match=r"got a dict: give its values \(list\(d.values\(\)\)\)"):
            make({"train": "data.parquet"})
    assert [b["x"].tolist() for b in pqloader.Loader(["data.parquet"])] == [[2]]


def test_a_source_that_is_not_paths_is_a_type_error_naming_source(tmp_path):
    # A non-iterable was a bare "'int' object is not iterable"; a Loader (or Mixture) given
    # as the source was listed, i.e. iterated: a whole epoch read (forever with
    # num_epochs=None), its position moved, then "source entries ... got dict".
    pq.write_table(pa.table({"x": [0, 1, 2]}), tmp_path / "f.parquet")
    for source in (5, None, 1.5):
        for make in (pqloader.Loader, pqloader.inspect):
            with pytest.raises(TypeError, match=r"^source must be a path.*got"):
                make(source)
    endless = pqloader.Loader(str(tmp_path), batch_size=1, num_epochs=None)
    mixture = pqloader.mix([pqloader.Loader(str(tmp_path))], [1])
    for source in (endless, mixture):
        with pytest.raises(TypeError, match=r"^source must be a path.*got a pqloader\.(Loader|Mixture)"):
            run_with_timeout(lambda: pqloader.Loader(source), timeout=60)
    assert (endless.state_dict()["epoch"], endless.state_dict()["batch"]) == (0, 0)
    assert endless.stats()["batches"] == 0


def test_a_summary_spelled_with_percent_escapes_in_a_file_uri_is_refused_as_a_summary(tmp_path):
    pq.write_table(pa.table({"id": [1]}), tmp_path / "p.parquet")
    pq.write_metadata(pa.schema([("id", pa.int64())]), tmp_path / "_common_metadata")
    with pytest.raises(pqloader.InvalidDataError, match="is a summary"):
        pqloader.Loader(f"file://{tmp_path}/%5Fcommon%5Fmetadata")


def test_a_file_named_as_a_directory_is_refused_as_the_os_refuses_it(tmp_path):
    # 'a.parquet/' read the file (the engine dropped the '/'), where open(2) says ENOTDIR.
    f = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), f)
    for source in (f"{f}/", f"{f}//", f"{f}/.", f"file://{f}/", f"{f}/*"):
        with pytest.raises(ValueError, match=f"names the file '{f}' as a directory"):
            pqloader.Loader(source)
        with pytest.raises(ValueError, match="as a directory"):
            pqloader.inspect(source)
    assert [b["x"].tolist() for b in pqloader.Loader(str(f), shuffle=False)] == [[1, 2]]


def test_every_rfc8089_spelling_of_a_local_file_uri_reads_the_file(tmp_path):
    # file://localhost/p was refused ("Unsupported hostname"); file:/p (Hadoop's, Spark's
    # spelling) was read as the relative path ./file:/p.
    f = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), f)
    for source in (f"file://{f}", f"file://localhost{f}", f"FILE://LocalHost{f}", f"file:{f}",
                   f"file://localhost{tmp_path}/"):
        assert [b["x"].tolist() for b in pqloader.Loader(source, shuffle=False)] == [[1, 2]], source
    with pytest.raises(ValueError, match="names the host 'server'.*local files only"):
        pqloader.Loader(f"file://server{f}")
    cache = tmp_path / "my cache"
    loader = pqloader.Loader(str(f), cache_dir=f"file://localhost{tmp_path}/my%20cache")
    assert loader.options.cache_dir == str(cache)
    with pytest.raises(ValueError, match="cache_dir .*names the host"):
        pqloader.Loader(str(f), cache_dir=f"file://server{tmp_path}/c")


def test_a_file_uri_source_names_the_path_after_its_scheme_as_cache_dir_does(tmp_path):
    # Arrow parsed a source's file: URI: '#' and '?' ended the path (file:///d/run#3 read
    # /d/run, another dataset, without a word; file:///d/q?x was missing), and a space, a
    # bracket, a '%' or a non-ASCII letter (also Hadoop's unescaped file:/d/my ds) could
    # not be parsed; a cache_dir of the same spelling named the path itself.
    names = ["run", "run#3", "q?x", "my ds", "br[1]", "100%", "São 東京"]
    for i, name in enumerate(names):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"x": [i]}), tmp_path / name / "a.parquet")
    for i, name in enumerate(names):
        for source in (f"file://{tmp_path}/{name}", f"file:{tmp_path}/{name}",
                       f"file://localhost{tmp_path}/{name}/", (tmp_path / name).as_uri()):
            assert [b["x"].tolist() for b in pqloader.Loader(source)] == [[i]], source
        files = pqloader.inspect(f"file://{tmp_path}/{name}")["files"]
        assert [f["path"] for f in files] == [f"{tmp_path}/{name}/a.parquet"]
        cache = pqloader.Loader(f"file://{tmp_path}/{name}", cache_dir=f"file://{tmp_path}/c/{name}").options
        assert cache.cache_dir == f"{tmp_path}/c/{name}"
    # A URI already escaped keeps its spelling (a state saved before loads), and one of
    # its glob's wildcards may be escaped or not.
    uri = (tmp_path / "my ds").as_uri()
    assert pqloader.Loader(uri).state_dict()["options"]["sources"] == [uri]
    for glob in (f"file://{tmp_path}/run[#]*", f"file://{tmp_path}/run%5B%23%5D*/*.parquet"):
        assert [b["x"].tolist() for b in pqloader.Loader(glob)] == [[1]], glob


@pytest.mark.skipif(not os.path.exists("/dev/null") or not stat.S_ISCHR(os.stat("/dev/null").st_mode),
                    reason="needs /dev/null as a character device")
def test_character_device_source_is_refused():
    with pytest.raises(ValueError, match="character device"):
        pqloader.Loader("/dev/null")


# ---------------------------------------------------------------------------
# fill_null against the column types
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fill,exc,words",
    [
        ({"f64": "zero"}, TypeError, ["'f64'", "float64", "'zero'"]),
        ({"i32": b"0"}, TypeError, ["'i32'", "int32", "b'0'"]),
        ({"text": 0}, TypeError, ["'text'", "str", "0"]),
        ({"blob": 1.5}, TypeError, ["'blob'", "bytes", "1.5"]),
        ({"i32": 0.5}, ValueError, ["'i32'", "int32", "0.5"]),
        ({"i32": float("nan")}, ValueError, ["'i32'", "nan"]),
        ({"u8": -1}, ValueError, ["'u8'", "uint8", "-1"]),
        ({"i32": 2**40}, ValueError, ["'i32'", "int32", str(2**40)]),
        (-1, TypeError, ["'text'", "-1", "dict"]),  # a scalar applies to every column
        ("n/a", TypeError, ["'f64'", "'n/a'", "dict"]),
    ],
    ids=["str-for-float", "bytes-for-int", "int-for-str", "float-for-bytes", "fraction-for-int",
         "nan-for-int", "negative-for-uint8", "overflow-int32", "scalar-int-for-str", "scalar-str-for-float"],
)
def test_fill_null_of_the_wrong_kind_is_refused_before_reading(typed_ds, fill, exc, words):
    with pytest.raises(exc) as ei:
        pqloader.Loader(typed_ds, fill_null=fill)
    msg = str(ei.value)
    for word in words:
        assert word in msg, f"{word!r} not in {msg!r}"


def test_fill_null_must_be_a_value_of_a_float16_or_bool_column(tmp_path):
    # They were cast unchecked: 1e6 became inf in float16, 2 and 0.5 became True.
    path = tmp_path / "t.parquet"
    write_parquet(path, pa.table({"h": pa.array([1.5, None], pa.float16()),
                                  "flag": pa.array([True, None])}), [2])
    for fill, words in (({"h": 1e6}, ["h", "overflows", "float16"]),
                        ({"flag": 2}, ["flag", "not a bool", "2"]),
                        ({"flag": 0.5}, ["flag", "not a bool", "0.5"])):
        with pytest.raises(ValueError) as ei:
            pqloader.Loader(str(path), fill_null={"h": 0, "flag": False, **fill})
        for word in words:
            assert word in str(ei.value), ei.value
    (batch,) = list(pqloader.Loader(str(path), fill_null={"h": float("inf"), "flag": 1}))
    assert batch["h"].tolist() == [1.5, float("inf")] and batch["flag"].tolist() == [True, True]


def test_fill_null_of_the_right_kind_fills_every_column(typed_ds):
    loader = pqloader.Loader(typed_ds, fill_null={"f64": -1, "i32": 7.0, "u8": 255, "text": "?", "blob": "?"})
    (batch,) = list(loader)
    np.testing.assert_array_equal(batch["f64"], np.array([1.5, -1.0, 3.5]))
    np.testing.assert_array_equal(batch["i32"], np.array([1, 7, 3], np.int32))
    np.testing.assert_array_equal(batch["u8"], np.array([1, 255, 3], np.uint8))
    assert batch["text"] == ["a", "?", "c"]
    assert batch["blob"] == [b"a", b"?", b"c"]


# ---------------------------------------------------------------------------
# load_state_dict
# ---------------------------------------------------------------------------


def _loader(ds, **over):
    kw = dict(batch_size=BS, shuffle=True, seed=5, num_epochs=2, shuffle_window=2)
    kw.update(over)
    return pqloader.Loader(ds, **kw)


def _state(ds, k=3, **over):
    loader = _loader(ds, **over)
    it = iter(loader)
    for _ in range(k):
        next(it)
    return json.loads(json.dumps(loader.state_dict()))


def _with(state, path, value):
    """A deep copy of `state` with state[path[0]][path[1]]... set to `value` (DELETE removes it)."""
    out = copy.deepcopy(state)
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


DELETE = object()
BAD_STATES = [
    # (path into the state, value, word the message must contain)
    (("epoch",), -1, "epoch"),
    (("epoch",), 1.0, "epoch"),
    (("epoch",), "1", "epoch"),
    (("epoch",), True, "epoch"),
    (("epoch",), DELETE, "epoch"),
    (("batch",), 1.5, "batch"),
    (("batch",), -1, "batch"),
    (("batch",), 10**6, "batch"),
    (("batch",), None, "batch"),
    (("iteration_end",), -5, "iteration_end"),
    (("iteration_end",), 0, "iteration_end"),  # before the state's own epoch 1
    (("iteration_end",), "2", "iteration_end"),
    (("seed",), -1, "seed"),
    (("seed",), 2**64, "seed"),
    (("seed",), "5", "seed"),
    (("seed",), DELETE, "seed"),
    (("version",), 3, "version"),
    (("version",), True, "version"),
    (("options",), None, "options"),
    (("options",), [], "options"),
    (("options",), DELETE, "options"),
    (("options", "files"), DELETE, "files"),
    (("options", "batch_size"), 0, "batch_size"),  # another batch size is an elastic resume
    (("options", "world_size"), "2", "world_size"),
    (("options", "shuffle_window"), 99, "shuffle_window"),
    (("elastic",), {"world_size": 2, "batch_size": 4, "batches": [1]}, "batches"),
    (("rank_batches",), [1, 2], "rank_batches"),
    (("elastic",), {"world_size": 2, "batch_size": 4, "batches": [1, -1]}, "batches"),
]


@pytest.mark.parametrize("path,value,word", BAD_STATES,
                         ids=[f"{'.'.join(p)}={'DELETE' if v is DELETE else repr(v)}" for p, v, _ in BAD_STATES])
def test_malformed_state_is_refused_naming_the_field_and_leaves_the_loader_unchanged(ds, path, value, word):
    good = _state(ds, k=len(_loader(ds)) + 2)  # epoch 1
    bad = _with(good, path, value)
    ref = list(_loader(ds))
    loader = _loader(ds)
    it = iter(loader)
    head = [next(it) for _ in range(4)]
    before = loader.state_dict()
    with pytest.raises(pqloader.InvalidDataError) as ei:
        loader.load_state_dict(bad)
    assert word in str(ei.value), str(ei.value)
    assert isinstance(ei.value, ValueError)
    assert loader.state_dict() == before
    assert_batch_streams_equal(head + list(it), ref)  # the running iterator was not stopped


@pytest.mark.parametrize("state", [None, [], "state", 3, {}], ids=["None", "list", "str", "int", "empty-dict"])
def test_non_state_is_refused_as_invalid_data(ds, state):
    loader = _loader(ds)
    with pytest.raises(pqloader.InvalidDataError, match="not a pqloader state"):
        loader.load_state_dict(state)


@pytest.mark.parametrize("bad", ["seed", "options"], ids=["bad-seed", "other-options"])
def test_refused_state_does_not_replace_a_drawn_seed(ds, bad):
    loader = _loader(ds, seed=None)
    drawn = loader.seed
    ref = list(_loader(ds, seed=drawn))
    state = _state(ds, seed=drawn ^ 1)
    if bad == "seed":
        state["seed"] = -3
    else:
        state["options"]["shuffle_window"] = 7
    with pytest.raises(pqloader.InvalidDataError):
        loader.load_state_dict(state)
    assert loader.seed == drawn
    assert loader.state_dict()["seed"] == drawn
    assert_batch_streams_equal(list(loader), ref)


def test_accepted_state_adopts_the_seed_for_a_drawn_seed_loader(ds):
    state = _state(ds, k=5, seed=123)
    loader = _loader(ds, seed=None)
    loader.load_state_dict(state)
    assert loader.seed == 123
    assert_batch_streams_equal(list(loader), list(_loader(ds, seed=123))[5:])


@pytest.mark.parametrize("epoch,exc", [(-1, ValueError), (1.5, TypeError), ("1", TypeError)])
def test_set_epoch_refuses_a_bad_epoch_and_keeps_the_position(ds, epoch, exc):
    loader = _loader(ds)
    list(loader)
    before = loader.state_dict()
    with pytest.raises(exc, match="epoch"):
        loader.set_epoch(epoch)
    assert loader.state_dict() == before


def test_loader_options_repr_never_shows_storage_credentials(ds):
    loader = pqloader.Loader(ds, storage_options={"access_key": "AKIA-test", "secret_key": "hunter2-secret"})
    assert loader.options.storage_options["secret_key"] == "hunter2-secret"
    assert "hunter2-secret" not in repr(loader.options) and "hunter2-secret" not in repr(loader)


def test_storage_option_values_of_the_types_their_keys_take_become_text():
    # docs/reliability.md promises TypeError for wrong types; {"region": 5} was accepted
    # (as "5"). Text is taken for every key (the CLI gives text; the engine parses it).
    from pqloader._env import normalize_storage_options

    given = {"region": "us-east-1", "anonymous": True, "force_virtual_addressing": 0,
             "connect_timeout": 2.5, "request_timeout": 3, "retry_max_attempts": np.int64(4),
             "retry_budget": "60", "session_token": None}
    expected = {"region": "us-east-1", "anonymous": "true", "force_virtual_addressing": "0",
                "connect_timeout": "2.5", "request_timeout": "3", "retry_max_attempts": "4",
                "retry_budget": "60"}
    assert normalize_storage_options(given) == expected
    assert normalize_storage_options(expected) == expected  # idempotent
    assert normalize_storage_options({"anonymous": np.bool_(True)}) == {"anonymous": "true"}
    with pytest.raises(TypeError) as e:
        normalize_storage_options({"secret_key": b"hunter2-secret"})
    assert "hunter2" not in str(e.value)  # the type is named, never the value


def test_a_shuffled_loader_of_several_ranks_needs_a_seed(ds):
    # Each rank drawing its own seed would shuffle differently: overlapping shards.
    with pytest.raises(ValueError, match="needs an explicit seed"):
        pqloader.Loader(ds, batch_size=4, shuffle=True, seed=None, rank=1, world_size=2)
    pqloader.Loader(ds, batch_size=4, shuffle=True, seed=None, rank=0, world_size=1)
    pqloader.Loader(ds, batch_size=4, shuffle=False, seed=None, rank=1, world_size=2)


def test_epochs_stop_below_2_32(typed_ds):
    # 32 bits of the epoch key the shuffle: epoch 2**32 repeated epoch 0's order.
    loader = pqloader.Loader(typed_ds, fill_null={"f64": 0, "i32": 0, "u8": 0, "text": "", "blob": b""})
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(2**32)
    loader.set_epoch(2**32 - 1)  # the last one runs (no next epoch is started ahead)
    assert len(list(loader)) == 1


def test_the_state_after_the_last_epoch_loads(ds):
    # A loader that ran epoch 2**32 - 1 to its end recorded epoch 2**32, batch 0: a state
    # its own load_state_dict refused ("state['epoch'] must be in [0, 4294967295]").
    loader = pqloader.Loader(ds, batch_size=4, shuffle=True, seed=1)
    loader.set_epoch(2**32 - 1)
    assert len(list(loader)) == len(loader)
    assert loader.epoch == 2**32 - 1
    state = loader.state_dict()
    fresh = pqloader.Loader(ds, batch_size=4, shuffle=True, seed=1)
    fresh.load_state_dict(state)
    assert fresh.state_dict()["epoch"] == state["epoch"]
    # Nothing is left: the next epoch would repeat epoch 0's order, so it is refused.
    for resumed in (loader, fresh):
        with pytest.raises(ValueError, match="2\\^32"):
            next(iter(resumed))


def test_a_mixtures_state_after_the_last_epoch_loads(ds):
    # As a loader's: a mixture that ran epoch 2**32 - 1 to its end recorded epoch 2**32.
    def mixture():
        return pqloader.mix([pqloader.Loader(ds, batch_size=4, shuffle=True, seed=s) for s in (1, 2)],
                            weights=[1, 1], batch_size=4, seed=3)
    m = mixture()
    m.set_epoch(2**32 - 1)
    assert len(list(m)) == len(m) > 0
    state = m.state_dict()
    assert (state["epoch"], state["batch"]) == (2**32 - 1, len(m))
    fresh = mixture()
    fresh.load_state_dict(state)
    assert fresh.state_dict()["epoch"] == 2**32 - 1
    for resumed in (m, fresh):
        with pytest.raises(ValueError, match="2\\^32"):
            next(iter(resumed))


# ---------------------------------------------------------------------------
# NUL characters, bytes and NumPy flags
# ---------------------------------------------------------------------------


def test_a_nul_in_a_source_is_refused_not_cut_off_there(ds):
    # 'ds/*\0x' names nothing; the engine's glob cut it at the NUL and read all of ds/.
    for source in (os.path.join(ds, "*") + "\0x", os.path.join(ds, "part-000.parquet") + "\0x"):
        with pytest.raises(ValueError, match="NUL"):
            pqloader.Loader(source)
    with pytest.raises(ValueError, match="NUL"):
        pqloader.inspect(os.path.join(ds, "*") + "\0x")


def test_a_nul_in_a_cache_dir_is_refused_not_cut_off_there(ds, tmp_path):
    # 'c\0d' made and used the directory 'c' (and warned "Is a directory" per file).
    with pytest.raises(ValueError, match="cache_dir .*NUL"):
        pqloader.Loader(ds, cache_dir=str(tmp_path / "c") + "\0d")
    for fn in (pqloader.cache_stats, pqloader.cache_prune, pqloader.cache_clear):
        with pytest.raises(ValueError, match="cache_dir .*NUL"):
            fn(str(tmp_path / "c") + "\0d")
    assert not (tmp_path / "c").exists()


def test_a_bytes_cache_dir_of_the_cache_functions_is_a_type_error_naming_the_fix(tmp_path):
    # (it was pybind's "incompatible function arguments", naming no argument)
    for fn in (pqloader.cache_stats, pqloader.cache_prune, pqloader.cache_clear):
        with pytest.raises(TypeError, match=r"cache_dir must be a text path.*os\.fsdecode"):
            fn(os.fsencode(str(tmp_path)))


def test_use_summary_takes_numpy_bools_as_the_other_flags_do(ds):
    assert list(pqloader.Loader(ds, use_summary=np.bool_(False), batch_size=BS)) is not None
    assert pqloader.Loader(ds, use_summary=np.bool_(False)).options.use_summary is False
    with pytest.raises(TypeError, match="use_summary"):
        pqloader.Loader(ds, use_summary=np.array([1, 2]))  # (was numpy's "truth value ... ambiguous")


@pytest.mark.parametrize("text", [b"id > 1", 3, None])
def test_parse_filter_of_a_non_str_is_a_type_error_naming_it(text):
    # (bytes: "a bytes-like object is required, not 'str'", the reverse of the truth)
    with pytest.raises(TypeError, match="parse_filter takes the filter's text"):
        pqloader.parse_filter(text)


def test_a_nul_in_a_storage_option_is_refused_without_showing_the_value(ds):
    # endpoint_override '127.0.0.1:1\0x' reached 127.0.0.1:1: the S3 client cut it there.
    for key in ("endpoint_override", "secret_key"):
        opts = {"access_key": "a", "secret_key": "b", key: "hunter2\0x"}
        with pytest.raises(ValueError, match=rf"storage_options\['{key}'\] holds a NUL") as ei:
            pqloader.Loader("s3://bucket/x.parquet", storage_options=opts)
        assert "hunter2" not in str(ei.value)


def test_a_world_size_from_the_environment_beyond_the_limit_names_the_variable(ds, monkeypatch):
    # (it was "world_size must be in [1, 2**62]", an argument never given)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(10**23))
    with pytest.raises(ValueError, match="environment variable WORLD_SIZE=1"):
        pqloader.Loader(ds)


def test_a_rank_found_before_the_process_group_is_checked_against_it_when_iterating(tmp_path, monkeypatch):
    # (test_distributed.py runs this with gloo ranks; here a stand-in group, in-process.)
    import sys
    import types

    write_dataset(tmp_path / "d", [[4]])
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    found = pqloader.Loader(str(tmp_path / "d"), batch_size=2)  # no group yet: rank 0 of 1
    given = pqloader.Loader(str(tmp_path / "d"), batch_size=2, rank=0, world_size=1)
    group = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                  get_rank=lambda: 1, get_world_size=lambda: 2)
    monkeypatch.setitem(sys.modules, "torch.distributed", group)
    with pytest.raises(ValueError, match="rank 0 of 1, found when it was built, but the initialised "
                                         "torch.distributed process group says rank 1 of 2"):
        next(iter(found))
    assert [b["id"].tolist() for b in given] == [[0, 1], [2, 3]]  # given: the caller's choice


def test_a_torch_distributed_another_thread_is_still_importing_is_no_group(tmp_path, monkeypatch):
    # A Loader built while another thread imported torch met the module half-made (no
    # is_available yet): "partially initialized module 'torch.distributed'", an
    # AttributeError out of Loader(). Such a module has no initialised group.
    import sys
    import types

    write_dataset(tmp_path / "d", [[4]])
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setitem(sys.modules, "torch.distributed", types.ModuleType("torch.distributed"))
    loader = pqloader.Loader(str(tmp_path / "d"), batch_size=2)
    assert [b["id"].tolist() for b in loader] == [[0, 1], [2, 3]]


def test_the_next_iteration_starts_in_the_epoch_after_an_ended_one(tmp_path):
    # (what len() of pqloader.torch.IterableDataset without workers counts from)
    write_dataset(tmp_path / "d", [[4]])
    loader = pqloader.Loader(str(tmp_path / "d"), batch_size=2, num_epochs=1)
    assert loader._next_iteration_epoch() == 0
    it = iter(loader)
    next(it)
    assert loader._next_iteration_epoch() == 0  # mid-epoch: the rest of epoch 0
    next(it)  # every batch taken, the end not reached (len(loader) batches, then no next)
    assert loader._next_iteration_epoch() == 1
    list(it)
    assert loader._next_iteration_epoch() == 1
    assert [b["id"].tolist() for b in loader] == [[0, 1], [2, 3]]  # epoch 1: the same rows
