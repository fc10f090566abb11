"""A process whose numeric locale writes a decimal comma (a German desktop's Jupyter that
called setlocale): options, messages, batches and states are those of the C locale.
C's strtod and printf follow LC_NUMERIC: storage options' seconds were read with it
("0.5" refused, "0,5" taken) and cache warnings printed "3,5 KiB"."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import subprocess_env, write_dataset

SCRIPT = r"""
import hashlib, json, locale, sys, warnings
locale.setlocale(locale.LC_ALL, "")
import pqloader

data, cache = sys.argv[1], sys.argv[2]
out = {"decimal_point": locale.localeconv()["decimal_point"]}
# Seconds as Python sends them ("0.5"), and as a decimal comma would spell them.
pqloader.Loader(data, columns=["id"], storage_options={"connect_timeout": 0.5, "retry_base_delay": 0.05}).close()
try:
    pqloader.Loader(data, columns=["id"], storage_options={"connect_timeout": "0,5"}).close()
    out["comma_seconds"] = "accepted"
except ValueError as e:
    out["comma_seconds"] = str(e)
loader = pqloader.Loader(data, batch_size=7, shuffle=True, seed=3, filter="x > 0.25",
                         fill_null={"v": 0.5},
                         cache_dir=cache, cache_size_limit=3584, cache_shards=1)
digest = hashlib.sha256()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for batch in loader:
        for name in sorted(batch):
            digest.update(name.encode() + batch[name].tobytes())
out["batches"] = digest.hexdigest()
out["state"] = json.dumps(loader.state_dict(), sort_keys=True, default=str)
out["warnings"] = sorted({str(w.message) for w in caught if "KiB" in str(w.message)})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def comma_locale(tmp_path_factory) -> Path:
    """A directory for LOCPATH holding de_DE.UTF-8, built by localedef (no root needed;
    its sources come with Debian's `locales`, which `make` installs)."""
    if shutil.which("localedef") is None or not Path("/usr/share/i18n/locales/de_DE").exists():
        pytest.fail("localedef and Debian's `locales` package are needed (make deps installs them)")
    d = tmp_path_factory.mktemp("locales")
    run = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(d / "de_DE.UTF-8")],
                         capture_output=True, text=True, timeout=120)
    # (exit 1 is warnings only, e.g. about the charmap's comments)
    assert (d / "de_DE.UTF-8").is_dir(), run.stderr
    return d


def _run(tmp_path, data, name, env_extra):
    env = dict(subprocess_env(), **env_extra)
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(data), str(tmp_path / f"cache-{name}")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_decimal_comma_locale_changes_no_option_message_batch_or_state(tmp_path, comma_locale):
    import numpy as np
    import pyarrow as pa

    def table(n, start, seed):
        rng = np.random.default_rng(start)
        return pa.table({"id": np.arange(start, start + n), "x": rng.random(n, dtype=np.float32),
                         "v": pa.array(rng.random(n), mask=rng.random(n) < 0.3)})

    data = tmp_path / "d"
    write_dataset(data, [[40, 40], [30]], table)
    plain = _run(tmp_path, data, "c", {"LC_ALL": "C"})
    comma = _run(tmp_path, data, "de", {"LC_ALL": "de_DE.UTF-8", "LOCPATH": str(comma_locale)})
    assert plain["decimal_point"] == "." and comma["decimal_point"] == ","
    for got in (plain, comma):
        assert "connect_timeout" in got["comma_seconds"] and "'0,5'" in got["comma_seconds"]
        assert got["warnings"], "the cache limit made no warning naming sizes"
        assert all("," not in w.split("KiB")[0].split()[-1] for w in got["warnings"]), got["warnings"]
    assert comma["warnings"] == [w.replace(str(tmp_path / "cache-c"), str(tmp_path / "cache-de"))
                                 for w in plain["warnings"]]
    assert comma["batches"] == plain["batches"]
    assert comma["state"] == plain["state"]
