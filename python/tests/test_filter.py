"""Loader(filter=...): rows chosen by pyarrow expressions, strings and Python predicates,
pushed down to partition keys, row-group statistics and row masks; held to pyarrow's
``dataset.to_table(filter=...)`` as a multiset."""

from __future__ import annotations

import enum
import shutil
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import collect

ROWS_PER_FILE = 2000
ROW_GROUP = 250


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Hive-partitioned by lang; ts sorted within each file (statistics prune on it);
    score has nulls; label small ints."""
    root = tmp_path_factory.mktemp("filtered")
    rng = np.random.default_rng(5)
    next_id = 0
    for lang in ("de", "en", "fr"):
        for part in range(2):
            n = ROWS_PER_FILE
            ids = np.arange(next_id, next_id + n, dtype=np.int64)
            next_id += n
            score = rng.random(n)
            table = pa.table({
                "id": ids,
                "ts": np.arange(n, dtype=np.int64) + part * n,
                "label": rng.integers(0, 5, n).astype(np.int64),
                "score": pa.array(score, mask=rng.random(n) < 0.1),
                "x": rng.random(n).astype(np.float32),
                "tag": pa.array([f"t{i % 7}" for i in range(n)]),
            })
            d = root / f"lang={lang}"
            d.mkdir(exist_ok=True)
            pq.write_table(table, d / f"part-{part}.parquet", row_group_size=ROW_GROUP)
    return root


def expected_ids(root, expression):
    table = pads.dataset(root, partitioning="hive").to_table(filter=expression, columns=["id"])
    return np.sort(table["id"].to_numpy())


def loaded_ids(root, flt, **kwargs):
    kwargs.setdefault("batch_size", 64)
    loader = pqloader.Loader(str(root), columns=["id"], filter=flt, num_epochs=1, **kwargs)
    ids = [b["id"] for b in loader]
    return (np.sort(np.concatenate(ids)) if ids else np.zeros(0, np.int64)), loader


FILTERS = [
    pc.field("lang") == "en",
    (pc.field("ts") >= 600) & (pc.field("ts") < 900),
    pc.field("label").isin([1, 3]),
    (pc.field("lang") != "de") & (pc.field("ts") < 300) & (pc.field("x") > 0.5),
    pc.field("score") > 0.5,  # nulls dropped
    pc.field("score").is_null(),
    (pc.field("tag") == "t3") | (pc.field("label") == 0),
    pc.field("ts") > 10**9,  # nothing
]


@pytest.mark.parametrize("index", range(len(FILTERS)))
def test_filtered_rows_equal_pyarrow_dataset_filter(data, index):
    expression = FILTERS[index]
    got, loader = loaded_ids(data, expression)
    want = expected_ids(data, expression)
    np.testing.assert_array_equal(got, want)
    assert loader.num_rows == len(want)
    s = loader.stats()
    assert s["filter_rows"] == 6 * ROWS_PER_FILE
    assert s["filter_rows_kept"] == len(want)


def test_each_stage_prunes_what_it_can_and_counts_it(data):
    _, by_key = loaded_ids(data, pc.field("lang") == "fr")
    s = by_key.stats()
    assert s["filter_files"] == 6 and s["filter_files_pruned"] == 4
    assert s["filter_row_groups_pruned_partition"] == 4 * ROWS_PER_FILE // ROW_GROUP
    assert s["filter_row_groups_masked"] == 0 and s["filter_mask_bytes_read"] == 0
    assert s["filter_row_groups_all_rows"] == 2 * ROWS_PER_FILE // ROW_GROUP  # by the keys
    assert s["bytes_read"] <= s["filter_bytes"] - s["filter_bytes_pruned"]

    _, by_stats = loaded_ids(data, (pc.field("ts") >= 500) & (pc.field("ts") < 750))
    s = by_stats.stats()
    # ts 500..749 lies in row groups 2 (500..749) of part 0 in each of 3 languages: the
    # statistics show them wholly kept, but only prune (as pyarrow): they are masked.
    assert s["filter_row_groups_all_rows"] == 0
    assert s["filter_row_groups_pruned_statistics"] == 6 * ROWS_PER_FILE // ROW_GROUP - 3
    assert s["filter_row_groups_masked"] == 3 and s["filter_row_groups_pruned_mask"] == 0
    assert s["units_read"] >= 3 and s["bytes_read"] < s["filter_bytes"] / 10

    _, masked = loaded_ids(data, pc.field("label") == 2)
    s = masked.stats()
    assert s["filter_row_groups_masked"] == 6 * ROWS_PER_FILE // ROW_GROUP
    assert s["filter_mask_bytes_read"] > 0


def test_string_filters_parse_to_the_same_rows(data):
    for text, expression in [
        ("lang == 'en' and 100 <= ts < 700", (pc.field("lang") == "en") & (pc.field("ts") >= 100)
         & (pc.field("ts") < 700)),
        ("label in [0, 4] or score is None", pc.field("label").isin([0, 4]) | pc.field("score").is_null()),
        ("not (x > 0.25) and tag != 't1'", ~(pc.field("x") > 0.25) & (pc.field("tag") != "t1")),
        ("label not in (1, 2)", ~pc.field("label").isin([1, 2])),
    ]:
        got, _ = loaded_ids(data, text)
        np.testing.assert_array_equal(got, expected_ids(data, expression), err_msg=text)
    for bad in ("lang ==", "foo(3)", "x in 3", "a is 3", "x + 1"):
        with pytest.raises(ValueError, match="filter"):
            pqloader.parse_filter(bad)


def test_predicates_run_on_whole_batches_and_and_with_expressions(data):
    seen = []

    def big_x(batch):
        seen.append(batch.num_rows)
        assert batch.schema.names == ["x"]
        return pc.greater(batch["x"], 0.75)

    predicate = pqloader.Predicate(["x"], big_x)
    got, loader = loaded_ids(data, [pc.field("lang") == "en", predicate])
    np.testing.assert_array_equal(
        got, expected_ids(data, (pc.field("lang") == "en") & (pc.field("x") > 0.75)))
    # One call per row group the expression left (en only), each with all its rows.
    assert seen == [ROW_GROUP] * (2 * ROWS_PER_FILE // ROW_GROUP)
    # numpy results and lists are accepted too.
    got2, _ = loaded_ids(data, pqloader.Predicate(["label", "lang"],
                                                  lambda b: (b["label"].to_numpy() == 1)
                                                  & (np.asarray(b["lang"]) == "fr")))
    np.testing.assert_array_equal(
        got2, expected_ids(data, (pc.field("label") == 1) & (pc.field("lang") == "fr")))


def test_a_loader_whose_predicate_refers_to_it_is_collected(data):
    """The engine kept the predicate out of the garbage collector's sight, so a
    predicate referring to its Loader (a bound method of an object holding the Loader)
    made a cycle that was never collected: each such Loader kept its threads and
    memory for good (60 of them: 845 threads)."""
    import gc
    import weakref

    class Job:
        def __init__(self):
            self.loader = pqloader.Loader(str(data), columns=["id"], batch_size=64,
                                          filter=pqloader.Predicate(["x"], self.keep))

        def keep(self, batch):
            return pc.greater(batch["x"], 0.75)

    job = Job()
    got = np.sort(np.concatenate([b["id"] for b in job.loader]))
    np.testing.assert_array_equal(got, expected_ids(data, pc.field("x") > 0.75))
    gone = weakref.ref(job.loader)
    del job
    gc.collect()
    assert gone() is None


def test_predicate_errors_name_the_row_group(data):
    def broken(batch):
        raise ZeroDivisionError("boom")

    with pytest.raises(pqloader.Error, match=r"predicate raised .*ZeroDivisionError.*boom"):
        pqloader.Loader(str(data), filter=pqloader.Predicate(["x"], broken))
    with pytest.raises(pqloader.Error, match=r"row group \d+"):
        pqloader.Loader(str(data), filter=pqloader.Predicate(["x"], lambda b: [True]))
    with pytest.raises(TypeError, match="Predicate"):
        pqloader.Loader(str(data), filter=lambda b: True)
    with pytest.raises(TypeError, match="filter must be"):
        pqloader.Loader(str(data), filter=42)
    with pytest.raises(pqloader.ColumnNotFoundError, match="'nope'"):
        pqloader.Loader(str(data), filter=pc.field("nope") == 1)
    with pytest.raises(pqloader.Error, match="not a condition"):
        pqloader.Loader(str(data), filter=pc.field("ts"))


def test_predicates_return_booleans_and_ctrl_c_stays_a_keyboard_interrupt(data):
    # Floats (0.3, NaN) or strings ("False") as truth values would keep rows silently.
    for bad in (lambda b: np.full(b.num_rows, 0.3), lambda b: ["False"] * b.num_rows,
                lambda b: pa.array(np.ones(b.num_rows, np.int64)), lambda b: None):
        with pytest.raises(pqloader.Error, match=r"row group \d+.*not (bool|one bool per row)"):
            pqloader.Loader(str(data), filter=pqloader.Predicate(["x"], bad))
    ids, _ = loaded_ids(data, pqloader.Predicate(["x"], lambda b: [v < 0.5 for v in b["x"].to_pylist()]))
    np.testing.assert_array_equal(ids, expected_ids(data, pc.field("x") < 0.5))

    def interrupted(batch):
        raise KeyboardInterrupt  # as Ctrl-C raises it inside a running predicate

    with pytest.raises(KeyboardInterrupt):  # not a pqloader.Error that `except Exception` takes
        pqloader.Loader(str(data), filter=pqloader.Predicate(["x"], interrupted))

    def exits(code):
        def predicate(batch):
            sys.exit(code) if code is not None else sys.exit()
        return predicate

    class Code(enum.IntEnum):
        FOUR = 4

    # The code as sys.exit got it, the very object (False exits with status 0, an IntEnum
    # with its value, a text or a float prints and exits with 1): any object, also one
    # whose str() fails (an int of 5,000 digits) or that is not UTF-8.
    for code in (3, 0, False, True, Code.FOUR, "bye", None, -2**70, 1.5, 10**5000, "\udc80"):
        with pytest.raises(SystemExit) as e:
            pqloader.Loader(str(data), filter=pqloader.Predicate(["x"], exits(code)))
        assert e.value.code is code

    def interrupted_with_args(batch):
        raise KeyboardInterrupt("stop", 5)

    with pytest.raises(KeyboardInterrupt) as k:
        pqloader.Loader(str(data), filter=pqloader.Predicate(["x"], interrupted_with_args))
    assert k.value.args == ("stop", 5)


def test_a_predicate_returning_a_list_of_bools_takes_empty_row_groups_and_all_null_lists(tmp_path):
    # pa.array([]) and pa.array([None, None]) are of the null type: a list predicate
    # failed on a row group of no rows (pyarrow's ParquetWriter writes one for an empty
    # table) or on one where every value was None ("null counts as False").
    with pq.ParquetWriter(tmp_path / "a.parquet", pa.schema([("x", pa.int64())])) as w:
        w.write_table(pa.table({"x": pa.array([], pa.int64())}))
        w.write_table(pa.table({"x": [1, 2, 3]}))
        w.write_table(pa.table({"x": [4, 5]}))
    assert pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(0).num_rows == 0

    def small(batch):
        return [True if v < 3 else None for v in batch["x"].to_pylist()]

    loader = pqloader.Loader(str(tmp_path), filter=pqloader.Predicate(["x"], small), num_epochs=1)
    assert np.concatenate([b["x"] for b in loader]).tolist() == [1, 2]
    with pytest.raises(pqloader.Error, match=r"row group 1.*returned 0 values for 3 rows"):
        pqloader.Loader(str(tmp_path), filter=pqloader.Predicate(["x"], lambda b: []))


def test_predicate_columns_may_be_any_iterable_of_names(data):
    # A generator's names were used up checking them: Predicate([]) and an
    # InvalidDataError ("a predicate needs the columns it reads") from the engine.
    predicate = pqloader.Predicate((c for c in ["x"]), lambda b: pc.greater(b["x"], 0.75))
    assert predicate.columns == ["x"]
    ids, _ = loaded_ids(data, predicate)
    np.testing.assert_array_equal(ids, expected_ids(data, pc.field("x") > 0.75))
    for bad in (5, "x", [1]):
        with pytest.raises(TypeError, match="Predicate columns must be a list of column names"):
            pqloader.Predicate(bad, lambda b: b)


def test_a_literal_pyarrow_cannot_hold_is_a_value_error():
    with pytest.raises(ValueError, match="filter"):
        pqloader.parse_filter("x == 99999999999999999999999")


@pytest.mark.parametrize("text", ["not " * 2000 + "x > 1",  # deep in convert()
                                  "x == " + "-" * 3000 + "1"])  # deep in ast.parse
def test_a_filter_nested_too_deeply_is_a_value_error(data, text):
    # They raised a bare RecursionError (and the CLI printed its traceback).
    with pytest.raises(ValueError, match="nested too deeply") as e:
        pqloader.parse_filter(text)
    assert len(str(e.value)) < 200  # the text is shortened
    with pytest.raises(ValueError, match="nested too deeply"):
        pqloader.Loader(str(data), filter=text)
    pqloader.parse_filter("not " * 200 + "x > 1")  # nesting within Python's limits parses


def test_statistics_decide_nothing_that_nan_rows_or_nested_columns_would_contradict(tmp_path):
    """Parquet's min/max of a float column leave NaN out, and a list's or struct's single
    leaf has statistics that are not the column's: rows equal the filter evaluated row by
    row (pyarrow's own dataset prunes the negations below by those statistics, wrongly)."""
    n = 40
    x = np.tile(np.array([np.nan, 1.0, 2.0, 1.5]), n // 4)
    lists = [[] if i % 3 == 0 else [None] for i in range(n)]  # every leaf null, no null list
    lists[5] = None
    table = pa.table({"id": np.arange(n, dtype=np.int64), "x": x, "f": x.astype(np.float32),
                      "l": pa.array(lists, type=pa.list_(pa.int64())),
                      "s": pa.array([None if i == 7 else {"a": None} for i in range(n)],
                                    type=pa.struct([("a", pa.int64())]))})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=8)
    x_ = pc.field("x")
    for flt in (x_ > 0, x_ >= 1, x_ <= 2, pc.field("f") > 0, ~(x_ <= 2), ~(x_ > 0), x_ != 5,
                pc.field("l").is_valid(), pc.field("l").is_null(), pc.field("s").is_valid(),
                pc.field("s").is_null(), pc.list_value_length(pc.field("l")) >= 0):
        want = np.sort(table.filter(flt)["id"].to_numpy())
        got, _ = loaded_ids(tmp_path, flt, batch_size=8)
        np.testing.assert_array_equal(got, want, err_msg=str(flt))


def _lie_min_max(src, dst, value: int) -> None:
    """Copy `src` (one int64 column, PLAIN) with its statistics claiming min == max == value."""
    import struct

    data = src.read_bytes()
    (length,) = struct.unpack("<i", data[-8:-4])
    start = len(data) - 8 - length
    footer = bytes(data[start:-8])
    stats = pq.ParquetFile(src).metadata.row_group(0).column(0).statistics
    for old in (stats.min, stats.max):  # binary fields: length 8 (varint), then the bytes
        footer = footer.replace(b"\x08" + struct.pack("<q", old), b"\x08" + struct.pack("<q", value))
    dst.write_bytes(data[:start] + footer + struct.pack("<i", len(footer)) + b"PAR1")


def test_statistics_only_prune_and_never_keep_rows_that_fail_the_filter(tmp_path):
    """Statistics that lie (min == max == 5 over 0..99) showed the row group wholly kept
    for `x == 5`: all 100 rows came out, and `x == 5 and y > 3` checked only `y > 3`.
    pyarrow uses statistics to skip row groups and checks every row it reads."""
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"x": np.arange(100, dtype=np.int64)}), good, use_dictionary=False)
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = bad_dir / "bad.parquet"
    _lie_min_max(good, bad, 5)
    stats = pq.ParquetFile(bad).metadata.row_group(0).column(0).statistics
    assert (stats.min, stats.max) == (5, 5)
    for flt in (pc.field("x") == 5, (pc.field("x") == 5) & (pc.field("x") >= 0), pc.field("x") <= 5):
        want = pads.dataset(bad).to_table(filter=flt)["x"].to_numpy()
        got = np.concatenate([b["x"] for b in pqloader.Loader(str(bad), filter=flt)])
        np.testing.assert_array_equal(got, want, err_msg=str(flt))
    assert len(want) == 6  # (x <= 5: pyarrow's answer too, row by row)
    # Statistics still prune: x > 5 skips the row group unread, in both (a lie costs rows).
    assert pads.dataset(bad).to_table(filter=pc.field("x") > 5).num_rows == 0
    loader = pqloader.Loader(str(bad), filter=pc.field("x") > 5)
    assert len(loader) == 0 and loader.stats()["filter_row_groups_pruned_statistics"] == 1


def test_an_endless_iteration_over_no_rows_is_an_error_not_a_spin(data):
    loader = pqloader.Loader(str(data), filter=pc.field("ts") < -1, num_epochs=None)
    assert len(loader) == 0
    with pytest.raises(pqloader.InvalidDataError, match="no batch.*num_epochs=None"):
        next(iter(loader))


def test_states_tell_apart_filters_whose_descriptions_arrow_abbreviates(data):
    # Arrow prints a long value set as "0, 1, ..., 39": the state must not take one for
    # the other (rows would be skipped or repeated after the resume).
    mine = pqloader.Loader(str(data), filter=pc.field("ts").isin(list(range(40))), batch_size=8,
                           columns=["id"])
    it = iter(mine)
    next(it)
    other = pqloader.Loader(str(data), filter=pc.field("ts").isin([t for t in range(40) if t != 20]),
                            batch_size=8, columns=["id"])
    with pytest.raises(pqloader.InvalidDataError, match="different"):
        other.load_state_dict(mine.state_dict())
    same = pqloader.Loader(str(data), filter=pc.field("ts").isin(list(range(40))), batch_size=8,
                           columns=["id"])
    same.load_state_dict(mine.state_dict())  # the same filter is taken


@pytest.mark.parametrize("theirs, mine", [
    (pc.field("x") <= np.float32(0.1), pc.field("x") <= 0.1),  # both print "(x <= 0.1)"
    ((pc.field("cat") / 2.0) == 1, (pc.field("cat") / 2) == 1),  # both "divide_checked(cat, 2)"
    (pc.field("s") == pa.scalar(b"s1"), pc.field("s") == "7331"),  # bytes print as hex
    (pc.equal(pc.add(pc.field("u"), pa.scalar(1, pa.uint8())), 0), pc.equal(pc.add(pc.field("u"), 1), 0)),
    (pc.field("x").isin(pa.array([0.1], pa.float32())), pc.field("x").isin([0.1])),  # (its type is printed)
])
def test_states_tell_apart_filters_whose_literals_print_alike(tmp_path, theirs, mine):
    # A literal's text leaves out its type: a state of one filter resumed the other's
    # selection (float32 0.1 keeps rows a double 0.1 does not; 2.0 divides as a double).
    x = np.array([0.1] * 10 + [float(np.float32(0.1))] * 10 + [0.5] * 20)
    pq.write_table(pa.table({"id": np.arange(40), "x": x, "cat": np.arange(40) % 5,
                             "s": ["s1"] * 10 + ["7331"] * 30, "u": np.arange(216, 256, dtype=np.uint8)}),
                   tmp_path / "a.parquet", row_group_size=10)
    a = pqloader.Loader(str(tmp_path), filter=theirs, batch_size=2, columns=["id"])
    b = pqloader.Loader(str(tmp_path), filter=mine, batch_size=2, columns=["id"])

    def ids(f):
        return [int(i) for batch in pqloader.Loader(str(tmp_path), filter=f, batch_size=64, columns=["id"])
                for i in batch["id"]]

    assert ids(theirs) != ids(mine)  # other selections
    next(iter(a))
    with pytest.raises(pqloader.InvalidDataError, match="filter: .*(filter-literals|value_set=float)"):
        b.load_state_dict(a.state_dict())
    same = pqloader.Loader(str(tmp_path), filter=theirs, batch_size=2, columns=["id"])
    same.load_state_dict(a.state_dict())  # the same filter is taken
    # A filter without such literals keeps its fingerprint's text (states saved before load).
    plain = pqloader.Loader(str(tmp_path), filter=pc.field("x") <= 0.1, columns=["id"])
    assert plain.state_dict()["options"]["transforms"] == "|filter=(x <= 0.1)"


def test_states_tell_apart_duration_units_and_date64_times(tmp_path):
    # Arrow prints a duration as its bare count and a date64 as its day: `dur >= 5 s` and
    # `dur >= 5 ms`, a date64 at 01:00 and that day's date32, resumed each other's states.
    import datetime as dt
    n = 20
    pq.write_table(pa.table({"id": np.arange(n), "dur": pa.array(np.arange(n) * 1000, pa.duration("ms")),
                             "d": pa.array([dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in range(n)],
                                           pa.date32())}), tmp_path / "a.parquet")
    day = 1578009600000  # 2020-01-03 in ms
    for theirs, mine in [(pc.field("dur") >= pa.scalar(5, pa.duration("s")),
                          pc.field("dur") >= pa.scalar(5, pa.duration("ms"))),
                         (pc.field("d") >= pa.scalar(day + 3600000, pa.date64()),
                          pc.field("d") >= pa.scalar(dt.date(2020, 1, 3), pa.date32()))]:
        a = pqloader.Loader(str(tmp_path), batch_size=1, columns=["id"], filter=theirs)
        b = pqloader.Loader(str(tmp_path), batch_size=1, columns=["id"], filter=mine)
        assert a.num_rows != b.num_rows
        next(iter(a))
        with pytest.raises(pqloader.InvalidDataError, match="filter-literals"):
            b.load_state_dict(a.state_dict())
    # A date64 at midnight is the date32 it prints as: its state keeps its form.
    midnight = pqloader.Loader(str(tmp_path), columns=["id"], filter=pc.field("d") >= pa.scalar(day, pa.date64()))
    assert "filter-literals" not in midnight.state_dict()["options"]["transforms"]


def test_a_state_past_the_batches_of_another_predicates_selection_says_why(tmp_path):
    # A state records a Predicate's columns, not its code: one that now keeps fewer rows
    # leaves the state's position past the end, which the error explains.
    pq.write_table(pa.table({"id": np.arange(100), "cat": np.arange(100) % 5}), tmp_path / "a.parquet",
                   row_group_size=25)
    a = pqloader.Loader(str(tmp_path), filter=pqloader.Predicate(["cat"], lambda b: pc.less(b["cat"], 4)),
                        batch_size=10, columns=["id"])
    it = iter(a)
    for _ in range(7):
        next(it)
    b = pqloader.Loader(str(tmp_path), filter=pqloader.Predicate(["cat"], lambda b: pc.less(b["cat"], 1)),
                        batch_size=10, columns=["id"])
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"state\['batch'\] is 7, past the 2 batches .*epoch 0.*Predicate"):
        b.load_state_dict(a.state_dict())


def batches(loader):
    return [b["id"].copy() for b in loader]


def test_filtered_epochs_are_deterministic_across_threads_and_resume(data):
    flt = (pc.field("label") != 2) & (pc.field("lang") != "fr")
    kwargs = dict(columns=["id"], batch_size=50, shuffle=True, seed=3, filter=flt, num_epochs=1)
    one = batches(pqloader.Loader(str(data), num_workers=1, **kwargs))
    three = batches(pqloader.Loader(str(data), num_workers=3, _debug_max_delay_us=300, **kwargs))
    assert len(one) == len(three)
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.sort(np.concatenate(one)), expected_ids(data, flt))
    # Resume mid-epoch equals the uninterrupted tail.
    loader = pqloader.Loader(str(data), **kwargs)
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = loader.state_dict()
    resumed = pqloader.Loader(str(data), **kwargs)
    resumed.load_state_dict(state)
    tail = batches(resumed)
    assert len(tail) == len(one) - 7
    for a, b in zip(tail, one[7:]):
        np.testing.assert_array_equal(a, b)
    # A state of another filter is refused.
    other = pqloader.Loader(str(data), **{**kwargs, "filter": pc.field("label") != 3})
    with pytest.raises(pqloader.InvalidDataError, match="different options: filter: state has"):
        other.load_state_dict(state)  # (it was reported as "transforms: ...")


def test_ranks_share_the_filtered_rows_equally(data):
    flt = pc.field("label").isin([0, 1])
    got = []
    lengths = set()
    for rank in range(3):
        loader = pqloader.Loader(str(data), columns=["id"], batch_size=40, filter=flt, rank=rank,
                                 world_size=3, shuffle=True, seed=1, num_epochs=1, drop_last=True)
        b = batches(loader)
        lengths.add(len(b))
        got.append(np.concatenate(b))
    assert len(lengths) == 1
    allids = np.concatenate(got)
    assert len(np.unique(allids)) == len(allids)
    assert set(allids) <= set(expected_ids(data, flt))


def test_selection_is_kept_in_the_cache_dir(data, tmp_path):
    flt = pc.field("x") < 0.3
    kwargs = dict(columns=["id", "x"], batch_size=100, filter=flt, cache_dir=str(tmp_path),
                  num_epochs=1)
    first = pqloader.Loader(str(data), **kwargs)
    a = batches(first)
    assert first.stats()["filter_from_store"] is False
    assert list((tmp_path / "filters").glob("*.sel"))
    second = pqloader.Loader(str(data), **kwargs)
    assert second.stats()["filter_from_store"] is True
    b = batches(second)
    assert second.stats()["cache_hits"] > 0  # the directory stayed a cache with filters/ in it
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # The cached decoded row groups hold the filtered rows: another filter misses them.
    other = pqloader.Loader(str(data), **{**kwargs, "filter": pc.field("x") >= 0.3})
    ids = np.sort(np.concatenate(batches(other)))
    np.testing.assert_array_equal(ids, expected_ids(data, pc.field("x") >= 0.3))
    # Selections are outside the entries and their size limit: counted apart.
    stats = pqloader.cache_stats(str(tmp_path))
    sels = list((tmp_path / "filters").glob("*.sel"))
    assert stats["selections"] == len(sels) == 2
    assert stats["selection_bytes"] == sum(p.stat().st_size for p in sels)
    assert stats["footers"] == 0  # local footers are read from the files
    report = pqloader.cache_clear(str(tmp_path))
    assert report["foreign_count"] == 0 and not list((tmp_path / "filters").glob("*.sel"))
    assert pqloader.cache_stats(str(tmp_path))["selections"] == 0


def test_a_selection_that_cannot_be_saved_is_a_counted_cache_write_error_warned_once(tmp_path):
    # A selection that could not be saved into cache_dir/filters (a full or read-only disk;
    # here a file in the place of filters/) was dropped silently, where a failed insert of
    # an entry is counted (cache_write_errors) and warned of once.
    import warnings
    pq.write_table(pa.table({"x": pa.array(range(1000), pa.int64())}), tmp_path / "d.parquet",
                   row_group_size=250)
    cache = tmp_path / "cache"
    first = pqloader.Loader(str(tmp_path / "d.parquet"), batch_size=100, cache_dir=str(cache))
    assert sum(len(b["x"]) for b in first) == 1000  # a marked cache
    (cache / "filters").write_text("not a directory\n")
    loader = pqloader.Loader(str(tmp_path / "d.parquet"), batch_size=100, cache_dir=str(cache),
                             filter="x < 555", num_epochs=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = [int(i) for b in loader for i in b["x"]]
    assert ids == list(range(555)) * 2
    saved = [str(w.message) for w in caught if "selection" in str(w.message)]
    assert len(saved) == 1 and "cannot save the filter's selection" in saved[0], [str(w.message) for w in caught]
    assert str(cache / "filters") in saved[0]
    assert loader.stats()["cache_write_errors"] == 1
    assert loader.stats()["filter_from_store"] is False
    assert (cache / "filters").read_text() == "not a directory\n"


def test_a_selection_kept_for_one_root_never_serves_another_root_of_the_same_files(tmp_path):
    # The partition keys come from the directories below the root, so the same files
    # loaded from another root have other keys; the stored selection's key named only
    # the files and the expression, and served one root's selection to the other.
    cache_dir = str(tmp_path / "cache")
    nested = tmp_path / "nested" / "a=1" / "b=2"
    nested.mkdir(parents=True)
    pq.write_table(pa.table({"id": [0, 1, 2, 3]}), nested / "f.parquet")

    def ids(root, flt):
        loader = pqloader.Loader(str(root), columns=["id"], batch_size=10, filter=flt,
                                 cache_dir=cache_dir)
        return sorted(v for b in loader for v in b["id"].tolist())

    assert ids(tmp_path / "nested", "a == 1") == [0, 1, 2, 3]
    # Below a=1, 'a' is no partition key: refused, as without a cache_dir.
    with pytest.raises(pqloader.ColumnNotFoundError, match="'a'"):
        ids(tmp_path / "nested" / "a=1", "a == 1")
    assert ids(tmp_path / "nested" / "a=1", "b == 2") == [0, 1, 2, 3]

    # A file that stores the key's column too (without statistics to contradict its
    # path): the column loads from the file under either root, and the filter reads the
    # file's values as the batches do (it took the path's value under the root: []).
    shadow = tmp_path / "shadow" / "p=1"
    shadow.mkdir(parents=True)
    pq.write_table(pa.table({"id": [0, 1, 2, 3], "p": [1, 2, 1, 2]}), shadow / "f.parquet",
                   write_statistics=False)
    assert ids(tmp_path / "shadow", "p == 2") == [1, 3]
    assert ids(shadow, "p == 2") == [1, 3]


def test_a_key_twice_in_a_path_filters_on_its_first_value_as_it_loads(tmp_path):
    # a=1/a=2/: the column holds 1 (as pyarrow's), and the filter took the last value, 2.
    for p in ["a=1/a=2", "a=3/a=4"]:
        (tmp_path / p).mkdir(parents=True)
        pq.write_table(pa.table({"x": np.arange(2)}), tmp_path / p / "f.parquet")
    for value in (1, 2, 3):
        expected = pads.dataset(str(tmp_path), partitioning="hive").to_table(filter=pc.field("a") == value)
        with pqloader.Loader(str(tmp_path), batch_size=10, filter=f"a == {value}") as loader:
            assert [int(v) for b in loader for v in b["a"]] == expected["a"].to_pylist()


def test_another_filters_selection_in_place_of_this_ones_is_recomputed(data, tmp_path):
    # A stored selection held no key: another filter's file copied over this one's name
    # was served as this filter's rows (wrong rows, silently).
    kwargs = dict(columns=["id", "x"], batch_size=100, cache_dir=str(tmp_path), num_epochs=1)
    first, second = pc.field("x") < 0.3, pc.field("x") >= 0.8
    batches(pqloader.Loader(str(data), filter=first, **kwargs))
    (one,) = list((tmp_path / "filters").glob("*.sel"))
    batches(pqloader.Loader(str(data), filter=second, **kwargs))
    (two,) = set((tmp_path / "filters").glob("*.sel")) - {one}
    shutil.copyfile(one, two)
    loader = pqloader.Loader(str(data), filter=second, **kwargs)
    ids = np.sort(np.concatenate(batches(loader)))
    assert loader.stats()["filter_from_store"] is False
    np.testing.assert_array_equal(ids, expected_ids(data, second))


def test_filter_round_trips_through_options(data):
    loader = pqloader.Loader(str(data), filter="label == 4", columns=["id"])
    again = pqloader.Loader(loader.sources, **loader.options.to_kwargs())
    assert again.num_rows == loader.num_rows == len(expected_ids(data, pc.field("label") == 4))


def test_filter_on_columns_not_loaded_and_on_a_file_lacking_the_column(tmp_path):
    pq.write_table(pa.table({"id": np.arange(10), "flag": [True, False] * 5}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": np.arange(10, 20)}), tmp_path / "b.parquet")  # no flag: null
    got, _ = loaded_ids(tmp_path, pc.field("flag"))
    np.testing.assert_array_equal(got, np.arange(0, 10, 2))
    got, _ = loaded_ids(tmp_path, pc.field("flag").is_null())
    np.testing.assert_array_equal(got, np.arange(10, 20))


def test_inspect_shows_what_each_stage_prunes(data):
    import subprocess
    import sys

    info = pqloader.inspect(str(data), filter="lang == 'fr' and ts < 250")
    f = info["filter"]
    assert f["files_pruned"] == 4 and f["row_groups_pruned_statistics"] == 2 * ROWS_PER_FILE // ROW_GROUP - 1
    assert f["row_groups_all_rows"] == 0 and f["row_groups_masked"] == 1 and f["rows_kept"] == 250
    assert "lang" in f["expression"]
    out = subprocess.run([sys.executable, "-m", "pqloader", "inspect", str(data), "--filter",
                          "label == 1 and lang != 'de'"], capture_output=True, text=True, check=True).stdout
    assert "partition keys: 2 of 6 file(s) pruned" in out
    assert f"row masks:      {4 * ROWS_PER_FILE // ROW_GROUP} row group(s) read" in out


def _row_by_row(table, expression):
    """The ids the expression keeps, evaluated on the whole table (no statistics)."""
    import pyarrow.dataset as ds
    return sorted(ds.dataset(table).to_table(filter=expression)["id"].to_pylist())


def test_is_null_and_is_valid_of_a_dictionary_column_with_all_null_row_groups(tmp_path):
    # A pandas Categorical: Arrow simplified is_null/is_valid of a dictionary field the
    # wrong way round under an all-null row group's statistics ("s is not None" kept such
    # row groups whole, "s is None" pruned them), silently.
    s = pa.array([None, None, "a", None, None, None, "b", "c"]).dictionary_encode()
    table = pa.table({"id": np.arange(8), "s": s})
    pq.write_table(table, tmp_path / "cat.parquet", row_group_size=2)
    for expression in (pc.field("s").is_valid(), pc.field("s").is_null(), ~pc.field("s").is_null(),
                       pc.field("s") == "a", pc.field("s") != "a"):
        got, _ = loaded_ids(tmp_path, expression)
        assert got.tolist() == _row_by_row(table, expression), str(expression)
    for text, expected in (("s is None", [0, 1, 3, 4, 5]), ("s is not None", [2, 6, 7])):
        assert loaded_ids(tmp_path, text)[0].tolist() == expected
    # A file without the column: its rows are null, not "known" through the dictionary type.
    pq.write_table(pa.table({"id": np.arange(8, 12)}), tmp_path / "other.parquet")
    for text, expected in (("s is None", [0, 1, 3, 4, 5, 8, 9, 10, 11]), ("s is not None", [2, 6, 7])):
        assert loaded_ids(tmp_path, text)[0].tolist() == expected


@pytest.mark.parametrize("nan", [float("nan"), pa.scalar(float("nan"), pa.float32())])
def test_comparisons_with_a_nan_literal_are_false_for_every_row(tmp_path, nan):
    # Arrow's simplification with min/max statistics ordered NaN above every bound: "x < nan"
    # kept row groups whole, "~(x < nan)" pruned them.
    table = pa.table({"id": np.arange(8), "x": pa.array([1, 2, 3, 4, 5, None, 7, 8], pa.int64())})
    pq.write_table(table, tmp_path / "ints.parquet", row_group_size=4)
    x = pc.field("x")
    in_set = x.isin(pa.array([float("nan"), 3.0], pa.float32() if isinstance(nan, pa.Scalar) else pa.float64()))
    folded = pc.divide(pc.scalar(0.0), pc.scalar(0.0))  # a NaN once Arrow folds constants
    for expression in (x < nan, x <= nan, ~(x < nan), (x < nan) | (x == 7), in_set, ~in_set, x != nan,
                       x < folded, ~(x < folded)):
        got, _ = loaded_ids(tmp_path, expression)
        assert got.tolist() == _row_by_row(table, expression), str(expression)


def test_a_nan_that_partition_keys_or_constant_row_groups_make_leaves_the_statistics_unused(tmp_path):
    # "x < sqrt(y)" holds no NaN literal, but where a partition key's value, or a row group's
    # statistics (min == max), fix y at -1 it makes one, which Arrow's simplification with
    # the other columns' min/max orders above every bound: statistics pruned the row groups
    # of k=0/ and of y = -1 for "not (x < ...)", whose rows all pass.
    tables = []
    for k in (0, 1):
        table = pa.table({"id": np.arange(6 * k, 6 * k + 6), "x": pa.array([1, 2, 3, 4, None, 6], pa.int64()),
                          "y": pa.array([-1, -1, -1, 4, 4, 4], pa.int64())})
        (tmp_path / f"k={k}").mkdir()
        pq.write_table(table, tmp_path / f"k={k}" / "a.parquet", row_group_size=3)
        tables.append(table.append_column("k", pa.array([k] * 6, pa.int64())))
    whole = pa.concat_tables(tables)
    x, k, y = pc.field("x"), pc.field("k").cast(pa.float64()), pc.field("y").cast(pa.float64())
    for made in (pc.sqrt(k - 1.0), pc.divide(k, 0.0), pc.sqrt(y), pc.divide(y + 1.0, 0.0)):  # NaN: k=0, y=-1
        for expression in (~(x < made), ~(x >= made), x < made):
            got, _ = loaded_ids(tmp_path, expression)
            assert got.tolist() == _row_by_row(whole, expression), str(expression)


def test_the_string_syntax_takes_uint64_literals_and_refuses_comparisons_with_none(tmp_path):
    table = pa.table({"id": np.arange(4), "u": pa.array([1, 2**63 + 1, 3, 2**63 + 1], pa.uint64()),
                      "x": pa.array([None, 1, None, 2], pa.int64())})
    pq.write_table(table, tmp_path / "a.parquet")
    assert loaded_ids(tmp_path, "u == 9223372036854775809")[0].tolist() == [1, 3]  # was 'C long' overflow
    assert loaded_ids(tmp_path, "u in [9223372036854775809, 1]")[0].tolist() == [0, 1, 3]
    with pytest.raises(ValueError, match="compare with None by 'is None'"):  # kept no row, silently
        pqloader.Loader(str(tmp_path), filter="x == None")
    assert loaded_ids(tmp_path, "x is None")[0].tolist() == [0, 2]


def test_a_set_of_values_parses_in_the_order_written_whatever_the_hash_seed():
    # A set literal's order follows its strings' hashes, another per process
    # (PYTHONHASHSEED): a state saved with "s in {...}" was refused by the next process
    # as taken with another filter, and ranks kept their selections under other keys.
    import subprocess

    from conftest import subprocess_env
    text = "s in {'alpha', 'beta', 'gamma', 'delta', 'eps', 'beta'}"
    written = str(pc.field("s").isin(["alpha", "beta", "gamma", "delta", "eps"]))
    assert str(pqloader.parse_filter(text)) == written
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", f"import pqloader; print(pqloader.parse_filter({text!r}))"],
                             capture_output=True, text=True, timeout=600,
                             env={**subprocess_env(), "PYTHONHASHSEED": seed})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == written, seed


@pytest.mark.parametrize("n", [5, 250])
def test_a_state_of_an_isin_over_a_python_set_loads_in_a_process_of_another_hash_seed(tmp_path, n):
    # pc.field("lang").isin({...}) takes the set's order, another per process for strings
    # (PYTHONHASHSEED): a state saved in one process was refused by the next as taken with
    # another filter, and merge_states refused the states of ranks in their own processes
    # (n = 250: a set Arrow prints abbreviated, told apart by a hash of the expression).
    import json
    import subprocess

    from conftest import ids_of, subprocess_env
    values = [f"v{i:03d}" for i in range(n + 1)]
    pq.write_table(pa.table({"id": np.arange(2 * n + 2), "lang": values + values}),
                   tmp_path / "a.parquet", row_group_size=n // 2 + 1)
    make = ("import json, sys, pyarrow.compute as pc, pqloader\n"
            "def make(rank):\n"
            f"    return pqloader.Loader({str(tmp_path)!r}, batch_size=2, shuffle=True, seed=1, columns=['id'],\n"
            f"        rank=rank, world_size=2, filter=pc.field('lang').isin(set({values[:n]!r})))\n")
    save = make + ("l = make(int(sys.argv[1])); it = iter(l); next(it); next(it)\n"
                   "print(json.dumps(l.state_dict()))\n")
    states = []
    for rank, seed in ((0, "1"), (1, "2")):
        out = subprocess.run([sys.executable, "-c", save, str(rank)], capture_output=True, text=True,
                             timeout=600, env={**subprocess_env(), "PYTHONHASHSEED": seed})
        assert out.returncode == 0, out.stderr
        states.append(json.loads(out.stdout))
    namespace: dict = {}
    exec(make, namespace)
    for rank, state in enumerate(states):
        whole = ids_of(list(namespace["make"](rank)))
        loader = namespace["make"](rank)
        loader.load_state_dict(state)  # was refused: "filter: state has ..."
        assert ids_of(list(loader)) == whole[4:]
    merged = pqloader.merge_states(states)  # was refused: "rank 1's state differs from rank 0's"
    loader = namespace["make"](1)
    loader.load_state_dict(merged)
    assert ids_of(list(loader)) == ids_of(list(namespace["make"](1)))[4:]


def test_the_string_syntax_names_columns_as_written_not_as_python_folds_identifiers(tmp_path):
    # Python folds identifiers to NFKC: "µs" (micro sign) became "μs" (Greek mu), another
    # column, filtered silently; "ﬁle" became "file", no column.
    table = pa.table({"id": np.arange(4), "\u00b5s": [0, 5, 10, 15], "\u03bcs": [100] * 4,
                      "\ufb01le": [1, 2, 1, 2]})
    pq.write_table(table, tmp_path / "a.parquet")
    assert loaded_ids(tmp_path, "\u00b5s > 5")[0].tolist() == [2, 3]
    assert loaded_ids(tmp_path, "\u03bcs > 5")[0].tolist() == [0, 1, 2, 3]
    assert loaded_ids(tmp_path, "not \ufb01le == 1")[0].tolist() == [1, 3]
    # On other lines, after other non-ASCII text ("é" is two UTF-8 bytes, as Python's
    # offsets count), line breaks of each kind.
    for text in ("(\ufb01le == 2 and\r\n  '\u00e9' != 'x' and \u00b5s > 5)",
                 "('\u00e9\u00e9' == '\u00e9\u00e9' and\r \u00b5s > 5 and\n\ufb01le == 2)"):
        assert loaded_ids(tmp_path, text)[0].tolist() == [3], text


def test_columns_named_otherwise_than_python_names_are_written_in_backticks(tmp_path):
    table = pa.table({"id": [0, 1, 2, 3], "my-col": [1, 5, 7, 9], "class": ["a", "b`", "a", "c"],
                      "x": ["`my-col`", "q", "`my-col`", "q"], "_pq_column_0": [0, 0, 1, 1]})
    pq.write_table(table, tmp_path / "a.parquet")
    assert loaded_ids(tmp_path, "`my-col` > 3")[0].tolist() == [1, 2, 3]
    assert loaded_ids(tmp_path, "`class` == 'b`' or `class` == \"c\"")[0].tolist() == [1, 3]
    # a backtick inside a string literal is the literal's; a name the text already uses
    assert loaded_ids(tmp_path, "x == '`my-col`' and `my-col` < 7")[0].tolist() == [0]
    assert loaded_ids(tmp_path, "_pq_column_0 == 1 and `my-col` in [7]")[0].tolist() == [2]
    assert loaded_ids(tmp_path, "`id` >= 2 and not `class` is None")[0].tolist() == [2, 3]


def test_two_backtick_names_beside_the_stand_in_name_stay_two_columns(tmp_path):
    # With `_pq_column_0` in the text, both quoted names were given `_pq_column_1`: the
    # first was read as the second ("`a-b` == 1 and `c-d` == 0" filtered c-d == 1 and
    # c-d == 0), and no row was kept.
    table = pa.table({"id": [0, 1, 2, 3], "a-b": [1, 1, 0, 0], "c-d": [0, 1, 0, 1], "_pq_column_0": [5] * 4})
    pq.write_table(table, tmp_path / "a.parquet")
    assert loaded_ids(tmp_path, "`a-b` == 1 and `c-d` == 0 and _pq_column_0 == 5")[0].tolist() == [0]


@pytest.mark.parametrize("text, says", [
    ("1 in i", "'in' needs a list of values, not the column 'i'"),  # was "'i' is neither a column nor ..."
    ("i in 3", "'in' needs a list of values"),
    ("f(i) > 1", "is neither a column nor a literal"),
    ("my-col > 1", "written in backticks"),
    ("`my-col > 1", "a `quoted column name` is not closed"),
    ("``` > 1", "a `quoted column name` is not closed"),  # ``: a backtick in the name
    ("1 in `my col`", "'in' needs a list of values, not the column 'my col'"),
    ("`my-col` + 1 > 3", "'`my-col` + 1' is neither a column nor a literal"),  # was '_pq_column_0 + 1'
    ("f(`a b`) and x", "'f(`a b`)' is not a comparison"),
])
def test_malformed_string_filters_say_what_is_wrong(text, says):
    with pytest.raises(ValueError) as e:
        pqloader.parse_filter(text)
    assert says in str(e.value)
    with pytest.raises(ValueError) as e:  # a long one is shortened (1 MB made a 1 MB message)
        pqloader.parse_filter(text + " and x == '" + "a" * 100_000 + "'")
    assert len(str(e.value)) < 1000


@pytest.mark.parametrize("text", ["x in [1, 'a']", "x == 1j"])
def test_a_literal_pyarrow_cannot_convert_is_a_value_error_naming_the_filter(text):
    with pytest.raises(ValueError, match="^filter ") as e:  # was pyarrow's, without the filter
        pqloader.parse_filter(text)
    assert not isinstance(e.value, pa.ArrowException)


def test_files_that_differ_only_in_their_arrow_string_types_filter_each_with_its_own(tmp_path):
    """string in one file, large_string in another (pyarrow and Polars write them so; the
    Parquet schemas are equal): a Predicate saw the second file's int64 offsets as int32
    and kept wrong rows, an expression filter failed to bind; dictionary vs plain too."""
    d = tmp_path / "drift"
    d.mkdir()
    pq.write_table(pa.table({"id": [0, 1], "x": pa.array(["a", "bb"])}), d / "p0.parquet")
    pq.write_table(pa.table({"id": [2, 3, 4, 5],
                             "x": pa.array(["ccc", "", "a", "dd"], pa.large_string())}), d / "p1.parquet")
    pq.write_table(pa.table({"id": [6, 7], "x": pa.array(["a", "e"]).dictionary_encode()}),
                   d / "p2.parquet")
    pq.write_table(pa.table({"id": [8, 9], "x": pa.array(["a", "ff"], pa.large_string())}),
                   d / "p3.parquet")
    every = pads.dataset(str(d)).to_table(columns=["id"])["id"].to_pylist()
    assert every == list(range(10))

    def ids(filter_):
        loader = pqloader.Loader(str(d), columns=["id"], filter=filter_, batch_size=3, num_workers=1)
        return sorted(v for b in loader for v in b["id"].tolist())

    for value, want in (("a", [0, 4, 6, 8]), ("", [3]), ("dd", [5])):
        def equal(batch, value=value):
            return pc.equal(batch.column(0).cast(pa.large_string()), value)
        assert ids(pqloader.Predicate(["x"], equal)) == want, value
        assert ids(pc.field("x") == value) == want, value


@pytest.mark.parametrize("kept", [False, True])
def test_verify_checksums_covers_the_filter_columns_and_their_stored_selection(tmp_path, kept):
    """A filter column's page that no longer matches its CRC decodes (uncompressed,
    plain) to another value: with verify_checksums=True its rows must not be kept or
    dropped by that value. The mask pass read without verification (row 500 dropped
    silently), and a selection stored by a loader without it would serve one with it."""
    path = tmp_path / "crc.parquet"
    y = np.arange(1000, dtype=np.int64) + 0x1111111111
    pq.write_table(pa.table({"x": np.arange(1000), "y": y}), path, compression="none",
                   use_dictionary=False, write_page_checksum=True, write_statistics=False)
    data = bytearray(path.read_bytes())
    at = data.find(int(y[500]).to_bytes(8, "little"))
    assert at > 0
    data[at + 7] ^= 0x80  # y[500] becomes negative
    path.write_bytes(bytes(data))
    cache_dir = str(tmp_path / "cache") if kept else None

    def load(**kw):
        loader = pqloader.Loader(str(path), columns=["x"], batch_size=1000, filter="y > 0",
                                 cache_dir=cache_dir, **kw)
        return sorted(v for b in loader for v in b["x"].tolist())

    assert 500 not in load()  # unverified: the damaged value is what the file holds
    with pytest.raises(pqloader.InvalidDataError, match="crc.parquet.*row group 0.*CRC"):
        load(verify_checksums=True)


@pytest.mark.parametrize("how", ["expression", "predicate"])
def test_zero_row_row_group_is_filtered_like_pyarrow(tmp_path, how):
    # pyarrow writes an empty table as one row group of 0 rows; reading it for a row mask
    # gave "Must pass at least one array" (no file, no row group) instead of no rows.
    pq.write_table(pa.table({"x": pa.array([], pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([1, 2, 3], pa.int64())}), tmp_path / "b.parquet")
    assert pq.ParquetFile(tmp_path / "a.parquet").metadata.num_row_groups == 1
    f = "x > 1" if how == "expression" else pqloader.Predicate(["x"], lambda b: pc.greater(b["x"], 1))
    got = [v for b in pqloader.Loader(str(tmp_path), filter=f) for v in b["x"].tolist()]
    assert got == pads.dataset(str(tmp_path)).to_table(filter=pc.field("x") > 1)["x"].to_pylist()


def test_the_filter_sees_the_types_the_loader_loads_not_each_files_own(tmp_path):
    """A filter compares the values the batches hold: of the unified (or declared) type,
    as pyarrow's dataset casts each file to its schema before filtering. Bound to each
    file's own type, "x / 2 == 1.5" divided int64 x as integers (row 0 lost), "a - b < 0"
    overflowed uint32 and "d in [-2.12]" could not cast decimal(5, 1) to decimal(3, 2)."""
    def check(name, tables, flt, schema=None):
        d = tmp_path / name
        d.mkdir()
        for i, t in enumerate(tables):
            pq.write_table(t, d / f"{i}.parquet")
        kwargs = {} if schema is None else {"schema": schema}
        loader = pqloader.Loader(str(d), columns=["id"], filter=flt, batch_size=10, num_epochs=1,
                                 **kwargs)
        got = [v for b in loader for v in b["id"].tolist()]
        types = schema if schema is not None else pa.schema(pqloader.Loader(str(d)).arrow_schema)
        assert got == pads.dataset(str(d), schema=types).to_table(filter=flt)["id"].to_pylist()
        return got

    assert check("int_to_float",
                 [pa.table({"id": [0, 1], "x": pa.array([3, 4], pa.int64())}),
                  pa.table({"id": [2, 3], "x": pa.array([3.0, 4.0])})],
                 pc.field("x") / 2 == 1.5,
                 pa.schema([("id", pa.int64()), ("x", pa.float64())])) == [0, 2]
    assert check("uint32_to_int64",
                 [pa.table({"id": [0, 1], "a": pa.array([1, 5], pa.uint32()),
                            "b": pa.array([2, 3], pa.uint32())}),
                  pa.table({"id": [2, 3], "a": pa.array([1, 5], pa.int64()),
                            "b": pa.array([2, 3], pa.int64())})],
                 pc.field("a") - pc.field("b") < 0) == [0, 2]
    from decimal import Decimal
    assert check("decimals",
                 [pa.table({"id": [0, 1], "d": pa.array([Decimal("30.5"), Decimal("-2.1")],
                                                        pa.decimal128(5, 1))}),
                  pa.table({"id": [2, 3], "d": pa.array([Decimal("-2.12"), Decimal("1")],
                                                        pa.decimal128(12, 4))})],
                 pc.field("d").isin(pa.array([Decimal("-2.12")], pa.decimal128(3, 2)))) == [2]


def test_a_selection_kept_for_one_type_of_a_partition_key_never_serves_another(tmp_path):
    """schema= can type a key from the paths as str ("01" kept) where it would load as
    int64: the stored selection's key named the keys but not their types."""
    for i, p in enumerate(["01", "1", "2"]):
        (tmp_path / "data" / f"p={p}").mkdir(parents=True)
        pq.write_table(pa.table({"id": [i]}), tmp_path / "data" / f"p={p}" / "f.parquet")
    flt = pc.field("p").cast(pa.string()) == "1"
    as_text = pa.schema([("id", pa.int64()), ("p", pa.string())])

    def ids(**kwargs):
        loader = pqloader.Loader(str(tmp_path / "data"), columns=["id"], filter=flt,
                                 batch_size=10, num_epochs=1, **kwargs)
        return [v for b in loader for v in b["id"].tolist()]

    assert ids() == [0, 1] and ids(schema=as_text) == [1]
    cache_dir = str(tmp_path / "cache")
    assert ids(cache_dir=cache_dir) == [0, 1]
    assert ids(schema=as_text, cache_dir=cache_dir) == [1]


def test_a_file_where_the_column_is_all_null_does_not_undo_the_loaded_type(tmp_path):
    """A file whose column is all null (pyarrow stores it as type null) still loads as
    the unified type: the other files are compared in it too, not each in its own
    (uint32 "a - b" overflowed)."""
    pq.write_table(pa.table({"id": [0, 1], "a": pa.array([1, 5], pa.uint32()),
                             "b": pa.array([2, 3], pa.uint32())}), tmp_path / "0.parquet")
    pq.write_table(pa.table({"id": [2, 3], "a": pa.array([1, 5], pa.int64()),
                             "b": pa.array([2, 3], pa.int64())}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"id": [4], "a": pa.array([None], pa.null()),
                             "b": pa.array([None], pa.null())}), tmp_path / "2.parquet")
    flt = pc.field("a") - pc.field("b") < 0
    loader = pqloader.Loader(str(tmp_path), columns=["id"], filter=flt, batch_size=10,
                             num_epochs=1)
    got = [v for b in loader for v in b["id"].tolist()]
    types = pa.schema([("id", pa.int64()), ("a", pa.int64()), ("b", pa.int64())])
    assert got == pads.dataset(str(tmp_path), schema=types).to_table(filter=flt)["id"].to_pylist()
    assert got == [0, 2]


def test_integers_a_declared_float_holds_exactly_are_filtered_as_they_load(tmp_path):
    """2**53 + 2 converts to float64 exactly, so schema= loads it; the filter compares
    the same values (Arrow's safe cast refuses every integer past 2**53). One that does
    not convert exactly is refused as loading refuses it."""
    pq.write_table(pa.table({"id": [0, 1], "x": pa.array([2**53 + 2, 5], pa.int64())}),
                   tmp_path / "0.parquet")
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])

    def ids(flt):
        loader = pqloader.Loader(str(tmp_path), columns=["id"], filter=flt, schema=schema,
                                 batch_size=10, num_epochs=1)
        return [v for b in loader for v in b["id"].tolist()]

    loaded = [v for b in pqloader.Loader(str(tmp_path), schema=schema, batch_size=10,
                                         num_epochs=1) for v in b["x"].tolist()]
    assert loaded == [float(2**53 + 2), 5.0]
    assert ids(pc.field("x") > 2) == [0, 1]
    assert ids(pc.field("x") < 100) == [1]
    pq.write_table(pa.table({"id": [0, 1], "x": pa.array([2**53 + 1, 5], pa.int64())}),
                   tmp_path / "0.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match="9007199254740993"):
        ids(pc.field("x") > 2)


def test_statistics_of_values_a_declared_type_cannot_hold_do_not_prune(tmp_path):
    """schema= declares a column only the filter reads narrower than its file stores it:
    the row group's statistics (5 .. 2**32 + 3) wrapped to int32 (5 .. 3) and pruned it,
    row 1 (7 > 6) lost without an error; pyarrow's cast refuses 2**32 + 3."""
    pq.write_table(pa.table({"id": [0, 1, 2], "x": pa.array([5, 7, 2**32 + 3], pa.int64())}),
                   tmp_path / "0.parquet")
    schema = pa.schema([("id", pa.int64()), ("x", pa.int32())])
    flt = pc.field("x") > 6
    with pytest.raises(pa.ArrowInvalid):
        pads.dataset(str(tmp_path), schema=schema).to_table(filter=flt)
    with pytest.raises(pqloader.InvalidDataError, match="4294967299"):
        list(pqloader.Loader(str(tmp_path), columns=["id"], schema=schema, filter=flt,
                             batch_size=10, num_epochs=1))


@pytest.mark.parametrize("declared", [None, pa.float32(), pa.float64()])
def test_a_float16_file_of_a_column_loaded_as_a_wider_float_is_filtered_in_it(tmp_path, declared):
    # The float16 file was bound in its own type (no kernel compares halffloat): refused,
    # where the column loads as float32 (unified) or as declared.
    pq.write_table(pa.table({"id": [0, 1], "v": pa.array(np.array([np.nan, 0.1], np.float16))}),
                   tmp_path / "0.parquet")
    if declared is None:
        pq.write_table(pa.table({"id": [2, 3], "v": pa.array(np.array([0.1, 65504], np.float32))}),
                       tmp_path / "1.parquet")
    loaded = declared or pa.float32()
    schema = pa.schema([("id", pa.int64()), ("v", loaded)])
    flt = pc.field("v") > 0.09
    got = [v for b in pqloader.Loader(str(tmp_path), columns=["id"], filter=flt, batch_size=10,
                                      schema=None if declared is None else schema)
           for v in b["id"].tolist()]
    assert got == pads.dataset(str(tmp_path), schema=schema).to_table(filter=flt)["id"].to_pylist()
    assert got == ([1, 2, 3] if declared is None else [1])


def test_a_stored_key_that_disagrees_with_its_path_is_refused_under_a_filter_too(tmp_path):
    # A file under k=a/ storing k = 'b': refused unfiltered, but with k == 'a' its row
    # groups were pruned by those very statistics before the check, which then saw none
    # of them (0 rows, no error).
    (tmp_path / "k=a").mkdir()
    pq.write_table(pa.table({"x": [1, 2], "k": ["b", "b"]}), tmp_path / "k=a" / "f.parquet")
    (tmp_path / "k=c").mkdir()
    pq.write_table(pa.table({"x": [3], "k": ["c"]}), tmp_path / "k=c" / "f.parquet")
    for flt in (None, "k == 'a'", pc.field("k") == "a"):
        with pytest.raises(pqloader.SchemaMismatchError, match=r"partition key 'k' is 'a' in the path"):
            pqloader.Loader(str(tmp_path), batch_size=4, filter=flt)


@pytest.mark.parametrize("first,second", [
    (pa.array(["apple", "kiwi"]).dictionary_encode(), pa.array(["avocado", "fig"])),
    (pa.array([b"ab", b"zz"], pa.binary(2)), pa.array([b"ax", b"q"])),
    (pa.array(["apple", "kiwi"], pa.string_view()), pa.array(["avocado", "fig"], pa.string_view())),
], ids=["dictionary_and_string", "fixed_size_binary_and_binary", "string_view"])
def test_string_functions_filter_files_of_another_layout(tmp_path, first, second):
    # Bound to each file's own layout, "starts_with" had no kernel for a dictionary or
    # fixed-size binary file (pyarrow's dataset casts each file to the loaded type first),
    # and nothing compared a string_view column.
    pq.write_table(pa.table({"id": [0, 1], "s": first}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2, 3], "s": second}), tmp_path / "b.parquet")
    f = pc.starts_with(pc.field("s"), "a")
    got = sorted(int(i) for b in pqloader.Loader(str(tmp_path), filter=f, columns=["id"]) for i in b["id"])
    assert got == [0, 2]
    if first.type != pa.string_view():
        schema = pa.schema(pqloader.Loader(str(tmp_path)).arrow_schema)
        assert sorted(pads.dataset(str(tmp_path), schema=schema).to_table(filter=f)["id"].to_pylist()) == got


def test_float16_columns_are_filtered_as_float32(tmp_path):
    # No Arrow kernel compares float16: the filter was refused naming halffloat. As float32
    # (which holds each value exactly) it compares as numpy does.
    v = np.array([0.5, -1.0, np.nan, 65504, 0.1], np.float16)
    pq.write_table(pa.table({"id": np.arange(5), "v": pa.array(v)}), tmp_path / "h.parquet")
    got = [int(i) for b in pqloader.Loader(str(tmp_path), filter="v > 0.25", columns=["id"]) for i in b["id"]]
    assert got == [i for i in range(5) if v.astype(np.float32)[i] > 0.25] == [0, 3]


@pytest.mark.parametrize("other", [pa.list_(pa.int64()), pa.large_list(pa.int64()), pa.list_(pa.int64(), 1)])
def test_a_filter_on_a_list_column_computes_in_the_loaded_list_type(tmp_path, other):
    # An int32 file's values beside an int64 (large, fixed-size) one: the column loads as
    # a list of int64 and pyarrow's dataset casts each file to it before the filter. The
    # filter ran in each file's own type: the product wrapped in int32 and row 0 was
    # dropped (multiply) or refused (multiply_checked); a file whose column is all null
    # (type null) made list_value_length "not apply".
    pq.write_table(pa.table({"id": [0, 1], "l": pa.array([[30000], [4]], pa.list_(pa.int32()))}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2, 3], "l": pa.array([[9], [1]], other)}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": [4], "l": pa.array([None], pa.null())}), tmp_path / "c.parquet")
    loaded = pqloader.Loader(str(tmp_path), lists={"l": "ragged"}, null_mask=["l"])
    schema = pa.schema(loaded.arrow_schema)
    for f in (pc.multiply(pc.list_element(pc.field("l"), 0), 100000) > 10**9,
              pc.multiply_checked(pc.list_element(pc.field("l"), 0), 100000) > 10**9,
              pc.list_value_length(pc.field("l")) > 0):
        want = sorted(pads.dataset(tmp_path, schema=schema).to_table(filter=f)["id"].to_pylist())
        got = sorted(i for b in pqloader.Loader(str(tmp_path), lists={"l": "ragged"}, null_mask=["l"], filter=f) for i in b["id"].tolist())
        assert got == want, (f, got, want)


def _column_of(loader, column="id"):
    return [v for b in loader for v in b[column].tolist()]


@pytest.mark.parametrize("declared", [None, pa.list_(pa.float32())])
def test_a_list_of_float16_is_filtered_as_a_list_of_float32(tmp_path, declared):
    # README: float16 is compared in a filter as float32; design.md: lists of
    # numbers in the loaded list type. list<halffloat> was refused ("no kernel matching
    # input types (halffloat, int8)"), also under a declared list<float32>.
    pq.write_table(pa.table({"id": [0, 1], "l": pa.array([[1.5], [2.5]], pa.list_(pa.float16()))}),
                   tmp_path / "a.parquet")
    flt = pc.list_element(pc.field("l"), 0) > 2
    schema = None if declared is None else pa.schema([("id", pa.int64()), ("l", declared)])
    got = _column_of(pqloader.Loader(str(tmp_path), batch_size=4, columns=["id"], filter=flt, schema=schema))
    assert got == [1]


def test_a_list_of_fixed_size_lists_is_filtered_in_the_loaded_type(tmp_path):
    # filter-v10 covers one list level: list<fixed_size_list<int32, 1>> beside
    # list<fixed_size_list<int64, 1>> loads as int64 but was filtered in the int32 file's
    # type (overflow error).
    pq.write_table(pa.table({"id": [0, 1], "l": pa.array([[[1]], [[3]]], pa.list_(pa.list_(pa.int32(), 1)))}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2], "l": pa.array([[[4]]], pa.list_(pa.list_(pa.int64(), 1)))}),
                   tmp_path / "b.parquet")
    flt = pc.list_element(pc.list_element(pc.field("l"), 0), 0) * 1_000_000_000 >= 2_000_000_000
    assert sorted(_column_of(pqloader.Loader(str(tmp_path), batch_size=4, columns=["id"], filter=flt))) == [1, 2]


@pytest.mark.parametrize("flt", ["k == 'a'", "k == 'b'"])
def test_a_stored_key_that_disagrees_with_its_path_is_refused_when_only_the_filter_reads_it(tmp_path, flt):
    # The stored key was checked against its path only where selected:
    # with columns=['x'] the filter reads the file's 'b' under k=a/ and keeps or drops
    # the rows with no error (the same filter with k selected is refused).
    (tmp_path / "k=a").mkdir()
    pq.write_table(pa.table({"x": [1, 2], "k": ["b", "b"]}), tmp_path / "k=a" / "f.parquet")
    (tmp_path / "k=c").mkdir()
    pq.write_table(pa.table({"x": [3], "k": ["c"]}), tmp_path / "k=c" / "f.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match=r"partition key 'k' is 'a' in the path"):
        pqloader.Loader(str(tmp_path), batch_size=4, columns=["x"], filter=flt)


@pytest.mark.parametrize("layout", [[4], [1, 1, 1, 1]], ids=["one_row_group", "row_groups_of_one"])
def test_an_integer_bound_a_float_column_does_not_hold_prunes_nothing(tmp_path, layout):
    # Under a declared float64, an int64 row group of 2^53 + 1 had its statistics rounded
    # to 2^53: "x > 2.0**53" pruned it (a row lost, silently) where one row group with a
    # smaller min was read and refused; pyarrow refuses in both layouts.
    big = 2**53 + 1
    pq.write_table(pa.table({"x": pa.array([big, 1, big, big], pa.int64())}), tmp_path / "a.parquet",
                   row_group_size=layout[0])
    schema = pa.schema([("x", pa.float64())])
    with pytest.raises(pa.ArrowInvalid):
        pads.dataset(str(tmp_path), schema=schema).to_table(filter=pc.field("x") > 2.0**53)
    for flt in (pc.field("x") > 2.0**53, pc.field("x") < 6.0):
        with pytest.raises(pqloader.SchemaMismatchError, match=str(big)):
            collect(pqloader.Loader(str(tmp_path), schema=schema, filter=flt))
    # Exact bounds still prune.
    pq.write_table(pa.table({"x": pa.array([2**60, 5], pa.int64())}), tmp_path / "a.parquet", row_group_size=1)
    loader = pqloader.Loader(str(tmp_path), schema=schema, filter=pc.field("x") < 6.0)
    assert collect(loader)["x"].tolist() == [5.0]
    assert loader.stats()["filter_row_groups_pruned_statistics"] == 1


def test_the_exact_bound_of_an_integer_row_group_still_prunes_under_a_float(tmp_path):
    # [-93, 2^63 - 1] under a declared float64: the max is not exact, the min is, so
    # "x < -510" prunes the row group, as pyarrow does (pqloader read it, and refused
    # 2^63 - 1 as inexact, naming -93, the first value).
    pq.write_table(pa.table({"x": pa.array([-93, 2**63 - 1, 84], pa.int64())}), tmp_path / "a.parquet")
    schema = pa.schema([("x", pa.float64())])
    flt = pc.field("x") < -510.0
    assert pads.dataset(str(tmp_path), schema=schema).to_table(filter=flt).num_rows == 0
    loader = pqloader.Loader(str(tmp_path), schema=schema, filter=flt)
    assert len(collect(loader).get("x", [])) == 0
    assert loader.stats()["filter_row_groups_pruned_statistics"] == 1
    # A filter the bound does not settle reads the column, and names the inexact value.
    with pytest.raises(pqloader.SchemaMismatchError, match=str(2**63 - 1)):
        collect(pqloader.Loader(str(tmp_path), schema=schema, filter=pc.field("x") > 0.0))


def test_a_filter_of_too_many_calls_is_refused_not_a_crash(tmp_path):
    # Arrow's simplification recurses once per link of an and/or chain: 10,000 "or"s (a
    # string or an expression) killed the process (a segmentation fault; pyarrow's own
    # dataset too). In a child, as a crash would end this process.
    import subprocess

    from conftest import subprocess_env
    pq.write_table(pa.table({"id": np.arange(10), "i": np.arange(10)}), tmp_path / "a.parquet")
    script = ("import functools, operator, sys, pyarrow.compute as pc, pqloader\n"
              "text = ' or '.join(f'i == {k}' for k in range(10000))\n"
              "expr = functools.reduce(operator.or_, [pc.field('i') == k for k in range(10000)])\n"
              "for f in (text, expr):\n"
              "    try:\n"
              "        pqloader.Loader(sys.argv[1], filter=f)\n"
              "    except ValueError as e:\n"
              "        print(str(e)[-160:])\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("more than the 2000") == 2 and "x in [...]" in done.stdout, done.stdout
    text = " or ".join(f"i == {k}" for k in range(500))  # 999 calls: taken
    assert loaded_ids(tmp_path, text)[0].tolist() == list(range(10))


def test_states_tell_apart_value_sets_whose_strings_print_alike(tmp_path):
    # Arrow prints an isin's strings unescaped, one a line: ['a",\n  "b'] read as two values.
    pq.write_table(pa.table({"id": np.arange(8), "s": ["a", "b"] * 4}), tmp_path / "a.parquet")
    one = pqloader.Loader(str(tmp_path), batch_size=2, filter=pc.field("s").isin(['a",\n  "b']))
    two = pqloader.Loader(str(tmp_path), batch_size=2, filter=pc.field("s").isin(["a", "b"]))
    assert one.num_rows == 0 and two.num_rows == 8
    with pytest.raises(pqloader.InvalidDataError, match="different options: filter: state has"):
        two.load_state_dict(one.state_dict())
    plain = pqloader.Loader(str(tmp_path), filter=pc.field("s").isin(["a", "b"]))
    assert "#" not in plain.state_dict()["options"]["transforms"]  # other states keep their form


def test_a_refused_state_of_a_long_value_set_shows_where_the_filters_differ(tmp_path):
    # Arrow abbreviates a long value set ("..."), so two filters print alike for more than
    # the 200 characters shown and differ only in the hash after them: the message showed
    # the same two beginnings ("state has '...-22,\n  -', loader has '...-22,\n  -'").
    # (Differing in the middle once sorted, as the engine sorts an is_in's values.)
    pq.write_table(pa.table({"id": np.arange(120)}), tmp_path / "a.parquet")
    one = pqloader.Loader(str(tmp_path), batch_size=2, filter=pc.field("id").isin(list(range(0, 120, 2))))
    two = pqloader.Loader(str(tmp_path), batch_size=2,
                          filter=pc.field("id").isin([*range(0, 60, 2), 61, *range(62, 120, 2)]))
    with pytest.raises(pqloader.InvalidDataError, match="different options: filter: state has") as e:
        two.load_state_dict(one.state_dict())
    state, loader = str(e.value).split("state has ", 1)[1].split(", loader has ", 1)
    assert "#" in state and "#" in loader, str(e.value)  # the hashes, where they differ
    assert state != loader.split(" (alike for")[0], str(e.value)


def test_the_error_of_a_predicate_failing_on_several_row_groups_names_the_first(tmp_path):
    # The first error in time was reported: "row group 7" now and then, "row group 0"
    # mostly (and which exception class, where they differ).
    import random
    import time
    for i in range(4):
        pq.write_table(pa.table({"x": np.arange(100) + 100 * i}), tmp_path / f"f{i}.parquet", row_group_size=10)

    def f(b):
        time.sleep(random.random() * 0.01)
        if b["x"][0].as_py() % 70 == 0:
            raise ValueError(f"bad at {b['x'][0].as_py()}")
        return pc.less(b["x"], 1000)

    for _ in range(10):
        with pytest.raises(pqloader.Error, match=r"f0.parquet', row group 0\b.*bad at 0"):
            pqloader.Loader(str(tmp_path), num_workers=4, filter=pqloader.Predicate(["x"], f))


def test_a_filter_failing_on_a_partition_value_names_the_file_and_key(tmp_path):
    # It said only "divide by zero" (the keys' values are folded into the filter per file).
    (tmp_path / "p=1").mkdir()
    pq.write_table(pa.table({"id": [0]}), tmp_path / "p=1" / "f.parquet")
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"filter .*divide_checked.* on the partition keys of '.*f\.parquet' \(p=1\).*divide by zero"):
        pqloader.Loader(str(tmp_path), filter=pc.divide_checked(pc.field("p"), 0) == 1)



def test_options_with_filters_compare_by_the_filter_they_hold():
    from pqloader._options import LoaderOptions
    expr = pads.field("x") > 1
    assert LoaderOptions(filter=expr) == LoaderOptions(filter="x > 1")
    assert LoaderOptions(filter=expr) == LoaderOptions(filter=[pads.field("x") > 1])
    assert LoaderOptions(filter=expr) != LoaderOptions(filter=pads.field("x") > 2)
    assert LoaderOptions(filter=expr) != LoaderOptions()
    pred = pqloader.Predicate(["x"], lambda t: t)
    assert LoaderOptions(filter=pred) == LoaderOptions(filter=pred)
    assert LoaderOptions(filter=pred) != LoaderOptions(filter=pqloader.Predicate(["x"], lambda t: t))


def test_a_decimal_isin_of_floats_keeps_the_rows_of_the_row_by_row_filter_whatever_the_row_groups(tmp_path):
    """Arrow's is_in casts a float value set to a decimal column's type, rounding each
    value to its scale (4.996 of a decimal(9, 2) column is 5.00), where the statistics'
    guarantee compared the bounds with the float itself (4.00..4.99 and 5.00..5.99
    "cannot hold" 4.996): row groups of 100 rows kept nothing, one row group kept 5.00.
    Statistics only prune: the rows are the filter's evaluated row by row."""
    from decimal import Decimal
    table = pa.table({"id": pa.array(range(1000), pa.int64()),
                      "x": pa.array([Decimal(i).scaleb(-2) for i in range(1000)],
                                    pa.decimal128(9, 2))})
    for rows in (1000, 100):
        (tmp_path / str(rows)).mkdir()
        pq.write_table(table, tmp_path / str(rows) / "f.parquet", row_group_size=rows)
    for flt in (pc.field("x").isin([4.996]), "x in [4.996]", "x not in [4.996]"):
        got = {}
        for name, rows in (("one", 1000), ("many", 100)):
            d = tmp_path / str(rows)
            loader = pqloader.Loader(str(d), columns=["id"], filter=flt, batch_size=1000,
                                     num_epochs=1)
            got[name] = sorted(v for b in loader for v in b["id"].tolist())
        # (row by row, as pyarrow evaluates one row group: the set's 4.996 is 5.00)
        want = [500] if "not" not in str(flt) else [i for i in range(1000) if i != 500]
        assert got["one"] == want
        assert got["many"] == want


@pytest.mark.parametrize("fn", [None, 5, "x > 1", pc.field("x") > 1])
def test_predicate_refuses_a_function_that_is_not_callable(fn):
    # Refused where it is built, naming the type (a mutant that let it through survived).
    with pytest.raises(TypeError, match=f"Predicate fn must be callable, got {type(fn).__name__}"):
        pqloader.Predicate(["x"], fn)


def test_every_expression_of_a_list_holds(data):
    # filter=[a, b, c]: all must hold. Only the first and the Predicates were tested
    # (a mutant that and-ed the expressions from the third on, dropping the second,
    # survived).
    parts = [pc.field("lang") != "fr", "score > 0.25", pc.field("label") < 3, "ts >= 5"]
    want = expected_ids(data, (pc.field("lang") != "fr") & (pc.field("score") > 0.25)
                        & (pc.field("label") < 3) & (pc.field("ts") >= 5))
    assert 0 < len(want) < len(expected_ids(data, pc.field("lang") != "fr"))
    for n in (2, 3, 4):
        expr = parts[0]
        for p in parts[1:n]:
            expr = expr & (pqloader._filter.parse_filter(p) if isinstance(p, str) else p)
        got, _ = loaded_ids(data, parts[:n])
        np.testing.assert_array_equal(got, expected_ids(data, expr))
    got, _ = loaded_ids(data, parts)
    np.testing.assert_array_equal(got, want)


def test_a_state_of_another_filter_is_labelled_filter_whatever_its_literals_hold(tmp_path):
    # The label split the fingerprint at the first "|pack(" anywhere: a filter literal
    # holding it was reported as "pack: state has ..." (or "pack and filter"), no Pack given.
    pq.write_table(pa.table({"id": np.arange(4), "s": ["a|pack(x", "a|pack(y", "b", "c"]}),
                   tmp_path / "a.parquet")
    a = pqloader.Loader(str(tmp_path), batch_size=1, filter=pc.field("s") == "a|pack(x")
    for other in ("a|pack(y", "b"):
        b = pqloader.Loader(str(tmp_path), batch_size=1, filter=pc.field("s") == other)
        with pytest.raises(pqloader.InvalidDataError, match="different options: filter: state has"):
            b.load_state_dict(a.state_dict())
    # A real Pack's difference is labelled pack, beside the filter's.
    pq.write_table(pa.table({"id": np.arange(4), "s": ["a|pack(x"] * 4,
                             "tokens": [[1, 2], [3], [4, 5, 6], [7]]}), tmp_path / "a.parquet")
    kw = dict(batch_size=1, columns=["tokens"], filter=pc.field("s") == "a|pack(x")
    c = pqloader.Loader(str(tmp_path), pack=pqloader.Pack("tokens", seq_len=4), **kw)
    d = pqloader.Loader(str(tmp_path), pack=pqloader.Pack("tokens", seq_len=5), **kw)
    with pytest.raises(pqloader.InvalidDataError, match="different options: pack: state has"):
        d.load_state_dict(c.state_dict())
    e = pqloader.Loader(str(tmp_path), pack=pqloader.Pack("tokens", seq_len=5),
                        **{**kw, "filter": pc.field("s") == "b"})
    with pytest.raises(pqloader.InvalidDataError, match="different options: pack and filter: state"):
        e.load_state_dict(c.state_dict())


# Typed literals of the string syntax: timestamp('...'), date('...'), time('...'),
# duration(n, 'unit') (before them, "ts > '2024-01-01'" had no kernel and a temporal
# column could not be filtered from a string, nor from the CLI at all).

def _temporal_table():
    """40 rows an hour apart from 2024-01-01 00:00, in row groups of 10 (hours 0-9, ...,
    30-39: statistics prune by time) and each temporal type."""
    import datetime as dt
    hours = [dt.datetime(2024, 1, 1) + dt.timedelta(hours=i) for i in range(40)]
    utc = [h.replace(tzinfo=dt.timezone.utc) for h in hours]
    return pa.table({
        "id": np.arange(40),
        **{f"ts_{u}": pa.array(hours, pa.timestamp(u)) for u in ("s", "ms", "us", "ns")},
        **{f"tz_{u}": pa.array(utc, pa.timestamp(u, "UTC")) for u in ("ms", "us", "ns")},
        "paris": pa.array(utc, pa.timestamp("us", "Europe/Paris")),
        "d32": pa.array([h.date() for h in hours], pa.date32()),
        "d64": pa.array([h.date() for h in hours], pa.date64()),
        "t32": pa.array([h.time() for h in hours], pa.time32("ms")),
        "t64": pa.array([h.time() for h in hours], pa.time64("ns")),
        "dur": pa.array([dt.timedelta(hours=i) for i in range(40)], pa.duration("ms")),
    })


def _temporal_cases():
    import datetime as dt
    utc = dt.timezone.utc
    at = dt.datetime(2024, 1, 2, 1)  # hour 25: row group 2
    cases = []
    for u in ("s", "ms", "us", "ns"):
        cases += [(f"ts_{u} < timestamp('2024-01-02 01:00')", pc.field(f"ts_{u}") < at, 1),
                  (f"ts_{u} >= timestamp('2024-01-02T00:59:59.999')", pc.field(f"ts_{u}") >= at, 2),
                  (f"ts_{u} <= timestamp('2024-01-02 01:00:00.000000001')", pc.field(f"ts_{u}") <= at, None)]
    for u in ("ms", "us", "ns"):  # an instant (UTC), written with an offset or Z
        cases += [(f"tz_{u} < timestamp('2024-01-02T03:00+02:00')", pc.field(f"tz_{u}") < at.replace(tzinfo=utc), 1),
                  (f"tz_{u} > timestamp('2024-01-02 01:00Z')", pc.field(f"tz_{u}") > at.replace(tzinfo=utc), 2)]
    cases += [
        # a wall-clock time in a zone: the column's zone compares at any unit
        ("paris < timestamp('2024-01-02 02:00', 'Europe/Paris')", pc.field("paris") < at.replace(tzinfo=utc), 1),
        ("paris < timestamp('2024-01-02 01:00Z')", pc.field("paris") < at.replace(tzinfo=utc), 1),
        ("tz_us >= timestamp('2024-01-02 02:00', 'Europe/Paris')", pc.field("tz_us") >= at.replace(tzinfo=utc), 2),
        ("d32 >= date('2024-01-02')", pc.field("d32") >= dt.date(2024, 1, 2), 2),
        ("d64 < date('2024-01-02')", pc.field("d64") < dt.date(2024, 1, 2), 1),
        ("t32 < time('03:00')", pc.field("t32") < dt.time(3), None),
        ("t64 > time('03:00:00.000000001')",
         pc.field("t64") > pa.scalar(1 + 3 * 3600 * 10**9, pa.time64("ns")), None),
        ("dur >= duration(90000, 's')", pc.field("dur") >= dt.timedelta(hours=25), 2),
        ("dur in [duration(3600000, 'ms'), duration(7200000000, 'us')]",
         pc.field("dur").isin([dt.timedelta(hours=1), dt.timedelta(hours=2)]), 3),
        ("timestamp('2024-01-01 12:00') <= ts_us < timestamp('2024-01-01 14:00')",
         (pc.field("ts_us") >= dt.datetime(2024, 1, 1, 12)) & (pc.field("ts_us") < dt.datetime(2024, 1, 1, 14)), 3),
    ]
    return cases


@pytest.mark.parametrize("index", range(len(_temporal_cases())))
def test_typed_literals_filter_temporal_columns_as_pyarrow_filters_datetimes(tmp_path, index):
    text, expression, pruned = _temporal_cases()[index]
    pq.write_table(_temporal_table(), tmp_path / "a.parquet", row_group_size=10)
    got, loader = loaded_ids(tmp_path, text)
    want = expected_ids(tmp_path, expression)
    assert 0 < len(want) < 40
    np.testing.assert_array_equal(got, want, err_msg=text)
    if pruned is not None:  # row groups of other hours pruned by their statistics
        assert loader.stats()["filter_row_groups_pruned_statistics"] == pruned, text


def test_typed_literals_are_the_pyarrow_scalars_of_the_same_values():
    import datetime as dt
    paris = pa.timestamp("us", "Europe/Paris")
    for text, expression in [
        ("ts > timestamp('2024-01-01 12:00')", pc.field("ts") > dt.datetime(2024, 1, 1, 12)),  # us, as a datetime
        ("ts > timestamp('2024-01-01')", pc.field("ts") > dt.datetime(2024, 1, 1)),
        ("ts > timestamp('2024-01-01T12:00:00.5Z')",
         pc.field("ts") > dt.datetime(2024, 1, 1, 12, 0, 0, 500000, tzinfo=dt.timezone.utc)),
        ("ts > timestamp('2024-07-01 12:00', 'Europe/Paris')",  # summer time: 10:00 UTC
         pc.field("ts") > pa.scalar(dt.datetime(2024, 7, 1, 10, tzinfo=dt.timezone.utc), paris)),
        ("ts > timestamp('2024-01-01 00:00:00.123456789')",
         pc.field("ts") > pa.scalar(1704067200123456789, pa.timestamp("ns"))),
        ("d == date('2024-02-29')", pc.field("d") == dt.date(2024, 2, 29)),
        ("t < time('23:59:59.999999')", pc.field("t") < dt.time(23, 59, 59, 999999)),
        ("x >= duration(-5, 'ns')", pc.field("x") >= pa.scalar(-5, pa.duration("ns"))),
        ("d in [date('2024-01-01'), None]", pc.field("d").isin(pa.array([dt.date(2024, 1, 1), None], pa.date32()))),
        # a list of several units: in the finest
        ("ts not in (timestamp('1970-01-01 00:00:01'), timestamp('1970-01-01 00:00:00.000000001'))",
         ~pc.field("ts").isin(pa.array([10**9, 1], pa.timestamp("ns")))),
    ]:
        assert pqloader.parse_filter(text).equals(expression), text
    # `date` is a column's name, as any name in backticks
    assert pqloader.parse_filter("`date` == date('2024-01-01')").equals(pc.field("date") == dt.date(2024, 1, 1))
    with pytest.raises(ValueError, match="neither a column nor a literal"):
        pqloader.parse_filter("d == `date`('2024-01-01')")


@pytest.mark.parametrize("text, says", [
    ("ts > timestamp('2024-13-01')", "\"timestamp('2024-13-01')\": month must be in 1..12"),
    ("ts > timestamp('2024-02-30 12:00')", "\"timestamp('2024-02-30 12:00')\": day is out of range"),
    ("ts > timestamp('yesterday')", "\"timestamp('yesterday')\": not a timestamp: write 'YYYY-MM-DD"),
    ("ts > timestamp('2024-01-01 12:00:00.1234567891')", "not a timestamp"),  # past nanoseconds
    ("ts > timestamp('2300-01-01 00:00:00.000000001')", "past the range of a timestamp in nanoseconds"),
    ("ts > timestamp('2024-01-01', 'Mars/Olympus')", "no time zone 'Mars/Olympus'"),
    ("ts > timestamp('2024-03-31 02:30', 'Europe/Paris')", "does not exist in Europe/Paris"),
    ("ts > timestamp('2024-10-27 02:30', 'Europe/Paris')", "is ambiguous in Europe/Paris"),
    ("ts > timestamp('0001-01-01 00:00', 'Europe/Paris')",  # year 0 in UTC: was "date value out of range"
     "\"timestamp('0001-01-01 00:00', 'Europe/Paris')\": 0001-01-01 00:00:00 in Europe/Paris is past the years"),
    ("ts > timestamp('9999-12-31 23:00', 'America/New_York')", "is past the years 1 to 9999 in UTC"),
    ("ts > timestamp('2024-01-01T00:00+24:00')", "+24:00 is no offset (hours below 24, minutes below 60)"),
    ("ts > timestamp(20240101)", "its arguments are text"),
    ("ts > timestamp(x)", "its arguments are literals, not 'x'"),
    ("ts > timestamp('2024-01-01', tz='UTC')", "write timestamp("),
    ("d > date('2024-1-1')", "\"date('2024-1-1')\": not a date: write 'YYYY-MM-DD'"),
    ("t > time('24:00')", "\"time('24:00')\": hour must be in 0..23"),
    ("x > duration(1.5, 's')", "the count is float 1.5, not an integer"),
    ("x > duration(1, 'h')", "the unit is 'h', not one of 's', 'ms', 'us', 'ns'"),
    ("ts in [timestamp('2024-01-01'), date('2024-01-01')]", "the list mixes date and timestamp values"),
    ("ts in [timestamp('2024-01-01'), timestamp('2024-01-01Z')]", "the list mixes timestamps of UTC and no time zone"),
    ("ts in [timestamp('2024-01-01'), '2024-01-02']", "mixes \"'2024-01-02'\" with typed literals"),
    ("ts > now()", "the typed literals are timestamp("),
])
def test_a_typed_literal_that_does_not_parse_is_refused_naming_its_text(text, says):
    with pytest.raises(ValueError) as e:
        pqloader.parse_filter(text)
    assert says in str(e.value) and str(e.value).startswith("filter ")


def test_naive_and_aware_timestamps_are_refused_as_pyarrow_refuses_them(tmp_path):
    pq.write_table(_temporal_table(), tmp_path / "a.parquet", row_group_size=10)
    for text in ("tz_us < timestamp('2024-01-02 01:00')", "ts_us < timestamp('2024-01-02 01:00Z')",
                 "ts_us < timestamp('1990-01-01 00:00', 'UTC')"):  # (all row groups after it, too)
        with pytest.raises(pqloader.InvalidDataError, match="a.parquet.*Cannot compare timestamp with timezone "
                           "to timestamp without timezone"):
            pqloader.Loader(str(tmp_path), filter=text)


def test_typed_literals_filter_int96_timestamps(tmp_path):
    import datetime as dt
    hours = [dt.datetime(2024, 1, 1) + dt.timedelta(hours=i) for i in range(40)]
    table = pa.table({"id": np.arange(40), "ts": pa.array(hours, pa.timestamp("ns"))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=10, use_deprecated_int96_timestamps=True)
    for unit in (None, "ms"):
        kwargs = {} if unit is None else {"coerce_int96_timestamp_unit": unit}
        got, _ = loaded_ids(tmp_path, "ts >= timestamp('2024-01-02 01:00') or ts in [timestamp('2024-01-01 03:00')]",
                            **kwargs)
        assert got.tolist() == [3] + list(range(25, 40))


def test_a_selection_kept_for_one_int96_unit_never_serves_another(tmp_path):
    # INT96 timestamps read in microseconds (coerce_int96_timestamp_unit) are truncated:
    # 250 ns past the hour is the hour itself. The stored selection's key left the unit out,
    # so the selection made in nanoseconds (the row of 250 ns) was served in microseconds
    # (where that row is the hour, and fails), and the reverse dropped it.
    base = np.datetime64("2024-01-01T00:00:00", "ns").astype(np.int64)
    ts = pa.array([base + 250 * i for i in range(8)], pa.int64()).cast(pa.timestamp("ns"))
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": np.arange(8), "ts": ts}), data / "a.parquet", row_group_size=4,
                   use_deprecated_int96_timestamps=True)
    text = "ts == timestamp('2024-01-01 00:00:00.000000250')"
    cache = str(tmp_path / "cache")
    seen = []
    for unit in ("ns", "us", "ns", "us"):
        got, loader = loaded_ids(data, text, coerce_int96_timestamp_unit=unit, cache_dir=cache)
        want = pq.read_table(data, coerce_int96_timestamp_unit=unit).filter(pqloader.parse_filter(text))["id"]
        assert got.tolist() == want.to_pylist(), unit
        seen.append((got.tolist(), loader.stats()["filter_from_store"]))
    assert seen == [([1], False), ([], False), ([1], True), ([], True)]


def test_selections_of_two_typed_literals_are_kept_apart_in_the_cache(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(_temporal_table(), data / "a.parquet", row_group_size=10)
    cache = str(tmp_path / "cache")
    seen = []
    for text in ("tz_ns < timestamp('2024-01-02 01:00Z')",  # hour 25 UTC: 25 rows
                 "tz_ns < timestamp('2024-01-02 01:00+01:00')",  # hour 24 UTC: 24 rows
                 "tz_ns < timestamp('2024-01-02 01:00:00.000000001Z')",  # and hour 25 itself
                 "tz_ns < timestamp('2024-01-02 01:00Z')"):
        got, loader = loaded_ids(data, text, cache_dir=cache)
        seen.append((len(got), loader.stats()["filter_from_store"]))
    assert seen == [(25, False), (24, False), (26, False), (25, True)]


def test_inspect_and_bench_take_typed_literals_in_filter(tmp_path):
    import json
    import subprocess
    pq.write_table(_temporal_table(), tmp_path / "a.parquet", row_group_size=10)
    flt = "ts_us >= timestamp('2024-01-02 01:00') and d32 in [date('2024-01-02')]"
    out = subprocess.run([sys.executable, "-m", "pqloader", "inspect", str(tmp_path), "--filter", flt],
                         capture_output=True, text=True, check=True).stdout
    assert "statistics:     2 row group(s) pruned" in out and "kept: 15 of 40 rows" in out
    out = subprocess.run([sys.executable, "-m", "pqloader", "bench", str(tmp_path), "--filter", flt, "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["rows"] == 15
    bad = subprocess.run([sys.executable, "-m", "pqloader", "inspect", str(tmp_path), "--filter",
                          "d32 > date('2024-02-30')"], capture_output=True, text=True)
    assert bad.returncode != 0 and "date('2024-02-30')" in bad.stderr and "Traceback" not in bad.stderr


def _without_column_orders(src, dst, swap=None) -> None:
    """Copy `src` (pyarrow's, 2 columns) as a writer before column orders wrote it: its
    column_orders (the footer's last field) made an unknown field, so Arrow reads the
    deprecated min/max; `swap` (old, new) replaces the first `old` bytes (a deprecated min:
    written before min_value) by `new`."""
    import struct

    data = src.read_bytes()
    (length,) = struct.unpack("<i", data[-8:-4])
    start = len(data) - 8 - length
    footer = bytearray(data[start:-8])
    # field 7, a list of 2 TypeDefinedOrder unions, then the stop: made field 15, skipped
    tail = 3 * 2 + 3
    assert footer[-tail] == 0x19 and footer[-tail + 1] == 0x2C and footer[-1] == 0
    footer[-tail] = 0x99
    if swap is not None:
        assert footer.count(swap[0]) == 2
        footer = footer.replace(swap[0], swap[1], 1)
    dst.parent.mkdir(exist_ok=True)
    dst.write_bytes(data[:start] + bytes(footer) + struct.pack("<i", len(footer)) + b"PAR1")


def test_deprecated_min_max_of_decimals_stored_as_bytes_prune_nothing(tmp_path):
    """Files without column orders (parquet-mr before 1.10: Spark 2.x; parquet-testing's
    fixed_length_decimal.parquet) hold min/max only in the deprecated fields, which the
    format orders by signed comparison, byte by byte for byte arrays: not a decimal's
    order (2.00, 0x..c8, sorts below 1.00, 0x..64). Read as decimals, parquet-mr 1.8's
    min 2.00 and max 24.00 over 1.00, 2.00, 24.00 pruned the row group for `v == 1.00`
    (pyarrow's dataset too): such bounds prune only where min == max."""
    from decimal import Decimal

    dtype = pa.decimal128(25, 2)  # FIXED_LEN_BYTE_ARRAY of 11 bytes
    values = [Decimal("1.00"), Decimal("2.00"), Decimal("24.00")]
    table = pa.table({"id": np.arange(3, dtype=np.int64), "v": pa.array(values, dtype)})
    src = tmp_path / "src.parquet"
    pq.write_table(table, src, use_dictionary=False, store_decimal_as_integer=False)
    one, two = (int(x * 100).to_bytes(11, "big", signed=True) for x in (1, 2))
    _without_column_orders(src, tmp_path / "old" / "a.parquet", swap=(one, two))
    meta = pq.ParquetFile(tmp_path / "old" / "a.parquet").metadata
    assert meta.row_group(0).column(1).statistics.min == Decimal("2.00")  # what Arrow reads
    v = pc.field("v")
    for flt in (v == pa.scalar(Decimal("1.00"), dtype), v < pa.scalar(Decimal("2.00"), dtype),
                v <= pa.scalar(Decimal("1.50"), dtype), v.isin(pa.array([Decimal("1.00")], dtype))):
        want = np.sort(table.filter(flt)["id"].to_numpy())
        got, _ = loaded_ids(tmp_path / "old", flt)
        np.testing.assert_array_equal(got, want, err_msg=str(flt))
        assert len(want) == 1
    # Bounds that are equal hold in any order: they still prune.
    pq.write_table(table.slice(0, 1), src, use_dictionary=False, store_decimal_as_integer=False)
    _without_column_orders(src, tmp_path / "one" / "a.parquet")
    got, loader = loaded_ids(tmp_path / "one", v == pa.scalar(Decimal("2.00"), dtype))
    assert len(got) == 0 and loader.stats()["filter_row_groups_pruned_statistics"] == 1
    got, _ = loaded_ids(tmp_path / "one", v == pa.scalar(Decimal("1.00"), dtype))
    assert got.tolist() == [0]


def _as_older_pyarrow_writes(expression, left_out):
    """`expression`'s serialized bytes without the options fields `left_out` (as an older
    pyarrow, which has no such field, writes them: pyarrow 14's PadOptions)."""
    reader = pa.ipc.open_file(expression.__reduce__()[1][0])
    batch = reader.get_batch(0)
    schema, columns = reader.schema, list(batch.columns)
    for i, array in enumerate(columns):
        if pa.types.is_struct(array.type):
            keep = [k for k in range(array.type.num_fields) if array.type.field(k).name not in left_out]
            columns[i] = pa.StructArray.from_arrays([array.field(k) for k in keep],
                                                    fields=[array.type.field(k) for k in keep])
            schema = schema.set(i, schema.field(i).with_type(columns[i].type))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(pa.record_batch(columns, schema=schema))
    return sink.getvalue().to_pybytes()


def test_a_pad_filter_of_pyarrow_before_lean_left_on_odd_padding_reaches_the_engine(tmp_path):
    # pyarrow 14's PadOptions has no lean_left_on_odd_padding; the engine's Arrow refused
    # such an expression ("Cannot deserialize field lean_left_on_odd_padding of options
    # type PadOptions") for every utf8_center / *_lpad / *_rpad filter made by it. The
    # field is added at True, which is what pyarrow 14's kernels did.
    from pqloader import _filter
    e = (pc.utf8_center(pc.field("s"), 5, "x") == "xabxx") | (pc.ascii_lpad(pc.field("s"), 3) == " ab")
    old = _as_older_pyarrow_writes(e, {"lean_left_on_odd_padding"})
    with pytest.raises(pa.ArrowInvalid, match="lean_left_on_odd_padding"):
        pc.Expression._deserialize(pa.py_buffer(old))
    fixed = _filter._for_engine_arrow(old)
    assert pc.Expression._deserialize(pa.py_buffer(fixed)).equals(e)
    plain = (pc.field("s") == "PadOptions").__reduce__()[1][0].to_pybytes()
    assert _filter._for_engine_arrow(plain) is plain  # nothing to add: unchanged
    pq.write_table(pa.table({"id": [0, 1, 2], "s": ["ab", "abc", "b"]}), tmp_path / "a.parquet")
    assert collect(pqloader.Loader(str(tmp_path), filter=e))["id"].tolist() == [0]


def test_an_int_literal_against_a_wide_decimal_says_how_to_write_it(tmp_path):
    # Spark infers decimal(38, 18) for Python Decimals; "amount < 0" got only Arrow's
    # "Precision is not great enough for the result".
    import decimal
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [0, 1], "amount": pa.array([decimal.Decimal("-1.5"), decimal.Decimal(2)],
                                                             pa.decimal128(38, 18))}), path)
    with pytest.raises(pqloader.InvalidDataError, match=r"amount.*Precision.*decimal scalar of a small precision"):
        pqloader.Loader(str(path), columns=["id"], filter="amount < 0")
    small = pa.scalar(decimal.Decimal(0), pa.decimal128(1, 0))
    for f in ("amount < 0.0", pc.field("amount") < small):
        got = collect(pqloader.Loader(str(path), columns=["id"], filter=f))
        assert got["id"].tolist() == [0]


@pytest.mark.parametrize("when", ["before the first batch", "between two epochs"])
def test_a_file_rewritten_with_its_layout_after_the_filter_ran_is_refused_not_misfiltered(
        tmp_path, when):
    # The filter's selection (row groups kept by statistics, rows kept by the filter's
    # values) is made when the Loader is made, from the listed version. A file replaced by
    # one of the same layout with other values (same size, other mtime) then decoded, and
    # the old selection was applied to the new values: 'id >= 2500' gave ids 0-499, no
    # error. Rows that fail the filter are altered output: the change must be refused.
    path = tmp_path / "a.parquet"
    kw = dict(row_group_size=300, use_dictionary=False, compression="none")
    ids = np.arange(3000, dtype=np.int64)
    pq.write_table(pa.table({"id": ids}), path, **kw)
    loader = pqloader.Loader(str(tmp_path), batch_size=100, filter="id >= 2500")
    if when == "between two epochs":
        assert sorted(collect(loader)["id"].tolist()) == list(range(2500, 3000))
        loader.close()  # drops the epoch read ahead: the next one reads the file again
    pq.write_table(pa.table({"id": ids[::-1].copy()}), tmp_path / "new.tmp", **kw)
    assert (tmp_path / "new.tmp").stat().st_size == path.stat().st_size
    (tmp_path / "new.tmp").replace(path)
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"a\.parquet' was modified since the loader listed it"):
        got = collect(loader)["id"]
        assert (got >= 2500).all(), got  # what it gave: ids 0-499


FILTER_READ_ONLY = """
import json, sys, pqloader
loader = pqloader.Loader(sys.argv[1], filter="x > 450", batch_size=64, cache_dir=sys.argv[2])
s = loader.stats()
print(json.dumps([s["filter_from_store"], sorted(int(v) for b in loader for v in b["x"])]))
"""


def test_a_read_only_cache_dir_keeps_no_loader_waiting_on_the_filters_lock(tmp_path):
    # A loader that could store no selection (a read-only cache_dir) took filters/.lock all
    # the same to compute it: the ranks of a node computed one after another, each waiting
    # (up to 30 minutes) for one that stored nothing. It computes at once now (the
    # footers' lock of remote datasets is taken the same way: NodeLock::AcquireToStore).
    import json
    from conftest import run_beside_a_held_lock_on_a_read_only_cache
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"x": np.arange(1000)}), tmp_path / "data" / "a.parquet", row_group_size=100)
    out = run_beside_a_held_lock_on_a_read_only_cache(tmp_path, "filters/.lock", FILTER_READ_ONLY,
                                                       str(tmp_path / "data"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [False, list(range(451, 1000))]
