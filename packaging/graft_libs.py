"""Copy into a repaired wheel the shared libraries that auditwheel leaves to the system.

auditwheel grafts every library the wheel links except those its manylinux policy lets
the target system provide; zlib (`libz.so.1`, which the grafted libpng needs) is one of
them. pqloader carries it too, so that the extension resolves nothing but glibc,
libstdc++ and libgcc from the system (tested with ldd in python/tests_wheel). Each
library is grafted the way auditwheel does it: copied into `pqloader.libs/` as
`NAME-<first 8 hex digits of its sha256>.so.N`, that soname set, and every ELF file of
the wheel that needs it re-pointed to the new name (they already look in
`pqloader.libs/` through their RPATH). RPATH entries that lead outside the wheel (the
build's `$ORIGIN/../pyarrow`) are dropped, so an installed pyarrow is never searched.
RECORD is rewritten.

Usage: python packaging/graft_libs.py IN_WHEEL OUT_WHEEL [SONAME ...]  (default libz.so.1)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from auditwheel.wheeltools import InWheel

LIBS_DIR = "pqloader.libs"


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def _needed(path: Path) -> list[str]:
    out = subprocess.run(["patchelf", "--print-needed", str(path)], check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def _resolve(path: Path, soname: str) -> Path:
    """The file the dynamic linker loads for `soname` as a dependency of `path`."""
    out = subprocess.run(["ldd", str(path)], check=True, capture_output=True, text=True,
                         env={**os.environ, "LD_LIBRARY_PATH": ""}).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == soname and parts[1] == "=>":
            return Path(os.path.realpath(parts[2]))
    raise SystemExit(f"graft_libs: {path.name} needs {soname}, which ldd cannot find")


def _keep_rpath_inside(path: Path, root: Path) -> None:
    """Drop RPATH entries that point outside the wheel (e.g. the build's $ORIGIN/../pyarrow)."""
    rpath = subprocess.run(["patchelf", "--print-rpath", str(path)], check=True,
                           capture_output=True, text=True).stdout.strip()
    if not rpath:
        return
    kept = []
    for entry in rpath.split(":"):
        if entry.startswith("$ORIGIN"):
            target = (path.parent / entry.replace("$ORIGIN", ".", 1)).resolve()
            if target.is_dir() and target.is_relative_to(root.resolve()):
                kept.append(entry)
    if kept != rpath.split(":"):
        subprocess.run(["patchelf", "--set-rpath", ":".join(kept), str(path)], check=True)
        print(f"graft_libs: RPATH of {path.name}: {rpath} -> {':'.join(kept)}")


def graft(in_wheel: Path, out_wheel: Path, sonames: list[str]) -> None:
    with InWheel(in_wheel, out_wheel) as root:
        root = Path(root)
        elves = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and _is_elf(p)]
        libs = root / LIBS_DIR
        if not libs.is_dir():
            raise SystemExit(f"graft_libs: {in_wheel} has no {LIBS_DIR}/ (run auditwheel repair first)")
        for p in elves:
            _keep_rpath_inside(p, root)
        for soname in sonames:
            users = [p for p in elves if soname in _needed(p)]
            if not users:
                continue
            source = _resolve(users[0], soname)
            digest = hashlib.sha256(source.read_bytes()).hexdigest()[:8]
            stem, _, version = soname.partition(".so")
            new_name = f"{stem}-{digest}.so{version}"
            target = libs / new_name
            shutil.copy2(source, target)
            os.chmod(target, 0o755)
            subprocess.run(["patchelf", "--set-soname", new_name, str(target)], check=True)
            for p in users:
                subprocess.run(["patchelf", "--replace-needed", soname, new_name, str(p)], check=True)
            print(f"graft_libs: {soname} ({source}) -> {LIBS_DIR}/{new_name}, "
                  f"needed by {', '.join(sorted(p.name for p in users))}")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    graft(Path(argv[0]), Path(argv[1]), argv[2:] or ["libz.so.1"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
