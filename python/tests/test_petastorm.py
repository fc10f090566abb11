"""pqloader.petastorm against what real Petastorm 0.13.1 decodes from the same datasets.

The datasets under python/tests/petastorm/fixtures were written by Petastorm's
materialize_dataset under pyspark, and the expected values were recorded by Petastorm's
own readers (python/tests/petastorm/make_fixtures.py, in bench/.venvs/petastorm); these
tests never import petastorm.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import transforms as T
from pqloader.petastorm import (Loader, TransformSpec, UntrustedSchemaError, make_batch_reader, make_reader,
                                PetastormMetadataError)
from pqloader.petastorm import _dataset, _schema_io, reader as reader_module
from pqloader.petastorm.predicates import (in_intersection, in_lambda, in_negate, in_pseudorandom_split,
                                           in_reduce, in_set)
from pqloader.petastorm.selectors import IntersectIndexSelector, SingleIndexSelector, UnionIndexSelector

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "petastorm", "fixtures")
CODECS = os.path.join(FIXTURES, "codecs")
PLAIN = os.path.join(FIXTURES, "plain")
N_ROWS = 40
NATURAL = dict(shuffle_row_groups=False, workers_count=2)


@pytest.fixture(scope="module")
def expected():
    return np.load(os.path.join(FIXTURES, "codecs_expected.npz"))


@pytest.fixture(scope="module")
def plain_expected():
    return np.load(os.path.join(FIXTURES, "plain_expected.npz"))


def _ids(**kwargs) -> list[int]:
    with make_reader(CODECS, **kwargs) as reader:
        return [int(r.id) for r in reader]


def _copy_dataset(tmp_path, metadata_update: dict[bytes, bytes]) -> str:
    """The codecs dataset with its _common_metadata changed (Parquet files copied)."""
    dst = tmp_path / "ds"
    shutil.copytree(CODECS, dst)
    meta = dst / "_common_metadata"
    schema = pq.read_schema(meta)
    md = dict(schema.metadata)
    md.update(metadata_update)
    pq.write_metadata(schema.with_metadata(md), meta)
    return str(dst)


# -- the restricted Unischema reader --------------------------------------------------
def _fixture_bytes(name: str) -> bytes:
    with open(os.path.join(FIXTURES, name), "rb") as f:  # (left open: a ResourceWarning)
        return f.read()


def test_unischema_is_rebuilt_from_petastorms_pickle_as_plain_objects():
    data = _fixture_bytes("unischema.pickle")
    schema = _schema_io.load_unischema(data)
    assert schema._name == "FixtureSchema"
    f = schema.fields
    assert list(f)[:3] == ["id", "id64", "label"]
    assert f["id"].numpy_dtype is np.int32 and f["id"].shape == () and not f["id"].nullable
    assert str(f["id"].codec) == "ScalarCodec(IntegerType())"
    assert str(f["image_jpeg"].codec) == "CompressedImageCodec('jpeg', 90)"
    assert f["gray_png"].shape == (16, 24)
    assert f["volume"].shape == (None, 3, 2) and str(f["volume"].codec) == "NdarrayCodec()"
    assert str(f["packed"].codec) == "CompressedNdarrayCodec()"
    assert f["name"].numpy_dtype is np.str_
    assert schema.matrix is f["matrix"]  # fields as attributes, as Petastorm's


def test_written_unischema_reads_back_equal():
    data = _fixture_bytes("unischema.pickle")
    schema = _schema_io.load_unischema(data)
    written = _schema_io.dumps_unischema(schema)
    assert b"petastorm.unischema" in written  # Petastorm's class names, so Petastorm reads it
    again = _schema_io.load_unischema(written)
    assert again == schema
    assert [str(x.codec) for x in again.fields.values()] == [str(x.codec) for x in schema.fields.values()]


class _RunsCommand:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class _CommandWriter(_schema_io._Writer):
    """Writes a genuine Unischema pickle, except that one value becomes os.system(command)."""

    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    def value(self, v):
        if v is _CommandWriter:
            self.glob("posix", "system")
            self.value((self.command,))
            self.write(pickle.REDUCE)
        else:
            super().value(v)


def _nested_payload(command: str) -> bytes:
    genuine = _schema_io.load_unischema(_fixture_bytes("unischema.pickle"))
    genuine.fields["image_png"].codec._quality = _CommandWriter  # the command, as a codec parameter
    w = _CommandWriter(command)
    w.write(pickle.PROTO + bytes([2]))
    w.value(genuine)
    w.write(pickle.STOP)
    genuine.fields["image_png"].codec._quality = 80
    return w.out.getvalue()


def _hostile_payloads(marker: str) -> dict[str, bytes]:
    cmd = f"touch {marker}"
    return {
        "top-level os.system": pickle.dumps(_RunsCommand(cmd)),
        "builtins.eval": pickle.dumps(_EvalReduce(f"__import__('os').system({cmd!r})")),
        "nested in a field": _nested_payload(cmd),
        "persistent id": _persistent_id_payload(),
    }


def _persistent_id_payload() -> bytes:
    class WithPid(pickle.Pickler):
        def persistent_id(self, obj):
            return "os.system" if obj == "marker" else None

    out = io.BytesIO()
    WithPid(out, protocol=4).dump({"_name": "marker"})
    return out.getvalue()


class _EvalReduce:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        return eval, (self.code,)


@pytest.mark.parametrize("case", ["top-level os.system", "builtins.eval"])
def test_the_hostile_pickles_would_run_a_command_if_unpickled(tmp_path, case):
    # The payloads are real: a plain pickle.loads runs the command.
    marker = tmp_path / "ran"
    payload = _hostile_payloads(str(marker))[case]
    subprocess.run([sys.executable, "-c", f"import pickle; pickle.loads({payload!r})"], check=True)
    assert marker.exists()


def test_the_nested_hostile_pickle_runs_its_command_when_the_classes_are_importable(tmp_path):
    # With stand-ins for petastorm's modules importable, plain pickle.loads gets as far
    # as the codec's state and runs the command hidden there.
    marker = tmp_path / "ran"
    payload = _nested_payload(f"touch {marker}")
    fake = tmp_path / "fake"
    (fake / "petastorm").mkdir(parents=True)
    (fake / "petastorm" / "__init__.py").write_text("")
    (fake / "petastorm" / "unischema.py").write_text(
        "from collections import namedtuple\nclass Unischema: pass\n"
        "UnischemaField = namedtuple('UnischemaField', 'name numpy_dtype shape codec nullable')\n")
    (fake / "petastorm" / "codecs.py").write_text(
        "".join(f"class {c}: pass\n" for c in ("ScalarCodec", "NdarrayCodec", "CompressedNdarrayCodec",
                                               "CompressedImageCodec")))
    (fake / "pyspark" / "sql").mkdir(parents=True)
    (fake / "pyspark" / "__init__.py").write_text("")
    (fake / "pyspark" / "sql" / "__init__.py").write_text("")
    (fake / "pyspark" / "sql" / "types.py").write_text(
        "".join(f"class {t}: pass\n" for t in ("IntegerType", "LongType", "ByteType", "ShortType", "FloatType",
                                               "DoubleType", "BooleanType", "StringType")))
    subprocess.run([sys.executable, "-c", f"import sys, pickle; sys.path.insert(0, {str(fake)!r}); "
                    f"pickle.loads({payload!r})"], check=True)
    assert marker.exists()


@pytest.mark.parametrize("case", ["top-level os.system", "builtins.eval", "nested in a field", "persistent id"])
def test_hostile_unischema_is_refused_and_runs_nothing(tmp_path, case):
    marker = tmp_path / "pwned"
    payload = _hostile_payloads(str(marker))[case]
    with pytest.raises(UntrustedSchemaError) as e:
        _schema_io.load_unischema(payload)
    assert "not trusted" in str(e.value)
    assert not marker.exists()
    url = _copy_dataset(tmp_path, {_schema_io.UNISCHEMA_KEY: payload})
    with pytest.raises(UntrustedSchemaError, match="not trusted"):
        make_reader(url)
    assert not marker.exists()
    assert isinstance(e.value, pqloader.InvalidDataError)


def test_hostile_refusal_names_the_global():
    with pytest.raises(UntrustedSchemaError, match=r"posix\.system|os\.system"):
        _schema_io.load_unischema(pickle.dumps(_RunsCommand("true")))


def test_object_dtypes_and_other_factories_are_refused():
    with pytest.raises(UntrustedSchemaError):  # numpy.dtype('O') could carry objects
        _schema_io.loads(pickle.dumps(np.dtype(object)))
    with pytest.raises(UntrustedSchemaError):
        _schema_io.loads(pickle.dumps(io.BytesIO))
    with pytest.raises(UntrustedSchemaError, match="not a Unischema"):
        _schema_io.load_unischema(pickle.dumps({"a": 1}))


def test_hostile_rowgroup_index_is_refused_before_anything_is_read(tmp_path):
    marker = tmp_path / "pwned"
    url = _copy_dataset(tmp_path, {_schema_io.ROWGROUPS_INDEX_KEY: pickle.dumps(_RunsCommand(f"touch {marker}"))})
    with pytest.raises(UntrustedSchemaError):
        make_reader(url, rowgroup_selector=SingleIndexSelector("label_index", [1]))
    assert not marker.exists()


def test_stored_row_group_counts_number_the_pieces_without_footers():
    ds = _dataset.open_dataset(CODECS, {})
    assert all(f.num_row_groups == 5 for f in ds.files)  # from _common_metadata's JSON
    assert len(ds.pieces()) == 15


# -- values equal Petastorm's ---------------------------------------------------------
def test_make_reader_decodes_every_codec_like_petastorm(expected):
    with make_reader(CODECS, **NATURAL) as reader:
        rows = [r._asdict() for r in reader]
    assert len(rows) == N_ROWS
    for name in rows[0]:
        want = expected[f"field/{name}"]
        got = np.array([r[name] for r in rows]) if isinstance(rows[0][name], str) else \
            np.stack([np.asarray(r[name]) for r in rows])
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_rows_are_namedtuples_with_petastorms_value_types():
    with make_reader(CODECS, schema_fields=["id", "name", "gray_png", "u8", "flag"], **NATURAL) as reader:
        row = next(reader)
    assert type(row).__name__ == "FixtureSchema_view_view"
    assert row._fields == ("id", "u8", "flag", "name", "gray_png")  # schema order
    assert isinstance(row.id, np.int32) and isinstance(row.u8, np.uint8) and isinstance(row.flag, np.bool_)
    assert isinstance(row.name, np.str_) and row.gray_png.shape == (16, 24)


def test_schema_fields_take_unischema_fields_and_regex_patterns():
    with make_reader(CODECS, **NATURAL) as full:
        schema = full.schema
    with make_reader(CODECS, schema_fields=[schema.id, "image_.*", "f[0-9]+"], **NATURAL) as reader:
        row = next(reader)
    assert set(row._fields) == {"id", "image_png", "image_jpeg", "f32", "f64"}
    with pytest.raises(ValueError, match="does not belong"):
        make_reader(CODECS, schema_fields=[pqloader.petastorm.unischema.UnischemaField(
            "nope", np.int32, (), None, False)])


def test_make_reader_refuses_a_plain_parquet_store():
    with pytest.raises(PetastormMetadataError, match="make_batch_reader"):
        make_reader(PLAIN)


def test_make_batch_reader_returns_petastorms_columns(plain_expected):
    with make_batch_reader("file://" + PLAIN, **NATURAL) as reader:
        batches = [b._asdict() for b in reader]
    assert reader.batched_output
    for name in batches[0]:
        got = np.concatenate([b[name] for b in batches])
        want = plain_expected[f"field/{name}"]
        assert str(got.dtype) == str(want.dtype), name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_a_reader_refuses_to_be_pickled_naming_the_reader():
    # (to a process pool, Ray, copy.deepcopy): the error named pqloader.Loader and advised
    # pqloader.torch.IterableDataset(loader), for a loader the reader's user never made.
    import copy
    with make_batch_reader(PLAIN, **NATURAL) as reader:
        for copier in (pickle.dumps, copy.deepcopy):
            with pytest.raises(TypeError, match="petastorm Reader cannot be pickled or copied"):
                copier(reader)


def test_make_batch_reader_schema_fields_patterns_and_dataframe_transform(plain_expected):
    def scale(df):
        df["score"] = df["score"] * 10
        return df

    spec = TransformSpec(scale, removed_fields=["word"])
    with make_batch_reader(PLAIN, schema_fields=["id", "sc.*", "word"], transform_spec=spec, **NATURAL) as reader:
        batches = [b._asdict() for b in reader]
    assert set(batches[0]) == {"id", "score"}
    np.testing.assert_array_equal(np.concatenate([b["score"] for b in batches]),
                                  plain_expected["field/score"] * 10)


# -- predicates, selectors, transforms ----------------------------------------------
PREDICATES = {
    "in_set": lambda: in_set([1, 2, 3, 17, 40], "label"),
    "in_set_ids": lambda: in_set({3, 5, 8, 13, 21, 34}, "id"),
    "in_lambda": lambda: in_lambda(["f64", "flag"], lambda f, b: f > 20 and not b),
    "in_lambda_state": lambda: in_lambda(["id"], lambda i, s: i % s == 1, 4),
    "in_intersection": lambda: in_intersection([3, 10], "tags"),
    "in_reduce_all": lambda: in_reduce([in_set([0, 1], "label"), in_lambda(["id"], lambda i: i > 10)], all),
    "in_reduce_any": lambda: in_reduce([in_set([0], "label"), in_lambda(["id"], lambda i: i > 40)], any),
    "in_pseudorandom_split_0": lambda: in_pseudorandom_split([0.3, 0.7], 0, "name"),
    "in_pseudorandom_split_1": lambda: in_pseudorandom_split([0.3, 0.7], 1, "id"),
}


@pytest.mark.parametrize("name", sorted(PREDICATES))
def test_predicates_keep_the_rows_petastorm_keeps(expected, name):
    assert _ids(predicate=PREDICATES[name](), **NATURAL) == expected[f"pred/{name}"].tolist()


def test_predicate_fields_outside_the_schema_view_are_read_but_not_returned(expected):
    with make_reader(CODECS, schema_fields=["id"], predicate=in_set([2], "label"), **NATURAL) as reader:
        rows = list(reader)
    assert rows[0]._fields == ("id",)
    assert [int(r.id) for r in rows] == [i for i in range(N_ROWS) if i % 5 == 2]


def test_negated_predicate_keeps_the_complement():
    kept = set(_ids(predicate=in_set([1, 2], "label"), **NATURAL))
    dropped = set(_ids(predicate=in_negate(in_set([1, 2], "label")), **NATURAL))
    assert kept.isdisjoint(dropped) and kept | dropped == set(range(N_ROWS))


def test_a_selective_predicate_skips_row_groups_without_a_match():
    # ids 3 and 5 lie in the first file's second row group (rows 3-5): only it is read.
    with make_reader(CODECS, schema_fields=["id", "image_png"], predicate=in_set({3, 5}, "id"), **NATURAL) as r:
        assert [int(x.id) for x in r] == [3, 5]
        assert r.loader.stats()["units_read"] == 1


def test_rowgroup_selector_reads_the_row_groups_petastorm_reads(expected):
    assert _ids(rowgroup_selector=SingleIndexSelector("label_index", [2, 4]), **NATURAL) == \
        expected["selector/label_2_4"].tolist()


def test_rowgroup_selectors_intersect_and_unite():
    a, b = SingleIndexSelector("label_index", [0]), SingleIndexSelector("label_index", [3])
    both = set(_ids(rowgroup_selector=IntersectIndexSelector([a, b]), **NATURAL))
    either = set(_ids(rowgroup_selector=UnionIndexSelector([a, b]), **NATURAL))
    only_a = set(_ids(rowgroup_selector=a, **NATURAL))
    assert both < only_a <= either
    with pytest.raises(ValueError, match="not available"):
        make_reader(CODECS, rowgroup_selector=SingleIndexSelector("nope", [1]))


def test_transform_spec_runs_per_row_with_edit_and_removed_fields(expected):
    def double_matrix(r):
        r["matrix"] = r["matrix"] * 2
        r["ratio"] = np.float64(r["id"]) / 7
        return r

    spec = TransformSpec(double_matrix, edit_fields=[("ratio", np.float64, (), False)],
                         removed_fields=["image_png", "image_jpeg", "gray_png", "name"])
    with make_reader(CODECS, schema_fields=["id", "matrix", "name", "image_png", "image_jpeg", "gray_png"],
                     transform_spec=spec, **NATURAL) as reader:
        rows = [r._asdict() for r in reader]
        assert list(reader.schema.fields) == ["id", "matrix", "ratio"]
    assert sorted(rows[0]) == expected["transform/fields"].tolist()
    for name in rows[0]:
        np.testing.assert_array_equal(np.stack([np.asarray(r[name]) for r in rows]), expected[f"transform/{name}"])


def test_filters_act_as_a_row_predicate():
    assert _ids(filters=[("label", "in", [1, 3]), ("id", ">", 20)], **NATURAL) == \
        [i for i in range(N_ROWS) if i % 5 in (1, 3) and i > 20]


# -- order, shards, epochs, cache ----------------------------------------------------
def test_shuffled_order_is_a_function_of_the_seed_not_of_the_workers():
    a = _ids(seed=7, workers_count=1)
    b = _ids(seed=7, workers_count=4)
    c = _ids(seed=8, workers_count=2)
    assert a == b and a != c
    assert sorted(a) == list(range(N_ROWS)) and a != list(range(N_ROWS))


def test_unseeded_shuffle_draws_a_seed_that_replays_the_order():
    with make_reader(CODECS, schema_fields=["id"]) as reader:
        first = [int(r.id) for r in reader]
        seed = reader.seed
    assert _ids(seed=seed) == first


def test_shards_are_disjoint_equal_and_cover_the_dataset():
    shards = [_ids(cur_shard=k, shard_count=3, seed=1) for k in range(3)]
    assert len({len(s) for s in shards}) == 1
    assert set().union(*map(set, shards)) <= set(range(N_ROWS))
    assert sum(len(s) for s in shards) == N_ROWS - N_ROWS % 3
    assert all(set(a).isdisjoint(b) for i, a in enumerate(shards) for b in shards[i + 1:])
    with pytest.raises(ValueError, match="both specified"):
        make_reader(CODECS, cur_shard=1)


def test_shards_without_a_seed_are_disjoint_as_petastorms_are():
    # Petastorm's shards are disjoint whatever each process draws; so are these (every
    # shard of an unseeded sharded reader shares seed 0).
    shards = [_ids(cur_shard=k, shard_count=3) for k in range(3)]
    assert all(set(a).isdisjoint(b) for i, a in enumerate(shards) for b in shards[i + 1:])
    assert sum(len(s) for s in shards) == N_ROWS - N_ROWS % 3


def test_num_epochs_repeats_in_new_orders_and_reset_reads_again():
    with make_reader(CODECS, schema_fields=["id"], seed=3, num_epochs=2) as reader:
        ids = [int(r.id) for r in reader]
        assert len(ids) == 2 * N_ROWS and ids[:N_ROWS] != ids[N_ROWS:]
        assert sorted(ids[N_ROWS:]) == list(range(N_ROWS))
        reader.reset()
        assert len([r for r in reader]) == 2 * N_ROWS


@pytest.mark.parametrize("batched", [False, True])
def test_an_error_or_ctrl_c_in_next_leaves_the_rest_to_read(tmp_path, batched):
    """A KeyboardInterrupt (or any error) raised inside next() ends neither the reading nor
    the epochs: later calls yield the rest of the interrupted stream, as Petastorm's reader
    reads on; they used to end at once (StopIteration, last_row_consumed)."""
    if batched:
        pq.write_table(pa.table({"id": np.arange(5000, dtype=np.int64)}), tmp_path / "p.parquet",
                       row_group_size=500)
        make, url, fail_at = make_batch_reader, f"file://{tmp_path}", 3
    else:
        make, url, fail_at = make_reader, CODECS, N_ROWS + 5  # a row of the second epoch
    calls = {"n": 0, "fail_at": None}

    def func(x):
        calls["n"] += 1
        if calls["n"] == calls["fail_at"]:
            raise KeyboardInterrupt  # as Ctrl-C while next() waits for this batch
        return x

    def read(reader, out):
        for item in reader:
            out.extend(np.atleast_1d(np.asarray(item.id)).tolist())
        return out

    kwargs = dict(schema_fields=["id"], num_epochs=2, shuffle_row_groups=False,
                  transform_spec=TransformSpec(func))
    with make(url, **kwargs) as reader:
        full = read(reader, [])
    assert len(full) == 2 * (5000 if batched else N_ROWS)
    calls.update(n=0, fail_at=fail_at)
    got: list = []
    with make(url, **kwargs) as reader:
        with pytest.raises(KeyboardInterrupt):
            read(reader, got)
        assert 0 < len(got) < len(full) and not reader.last_row_consumed
        read(reader, got)
        assert reader.last_row_consumed
    assert got == full


@pytest.mark.parametrize("batched", [False, True])
def test_a_ctrl_c_while_a_batch_is_handed_out_keeps_its_rest(tmp_path, batched):
    """A Ctrl-C that lands while the reader makes a row (or a batch's namedtuple) of a batch
    the Loader already handed out: the next calls yield the rest of that batch, then the
    later ones. The rest of the batch was dropped (the Loader's position is after it)."""
    if batched:
        pq.write_table(pa.table({"id": np.arange(3000, dtype=np.int64)}), tmp_path / "p.parquet",
                       row_group_size=500)
        make, url, fail_at = make_batch_reader, f"file://{tmp_path}", 2
    else:
        make, url, fail_at = make_reader, CODECS, 3
    kwargs = dict(schema_fields=["id"], num_epochs=1, shuffle_row_groups=False)

    def ids(reader, out):
        for item in reader:
            out.extend(np.atleast_1d(np.asarray(item.id)).tolist())
        return out

    with make(url, **kwargs) as reader:
        full = ids(reader, [])
    with make(url, **kwargs) as reader:
        real = reader.schema._get_namedtuple()
        calls = {"n": 0}

        def make_item(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise KeyboardInterrupt  # as a signal delivered while this item is made
            return real(*args, **kwargs)

        reader.schema._get_namedtuple = lambda: make_item
        got: list = []
        with pytest.raises(KeyboardInterrupt):
            ids(reader, got)
        assert 0 < len(got) < len(full)
        ids(reader, got)
        assert reader.last_row_consumed
    assert got == full


def test_reset_in_the_middle_is_refused_and_a_stopped_reader_raises():
    reader = make_reader(CODECS, schema_fields=["id"])
    next(reader)
    with pytest.raises(NotImplementedError):
        reader.reset()
    reader.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        next(reader)


def test_local_disk_cache_serves_the_second_reader_with_equal_values(tmp_path, expected):
    kw = dict(schema_fields=["id", "image_jpeg", "matrix"], cache_type="local-disk",
              cache_location=str(tmp_path / "cache"), cache_size_limit=1 << 30, **NATURAL)
    with make_reader(CODECS, **kw) as first:
        rows1 = list(first)
    with make_reader(CODECS, **kw) as second:
        rows2 = list(second)
        assert second.loader.stats()["cache_hits"] > 0
    for a, b in zip(rows1, rows2):
        np.testing.assert_array_equal(a.image_jpeg, b.image_jpeg)
    np.testing.assert_array_equal(np.stack([r.image_jpeg for r in rows2]), expected["field/image_jpeg"])
    with pytest.raises(ValueError, match="Unknown cache_type"):
        make_reader(CODECS, cache_type="memcached")


def test_unmapped_parameters_warn_once_naming_the_alternative():
    reader_module._warned.clear()
    with pytest.warns(UserWarning, match="shuffling_queue_capacity|shuffle_window"):
        make_reader(CODECS, shuffle_row_drop_partitions=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_reader(CODECS, shuffle_row_drop_partitions=2)  # once per process
    with pytest.warns(UserWarning, match="workers_count"):
        make_reader(CODECS, reader_pool_type="process")
    with pytest.raises(NotImplementedError, match="NGram"):
        make_reader(CODECS, schema_fields=type("NGram", (), {})())


def test_file_urls_and_url_lists_read_the_same_rows():
    files = sorted(f for f in os.listdir(CODECS) if f.endswith(".parquet"))
    with make_reader(["file://" + os.path.join(CODECS, f) for f in files], schema_fields=["id"],
                     **NATURAL) as reader:
        assert [int(r.id) for r in reader] == list(range(N_ROWS))


def test_every_local_file_url_spelling_reads_the_dataset_and_another_host_is_refused():
    # file://server/ds was read as the local /ds (the host dropped without a word).
    for url in ("file://localhost" + CODECS, "file:" + CODECS):
        with make_reader(url, schema_fields=["id"], **NATURAL) as reader:
            assert [int(r.id) for r in reader] == list(range(N_ROWS)), url
    with pytest.raises(ValueError, match="names the host 'server'"):
        make_reader("file://server" + CODECS, schema_fields=["id"])


def test_a_file_url_names_the_path_after_the_scheme_percent_decoded_as_the_loader_takes_it(tmp_path):
    # Petastorm's urlparse ended the path at '#' or '?': file:///d/run#3 read /d/run, another
    # dataset, without a word; and file:///d/my%20ds was missing (pqloader.Loader reads both).
    value = {"run": 0, "run#3": 1, "q?x": 2, "my ds": 3}
    for name, x in value.items():
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"x": [x]}), tmp_path / name / "p.parquet")
    for name, url in (("run#3", f"file://{tmp_path}/run#3"), ("q?x", f"file://{tmp_path}/q?x"),
                      ("my ds", f"file://{tmp_path}/my%20ds"), ("run#3", (tmp_path / "run#3").as_uri())):
        assert [b["x"].tolist() for b in pqloader.Loader(url)] == [[value[name]]], url
        with make_batch_reader(url, reader_pool_type="dummy") as reader:
            assert [b.x.tolist() for b in reader] == [[value[name]]], url


def test_storage_options_map_from_s3fs_names():
    opts = _dataset.storage_options_from({"key": "AK", "secret": "SK", "client_kwargs": {
        "endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}}, None)
    assert opts == {"access_key": "AK", "secret_key": "SK", "endpoint_override": "127.0.0.1:9000",
                    "scheme": "http", "region": "eu-west-1"}
    with pytest.raises(ValueError, match="no pqloader equivalent"):
        _dataset.storage_options_from({"use_ssl": False}, None)
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(access_key="A", secret_key="B", endpoint_override="localhost:1", scheme="http")
    got = _dataset.storage_options_from(None, fs)
    assert got["access_key"] == "A" and got["endpoint_override"] == "localhost:1" and got["scheme"] == "http"


# -- the pqloader Loader over a Petastorm dataset -------------------------------------
def test_loader_applies_codecs_and_user_ops_follow(expected):
    loader = Loader(CODECS, columns=["id", "gray_png", "image_png", "packed"], batch_size=40,
                    transforms={"image_png": [T.CenterCrop(8)]})
    batch = next(iter(loader))
    assert batch["gray_png"].shape == (40, 16, 24)
    np.testing.assert_array_equal(batch["gray_png"], expected["field/gray_png"])
    np.testing.assert_array_equal(batch["packed"], expected["field/packed"])
    np.testing.assert_array_equal(batch["image_png"], expected["field/image_png"][:, 4:12, 8:16])


def test_loader_row_groups_reads_only_the_listed_row_groups(tmp_path):
    files = sorted(os.path.join(CODECS, f) for f in os.listdir(CODECS) if f.endswith(".parquet"))
    loader = pqloader.Loader(files, columns=["id"], batch_size=100,
                             row_groups={os.path.relpath(files[0]): [3, 1], files[2]: []})
    ids = next(iter(loader))["id"].tolist()
    assert ids == [3, 4, 5, 9, 10, 11] + list(range(13, 26))
    assert loader.stats()["units_read"] == 7
    state = loader.state_dict()
    other = pqloader.Loader(files, columns=["id"], batch_size=100)
    with pytest.raises(pqloader.InvalidDataError):
        other.load_state_dict(state)  # another selection is another dataset
    with pytest.raises(pqloader.InvalidDataError, match="has 5 row groups"):
        pqloader.Loader(files, row_groups={files[1]: [5]})
    with pytest.raises(pqloader.DataNotFoundError, match="not a file of the dataset"):
        pqloader.Loader(files, row_groups={str(tmp_path / "x.parquet"): [0]})
    with pytest.raises(TypeError):
        pqloader.Loader(files, row_groups={files[0]: "0"})


# -- pytorch loaders ------------------------------------------------------------------
TORCH_FIELDS = ["id", "u8", "flag", "f32", "name", "matrix", "gray_png"]


def test_dataloader_batches_equal_petastorms(expected):
    import torch
    from pqloader.petastorm.pytorch import DataLoader

    with DataLoader(make_reader(CODECS, schema_fields=TORCH_FIELDS, **NATURAL), batch_size=10) as loader:
        batches = list(loader)
    assert len(batches) == int(expected["torch/num_batches"])
    for name, value in batches[0].items():
        want_type = str(expected[f"torch_dtype/{name}"])
        if isinstance(value, torch.Tensor):
            assert str(value.dtype) == want_type, name
            np.testing.assert_array_equal(torch.cat([b[name] for b in batches]).numpy(), expected[f"torch/{name}"])
        else:
            assert type(value).__name__ == want_type, name
            assert [x for b in batches for x in b[name]] == expected[f"torch/{name}"].tolist()


def test_dataloader_with_a_custom_collate_gets_row_dicts():
    from pqloader.petastorm.pytorch import DataLoader

    seen = []

    def collate(rows):
        seen.append(sorted(rows[0]))
        return [int(r["id"]) for r in rows]

    with DataLoader(make_reader(CODECS, schema_fields=["id", "flag"], **NATURAL), batch_size=7,
                    collate_fn=collate) as loader:
        batches = list(loader)
    assert batches == [list(range(i, min(i + 7, N_ROWS))) for i in range(0, N_ROWS, 7)]
    assert seen[0] == ["flag", "id"]


def test_dataloader_after_a_predicate_still_gives_full_batches():
    from pqloader.petastorm.pytorch import DataLoader

    with DataLoader(make_reader(CODECS, schema_fields=["id"], predicate=in_set([0, 1, 2], "label"), **NATURAL),
                    batch_size=5) as loader:
        sizes = [len(b["id"]) for b in loader]
    assert sizes == [5, 5, 5, 5, 4]


def test_shuffling_queue_capacity_shuffles_across_row_groups_reproducibly():
    from pqloader.petastorm.pytorch import DataLoader

    def run(seed):
        with DataLoader(make_reader(CODECS, schema_fields=["id"], seed=seed, shuffle_row_groups=False),
                        batch_size=8, shuffling_queue_capacity=20) as loader:
            return [int(i) for b in loader for i in b["id"]]

    a, b, c = run(5), run(5), run(6)
    assert a == b and a != c and sorted(a) == list(range(N_ROWS))
    # Rows of different row groups (3 rows each) meet within a batch.
    assert len({i // 3 for i in a[:8]}) > 3


def test_batched_dataloader_applies_transform_fn_per_column(plain_expected):
    import torch
    from pqloader.petastorm.pytorch import BatchedDataLoader

    with BatchedDataLoader(make_batch_reader(PLAIN, schema_fields=["id", "vec"], **NATURAL), batch_size=16) as loader:
        batches = list(loader)
    assert [len(b["id"]) for b in batches] == [16, 16, 8]
    np.testing.assert_array_equal(torch.cat([b["vec"] for b in batches]).numpy(), plain_expected["field/vec"])
    with BatchedDataLoader(make_batch_reader(PLAIN, schema_fields=["id"], **NATURAL), batch_size=16,
                           transform_fn=lambda c: torch.as_tensor(c) * 2) as loader:
        assert next(iter(loader))["id"].tolist() == [2 * i for i in range(16)]


def test_dataloader_refuses_a_second_pass_while_one_runs():
    from pqloader.petastorm.pytorch import DataLoader

    loader = DataLoader(make_reader(CODECS, schema_fields=["id"]), batch_size=4)
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="full pass"):
        next(iter(loader))


def _partitioned(tmp_path) -> str:
    """A Petastorm dataset in hive folders (part=p0/ ...), as Spark's partitionBy writes."""

    from pqloader.petastorm.codecs import ScalarCodec
    from pqloader.petastorm.etl.dataset_metadata import write_metadata
    from pqloader.petastorm.unischema import Unischema, UnischemaField

    pyspark_types = pytest.importorskip("pyspark.sql.types")
    d = tmp_path / "part"
    schema = Unischema("PartSchema", [
        UnischemaField("id", np.int32, (), ScalarCodec(pyspark_types.IntegerType()), False),
        UnischemaField("part", np.str_, (), ScalarCodec(pyspark_types.StringType()), False)])
    pq.write_to_dataset(pa.table({"id": pa.array(range(30), pa.int32()),
                                  "part": [f"p{i % 3}" for i in range(30)]}), str(d), partition_cols=["part"])
    write_metadata("file://" + str(d), schema)
    return "file://" + str(d)


def test_predicates_and_filters_on_a_partition_key(tmp_path):
    # The key is in the path only: the row-group pass read a table without it (pyarrow
    # leaves an absent column out) and failed with KeyError; now decided per batch.
    url = _partitioned(tmp_path)
    for kw in ({"predicate": in_set({"p1"}, "part")}, {"filters": [("part", "=", "p1")]}):
        with make_reader(url, **kw) as reader:
            assert sorted(int(r.id) for r in reader) == list(range(1, 30, 3)), kw
    with pytest.warns(UserWarning, match="Please use make_reader"):  # a Unischema store, as Petastorm warns
        with make_batch_reader(url, predicate=in_lambda(["part"], lambda k: k == "p2")) as reader:
            batches = [b._asdict() for b in reader]
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(2, 30, 3))
    assert set(np.concatenate([b["part"] for b in batches]).tolist()) == {"p2"}  # the key is a column


def test_make_batch_reader_hands_predicates_a_dataframe_as_petastorm_does():
    # Petastorm's batch reader calls do_include(DataFrame) and in_lambda's function with
    # Series: a vectorised lambda failed here (called per row with scalars), and a
    # predicate not derived from PredicateBase failed outright.
    with make_batch_reader(PLAIN, predicate=in_lambda(["id"], lambda i: i % 3 == 0), **NATURAL) as reader:
        series = sorted(np.concatenate([b.id for b in reader]).tolist())

    class DuckTyped:
        def get_fields(self):
            return {"id"}

        def do_include(self, frame):
            return frame["id"].isin([1, 5, 9])

    with make_batch_reader(PLAIN, predicate=DuckTyped(), **NATURAL) as reader:
        duck = sorted(np.concatenate([b.id for b in reader]).tolist())
    with make_batch_reader(PLAIN, **NATURAL) as reader:
        ids = sorted(np.concatenate([b.id for b in reader]).tolist())
    assert series == [i for i in ids if i % 3 == 0] and duck == [i for i in ids if i in (1, 5, 9)]
    with make_batch_reader(PLAIN, predicate=in_lambda(["word"], lambda w: w.str.startswith("w1")),
                           **NATURAL) as reader:
        words = [w for b in reader for w in b.word]
    assert words and all(w.startswith("w1") for w in words)


def test_a_shard_with_no_rows_raises_no_data_available_as_petastorm_does():
    # More shards than rows read nothing, silently; Petastorm raises NoDataAvailableError.
    from pqloader.petastorm import NoDataAvailableError

    with pytest.raises(NoDataAvailableError, match=r"shard 0 of 41 has no rows"):
        make_reader(CODECS, cur_shard=0, shard_count=41, seed=1, **NATURAL)
    with make_reader(CODECS, cur_shard=0, shard_count=4, seed=1, **NATURAL) as reader:
        assert len(list(reader)) == N_ROWS // 4


def test_stop_from_another_thread_ends_the_reading_thread_as_stopped():
    # It closed the generator under the reading thread: "generator already executing".
    import threading
    import time

    reader = make_reader(CODECS, num_epochs=None, workers_count=1)
    rows, errors = [], []

    def read():
        try:
            for row in reader:
                rows.append(row)
                time.sleep(0.001)
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=read)
    t.start()
    while len(rows) < 50:
        time.sleep(0.01)
    reader.stop()
    t.join(60)
    assert not t.is_alive() and reader.stopped
    assert errors and "has stopped" in str(errors[0])


def test_filters_and_in_set_compare_integers_exactly_and_dates_as_pyarrow(tmp_path):
    # NumPy promoted a value list mixing large ints ([2**63 + 1, 4]) or the row-group
    # pass's Python lists to float64, where neighbouring integers are equal: rows were
    # kept or dropped wrongly; a date literal raised TypeError against the int32 days.
    import datetime as dt
    n = 8
    pq.write_table(pa.table({"id": np.arange(n),
                             "u": pa.array([2**63 + i if i % 2 else i for i in range(n)], pa.uint64()),
                             "big": pa.array([2**62 + i for i in range(n)], pa.int64()),
                             "d": pa.array([dt.date(2020, 1, 1 + i) for i in range(n)], pa.date32())}),
                   tmp_path / "a.parquet", row_group_size=4)
    url = "file://" + str(tmp_path)

    def ids(fields, **kw):
        with make_batch_reader(url, schema_fields=["id", *fields], num_epochs=1, **kw) as reader:
            return sorted(int(i) for b in reader for i in b.id)

    assert ids(["u"], filters=[("u", ">", 2**63)]) == [1, 3, 5, 7]
    assert ids(["u"], filters=[("u", "in", [2**63 + 1, 4])]) == [1, 4]
    assert ids(["u"], predicate=in_set({2**63 + 1, 4}, "u")) == [1, 4]
    assert ids(["big"], filters=[("big", "in", [2**62 + 3, 0.5])]) == [3]
    assert ids(["big"], filters=[("big", "not in", [2**62 + 3])]) == [0, 1, 2, 4, 5, 6, 7]
    expected = sorted(pq.read_table(tmp_path, filters=[("d", ">", dt.date(2020, 1, 4))])["id"].to_pylist())
    assert ids(["d"], filters=[("d", ">", dt.date(2020, 1, 4))]) == expected == [4, 5, 6, 7]


def test_row_group_pass_sees_temporal_and_decimal_columns_as_the_batches_hold_them(tmp_path):
    # The pre-pass read such columns with pyarrow as datetime / date / Decimal objects,
    # where the batches hold int64 / int32 counts and float64: in_set of a count, the
    # filter the error message asks for (the count), or a float equal to a decimal
    # emptied every row group (nothing read, rows silently lost) or raised TypeError.
    import datetime as dt
    import decimal
    n = 8
    ts = pa.array([dt.datetime(2020, 1, 1 + i) for i in range(n)], pa.timestamp("us"))
    days = pa.array([dt.date(2020, 1, 1 + i) for i in range(n)], pa.date32())
    pq.write_table(pa.table({"id": np.arange(n), "ts": ts, "d": days,
                             "dec": pa.array([decimal.Decimal(i) / 10 for i in range(n)], pa.decimal128(5, 1))}),
                   tmp_path / "a.parquet", row_group_size=4)
    url = "file://" + str(tmp_path)

    def ids(**kw):
        with make_batch_reader(url, schema_fields=["id"], num_epochs=1, **kw) as reader:
            return sorted(int(i) for b in reader for i in b.id)

    assert ids(predicate=in_set({ts[5].value}, "ts")) == [5]
    assert ids(predicate=in_set({days[6].value}, "d")) == [6]
    assert ids(filters=[("ts", ">=", ts[5].value)]) == [5, 6, 7]
    assert ids(filters=[("d", ">", dt.date(2020, 1, 6))]) == [6, 7]
    expected = pq.read_table(tmp_path, filters=[("dec", "=", 0.1)])["id"].to_pylist()
    assert ids(filters=[("dec", "=", 0.1)]) == expected == [1]
    assert ids(predicate=in_set({0.5}, "dec")) == [5]


def test_row_group_pass_reads_int96_in_the_loaders_unit(tmp_path):
    # With loader_options={"coerce_int96_timestamp_unit": "us"} the batches hold INT96
    # timestamps as microseconds, but the pre-pass read them with pyarrow's default
    # (nanoseconds): in_set of a microsecond count emptied every row group, silently.
    import datetime as dt
    ts = pa.array([dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 2), dt.datetime(2021, 1, 1),
                   dt.datetime(9999, 12, 31)], pa.timestamp("us"))
    pq.write_table(pa.table({"id": np.arange(4), "ts": ts}), tmp_path / "a.parquet",
                   use_deprecated_int96_timestamps=True, row_group_size=2)
    url = "file://" + str(tmp_path)
    with make_batch_reader(url, schema_fields=["id"], num_epochs=1, predicate=in_set({ts[2].value}, "ts"),
                           loader_options={"coerce_int96_timestamp_unit": "us"}) as reader:
        assert sorted(int(i) for b in reader for i in b.id) == [2]


def test_row_group_pass_refuses_int96_the_loaders_unit_cannot_hold(tmp_path):
    # pyarrow wraps an INT96 date nanoseconds cannot hold (9999-12-31 reads as 1816-03-30):
    # the pre-pass judged the wrapped date, so a filter `ts > 2000-01-01` dropped the row
    # group of 9999-12-31 silently, where the Loader refuses the value.
    import datetime as dt
    ts = pa.array([dt.datetime(2020, 1, 1), dt.datetime(9999, 12, 31)], pa.timestamp("us"))
    pq.write_table(pa.table({"id": np.arange(2), "ts": ts}), tmp_path / "a.parquet",
                   use_deprecated_int96_timestamps=True, row_group_size=1)
    url = "file://" + str(tmp_path)
    cut = int(np.datetime64("2000-01-01", "ns").astype(np.int64))
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"row group 1, column 'ts'.*9999-12-31.*coerce_int96_timestamp_unit"):
        make_batch_reader(url, schema_fields=["id"], num_epochs=1, filters=[("ts", ">", cut)])
    with make_batch_reader(url, schema_fields=["id"], num_epochs=1, filters=[("ts", ">", cut // 1000)],
                           loader_options={"coerce_int96_timestamp_unit": "us"}) as reader:
        assert sorted(int(i) for b in reader for i in b.id) == [0, 1]
    # Dates nanoseconds hold, before 1970 with a fraction of a second too, are judged as read.
    (tmp_path / "a.parquet").unlink()
    ts = pa.array([dt.datetime(1677, 9, 22), dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
                   dt.datetime(2262, 4, 10)], pa.timestamp("us"))
    pq.write_table(pa.table({"id": np.arange(3), "ts": ts}), tmp_path / "a.parquet",
                   use_deprecated_int96_timestamps=True, row_group_size=1)
    with make_batch_reader(url, schema_fields=["id"], num_epochs=1, filters=[("ts", "<", 0)]) as reader:
        assert sorted(int(i) for b in reader for i in b.id) == [0, 1]


def test_filters_refuse_a_date_with_a_column_that_is_no_date(tmp_path):
    # A datetime.date value became a count of days for any int32 column: compared with a
    # time32 column's milliseconds (or a plain int32), silently; pyarrow has no such
    # comparison. A date column still takes it.
    import datetime as dt
    pq.write_table(pa.table({"id": np.arange(4), "t": pa.array([0, 1000, 86400000 - 1, 3], pa.time32("ms")),
                             "n": pa.array([0, 1, 2, 3], pa.int32()),
                             "d": pa.array([0, 1, 2, 3], pa.date32())}),
                   tmp_path / "a.parquet", row_group_size=2)
    url = "file://" + str(tmp_path)
    for column in ("t", "n"):
        with pytest.raises(TypeError, match=f"column '{column}', which is not a date column"):
            make_batch_reader(url, schema_fields=["id"], num_epochs=1, filters=[(column, ">=", dt.date(1970, 1, 2))])
    with make_batch_reader(url, schema_fields=["id"], num_epochs=1,
                           filters=[("d", ">=", dt.date(1970, 1, 2))]) as reader:
        assert sorted(int(i) for b in reader for i in b.id) == [1, 2, 3]


def test_filters_refuse_a_date_with_an_int32_column_the_first_file_lacks(tmp_path):
    # The columns that are no date were read from the first file's footer only: a column
    # it lacks, stored as int32 (or time32) in a later file, took a date as a count of
    # days there, silently (rows 8, 9 kept for t > 1970-01-03).
    import datetime as dt
    pq.write_table(pa.table({"id": np.arange(5, dtype=np.int64)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": np.arange(5, 10, dtype=np.int64), "t": pa.array(range(5), pa.int32())}),
                   tmp_path / "b.parquet")
    url = "file://" + str(tmp_path)
    with pytest.raises(TypeError, match="column 't', which is not a date column"):
        make_batch_reader(url, num_epochs=1, **NATURAL, filters=[("t", ">", dt.date(1970, 1, 3))])
    with make_batch_reader(url, num_epochs=1, **NATURAL, filters=[("t", ">", 2)]) as reader:
        assert sorted(int(i) for b in reader for i in b.id) == [8, 9]


def test_row_group_pass_sees_decimals_as_int64_loads_them(tmp_path):
    # With loader_options={"decimals": "int64"} the batches hold unscaled integers (150
    # for 1.50); the pre-pass read decimals as float64 whatever the option (1.5), so a
    # filter on the values the batches hold pruned every row group: no rows, silently.
    import decimal
    values = [decimal.Decimal(v) for v in ("1.50", "2.25", "3.00", "1.50", "4.75", "0.10")]
    pq.write_table(pa.table({"id": np.arange(6), "dec": pa.array(values, pa.decimal128(5, 2))}),
                   tmp_path / "a.parquet", row_group_size=2)
    url = "file://" + str(tmp_path)

    def ids(**kw):
        with make_batch_reader(url, schema_fields=["id"], num_epochs=1,
                               loader_options={"decimals": "int64"}, **kw) as reader:
            return sorted(int(i) for b in reader for i in b.id)

    assert ids(filters=[("dec", "=", 150)]) == [0, 3]
    assert ids(filters=[("dec", ">", 300)]) == [4]
    assert ids(predicate=in_set({10}, "dec")) == [5]


def test_filters_prune_row_groups_holding_nulls_as_pyarrow_does(tmp_path):
    # The row-group pre-pass compared a column holding nulls (objects with None) with the
    # literal: `>` raised a raw TypeError. A null matches no comparison, as in pyarrow; a
    # row group kept that holds nulls is refused by the engine, naming the column.
    pq.write_table(pa.table({"id": np.arange(6), "x": pa.array([1, None, 5, 200, 300, 400], pa.int64())}),
                   tmp_path / "a.parquet", row_group_size=3)
    url = "file://" + str(tmp_path)

    def ids(**kw):
        with make_batch_reader(url, schema_fields=["id", "x"], num_epochs=1, **kw) as reader:
            return sorted(int(i) for b in reader for i in b.id)

    expected = sorted(pq.read_table(tmp_path, filters=[("x", ">", 100)])["id"].to_pylist())
    assert ids(filters=[("x", ">", 100)]) == expected == [3, 4, 5]
    assert ids(filters=[("x", "in", [300, 1000])]) == [4]
    assert ids(filters=[[("x", ">=", 400)], [("x", "<", 0)]]) == [5]
    for filters in ([("x", "<", 100)], [("x", "!=", 200)], [("x", "not in", [7])]):
        with pytest.raises(pqloader.InvalidDataError, match=r"column 'x' \(int64\) has 1 null"):
            ids(filters=filters)


def test_make_batch_reader_yields_no_empty_batch_and_skips_func_when_a_predicate_keeps_nothing(tmp_path):
    # A batch whose rows the predicate all dropped came out as an empty namedtuple of
    # arrays, after TransformSpec.func ran on an empty DataFrame; Petastorm's batch worker
    # publishes nothing for such rows (and never calls func on them).
    pq.write_table(pa.table({"id": np.arange(3000), "v": np.arange(3000) * 0.5}), tmp_path / "a.parquet",
                   row_group_size=3000)
    url = "file://" + str(tmp_path)
    calls = []

    def func(df):
        calls.append(len(df))
        return df

    for kw in ({"filters": [("id", "<", 10)]}, {"predicate": in_lambda(["id"], lambda s: s < 10)},
               {"filters": [("id", "<", 10)], "transform_spec": TransformSpec(func)}):
        with make_batch_reader(url, shuffle_row_groups=False, **kw) as reader:
            assert [len(b.id) for b in reader] == [10]
    assert calls == [10]


def test_batch_transform_output_takes_the_edited_fields_types():
    # Petastorm builds the transformed batch with the transformed schema (from_pandas
    # with schema=), so a column comes out in its edit_fields type; edit_fields entries
    # may be UnischemaFields (Petastorm indexes them).
    from pqloader.petastorm.unischema import UnischemaField

    spec = TransformSpec(lambda df: df.assign(score=df.score * 2, n=df.id * 3),
                         edit_fields=[("score", np.float32, (), False), UnischemaField("n", np.int32, (), None, False)])
    with make_batch_reader(PLAIN, transform_spec=spec, **NATURAL) as reader:
        assert reader.schema.fields["n"].numpy_dtype is np.int32
        batch = next(reader)
    assert batch.score.dtype == np.float32 and batch.n.dtype == np.int32
    np.testing.assert_array_equal(batch.n, batch.id * 3)


def test_leaving_a_dataloaders_with_stops_its_reading():
    # The DataLoader reads through its own Loader (reader.loader_for); leaving `with`
    # called reader.stop(), which closed only the reader's own iterator, so the
    # DataLoader's Loader kept reading ahead (forever with num_epochs=None) and the
    # loop could go on. As in Petastorm, the stopped reader ends the reading.
    from pqloader.petastorm.pytorch import DataLoader

    with DataLoader(make_reader(CODECS, schema_fields=["id"], num_epochs=None), batch_size=4) as loader:
        batches = iter(loader)
        next(batches)
    with pytest.raises(RuntimeError):
        next(batches)


def test_a_dataloader_per_epoch_over_one_reader_frees_each_ones_loader():
    # The reader kept every DataLoader's Loader (reader.loader_for) until stop(): a new
    # DataLoader per epoch over one reader kept each one's threads, footers and
    # read-ahead of its next epoch (~16 threads and ~7 MB a DataLoader), without bound.
    import gc
    import weakref

    from pqloader.petastorm.pytorch import DataLoader

    with make_batch_reader(PLAIN, **NATURAL) as reader:
        gone = []
        for _ in range(3):
            loader = DataLoader(reader, batch_size=8)
            assert sum(len(b["id"]) for b in loader) == N_ROWS
            gone.append(weakref.ref(loader.loader))
            del loader
        gc.collect()
        assert [r() for r in gone] == [None, None, None]
        kept = DataLoader(reader, batch_size=8)
        batches = iter(kept)
        next(batches)
    with pytest.raises(RuntimeError):  # stop() still closes a live DataLoader's Loader
        next(batches)


def test_make_reader_refuses_a_decimal_field_instead_of_rounding_it_to_float64(tmp_path):
    # Petastorm returns Decimal objects; the engine read them as the nearest float64
    # (1.000000000000000001 → 1.0), silently, where the docs say Decimal fields are refused.
    from decimal import Decimal

    from pqloader.petastorm.codecs import ScalarCodec
    from pqloader.petastorm.etl.dataset_metadata import write_metadata
    from pqloader.petastorm.unischema import Unischema, UnischemaField

    pyspark_types = pytest.importorskip("pyspark.sql.types")
    d = tmp_path / "dec"
    d.mkdir()
    schema = Unischema("DecSchema", [
        UnischemaField("id", np.int32, (), ScalarCodec(pyspark_types.IntegerType()), False),
        UnischemaField("price", Decimal, (), ScalarCodec(pyspark_types.DecimalType(38, 18)), False)])
    pq.write_table(pa.table({"id": pa.array([0, 1], pa.int32()),
                             "price": pa.array([Decimal("1.000000000000000001"), Decimal("2.5")],
                                               pa.decimal128(38, 18))}), str(d / "part-0.parquet"))
    write_metadata("file://" + str(d), schema)
    for kw in ({}, {"schema_fields": ["price"]}, {"schema_fields": ["id"], "predicate": in_set({2.5}, "price")}):
        with pytest.raises(pqloader.UnsupportedTypeError, match="'price'.*Decimal"):
            make_reader(str(d), **kw)
    with make_reader(str(d), schema_fields=["id"], shuffle_row_groups=False) as reader:
        assert [int(r.id) for r in reader] == [0, 1]


def test_filters_on_a_float32_column_select_the_rows_pyarrow_selects(tmp_path):
    # NumPy rounded a Python float literal to float32 before comparing (float32(0.7) >= 0.7,
    # float32(0.1) == 0.1), where pyarrow compares as doubles; and `in` compared as doubles
    # where pyarrow casts the value set to the column's type.
    d = tmp_path / "f32"
    d.mkdir()
    scores = np.array([0.1, 0.7, 0.9, 1 / 3, -0.0], np.float32)
    pq.write_table(pa.table({"id": np.arange(len(scores)), "score": scores}), str(d / "a.parquet"))
    for flt in ([("score", ">=", 0.7)], [("score", "<", 0.7)], [("score", "=", 0.1)], [("score", "!=", 0.1)],
                [("score", ">", 1 / 3)], [("score", "in", [0.1, 0.9])], [("score", "not in", [0.1])],
                [("score", "=", np.float32(0.1))], [("score", "<=", 0)]):
        with make_batch_reader(str(d), filters=flt, shuffle_row_groups=False) as reader:
            ours = sorted(i for b in reader for i in b.id.tolist())
        # (pyarrow's row-group pruning by statistics compares `in` values as doubles, unlike its
        # is_in kernel: -0.0 keeps the minimum below 0.1, so no row group is pruned here.)
        assert ours == sorted(pq.read_table(str(d), filters=flt).column("id").to_pylist()), flt


def test_filters_on_a_float32_column_with_nulls_compare_in_its_type_in_the_row_group_pass(tmp_path):
    # The row-group pre-pass hands a column with nulls over as objects: they became
    # Python floats (float64), so `in [0.1]` missed float32(0.1) there and the row group
    # was dropped silently (with fill_null, its matching rows were lost).
    d = tmp_path / "f32n"
    d.mkdir()
    pq.write_table(pa.table({"id": np.arange(6), "score": pa.array([0.1, None, -0.0, 0.1, 0.5, -0.0], pa.float32())}),
                   str(d / "a.parquet"), row_group_size=3)
    flt = [("score", "in", [0.1])]
    with make_batch_reader(str(d), filters=flt, shuffle_row_groups=False,
                           loader_options={"fill_null": {"score": 0.0}}) as reader:
        ours = sorted(i for b in reader for i in b.id.tolist())
    assert ours == sorted(pq.read_table(str(d), filters=flt).column("id").to_pylist()) == [0, 3]


def test_a_filter_comparing_a_column_with_a_value_of_another_kind_names_the_filter():
    # It raised NumPy's UFuncTypeError ("ufunc 'equal' did not contain a loop ..."), naming
    # neither the filter nor the column.
    for flt in ([("name", "=", 3)], [("id", "<", "3")]):
        with pytest.raises(TypeError, match=f"filter.*{flt[0][0]!r}.*cannot be compared"):
            with make_reader(CODECS, schema_fields=["id"], filters=flt) as reader:
                list(reader)


def test_filters_not_in_keeps_nulls_as_pyarrow_does(tmp_path):
    # pyarrow's `not in` is ~is_in, and is_in of a null is false: the null rows are kept.
    # They were pruned with their row group, silently.
    pq.write_table(pa.table({"id": pa.array([0, 1], pa.int64()), "v": pa.array([None, None], pa.float64())}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([2, 3], pa.int64()), "v": pa.array([1.0, 2.0])}), tmp_path / "b.parquet")
    filters = [("v", "not in", [1.0])]
    want = sorted(pq.read_table(tmp_path, filters=filters).column("id").to_pylist())
    assert want == [0, 1, 3]
    mask = reader_module._FiltersPredicate(filters).mask({"v": np.array([None, 1.0, 2.0], dtype=object)})
    assert mask.tolist() == [True, False, True]
    with pytest.raises(pqloader.InvalidDataError, match="'v'.*null"):  # not dropped: the nulls are refused
        make_batch_reader(str(tmp_path), schema_fields=["id"], filters=filters, **NATURAL)
    with make_batch_reader(str(tmp_path), schema_fields=["id"], filters=filters, **NATURAL,
                           loader_options={"fill_null": {"v": -1.0}}) as reader:
        assert sorted(int(i) for b in reader for i in b.id) == want


def test_a_predicate_on_a_column_some_files_lack_sees_nulls_as_pyarrow_does(tmp_path):
    # The file without `v` holds nulls there: `v > 3` keeps none of its rows, so its row
    # groups are pruned (they were read, and their nulls refused).
    pq.write_table(pa.table({"id": pa.array(range(5), pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array(range(5, 10), pa.int64()),
                             "v": pa.array([i / 2 for i in range(5, 10)])}), tmp_path / "b.parquet")
    schema = pa.schema([("id", pa.int64()), ("v", pa.float64())])
    want = sorted(pq.read_table(tmp_path, schema=schema, filters=[("v", ">", 3)]).column("id").to_pylist())
    assert want == [7, 8, 9]
    with make_batch_reader(str(tmp_path), schema_fields=["id"], filters=[("v", ">", 3)], **NATURAL) as reader:
        assert sorted(int(i) for b in reader for i in b.id) == want
    with make_batch_reader(str(tmp_path), schema_fields=["id"], **NATURAL,
                           predicate=in_lambda(["v"], lambda v: (v > 3).fillna(False))) as reader:
        assert sorted(int(i) for b in reader for i in b.id) == want


def test_make_batch_reader_gives_ragged_lists_one_array_per_row(tmp_path):
    # lists={'l': 'ragged'} loads values + offsets; the batch held the values of all its
    # rows run together (9 values for 6 ids), misaligned with the other columns.
    lists = [[1], [1, 2], [], [3, 4, 5], [6], [7, 8]]
    pq.write_table(pa.table({"id": pa.array(range(6), pa.int64()), "l": pa.array(lists, pa.list_(pa.int32()))}),
                   tmp_path / "a.parquet", row_group_size=3)
    for kwargs in ({}, {"filters": [("id", "!=", 4)]}):
        with make_batch_reader(str(tmp_path), **NATURAL, **kwargs,
                               loader_options={"lists": {"l": "ragged"}, "batch_size": 4}) as reader:
            batches = list(reader)
        ids = [int(i) for b in batches for i in b.id]
        rows = [r for b in batches for r in b.l]
        assert all(len(b.l) == len(b.id) for b in batches)
        assert [r.tolist() for r in rows] == [lists[i] for i in ids]
        assert all(r.dtype == np.int32 for r in rows)
        assert ids == [i for i in range(6) if i != 4] if kwargs else ids == list(range(6))


@pytest.mark.parametrize("kind", ["DataLoader", "BatchedDataLoader"])
def test_a_pytorch_loaders_state_keeps_the_rows_it_holds_to_recut_batches(tmp_path, kind):
    # Batches of 300 rows cut from the Loader's (an epoch of 2,000 rows ends in 200, which
    # the next epoch's rows complete): the Loader counted the held rows as handed out, so
    # its state_dict() (the one `.loader` offered) lost them on resume (3,800 of 4,000).
    from pqloader.petastorm import pytorch as pt
    pq.write_table(pa.table({"x": np.arange(2000, dtype=np.int64)}), tmp_path / "a.parquet", row_group_size=500)
    url = "file://" + str(tmp_path)

    def make():
        reader = make_batch_reader(url, schema_fields=["x"], num_epochs=2, shuffle_row_groups=False)
        return reader, getattr(pt, kind)(reader, batch_size=300)

    reader, dl = make()
    full = np.concatenate([b["x"].numpy() for b in dl])
    reader.stop()
    assert len(full) == 4000
    for cut in (1, 6, 7, 8, 13):
        reader, dl = make()
        it = iter(dl)
        got = [next(it)["x"].numpy() for _ in range(cut)]
        state = dl.state_dict()
        reader.stop()
        reader, again = make()
        again.load_state_dict(state)
        rest = [b["x"].numpy() for b in again]
        reader.stop()
        np.testing.assert_array_equal(np.concatenate(got + rest), full, err_msg=f"cut {cut}")
        assert all(len(b) == 300 for b in got + rest[:-1])
    # A loop left with `break` and iterated again: the held rows come first.
    reader, dl = make()
    out = []
    for i, b in enumerate(dl):
        out.append(b["x"].numpy())
        if i == 7:
            break
    out += [b["x"].numpy() for b in dl]
    reader.stop()
    np.testing.assert_array_equal(np.concatenate(out)[:4000], full)
    with pytest.raises(ValueError, match="not a state of a pqloader.petastorm.pytorch loader"):
        dl.load_state_dict(dl.loader.state_dict())


@pytest.mark.parametrize("num_epochs", [1, 2])
def test_a_pytorch_loaders_state_after_break_resumes_as_the_loop_iterated_again(tmp_path, num_epochs):
    # A predicate cuts the Loader's batches; a `break` that left an epoch's last rows held
    # (the Loader already past that epoch) and a for loop again ran one epoch more than a
    # state taken at the break resumed: 9 batches (epoch 0's last rows + epoch 1) vs 1.
    from pqloader.petastorm import pytorch as pt
    pq.write_table(pa.table({"id": np.arange(40, dtype=np.int64)}), tmp_path / "a.parquet", row_group_size=10)
    url = "file://" + str(tmp_path)

    def make():
        reader = make_batch_reader(url, num_epochs=num_epochs, shuffle_row_groups=False, workers_count=2,
                                   predicate=in_lambda(["id"], lambda i: i % 7 != 0))
        return reader, pt.DataLoader(reader, batch_size=4)

    reader, dl = make()
    n = len(list(dl))
    reader.stop()
    for k in range(1, n + 1):
        reader, dl = make()
        for i, _ in enumerate(dl):
            if i + 1 == k:
                break
        state = dl.state_dict()
        went_on = [b["id"].tolist() for b in dl]
        reader.stop()
        reader, again = make()
        again.load_state_dict(state)
        resumed = [b["id"].tolist() for b in again]
        reader.stop()
        assert resumed == went_on, f"break after batch {k}"


@pytest.mark.parametrize("kind", ["DataLoader", "BatchedDataLoader"])
def test_a_pytorch_loader_iterated_after_its_with_block_raises_as_petastorm(tmp_path, kind):
    # Leaving the with-block stops the reader; iterating again read the data once more
    # (the engine's Loader is usable after close()), where Petastorm's reader raises.
    from pqloader.petastorm import pytorch as pt
    pq.write_table(pa.table({"id": np.arange(10, dtype=np.int64)}), tmp_path / "a.parquet")
    with getattr(pt, kind)(make_batch_reader(str(tmp_path), num_epochs=1), batch_size=4) as dl:
        assert sum(len(b["id"]) for b in dl) == 10
    with pytest.raises(RuntimeError, match="has stopped.*context manager has exited"):
        next(iter(dl))
    with pytest.raises(RuntimeError, match="Cannot start a new iteration"):
        next(iter(dl))


def _state_after_one_batch(reader, dl):
    """A DataLoader's state after its first batch (through JSON), and the ids of the
    batches that followed; the reader is stopped."""
    import json
    it = iter(dl)
    next(it)
    state = json.loads(json.dumps(dl.state_dict()))
    went_on = [b["id"].tolist() for b in it]
    del it
    reader.stop()
    return state, went_on


def test_a_pytorch_loaders_state_is_refused_under_another_predicate(tmp_path):
    # A predicate was no part of the state: one taken under in_set({..}) loaded silently
    # under another predicate (or none), its position counting the rows of another stream.
    from pqloader.petastorm import pytorch as pt
    pq.write_table(pa.table({"id": np.arange(40, dtype=np.int64)}), tmp_path / "a.parquet", row_group_size=10)
    url = "file://" + str(tmp_path)

    def make(predicate):
        reader = make_batch_reader(url, num_epochs=1, shuffle_row_groups=False, predicate=predicate)
        return reader, pt.DataLoader(reader, batch_size=4)

    evens = list(range(0, 40, 2))
    state, went_on = _state_after_one_batch(*make(in_set(evens, "id")))
    for other in (in_set(range(0, 40, 3), "id"), None, in_lambda(["id"], lambda i: i % 2 == 0),
                  in_negate(in_set(evens, "id"))):
        reader, again = make(other)
        with pytest.raises(ValueError, match="taken with predicate in_set on \\['id'\\].*another stream"):
            again.load_state_dict(state)
        reader.stop()
    reader, again = make(in_set(reversed(evens), "id"))  # the same set
    again.load_state_dict(state)
    assert [b["id"].tolist() for b in again] == went_on
    reader.stop()
    reader, dl = make(None)
    plain = dl.state_dict()
    reader.stop()
    reader, again = make(in_set(evens, "id"))
    with pytest.raises(ValueError, match="taken with predicate None, but this reader has in_set"):
        again.load_state_dict(plain)
    reader.stop()


def _drop_multiples_of_3(frame):
    return frame[frame.id % 3 != 0]


def _keep_all(frame):
    return frame


def test_a_pytorch_loaders_state_is_refused_under_another_transform_spec(tmp_path):
    # A TransformSpec was no part of the state: one taken under a function that drops rows
    # loaded silently without it (its position counting rows of another stream), or under
    # selected_fields (batches of other columns).
    from pqloader.petastorm import pytorch as pt
    from pqloader.petastorm.transform import edit_field
    pq.write_table(pa.table({"id": np.arange(40, dtype=np.int64), "y": np.arange(40, dtype=np.int64)}),
                   tmp_path / "a.parquet", row_group_size=10)
    url = "file://" + str(tmp_path)

    def make(spec):
        reader = make_batch_reader(url, num_epochs=1, shuffle_row_groups=False, transform_spec=spec)
        return reader, pt.DataLoader(reader, batch_size=4)

    spec = TransformSpec(_drop_multiples_of_3, removed_fields=["y"])
    state, went_on = _state_after_one_batch(*make(spec))
    for other in (None, TransformSpec(_keep_all, removed_fields=["y"]), TransformSpec(_drop_multiples_of_3),
                  TransformSpec(_drop_multiples_of_3, selected_fields=["id"]),
                  TransformSpec(_drop_multiples_of_3, edit_fields=[edit_field("z", np.int64, ())],
                                removed_fields=["y"])):
        reader, again = make(other)
        with pytest.raises(ValueError, match="taken with transform_spec TransformSpec\\(func=.*_drop_multiples_of_3"
                                             ".*another stream"):
            again.load_state_dict(state)
        reader.stop()
    reader, again = make(TransformSpec(_drop_multiples_of_3, removed_fields=["y"]))  # an equal spec
    again.load_state_dict(state)
    assert [b["id"].tolist() for b in again] == went_on
    reader.stop()
    reader, again = make(spec)  # a state taken before the spec was recorded still loads
    again.load_state_dict({k: v for k, v in state.items() if k != "transform_spec"})
    assert [b["id"].tolist() for b in again] == went_on
    reader.stop()
    reader, dl = make(None)
    plain = dl.state_dict()
    reader.stop()
    reader, again = make(TransformSpec())  # a spec that changes nothing reads as none
    again.load_state_dict(plain)
    reader.stop()
    reader, again = make(spec)
    with pytest.raises(ValueError, match="taken with transform_spec None, but this reader has TransformSpec"):
        again.load_state_dict(plain)
    reader.stop()


def test_a_pytorch_loaders_state_with_held_rows_is_refused_by_another_rank(tmp_path):
    # The state of rows held to re-cut (skip_rows) is a position in one rank's rows: rank
    # 0's loaded on rank 1 dropped rank 1's rows silently ([26] and [38] of 12), and one of
    # a single process loaded on 2 ranks dropped 2 rows per rank.
    from pqloader.petastorm import pytorch as pt
    pq.write_table(pa.table({"id": np.arange(40, dtype=np.int64)}), tmp_path / "a.parquet", row_group_size=10)
    url = "file://" + str(tmp_path)

    def make(**shard):
        reader = make_batch_reader(url, num_epochs=1, shuffle_row_groups=False, workers_count=2, **shard,
                                   predicate=in_lambda(["id"], lambda i: i % 3 != 0))
        return reader, pt.DataLoader(reader, batch_size=4)

    for taken_by, loaded_by in (({"cur_shard": 0, "shard_count": 2}, {"cur_shard": 1, "shard_count": 2}),
                                ({}, {"cur_shard": 0, "shard_count": 2})):
        reader, dl = make(**taken_by)
        it = iter(dl)
        next(it)
        state = dl.state_dict()
        assert state["skip_rows"] == 2
        del it
        reader.stop()
        reader, other = make(**loaded_by)
        with pytest.raises(ValueError, match="rank 0 of .* each rank's own state"):
            other.load_state_dict(state)
        reader.stop()
        reader, same = make(**taken_by)  # the rank that took it resumes it
        same.load_state_dict(state)
        assert len([b for b in same]) >= 1
        reader.stop()


def test_make_batch_reader_hands_a_user_predicate_base_subclass_a_dataframe():
    # A user's own PredicateBase subclass is Petastorm's custom predicate: its do_include
    # gets the whole batch as a DataFrame, as a duck-typed one does (only pqloader's
    # built-in predicates run row by row; a mutant that ran every PredicateBase row by
    # row survived).
    import pandas as pd

    from pqloader.petastorm.predicates import PredicateBase

    seen = []

    class Mine(PredicateBase):
        def get_fields(self):
            return {"id"}

        def do_include(self, frame):
            seen.append(type(frame))
            return frame["id"].isin([1, 5, 9])

    with make_batch_reader(PLAIN, predicate=Mine(), **NATURAL) as reader:
        got = sorted(np.concatenate([b.id for b in reader]).tolist())
    assert got == [1, 5, 9] and seen and all(t is pd.DataFrame for t in seen), (got, seen)


def test_the_pytorch_loader_wraps_read_only_columns_without_a_warning(tmp_path):
    # torch.as_tensor of a read-only column warned "The given NumPy array is not writable"
    # from pqloader's code (once per process: checked in a fresh one).
    pytest.importorskip("torch")
    pq.write_table(pa.table({"id": np.arange(40, dtype=np.int64), "y": np.arange(40, dtype=np.float32)}),
                   tmp_path / "a.parquet", row_group_size=10)
    script = f"""
import warnings
warnings.simplefilter("error")
import numpy as np
from pqloader.petastorm import TransformSpec, make_batch_reader
from pqloader.petastorm import pytorch as pt
spec = TransformSpec(lambda df: df[df.id % 3 != 0])  # (its columns come back read-only)
with make_batch_reader({"file://" + str(tmp_path)!r}, num_epochs=1, shuffle_row_groups=False,
                       transform_spec=spec) as reader:
    ids = [int(i) for b in pt.DataLoader(reader, batch_size=4) for i in b["id"]]
assert ids == [i for i in range(40) if i % 3], ids
"""
    from conftest import subprocess_env
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=subprocess_env())
    assert r.returncode == 0, r.stderr


def test_petastorm_loader_refuses_a_string_of_columns_and_takes_unischema_fields(tmp_path):
    # list("image") was the columns ['i', 'm', ...]: "unknown columns", or where one-letter
    # fields exist, those fields silently (columns="ab" loaded fields a and b).
    with pytest.raises(TypeError, match=r"columns must be a list of names, not a str \('id'\)"):
        Loader(CODECS, columns="id", batch_size=4)
    with make_reader(CODECS, workers_count=1) as reader:
        field = reader.schema.fields["id"]
    loader = Loader(CODECS, columns=[field, "label"], batch_size=4)
    assert list(next(iter(loader))) == ["id", "label"]
    loader.close()


def test_pytorch_loaders_check_their_arguments_when_made():
    from pqloader.petastorm import pytorch as pt

    with make_reader(CODECS, workers_count=1) as reader:
        for bad, error in ((None, TypeError), ("1000", TypeError), (2.5, TypeError), (True, TypeError),
                           (-1, ValueError)):
            # (None and "1000" were a bare "'>' not supported between ... 'int'")
            with pytest.raises(error, match=r"DataLoader\(shuffling_queue_capacity=\.\.\.\)"):
                pt.DataLoader(reader, batch_size=4, shuffling_queue_capacity=bad)
            with pytest.raises(error, match=r"BatchedDataLoader\(shuffling_queue_capacity=\.\.\.\)"):
                pt.BatchedDataLoader(reader, batch_size=4, shuffling_queue_capacity=bad)
        # (collate_fn=None was "'NoneType' object is not callable" at the first batch)
        with pytest.raises(TypeError, match=r"DataLoader\(collate_fn=\.\.\.\) must be callable"):
            pt.DataLoader(reader, batch_size=4, collate_fn=None)
        with pytest.raises(TypeError, match=r"BatchedDataLoader\(transform_fn=\.\.\.\) must be callable"):
            pt.BatchedDataLoader(reader, batch_size=4, transform_fn="as_tensor")
        dl = pt.DataLoader(reader, batch_size=np.int64(4), shuffling_queue_capacity=np.int64(0))
        assert [len(b["id"]) for b in dl] == [4] * (N_ROWS // 4)


def test_a_pytorch_loaders_state_takes_numpy_counts_and_refuses_a_malformed_rank(tmp_path):
    import copy

    from pqloader.petastorm import pytorch as pt
    pq.write_table(pa.table({"x": np.arange(100, dtype=np.int64)}), tmp_path / "a.parquet", row_group_size=30)

    def make():
        return pt.DataLoader(make_batch_reader(str(tmp_path), num_epochs=2, shuffle_row_groups=False),
                             batch_size=7)

    def rest(state):
        with make() as dl:
            dl.load_state_dict(state)
            return np.concatenate([b["x"].numpy() for b in dl])

    with make() as dl:
        it = iter(dl)
        for _ in range(15):  # the 15th: epoch 0's last 2 rows and 5 of epoch 1's first batch
            next(it)
        state = dl.state_dict()
    assert state["skip_rows"] > 0 and state["rank"] == [0, 1]
    expected = rest(state)
    numpy_state = copy.deepcopy(state)
    numpy_state["skip_rows"] = np.int64(state["skip_rows"])
    numpy_state["rank"] = (np.int64(0), np.int64(1))
    for key in ("epoch", "batch", "iteration_end", "seed"):
        numpy_state["loader"][key] = np.int64(state["loader"][key])
    np.testing.assert_array_equal(rest(numpy_state), expected)  # (was "malformed ... skip_rows 5")
    # (an int was "'int' object is not iterable", [0] an IndexError, "01" "taken by rank 0
    # of 1 ... this loader (rank 0 of 1) cannot resume"; version True was taken as 1)
    for key, bad in (("rank", 0), ("rank", [0]), ("rank", "01"), ("rank", [1, 1]), ("version", True),
                     ("skip_rows", float(state["skip_rows"]))):
        with make() as dl, pytest.raises(ValueError, match=f"malformed .*{key}"):
            dl.load_state_dict(dict(state, **{key: bad}))


def test_filters_take_pyarrows_spellings_and_refuse_others_clearly():
    # pyarrow reads [["id", "<", 3]] as one conjunction (its first item's first item is a
    # column name): it was taken as a group of three terms ("'int' object is not iterable").
    ids = _ids(schema_fields=["id"], filters=[["id", "<", 3]], **NATURAL)
    assert ids == [0, 1, 2]
    assert _ids(schema_fields=["id"], filters=[[("id", "<", 2)], [["id", ">", 37]]], **NATURAL) == [0, 1, 38, 39]
    # Groups given as tuples of terms are groups too, as pyarrow reads them (they were
    # taken as one conjunction whose "term" (("id", "<", 2),) was refused).
    assert _ids(schema_fields=["id"], filters=[(("id", "<", 2),), (("id", ">", 37),)], **NATURAL) == [0, 1, 38, 39]
    assert _ids(schema_fields=["id"], filters=((("id", ">", 1), ("id", "<", 4)),), **NATURAL) == [2, 3]
    for bad in (("id", "<", 3), "id < 3", [("id", "<", 3), 5], [[]]):
        with pytest.raises(ValueError, match="filters must be"):
            make_reader(CODECS, filters=bad)


def test_predicate_masks_of_numpy_columns_match_petastorms_row_by_row_answer():
    # The vectorized paths of in_set and in_intersection keep exactly the rows that
    # do_include keeps row by row (Petastorm's semantics), column kinds the fixture lacks.
    flags = np.array([True, False, True, False])
    assert in_set([0], "f").mask({"f": flags}).tolist() == [False, True, False, True]  # 0 == False
    assert in_set([1, 5], "f").mask({"f": flags}).tolist() == [True, False, True, False]
    names = np.array(["a", "1", "b", "a"])
    keep = in_set(["a", 1], "s")  # the int 1 is not the str "1"
    assert keep.mask({"s": names}).tolist() == [True, False, False, True]
    assert [keep.do_include({"s": v}) for v in names] == [True, False, False, True]
    tags = np.array([[1, 2], [3, 4], [5, 3], [6, 7]])
    hit = in_intersection([3], "t")
    assert hit.mask({"t": tags}).tolist() == [False, True, True, False]
    assert [hit.do_include({"t": row}) for row in tags] == [False, True, True, False]
    cube = np.arange(16).reshape(2, 2, 4)  # a tensor column: any element of each row
    assert in_intersection([9], "t").mask({"t": cube}).tolist() == [False, True]


def test_pseudorandom_split_row_by_row_equals_its_mask_and_needs_its_field():
    ids = np.arange(200)
    parts = [in_pseudorandom_split([0.3, 0.7], k, "id") for k in (0, 1)]
    for p in parts:
        assert [p.do_include({"id": v}) for v in ids] == p.mask({"id": ids}).tolist()
    assert (parts[0].mask({"id": ids}) ^ parts[1].mask({"id": ids})).all()  # a partition
    with pytest.raises(ValueError, match="split key: id"):
        parts[0].do_include({"other": 1})


def test_unischema_fields_are_not_nullable_by_default():
    from pqloader.petastorm.unischema import Unischema, UnischemaField, insert_explicit_nulls
    field = UnischemaField("x", np.int32, ())
    assert field.nullable is False  # Petastorm's default
    schema = Unischema("S", [field, UnischemaField("y", np.int32, (), None, True)])
    row = {"x": 1}
    insert_explicit_nulls(schema, row)
    assert row == {"x": 1, "y": None}
    with pytest.raises(ValueError, match="Field x is not found"):
        insert_explicit_nulls(schema, {"y": 2})


def test_spark_types_of_fields_without_a_codec():
    pytest.importorskip("pyspark")
    import pyspark.sql.types as sql_types
    from pqloader.petastorm.unischema import Unischema, UnischemaField

    schema = Unischema("S", [UnischemaField("id", np.int64, ()), UnischemaField("f", np.float32, (), None, True)])
    spark = schema.as_spark_schema()
    assert [(f.name, type(f.dataType), f.nullable) for f in spark.fields] == [
        ("id", sql_types.LongType, False), ("f", sql_types.FloatType, True)]
    with pytest.raises(ValueError, match="non-scalar UnischemaField 'v' has codec set to None"):
        Unischema("S", [UnischemaField("v", np.float32, (3,))]).as_spark_schema()


def test_encode_row_refuses_fields_the_schema_lacks_and_none_where_not_nullable():
    from pqloader.petastorm.unischema import Unischema, UnischemaField, encode_row
    schema = Unischema("S", [UnischemaField("x", np.int32, ()), UnischemaField("y", np.int32, (), None, True)])
    assert encode_row(schema, {"x": np.int32(3)}) == {"x": 3, "y": None}
    assert type(encode_row(schema, {"x": np.int32(3)})["x"]) is int
    with pytest.raises(ValueError, match="do not match schema fields"):
        encode_row(schema, {"x": 1, "z": 2})
    with pytest.raises(ValueError, match='Field x is not "nullable"'):
        encode_row(schema, {"x": None})


def test_spark_type_stand_ins_compare_by_name_and_params():
    from pqloader.petastorm.codecs import SparkType
    dec = SparkType("DecimalType", {"precision": 10, "scale": 2})
    assert dec == SparkType("DecimalType", {"precision": 10, "scale": 2})
    assert dec != SparkType("DecimalType", {"precision": 10, "scale": 3})
    assert SparkType("IntegerType") == SparkType("IntegerType") != SparkType("LongType")
    assert dec.typeName() == "decimal"
    pyspark_types = pytest.importorskip("pyspark.sql.types")
    assert SparkType("IntegerType") == pyspark_types.IntegerType()  # by name: pyspark has no params attr
    assert SparkType("IntegerType") != pyspark_types.LongType()


@pytest.mark.parametrize("codec", ["NdarrayCodec", "CompressedNdarrayCodec"])
def test_array_codecs_refuse_to_write_another_type_or_shape_naming_the_field(codec):
    from pqloader.petastorm import codecs
    from pqloader.petastorm.unischema import UnischemaField
    field = UnischemaField("emb", np.float32, (None, 2))
    make = getattr(codecs, codec)()
    assert make.encode(field, np.zeros((3, 2), np.float32))  # accepted: bytes
    with pytest.raises(ValueError, match="emb feature. Expected ndarray"):
        make.encode(field, [[0.0, 0.0]])
    with pytest.raises(ValueError, match="emb feature. Expected .*float32.*Got float64"):
        make.encode(field, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="dimensions of emb feature"):
        make.encode(field, np.zeros((3, 3), np.float32))


def test_image_codec_writes_rgb_and_gray_and_refuses_other_channel_counts():
    pytest.importorskip("PIL")
    from pqloader.petastorm.codecs import CompressedImageCodec
    from pqloader.petastorm.unischema import UnischemaField
    rgb = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    field = UnischemaField("img", np.uint8, (None, None, 3), CompressedImageCodec("png"))
    codec = CompressedImageCodec("png")
    np.testing.assert_array_equal(codec.decode(field, codec.encode(field, rgb)), rgb)  # lossless
    gray_field = UnischemaField("g", np.uint8, (None, None), codec)
    np.testing.assert_array_equal(codec.decode(gray_field, codec.encode(gray_field, rgb[..., 0])), rgb[..., 0])
    with pytest.raises(ValueError, match=r"\(H, W\) or \(H, W, 3\). Got \(4, 5, 4\)"):
        codec.encode(UnischemaField("img", np.uint8, (None, None, 4)), np.zeros((4, 5, 4), np.uint8))


def test_scalar_codec_writes_the_python_value_of_its_spark_type():
    from pqloader.petastorm.codecs import ScalarCodec, SparkType
    from pqloader.petastorm.unischema import UnischemaField
    f = UnischemaField("v", np.float64, ())

    def enc(spark, value):
        return ScalarCodec(SparkType(spark)).encode(f, value)

    for spark, value, want in [("IntegerType", np.int64(3), 3), ("LongType", np.uint8(7), 7),
                               ("DoubleType", np.float32(1.5), 1.5), ("FloatType", 2, 2.0),
                               ("BooleanType", np.bool_(True), True), ("StringType", "ab", "ab")]:
        got = enc(spark, value)
        assert got == want and type(got) is type(want), (spark, got)
    with pytest.raises(ValueError, match="Expected a string value for field v"):
        enc("StringType", 3)
    with pytest.raises(TypeError, match="Expected a scalar as a value for field 'v'"):
        enc("IntegerType", [1])


def test_loader_hands_the_datasets_storage_options_to_the_engine(monkeypatch):
    seen = {}

    def capture(sources, **kw):
        seen.update(kw, sources=sources)

    monkeypatch.setattr(pqloader, "Loader", capture)
    Loader(CODECS, columns=["id"], storage_options={"client_kwargs": {"region_name": "eu-west-1"}})
    assert seen["storage_options"] == {"region": "eu-west-1"}
    Loader(CODECS, columns=["id"])
    assert seen["storage_options"] is None


def test_make_batch_reader_keeps_a_column_whose_description_carries_notes(tmp_path):
    # inspect describes a column with nulls as "float64(batch); 2 null(s): ..."; the
    # notes after "; " must not make the inferred schema skip it (with only a warning).
    pq.write_table(pa.table({"id": pa.array([0, 1, 2], pa.int64()), "v": pa.array([None, 1.5, None])}),
                   tmp_path / "a.parquet")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with make_batch_reader(str(tmp_path), **NATURAL, loader_options={"fill_null": {"v": -1.0}}) as reader:
            assert set(reader.schema.fields) == {"id", "v"}
            batches = list(reader)
    assert [float(x) for b in batches for x in b.v] == [-1.0, 1.5, -1.0]


# -- differences found side by side with Petastorm 0.13.1 (helper petdiff) --------------
def test_shards_that_leave_rows_out_of_each_epoch_say_so():
    # Petastorm's shards read all 40 rows (unequal shares); equal shares of 40 rows on 3
    # shards leave one row out of every epoch, the same row when nothing is shuffled: that
    # had been silent.
    seen = []
    for k in range(3):
        with pytest.warns(UserWarning, match=r"leave 1 row\(s\) out of each epoch .*the same rows every epoch"):
            reader = make_reader(CODECS, cur_shard=k, shard_count=3, **NATURAL)
        with reader:
            seen += [int(r.id) for r in reader]
    assert len(seen) == 39 and len(set(seen)) == 39
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 40 rows on 2 or 4 shards: nothing left out, no warning
        for count in (2, 4):
            with make_reader(CODECS, cur_shard=0, shard_count=count, **NATURAL) as reader:
                assert len(list(reader)) == N_ROWS // count
    # shard_policy="pad", which the warning names, reads every row.
    seen = []
    for k in range(3):
        with make_reader(CODECS, cur_shard=k, shard_count=3, loader_options={"shard_policy": "pad"},
                         **NATURAL) as reader:
            seen += [int(r.id) for r in reader]
    assert set(seen) == set(range(N_ROWS))


def test_a_transform_func_that_leaves_a_field_out_is_named():
    # Petastorm: TypeError from the row namedtuple ("missing 1 required positional argument:
    # 'name'"); here a bare KeyError('name') from the reader's internals.
    def drop_name(row):
        del row["name"]
        return row

    with make_reader(CODECS, schema_fields=["id", "name"], transform_spec=TransformSpec(drop_name),
                     **NATURAL) as reader:
        with pytest.raises(TypeError, match=r"func .*drop_name returned a row without field\(s\) \['name'\].*"
                                            r"removed_fields"):
            next(reader)
    with make_reader(CODECS, schema_fields=["id", "name"], transform_spec=TransformSpec(lambda r: None),
                     **NATURAL) as reader:
        with pytest.raises(TypeError, match=r"returned NoneType, not the row"):
            next(reader)
    with make_reader(CODECS, schema_fields=["id"], transform_spec=TransformSpec(
            edit_fields=[("ratio", np.float64, (), False)]), **NATURAL) as reader:
        with pytest.raises(TypeError, match=r"without a func: its edit_fields declare field\(s\) \['ratio'\]"):
            next(reader)
    # Declared in removed_fields, the same function is fine.
    with make_reader(CODECS, schema_fields=["id", "name"],
                     transform_spec=TransformSpec(drop_name, removed_fields=["name"]), **NATURAL) as reader:
        assert [int(r.id) for r in reader] == list(range(N_ROWS)) and reader.schema.fields.keys() == {"id"}


def test_complex_and_string_array_fields_are_read_and_refused_when_the_reader_is_made(tmp_path):
    # Petastorm writes (and reads) complex and string ndarray fields. Its complex64 Unischema
    # had been refused as untrusted ("numpy.complex64, which Petastorm does not write"), and a
    # string array failed only at the first row, in a worker.
    from pqloader.petastorm.unischema import Unischema, UnischemaField

    schema = _schema_io.load_unischema(_fixture_bytes("unischema.pickle"))
    fields = []
    for f in schema.fields.values():
        if f.name == "matrix":
            f = UnischemaField(f.name, np.complex64, f.shape, f.codec, f.nullable)
        elif f.name == "tags":
            f = UnischemaField(f.name, np.str_, f.shape, f.codec, f.nullable)
        elif f.name == "packed":
            f = UnischemaField(f.name, np.complex128, f.shape, f.codec, f.nullable)
        fields.append(f)
    data = _schema_io.dumps_unischema(Unischema(schema._name, fields))
    assert _schema_io.load_unischema(data).fields["matrix"].numpy_dtype is np.complex64
    url = _copy_dataset(tmp_path, {_schema_io.UNISCHEMA_KEY: data})
    with make_reader(url, schema_fields=["id", "label"], **NATURAL) as reader:  # the other fields read
        assert [int(r.id) for r in reader] == list(range(N_ROWS))
    for name, kind in (("matrix", "complex64"), ("tags", "str_"), ("packed", "complex128")):
        with pytest.raises(pqloader.UnsupportedTypeError, match=rf"'{url}': field '{name}' holds {kind} arrays"):
            make_reader(url, schema_fields=["id", name], **NATURAL)


def test_in_set_compares_a_float_column_as_python_in_does():
    # Petastorm's in_set is `value in set(values)`: float32(1/3) is not 1/3. The vectorised
    # mask had matched it under NumPy 1 (a short value list cast to float32 value by value;
    # a long one, or NumPy 2, not), so a migrated predicate kept other rows.
    from pqloader.petastorm.predicates import isin_exact

    col = np.array([1 / 3, 0.5, 2.0, 0.1], dtype=np.float32)
    for values in ([1 / 3], [0.5], [2], [0.1], [np.float32(0.1)], [1 / 3, 0.5] + list(range(100, 200))):
        assert isin_exact(col, values).tolist() == [v in set(values) for v in col], values
    assert _ids(predicate=in_set([1 / 3], "f32"), **NATURAL) == []
    assert _ids(predicate=in_set([np.float32(1 / 3)], "f32"), **NATURAL) == [1]


def test_a_batch_transform_that_changes_a_columns_type_is_never_cast_lossily(tmp_path):
    # A make_batch_reader func that turned an int32 column into floats without declaring it
    # (Petastorm returns the floats) had them cast back to int32 silently: -10.5 came out -10.
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": np.arange(20, dtype=np.int64), "i32": np.arange(20, dtype=np.int32) - 9,
                             "u8": np.arange(20, dtype=np.uint8)}), path)

    def halve(df):
        df["i32"] = df["i32"] * 1.5
        return df

    with make_batch_reader(str(path), transform_spec=TransformSpec(halve), **NATURAL) as reader:
        with pytest.raises(TypeError, match=r"func .*halve returned float64 values for field 'i32', declared int32, "
                                            r"which cannot hold them \(e\.g\. -?\d+\.5\).*edit_fields"):
            next(reader)

    def overflow(df):
        df["u8"] = df["u8"].astype(np.int64) + 250
        return df

    with make_batch_reader(str(path), transform_spec=TransformSpec(overflow), **NATURAL) as reader:
        with pytest.raises(TypeError, match=r"field 'u8', declared uint8"):
            next(reader)

    # Integers past a float field's range became inf silently (only floats were checked),
    # and integers the float rounds (2049 is no float16: it became 2048).
    pq.write_table(pa.table({"h": np.arange(4, dtype=np.float16)}), tmp_path / "h.parquet")
    for offset in (70000, 2049):
        def shifted(df, offset=offset):
            df["h"] = df["h"].astype(np.int64) + offset
            return df

        with make_batch_reader(str(tmp_path / "h.parquet"), transform_spec=TransformSpec(shifted),
                               **NATURAL) as reader:
            with pytest.raises(TypeError, match=rf"int64 values for field 'h', declared float16, .*e\.g\. {offset}"):
                next(reader)

    # Values the declared type holds are still given in it; declared, the new type is kept.
    def whole(df):
        df["i32"] = df["i32"] * 2.0
        df["u8"] = df["u8"].astype(np.int64) + 1
        return df

    with make_batch_reader(str(path), transform_spec=TransformSpec(whole), **NATURAL) as reader:
        (batch,) = list(reader)
    assert batch.i32.dtype == np.int32 and batch.i32.tolist() == [2 * (i - 9) for i in range(20)]
    assert batch.u8.dtype == np.uint8 and batch.u8.tolist() == list(range(1, 21))
    with make_batch_reader(str(path), transform_spec=TransformSpec(halve, edit_fields=[("i32", np.float64, (), False)]),
                           **NATURAL) as reader:
        (batch,) = list(reader)
    assert batch.i32.dtype == np.float64 and batch.i32.tolist() == [1.5 * (i - 9) for i in range(20)]


def test_null_mask_through_loader_options_returns_the_valid_fields(tmp_path):
    # The engine's hint for a column holding nulls names null_mask, which here goes in
    # loader_options: the <name>_valid columns it adds had been left out of the rows, so the
    # nulls came out as 0 / "" with nothing to tell them from real values.
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"id": pa.array(range(30), pa.int64()),
                             "ni": pa.array([None if i in (7, 21) else i for i in range(30)], pa.int32()),
                             "ns": pa.array([None if i == 9 else f"s{i}" for i in range(30)])}), path,
                   row_group_size=10)
    with pytest.raises(pqloader.InvalidDataError, match=r"column 'ni' .*pass loader_options=\{'fill_null': "
                                                          r"\{'ni': 0\}\}.*loader_options=\{'null_mask': \['ni'\]\}"):
        make_batch_reader(str(path), schema_fields=["id", "ni"], **NATURAL)
    with make_batch_reader(str(path), schema_fields=["id", "ni"], loader_options={"null_mask": ["ni"]},
                           **NATURAL) as reader:
        (batch,) = list(reader)
    assert batch._fields == ("id", "ni", "ni_valid")
    assert batch.ni_valid.dtype == np.bool_
    assert [i for i, v in enumerate(batch.ni_valid) if not v] == [7, 21]
    assert batch.ni.tolist() == [0 if i in (7, 21) else i for i in range(30)]
    with make_batch_reader(str(path), loader_options={"null_mask": True}, **NATURAL) as reader:
        (batch,) = list(reader)
    assert {"ni_valid", "ns_valid"} <= set(batch._fields)
    assert [i for i, v in enumerate(batch.ns_valid) if not v] == [9] and batch.ns[9] == ""
    with make_batch_reader(str(path), schema_fields=["id", "ni"], loader_options={"fill_null": {"ni": -1}},
                           **NATURAL) as reader:
        (batch,) = list(reader)
    assert batch._fields == ("id", "ni") and batch.ni[7] == -1


def test_spark_converters_loader_shuffles_row_groups_by_default_as_petastorms(tmp_path):
    # Petastorm's make_torch_dataloader opens make_batch_reader with its defaults
    # (shuffle_row_groups=True); the converter here set it to False, so a training loop
    # moved over read every epoch in storage order, silently.
    from pqloader.petastorm.spark import SparkDatasetConverter

    pq.write_table(pa.table({"id": pa.array(range(100), pa.int64())}), tmp_path / "part-0.parquet",
                   row_group_size=10)
    converter = SparkDatasetConverter("file://" + str(tmp_path), [str(tmp_path / "part-0.parquet")], 100)

    def ids(**kw):
        with converter.make_torch_dataloader(batch_size=10, num_epochs=1, **kw) as loader:
            return [int(i) for b in loader for i in b["id"]]

    shuffled = ids(seed=3)
    assert sorted(shuffled) == list(range(100)) and shuffled != list(range(100))
    assert shuffled == ids(seed=3)
    assert ids(shuffle_row_groups=False) == list(range(100))


def test_make_batch_reader_puts_hive_partition_keys_first_as_petastorm(tmp_path):
    # Petastorm's inferred schema lists the partition keys (in path order) before the
    # files' columns; here they came last, so a batch unpacked or indexed by position
    # (id, x, part, cat = batch) took other columns than under Petastorm.
    d = tmp_path / "ds"
    pq.write_to_dataset(pa.table({"id": pa.array(range(12), pa.int64()), "x": [i / 2 for i in range(12)],
                                  "part": pa.array([i % 3 for i in range(12)], pa.int64()),
                                  "cat": [f"c{i % 2}" for i in range(12)]}), str(d), partition_cols=["part", "cat"])
    with make_batch_reader("file://" + str(d), **NATURAL) as reader:
        assert list(reader.schema.fields) == ["part", "cat", "id", "x"]
        batches = list(reader)
    assert batches[0]._fields == ("part", "cat", "id", "x")
    part, cat, ids, x = (np.concatenate(c) for c in zip(*batches))
    assert sorted(ids.tolist()) == list(range(12))
    assert part.tolist() == [i % 3 for i in ids] and cat.tolist() == [f"c{i % 2}" for i in ids]
    assert x.tolist() == [i / 2 for i in ids]


def test_make_reader_strings_are_one_np_str_per_row_not_a_batch_wide_array(tmp_path):
    # Petastorm's decode gives each row np.str_(value). Here a batch's strings became one
    # np.str_ array, as wide as its longest string for every row (a 2 MB text among 127
    # short ones: a 1 GB array per batch, 8 MB of text took 4 GB), which also drops
    # trailing NULs ('ab\0' came out as 'ab').
    from pqloader.petastorm.codecs import ScalarCodec
    from pqloader.petastorm.etl.dataset_metadata import write_metadata
    from pqloader.petastorm.unischema import Unischema, UnischemaField

    pyspark_types = pytest.importorskip("pyspark.sql.types")
    d = tmp_path / "text"
    d.mkdir()
    docs = ["ab\0", "x" * 100_000] + [f"doc {i}" for i in range(62)]
    pq.write_table(pa.table({"id": pa.array(range(64), pa.int32()), "doc": docs}), str(d / "part-0.parquet"))
    write_metadata("file://" + str(d), Unischema("TextSchema", [
        UnischemaField("id", np.int32, (), ScalarCodec(pyspark_types.IntegerType()), False),
        UnischemaField("doc", np.str_, (), ScalarCodec(pyspark_types.StringType()), False)]))
    with make_reader(str(d), **NATURAL) as reader:
        rows = list(reader)
        batch = next(iter(reader.loader))
    assert [r.doc for r in rows] == docs and len(rows[0].doc) == 3
    assert all(type(r.doc) is np.str_ for r in rows)
    assert getattr(batch["doc"], "nbytes", 0) < 64 * 100_000  # not 64 rows as wide as the longest
    with make_reader(str(d), predicate=in_lambda(["doc"], lambda s: s.endswith("\0")), **NATURAL) as reader:
        assert [int(r.id) for r in reader] == [0]
    spec = TransformSpec(lambda row: dict(row, doc=row["doc"] + "\0"))
    with make_reader(str(d), transform_spec=spec, **NATURAL) as reader:
        assert [r.doc for r in reader] == [s + "\0" for s in docs]
