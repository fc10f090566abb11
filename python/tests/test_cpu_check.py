"""The extension is not loaded on a CPU without the instruction sets of the bundled Arrow
C++ (x86-64-v2): an ImportError names what is missing, where loading it would kill the
process with SIGILL (checked under qemu-x86_64 -cpu qemu64: SIGILL at import; without
POPCNT, SIGILL at the first batch)."""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="an x86-64 requirement")

OLD_CPU = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse sse2 pni cx16 lahf_lm\n\n"

IMPORT_WITH_FAKE_CPUINFO = """
import builtins, sys
real_open = builtins.open
def fake_open(path, *args, **kwargs):
    return real_open(sys.argv[1] if path == "/proc/cpuinfo" else path, *args, **kwargs)
builtins.open = fake_open
try:
    import pqloader
except ImportError as e:
    print("ImportError:", e)
    print("core loaded:", "pqloader._core" in sys.modules)
else:
    print("imported")
"""


def run_import(cpuinfo, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "PQLOADER_SKIP_CPU_CHECK"}
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", IMPORT_WITH_FAKE_CPUINFO, str(cpuinfo)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_an_old_cpu_gets_an_import_error_naming_what_it_lacks_not_a_sigill(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(OLD_CPU)
    out = run_import(cpuinfo)
    assert "ImportError: pqloader needs an x86-64 CPU with SSSE3, SSE4.1, SSE4.2 and POPCNT" in out
    assert "lacks ssse3, sse4_1, sse4_2, popcnt" in out
    assert "core loaded: False" in out  # refused before the extension (and Arrow) loaded


def test_the_check_can_be_skipped_and_passes_a_cpu_that_has_them(tmp_path):
    old = tmp_path / "old"
    old.write_text(OLD_CPU)
    assert run_import(old, {"PQLOADER_SKIP_CPU_CHECK": "1"}).strip() == "imported"
    new = tmp_path / "new"
    new.write_text(OLD_CPU.replace("pni", "pni ssse3 sse4_1 sse4_2 popcnt avx2"))
    assert run_import(new).strip() == "imported"


def test_missing_features_of_an_unreadable_or_flagless_cpuinfo_are_unknown(tmp_path):
    from pqloader import _native
    assert _native.missing_cpu_features(str(tmp_path / "absent")) == []
    (tmp_path / "noflags").write_text("processor\t: 0\n")
    assert _native.missing_cpu_features(str(tmp_path / "noflags")) == []
    assert _native.missing_cpu_features() == []  # this machine runs the tests
