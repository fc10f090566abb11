"""Copy into a repaired wheel the shared libraries that auditwheel leaves to the system.

auditwheel grafts every library the wheel links except those its manylinux policy lets
the target system provide; zlib (`libz.so.1`, which the grafted libpng needs) is one of
them. pqloader carries it too, so that the extension resolves nothing but glibc,
libstdc++ and libgcc from the system (tested with ldd in python/tests_wheel). Each
library is grafted the way auditwheel does it: copied into `pqloader.libs/` as
`NAME-<first 8 hex digits of its sha256>.so.N`, that soname set, and every ELF file of
the wheel that needs it re-pointed to the new name (they already look in
`pqloader.libs/` through their RPATH; a library of `pqloader.libs/` that had none, as
libpng had since its libz was the system's, gets `$ORIGIN`). RPATH entries that lead
outside the wheel (the build's `$ORIGIN/../pyarrow`) are dropped, so an installed pyarrow
is never searched.

Every library of `pqloader.libs/` is redistributed with its license: that of the Python
distribution it was copied from (pyarrow's LICENSE.txt and NOTICE.txt, which Apache-2.0
requires to travel with its binaries) or the Debian package's copyright file, in
`<dist-info>/licenses/third_party/<source>/`, and `third_party/LIBRARIES.txt` says which
library comes from where. A library whose license cannot be found fails the build.
RECORD is rewritten.

Usage: python packaging/graft_libs.py IN_WHEEL OUT_WHEEL [SONAME ...]  (default libz.so.1)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
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


def _ensure_origin_rpath(path: Path) -> None:
    """Let a library of pqloader.libs/ find its siblings itself (a RUNPATH of the extension
    covers only the extension's own NEEDED entries, not theirs)."""
    rpath = subprocess.run(["patchelf", "--print-rpath", str(path)], check=True,
                           capture_output=True, text=True).stdout.strip()
    if "$ORIGIN" not in rpath.split(":"):
        subprocess.run(["patchelf", "--set-rpath", ":".join(filter(None, ["$ORIGIN", rpath])),
                        str(path)], check=True)


def _license_source(plain: str) -> tuple[str, list[Path]]:
    """(source, license files) of the library file named `plain` before auditwheel mangled
    it: the Python distribution that ships it, else the Debian package that does."""
    for dist in importlib.metadata.distributions():
        if any(Path(f).name == plain for f in dist.files or ()):
            files = [Path(dist.locate_file(f)) for f in dist.files or ()
                     if ".dist-info/" in f.as_posix()
                     and re.match(r"(LICEN[CS]E|COPYING|NOTICE)", Path(f).name, re.I)]
            if files:
                return f"{dist.metadata['Name']}-{dist.version}", files
    try:
        out = subprocess.run(["dpkg", "-S", f"*/{plain}"], capture_output=True, text=True).stdout
    except FileNotFoundError:  # not a Debian system: no package to ask (the error below says so)
        out = ""
    for line in out.splitlines():
        package = line.split(":")[0].strip()
        copyright = Path("/usr/share/doc") / package / "copyright"
        if copyright.is_file():
            return package, [copyright]
    raise SystemExit(f"graft_libs: no license found for {plain} (neither a Python distribution "
                     "nor a Debian package ships it); the wheel may not redistribute it without")


def _add_licenses(root: Path) -> None:
    dist_info = next(root.glob("*.dist-info"))
    third_party = dist_info / "licenses" / "third_party"
    third_party.mkdir(parents=True, exist_ok=True)
    lines = []
    for lib in sorted((root / LIBS_DIR).iterdir()):
        plain = re.sub(r"-[0-9a-f]{8}(?=\.so)", "", lib.name)
        source, files = _license_source(plain)
        (third_party / source).mkdir(exist_ok=True)
        for f in files:
            shutil.copyfile(f, third_party / source / f.name)
        lines.append(f"{LIBS_DIR}/{lib.name}: {plain} from {source} "
                     f"({', '.join(f'{source}/{f.name}' for f in files)})")
    (third_party / "LIBRARIES.txt").write_text("\n".join(lines) + "\n")
    print(f"graft_libs: licenses of {len(lines)} bundled libraries -> {third_party.relative_to(root)}")


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
        for p in sorted(libs.iterdir()):
            if any((libs / needed).is_file() for needed in _needed(p)):
                _ensure_origin_rpath(p)
        _add_licenses(root)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    graft(Path(argv[0]), Path(argv[1]), argv[2:] or ["libz.so.1"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
