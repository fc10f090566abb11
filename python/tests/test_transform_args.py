"""Arguments of the transforms and helper classes (Pad, Pack, inspect, the Petastorm
readers): checked when the object is made, naming the argument and the value, and
consistent with the Loader's options (NumPy integers and bools taken where ints and
bools are, bools refused where numbers are, NaN and infinities refused where a finite
number is needed)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import transforms as T


@pytest.mark.parametrize("make, error, match", [
    # Accepted when made, refused only when the Loader was made, with no column or value:
    (lambda: T.RandomHorizontalFlip(2), ValueError, r"RandomHorizontalFlip\(p=...\).*\[0, 1\].*2"),
    (lambda: T.RandomHorizontalFlip(-0.1), ValueError, r"RandomHorizontalFlip\(p=...\)"),
    (lambda: T.RandomHorizontalFlip(float("nan")), ValueError, r"p=...\) must be a finite number"),
    (lambda: T.RandomResizedCrop(8, ratio=(2, 1)), ValueError, r"ratio=...\) must be \(lo, hi\) with 0 < lo <= hi"),
    (lambda: T.RandomResizedCrop(8, scale=(0, 1)), ValueError, r"scale=...\) must be \(lo, hi\)"),
    (lambda: T.RandomResizedCrop(8, scale=(0.9, 0.1)), ValueError, r"scale=...\) must be \(lo, hi\)"),
    (lambda: T.RandomResizedCrop(8, ratio=(-1, 1)), ValueError, r"ratio=...\)"),
    (lambda: T.RandomResizedCrop(8, ratio=(1, math.inf)), ValueError, r"ratio=...\) must be a finite number"),
    (lambda: T.RandomResizedCrop(8, scale={0.5, 1.0}), TypeError, r"scale=...\) must be a sequence"),
    (lambda: T.CenterCrop({4, 5}), TypeError, r"CenterCrop\(size=...\)"),   # no (height, width) order
    (lambda: T.Normalize([0.5], [0]), ValueError, r"Normalize\(std=...\) must not hold 0"),
    (lambda: T.Normalize([0.5], [math.nan]), ValueError, r"std=...\) must be a finite number"),
    (lambda: T.Normalize([math.inf], [1]), ValueError, r"mean=...\) must be a finite number"),
    (lambda: T.Normalize([0.5, 0.5], [1]), ValueError, r"one length.*2 means and 1 stds"),
    (lambda: T.Normalize([], []), ValueError, r"one length"),
    (lambda: T.Normalize([0.5], [1e-300]), ValueError, r"do not fit float32"),
    (lambda: T.Cast("complex64"), ValueError, r"Cast\(dtype='complex64'\).*float64.*not complex64"),
    (lambda: T.Cast("datetime64[ns]"), ValueError, r"Cast\(dtype="),
    (lambda: T.Cast(object), ValueError, r"Cast\(dtype="),
    (lambda: T.Cast("nope"), TypeError, r"Cast\(dtype=...\) must be a NumPy dtype.*'nope'"),
    (lambda: T.PadOrTruncate(4, pad=True), TypeError, r"PadOrTruncate\(pad=...\) must be a number"),  # was 1
    (lambda: T.PadOrTruncate(4, pad=np.bool_(True)), TypeError, r"PadOrTruncate\(pad=...\)"),
    (lambda: T.PadOrTruncate(4, pad=10**400), ValueError, r"beyond any column's range"),  # std::bad_cast
    (lambda: T.PadOrTruncate(2**40 + 1), ValueError, r"PadOrTruncate\(length=...\)"),
    (lambda: pqloader.Pad(length=2**70), ValueError, r"Pad\(length=...\) must be at most 2\*\*40"),
    (lambda: pqloader.Pad(max_length=2**70), ValueError, r"Pad\(max_length=...\) must be at most"),
    (lambda: pqloader.Pad(multiple_of=2**41), ValueError, r"Pad\(multiple_of=...\) must be at most"),
    (lambda: pqloader.Pad(value=np.bool_(True)), TypeError, r"Pad\(value=...\)"),
    # These named the argument alone ("mode must be ...", "size must be ..."), not the op:
    (lambda: T.DecodeImage(mode="rgba"), ValueError, r"DecodeImage\(mode=...\) must be 'rgb' or 'gray'"),
    (lambda: T.Resize(0), ValueError, r"Resize\(size=...\)"),
    (lambda: T.Resize("224"), TypeError, r"Resize\(size=...\)"),
    (lambda: T.CenterCrop((1, 2, 3)), ValueError, r"CenterCrop\(size=...\) must be an int or \(height, width\)"),
    (lambda: T.RandomResizedCrop((1, 2, 3)), ValueError, r"RandomResizedCrop\(size=...\) must be an int or"),
    (lambda: T.PadOrTruncate(4, side="up"), ValueError, r"PadOrTruncate\(side=...\) must be 'left' or 'right'"),
    (lambda: T.PadOrTruncate(4, truncation="up"), ValueError, r"PadOrTruncate\(truncation=...\) must be"),
])
def test_bad_arguments_are_refused_when_made_naming_them(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_accepted_edges_still_work():
    assert T.RandomHorizontalFlip(0).params == {"p": 0.0} and T.RandomHorizontalFlip(1).params == {"p": 1.0}
    assert T.RandomResizedCrop(8, scale=(0.5, 0.5), ratio=(1, 1)).params["ratio"] == [1.0, 1.0]
    assert T.RandomResizedCrop(8, scale=(0.5, 2.0)).params["scale"] == [0.5, 2.0]  # as torchvision
    assert T.Normalize([0.5], [0.25]).params == {"mean": [0.5], "std": [0.25]}
    assert T.Cast(np.float32) == T.Cast("float32") and T.Cast(bool) == T.Cast("bool")
    assert T.PadOrTruncate(4, pad=math.nan).params["pad"] != 0  # NaN padding of a float column
    assert T.PadOrTruncate(2**40).params["length"] == 2**40


def test_numpy_scalars_are_taken_where_ints_and_bools_are():
    # The Loader takes np.int64 and np.bool_; these said "must be a positive int".
    assert pqloader.Pad(length=np.int64(8)) == pqloader.Pad(length=8)
    assert type(pqloader.Pad(length=np.int64(8)).length) is int
    assert pqloader.Pad(max_length=np.int32(8), multiple_of=np.uint8(4)) == pqloader.Pad(max_length=8, multiple_of=4)
    assert pqloader.Pad(value=np.float32(1.5)) == pqloader.Pad(value=1.5)
    assert type(pqloader.Pad(value=np.int64(3)).value) is int
    assert pqloader.Pack("t", np.int64(8), eos=np.int32(2), pad=np.int16(0), truncate=np.bool_(True)) == \
        pqloader.Pack("t", 8, eos=2, pad=0, truncate=True)
    assert type(pqloader.Pack("t", np.int64(8)).seq_len) is int
    assert T.DecodeImage("gray", keepdims=np.bool_(False)) == T.DecodeImage("gray", keepdims=False)
    assert T.DecodeImage(exif_transpose=np.bool_(True)) == T.DecodeImage(exif_transpose=True)
    with pytest.raises(TypeError, match="keepdims"):
        T.DecodeImage("gray", keepdims=0)
    with pytest.raises(ValueError, match=r"Pad\(length=...\) must be a positive int"):
        pqloader.Pad(length=np.bool_(True))
    with pytest.raises(ValueError, match=r"Pack\(seq_len=...\)"):
        pqloader.Pack("t", np.float64(8))


def test_numpy_pad_and_pack_values_reach_the_batches(tmp_path):
    pq.write_table(pa.table({"l": pa.array([[1, 2, 3], [4]], pa.list_(pa.int32()))}), tmp_path / "p.parquet")
    got = next(iter(pqloader.Loader(str(tmp_path), batch_size=2,
                                    lists={"l": pqloader.Pad(length=np.int64(4), value=np.int64(-1))})))
    assert got["l"].tolist() == [[1, 2, 3, -1], [4, -1, -1, -1]]
    with pytest.raises(ValueError, match="does not fit"):  # the dtype check sees the NumPy value
        pqloader.Loader(str(tmp_path), lists={"l": pqloader.Pad(value=np.int64(2**40))})
    got = next(iter(pqloader.Loader(str(tmp_path), batch_size=1,
                                    pack=pqloader.Pack("l", np.int64(4), eos=np.int64(9)))))
    assert got["l"].tolist() == [[1, 2, 3, 9]]


def test_inspect_takes_numpy_bools_for_lengths(tmp_path):
    pq.write_table(pa.table({"l": pa.array([[1, 2], [3]], pa.list_(pa.int32()))}), tmp_path / "p.parquet")
    assert pqloader.inspect(str(tmp_path), lengths=np.bool_(True))["lengths"] == \
        pqloader.inspect(str(tmp_path), lengths=True)["lengths"]
    assert "lengths" not in pqloader.inspect(str(tmp_path), lengths=np.bool_(False))


def _skip_cpu_check(value):
    env = dict(os.environ, PQLOADER_SKIP_CPU_CHECK=value)
    out = subprocess.run([sys.executable, "-W", "always", "-c",
                          "from pqloader import _native; print(_native.skip_cpu_check())"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1], out.stderr


@pytest.mark.parametrize("value, skips", [("1", True), ("true", True), ("YES", True), (" on ", True),
                                          ("0", False), ("false", False), ("", False), ("no", False)])
def test_skip_cpu_check_takes_the_usual_spellings(value, skips):
    got, err = _skip_cpu_check(value)
    assert got == str(skips) and "PQLOADER_SKIP_CPU_CHECK" not in err


def test_skip_cpu_check_warns_of_another_value():
    got, err = _skip_cpu_check("sure")
    assert got == "False" and "PQLOADER_SKIP_CPU_CHECK='sure'" in err


def test_petastorm_reader_arguments_are_checked_as_the_loaders():
    from pqloader.petastorm import make_reader

    codecs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "petastorm", "fixtures", "codecs")
    natural = dict(shuffle_row_groups=False, workers_count=2)
    for kwargs, error, match in [
        ({"shuffle_rows": "False"}, TypeError, r"shuffle_rows=...\) must be True or False"),  # was a shuffle
        ({"workers_count": 2.7}, TypeError, r"workers_count=...\) must be an int"),           # was 2
        ({"workers_count": 0}, ValueError, r"workers_count=...\)"),
        ({"cur_shard": 3, "shard_count": 3}, ValueError, r"cur_shard=...\) must be in \[0, 2\]"),
        ({"cur_shard": True, "shard_count": 2}, TypeError, r"cur_shard=...\) must be an int"),
    ]:
        with pytest.raises(error, match=match):
            make_reader(codecs, **{**natural, **kwargs})
    # NumPy ints (a rank computed with NumPy) had been "must be ints".
    def ids(**kw):
        with make_reader(codecs, seed=1, **{**natural, **kw}) as reader:
            return [int(r.id) for r in reader]
    assert ids(cur_shard=np.int64(1), shard_count=np.int64(3)) == ids(cur_shard=1, shard_count=3)


def test_mix_weights_whose_sum_a_double_cannot_hold_are_refused(tmp_path):
    # The draws divide by the sum: [1e308, 1e308] (sum inf) drew source 1 alone, silently;
    # 10**400 was an OverflowError naming no source.
    pq.write_table(pa.table({"x": np.arange(20)}), tmp_path / "p.parquet")

    def loader():
        return pqloader.Loader(str(tmp_path), batch_size=4)

    with pytest.raises(ValueError, match="weights sum beyond a double"):
        pqloader.mix([loader(), loader()], [1e308, 1e308])
    with pytest.raises(ValueError, match="the weight of source '0' must be a finite number"):
        pqloader.mix([loader(), loader()], [10**400, 1])
    m = pqloader.mix([loader(), loader()], [1e307, 1e307], samples_per_epoch=20)
    assert set(np.concatenate([b["source"] for b in m]).tolist()) == {0, 1}


def test_image_sizes_are_bounded_at_int32s_largest():
    big = 2**31 - 1  # the largest side the engine takes (sizes pass through a double to int64)
    assert T.Resize(big).params["size"] == big
    assert T.CenterCrop(big).params["size"] == [big, big]
    assert T.CenterCrop((big, 1)).params["size"] == [big, 1]
    assert T.RandomResizedCrop([big]).params["size"] == [big, big]
    for make in (lambda: T.Resize(2**31), lambda: T.CenterCrop((1, 2**31)),
                 lambda: T.RandomResizedCrop(2**31)):
        with pytest.raises(ValueError, match="size"):
            make()


def _tokens_and_weights(tmp_path):
    pq.write_table(pa.table({"tokens": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int32())),
                             "w": pa.array([1.0, 2.0, 3.0], pa.float32())}), tmp_path / "a.parquet")
    return str(tmp_path)


def test_column_info_of_ops_then_pad_or_truncate_has_the_padded_length(tmp_path):
    # column_info gave (-1,) for [Cast, PadOrTruncate(4)] (the ops' shape before the
    # padding), where every batch is (B, 4) and PadOrTruncate alone gave (4,).
    src = _tokens_and_weights(tmp_path)
    for ops in ([T.PadOrTruncate(4)], [T.Cast("float32"), T.PadOrTruncate(4)]):
        loader = pqloader.Loader(src, batch_size=3, columns=["tokens"], transforms={"tokens": ops})
        batch = next(iter(loader))
        assert batch["tokens"].shape == (3, 4)
        assert loader.column_info["tokens"]["shape"] == (4,), ops
        assert loader.column_info["tokens"]["dtype"] == batch["tokens"].dtype.name


def test_pad_or_truncate_after_ops_that_give_a_number_per_row_is_refused_when_made(tmp_path):
    # [Cast, PadOrTruncate] on a float column was accepted and failed at the first batch
    # ("padding or ragged output needs a list"); PadOrTruncate alone was refused when made.
    src = _tokens_and_weights(tmp_path)
    for ops in ([T.PadOrTruncate(3)], [T.Cast("float64"), T.PadOrTruncate(3)]):
        with pytest.raises(pqloader.UnsupportedTypeError, match="column 'w'.*cannot pad it"):
            pqloader.Loader(src, batch_size=3, columns=["w"], transforms={"w": ops})
