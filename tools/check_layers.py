"""Check that the library's folders include each other only downwards.

    python tools/check_layers.py        (part of `make lint`)

Each folder of cpp/src/pqloader/ may include the folders listed for it in ALLOWED (and
the top-level error.h); tests (*_test.cc, *_benchmark.cc) may include anything. A new
edge is a design decision: add it here with its reason, and keep the graph acyclic.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "cpp" / "src" / "pqloader"

# folder -> folders it may include. Lower layers first.
ALLOWED: dict[str, set[str]] = {
    "util": set(),
    "random": {"util"},  # util/target_clones.h: a macro, the standard library otherwise
    "exec": {"util"},  # threads and order, nothing of Parquet
    "plan": {"random", "util"},  # pure: which rows, in what order
    "tensor": {"plan", "util"},  # batches, gathers, the buffer pool (RowRef from plan/)
    "io": {"tensor", "util"},  # util/fork_gate.h: storage tasks let a fork wait for them
    "transform": {"random", "tensor", "util"},
    "cache": {"tensor", "transform", "util"},  # entries hold transformed samples
    "dataset": {"cache", "io", "tensor", "util"},  # cache/: remote footers kept on disk
    "decode": {"dataset", "plan", "tensor", "util"},  # converts to the specs dataset/ chose
    "filter": {"cache", "dataset", "util"},
    "pack": {"cache", "dataset", "decode", "plan", "tensor", "util"},  # cache/: lengths kept on disk
    "mix": {"pack", "plan", "random", "tensor", "util"},  # and loader.h: it drives Loaders (pack/: packed sources)
}
# Top-level headers a folder may include besides error.h.
TOP_LEVEL: dict[str, set[str]] = {"mix": {"loader.h"}}

INCLUDE = re.compile(r'#include "pqloader/([^"]+)"')


def main() -> int:
    problems = []
    for folder in sorted(p for p in ROOT.iterdir() if p.is_dir()):
        name = folder.name
        if name not in ALLOWED:
            problems.append(f"{name}/: a new folder; list what it may include in tools/check_layers.py")
            continue
        for src in sorted(folder.iterdir()):
            if src.suffix not in (".h", ".cc") or src.stem.endswith(("_test", "_benchmark")):
                continue
            for target in INCLUDE.findall(src.read_text()):
                parts = target.split("/")
                if len(parts) == 1:
                    if target != "error.h" and target not in TOP_LEVEL.get(name, set()):
                        problems.append(f"{name}/{src.name} includes {target}")
                elif parts[0] != name and parts[0] not in ALLOWED[name]:
                    problems.append(f"{name}/{src.name} includes {target} ({name}/ -> {parts[0]}/)")
    # The table itself must stay acyclic.
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 1:
            problems.append("cycle: " + " -> ".join(path + [n]))
            return
        if state.get(n) == 2:
            return
        state[n] = 1
        for m in sorted(ALLOWED.get(n, ())):
            visit(m, path + [n])
        state[n] = 2

    for n in ALLOWED:
        visit(n, [])
    for p in problems:
        print(f"check_layers: {p}", file=sys.stderr)
    if not problems:
        print(f"check_layers: {len(ALLOWED)} folders include only downwards")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
