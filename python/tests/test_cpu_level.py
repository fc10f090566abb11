"""The vector kernels (AVX-512 draws, AVX2 gathers, interleaves, stacks, a mixture's
counts, the resize's sums and transposes) give the bytes of their baseline twins: the
output is a function of (data, options, seed, epoch, rank), not of the CPU. Each level
runs on this machine through PQLOADER_CPU_LEVEL (util/cpu_level.h), in its own process;
a level above the CPU's runs the CPU's."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import subprocess_env

SCRIPT = r"""
import hashlib, json, sys
import numpy as np
import pqloader
from pqloader import transforms as T

root = sys.argv[1]
F = [f"f{j}" for j in range(8)]
I = [f"i{j}" for j in range(4)]
cols = ["id", *F, *I, "u8", "d"]
out = {}

def digest(name, batches):
    m = hashlib.sha256()
    for b in batches:
        for k in sorted(b):
            v = np.ascontiguousarray(b[k])
            m.update(k.encode() + str(v.dtype).encode() + str(v.shape).encode() + v.tobytes())
    out[name] = m.hexdigest()

loader = pqloader.Loader(f"{root}/num", columns=cols, batch_size=128, shuffle=True, seed=7,
                         num_epochs=2)
digest("shuffled, two epochs", loader)
digest("stack, ordered", pqloader.Loader(f"{root}/num", columns=cols, batch_size=100,
                                         stack={"x": F, "y": I}))
digest("stack, shuffled", pqloader.Loader(f"{root}/num", columns=cols, batch_size=100,
                                          shuffle=True, seed=3, stack={"x": F, "y": I}))
def sources():
    return [pqloader.Loader(f"{root}/num", columns=["id", *F, "u8"], batch_size=64, shuffle=True,
                            seed=11 + s) for s in range(3)]
digest("mixture", pqloader.mix(sources(), [0.5, 0.3, 0.2], seed=5, batch_size=50))
digest("mixture to the last", pqloader.mix(sources(), [0.2, 0.3, 0.5], seed=9, batch_size=37,
                                           stop="last"))
crop = [T.DecodeImage(), T.RandomResizedCrop(33), T.RandomHorizontalFlip(),
        T.Normalize([0.4, 0.5, 0.6], [0.2, 0.25, 0.3]), T.ToCHW()]
digest("images, random crops", pqloader.Loader(f"{root}/img", batch_size=4, shuffle=True, seed=2,
                                               transforms={"image": crop}))
digest("images, resize", pqloader.Loader(f"{root}/img", batch_size=4,
                                         transforms={"image": [T.DecodeImage(), T.Resize(41),
                                                               T.CenterCrop(37)]}))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    Image = pytest.importorskip("PIL.Image")
    skdata = pytest.importorskip("skimage.data")
    root = tmp_path_factory.mktemp("levels")
    rng = np.random.default_rng(0)
    n = 5000
    d = rng.standard_normal(n)
    d[rng.random(n) < 0.05] = np.nan
    table = pa.table({"id": np.arange(n), **{f"f{j}": rng.standard_normal(n, dtype=np.float32) for j in range(8)},
                      **{f"i{j}": rng.integers(-2**62, 2**62, n) for j in range(4)},
                      "u8": rng.integers(0, 255, n, dtype=np.uint8), "d": d})
    (root / "num").mkdir()
    for i, part in enumerate((table.slice(0, 3100), table.slice(3100))):
        pq.write_table(part, root / "num" / f"part-{i}.parquet", row_group_size=700)
    images = []
    for photo in (skdata.astronaut(), skdata.chelsea(), skdata.coffee(), skdata.rocket()):
        for fmt in ("JPEG", "PNG"):
            b = io.BytesIO()
            Image.fromarray(photo[::3, ::3]).save(b, format=fmt)
            images.append(b.getvalue())
    (root / "img").mkdir()
    pq.write_table(pa.table({"image": pa.array(images, pa.binary())}), root / "img" / "a.parquet",
                   row_group_size=3)
    return root


def run_at(root, level):
    env = subprocess_env()
    env.pop("PQLOADER_CPU_LEVEL", None)
    if level is not None:
        env["PQLOADER_CPU_LEVEL"] = level
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(root)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_every_level_of_vector_kernels_gives_the_bytes_of_the_baseline(data):
    baseline, _ = run_at(data, "baseline")
    for level in ("avx2", "avx512", None):
        got, _ = run_at(data, level)
        assert got == baseline, level


def test_an_unknown_level_runs_the_baseline_and_says_so(data):
    baseline, _ = run_at(data, "baseline")
    got, err = run_at(data, "sse9")
    assert got == baseline
    assert "PQLOADER_CPU_LEVEL=sse9 is not baseline, avx2 or avx512; using the baseline kernels" in err
