"""Loading the extension so that its Arrow C++ stays its own (docs/design.md, "Packaging").

pqloader's wheel carries Arrow/Parquet C++ under mangled sonames. CPython loads extension
modules RTLD_LOCAL, so another Arrow in the process (pyarrow's, any version) stays in its
own lookup scope and the two never meet. Someone may have loaded that other Arrow
RTLD_GLOBAL (``sys.setdlopenflags`` before ``import pyarrow``, or ctypes): its symbols
are then searched before ours and calls from our extension land in the wrong Arrow
(heap corruption). In that case only, the extension is loaded with RTLD_DEEPBIND, which
makes it and its libraries search their own scope first. Not always: DEEPBIND also
bypasses an allocator preloaded with LD_PRELOAD (jemalloc, tcmalloc) for those
libraries, which is harmless for Arrow's own buffers but not worth it when nothing
needs it.

The Arrow/Parquet C++ the wheel carries (pyarrow's build) is compiled for x86-64-v2:
SSE4.1 instructions run while it loads and POPCNT ones on the first read (SSE4.2 ones
are in it too). On an older CPU, or a virtual machine whose CPU model hides them (QEMU's
default ``qemu64``/``kvm64``), the process would die of SIGILL at ``import pqloader``
or at the first batch, with no message: the extension is not loaded there, and an
ImportError names what the CPU lacks instead.
"""

from __future__ import annotations

import ctypes
import os
import sys

# arrow::Status::ToString() const: exported by every Arrow C++ release since 0.x.
_ARROW_SYMBOL = "_ZNK5arrow6Status8ToStringB5cxx11Ev"


# The x86-64 instruction sets the bundled Arrow C++ needs, as /proc/cpuinfo names them.
REQUIRED_X86_FLAGS = ("ssse3", "sse4_1", "sse4_2", "popcnt")
# Set to 1 (or true, yes, on) to load the extension whatever /proc/cpuinfo says (a
# kernel or emulator whose cpuinfo does not tell the CPU's real features).
SKIP_CPU_CHECK_ENV = "PQLOADER_SKIP_CPU_CHECK"
# Its spellings (case and surrounding spaces aside): "true" or "yes" had been silently
# taken as "check"; another value warns, naming it, and the check runs.
_TRUTHY = ("1", "true", "yes", "on")
_FALSY = ("", "0", "false", "no", "off")


def skip_cpu_check() -> bool:
    """Whether PQLOADER_SKIP_CPU_CHECK asks to skip the CPU check (a warning for a value
    that is neither a usual yes nor a usual no)."""
    value = os.environ.get(SKIP_CPU_CHECK_ENV)
    if value is None:
        return False
    word = value.strip().lower()
    if word in _TRUTHY:
        return True
    if word not in _FALSY:
        import warnings

        warnings.warn(f"{SKIP_CPU_CHECK_ENV}={value!r} is neither 1/true/yes/on nor 0/false/no/off: "
                      "the CPU check runs", RuntimeWarning, stacklevel=2)
    return False


def missing_cpu_features(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The REQUIRED_X86_FLAGS this x86-64 CPU lacks (none elsewhere, or unknown)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    flags = set(value.split())
                    return [flag for flag in REQUIRED_X86_FLAGS if flag not in flags]
    except OSError:
        pass
    return []  # unknown: let the load decide


def check_cpu(cpuinfo: str = "/proc/cpuinfo") -> None:
    """Raise ImportError if the CPU lacks an instruction set the bundled Arrow C++ uses."""
    if skip_cpu_check():
        return
    missing = missing_cpu_features(cpuinfo)
    if missing:
        raise ImportError(
            "pqloader needs an x86-64 CPU with SSSE3, SSE4.1, SSE4.2 and POPCNT (x86-64-v2, "
            "the level its bundled Arrow/Parquet C++ is built for); this CPU lacks "
            f"{', '.join(missing)} (per {cpuinfo}), and loading the extension would kill the "
            "process with SIGILL. In a virtual machine, choose a CPU model that passes these "
            "through (e.g. x86-64-v2 or host instead of qemu64/kvm64); set "
            f"{SKIP_CPU_CHECK_ENV}=1 to load it anyway.")


def foreign_arrow_is_global() -> bool:
    """Whether an Arrow C++ library is in the process's global symbol scope."""
    try:
        ctypes.CDLL(None)[_ARROW_SYMBOL]
    except (AttributeError, OSError):
        return False
    return True


def load_core() -> bool:
    """Import ``pqloader._core``; return whether RTLD_DEEPBIND was needed."""
    if "pqloader._core" in sys.modules:
        return False
    check_cpu()
    deepbind = hasattr(os, "RTLD_DEEPBIND") and foreign_arrow_is_global()
    if not deepbind:
        import pqloader._core  # noqa: F401
        return False
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_DEEPBIND)
    try:
        import pqloader._core  # noqa: F401
    finally:
        sys.setdlopenflags(flags)
    return True


LOADED_WITH_DEEPBIND = load_core()
