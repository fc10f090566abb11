"""Make a Petastorm (Unischema) view of a generated dataset, without Spark.

    bench/.venvs/petastorm/bin/python bench/petastorm_prep.py --data bench/data/small --workload images

`make_reader` only reads Petastorm datasets: Parquet plus a `_common_metadata`
file holding the pickled Unischema and the row-group count per file (what
`petastorm.etl.dataset_metadata.materialize_dataset` writes after a Spark
job). We write exactly those two keys with pyarrow into
<data>/<workload>.petastorm/, whose Parquet files are *hard links* to the
generated ones, so make_reader reads the very same bytes as every other
system. The column encodings already match Petastorm's codecs: `array` is
np.save bytes (NdarrayCodec); `image` is kept as raw JPEG bytes (codec None)
and decoded by a TransformSpec with the shared PIL decoder.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import sys

import numpy as np
import pyarrow.parquet as pq
from petastorm.codecs import NdarrayCodec
from petastorm.etl.dataset_metadata import ROW_GROUPS_PER_FILE_KEY, UNISCHEMA_KEY
from petastorm.unischema import Unischema, UnischemaField

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402


def unischema_for(workload: str) -> Unischema:
    label = UnischemaField("label", np.int64, (), None, False)
    if workload == "tabular":
        fields = [UnischemaField(f"f{i:03d}", np.float32, (), None, False) for i in range(C.N_FEATURES)]
        fields += [UnischemaField(f"i{i}", np.int64, (), None, False) for i in range(C.N_INT_COLS)]
        return Unischema("Tabular", fields + [label])
    if workload == "images":
        return Unischema("Images", [UnischemaField("image", np.bytes_, (), None, False), label])
    if workload == "ndarray":
        return Unischema("Ndarray", [UnischemaField("array", np.float32, C.NDARRAY_SHAPE, NdarrayCodec(), False), label])
    if workload == "tokens":
        return Unischema("Tokens", [UnischemaField("tokens", np.int32, (None,), None, False), label])
    raise ValueError(workload)


def prepare(data_dir: str, workload: str) -> str:
    dst = os.path.join(data_dir, workload + ".petastorm")
    meta = os.path.join(dst, "_common_metadata")
    files = C.parquet_files(data_dir, workload)
    stamp = C.manifest_path(data_dir, workload)
    if os.path.exists(meta) and os.path.getmtime(meta) >= os.path.getmtime(stamp):
        return dst
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(dst):
        os.remove(os.path.join(dst, f))
    counts = {}
    for f in files:
        name = os.path.basename(f)
        os.link(f, os.path.join(dst, name))
        counts[name] = pq.ParquetFile(f).metadata.num_row_groups
    schema = pq.read_schema(files[0])
    md = dict(schema.metadata or {})
    md[UNISCHEMA_KEY] = pickle.dumps(unischema_for(workload))
    md[ROW_GROUPS_PER_FILE_KEY] = json.dumps(counts).encode()
    pq.write_metadata(schema.with_metadata(md), meta)
    return dst


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workload", action="append")
    a = ap.parse_args()
    for w in a.workload or C.WORKLOADS:
        print(prepare(a.data, w))
