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
"""

from __future__ import annotations

import ctypes
import os
import sys

# arrow::Status::ToString() const: exported by every Arrow C++ release since 0.x.
_ARROW_SYMBOL = "_ZNK5arrow6Status8ToStringB5cxx11Ev"


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
