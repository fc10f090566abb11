#!/usr/bin/env python3
"""AST mutants of pqloader's Python layer (`make mutants-py`).

The Python tests import the installed wheel (its compiled ``_core`` and grafted
libraries), not python/pqloader, so the mutants run on a staged copy instead: the
extension is built from this checkout as `make sanitize-python` builds it (without
sanitizers; Arrow from the virtualenv's pyarrow) into build/mutants/py/ext-build, and
python/pqloader plus that ``_core`` are copied to build/mutants/py/site; the tests run
with ``PYTHONPATH`` pointing there, so ``import pqloader`` takes the copy (checked).

Mutation sites in MODULES (operators: comparison flipped to its negation, True/False
swapped, ``and``/``or`` swapped, an int constant +1 and -1, a ``raise`` made ``pass``,
an ``if`` condition negated) are enumerated from the AST; a seeded sample of them
(--count, --seed) is applied one at a time (``ast.unparse`` of the mutated module) and
the tests mapped to the module (TESTS) are run with ``-x``. A mutant whose tests fail
(or time out) is killed; one whose module does not import or compile still counts as
killed (the tests fail). The working tree is never written.

    python tools/mutants/py_mutants.py [--count 70] [--seed 13] [--only N,N] [--list]
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "python" / "pqloader"
MODULES = ("_options.py", "_column_checks.py", "_state.py", "_iteration.py", "_env.py", "_mix.py",
           "_filter.py", "_temporal.py", "_lists.py", "_cli_args.py", "_loader.py", "cli.py", "_cli_progress.py",
           "_inspect.py", "transforms.py", "petastorm/reader.py", "petastorm/predicates.py",
           "petastorm/codecs.py", "petastorm/unischema.py", "petastorm/_schema_io.py",
           "petastorm/_dataset.py", "petastorm/_loader.py", "_torch_checkpoint.py",
           "_torch_dataset.py", "_process.py")
# (_torch.py is not mutated: test_torch.py takes 40 s, and its device checks skip without
# CUDA, so most of its sites survive on a machine without a GPU.)
# Tests run per mutated module: fast files that exercise it (each run stops at the
# first failure; at most about 12 s when none fails). Slow tests are left out:
# test_distributed.py (gloo ranks, 14 s), test_elastic's distributed checkpoint (19 s),
# test_cache.py (10 s), test_s3.py (80 s), test_ray_train.py, test_torch.py.
_ELASTIC = ["python/tests/test_elastic.py",
            "--deselect=python/tests/test_elastic.py::test_gather_state_dict_and_distributed_checkpoint"]
TESTS = {
    "_options.py": ["python/tests/test_arguments.py", "python/tests/test_errors.py",
                    "python/tests/test_determinism.py", "python/tests/test_values.py",
                    "python/tests/test_schema_evolution.py", "python/tests/test_arrow_interop.py",
                    "python/tests/test_summary.py"],
    "_column_checks.py": ["python/tests/test_arguments.py", "python/tests/test_values.py",
                          "python/tests/test_lists.py", "python/tests/test_stack.py",
                          "python/tests/test_mix.py", "python/tests/test_errors.py"],
    "_state.py": ["python/tests/test_arguments.py", "python/tests/test_determinism.py",
                  "python/tests/test_mutant_gaps.py", *_ELASTIC],
    "_iteration.py": ["python/tests/test_epoch_boundary.py", "python/tests/test_threads.py",
                      "python/tests/test_determinism.py", "python/tests/test_values.py",
                      "python/tests/test_cache_plan.py", "python/tests/test_mutant_gaps.py", *_ELASTIC],
    "_env.py": ["python/tests/test_arguments.py", "python/tests/test_determinism.py"],
    "_mix.py": ["python/tests/test_mix.py", "python/tests/test_stats_epochs.py",
                "python/tests/test_mutant_gaps.py"],
    "_filter.py": ["python/tests/test_filter.py", "python/tests/test_colnames.py"],
    "_temporal.py": ["python/tests/test_filter.py"],
    "_lists.py": ["python/tests/test_lists.py", "python/tests/test_pack.py"],
    "_cli_args.py": ["python/tests/test_cli.py", "python/tests/test_colnames.py"],
    "_loader.py": ["python/tests/test_arguments.py", "python/tests/test_uncovered_paths.py",
                   "python/tests/test_determinism.py", "python/tests/test_transforms.py"],
    "cli.py": ["python/tests/test_cli.py", "python/tests/test_uncovered_paths.py",
               "python/tests/test_cache_safety.py", "python/tests/test_cache_stale.py"],
    "_cli_progress.py": ["python/tests/test_cli_progress.py"],
    "_inspect.py": ["python/tests/test_inspect_lengths.py", "python/tests/test_summary.py",
                    "python/tests/test_cli.py"],
    "transforms.py": ["python/tests/test_transform_args.py", "python/tests/test_transforms.py"],
    **{f"petastorm/{m}": ["python/tests/test_petastorm.py", "python/tests/test_transform_args.py"]
       for m in ("reader.py", "predicates.py", "codecs.py", "unischema.py", "_schema_io.py",
                 "_dataset.py", "_loader.py")},
    "_torch_checkpoint.py": [*_ELASTIC],
    "_torch_dataset.py": [*_ELASTIC, "python/tests/test_torch.py"],
    "_process.py": ["python/tests/test_threads.py", "python/tests/test_torch.py"],
}

_NEGATE = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
           ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
           ast.NotIn: ast.In}
_OP_TEXT = {ast.Lt: "<", ast.GtE: ">=", ast.Gt: ">", ast.LtE: "<=", ast.Eq: "==", ast.NotEq: "!=",
            ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}


@dataclasses.dataclass(frozen=True)
class Site:
    module: str
    index: int  # position of the node in the module's ast.walk order
    kind: str  # compare, bool-const, bool-op, int+1, int-1, raise-pass, if-negate
    op: int  # which comparison operator of a chained compare
    line: int
    what: str


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def sites_of(module: str, tree: ast.AST) -> list[Site]:
    """Every mutation site of a module, in a fixed order."""
    out = []
    docs = _docstring_nodes(tree)
    annotations = set()
    for node in ast.walk(tree):  # nothing inside a type annotation is mutated
        for ann in ([getattr(node, "annotation", None), getattr(node, "returns", None)]):
            if ann is not None:
                annotations.update(id(n) for n in ast.walk(ann))
    for i, node in enumerate(ast.walk(tree)):
        if id(node) in annotations or id(node) in docs:
            continue
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                neg = _NEGATE[type(op)]
                out.append(Site(module, i, "compare", k, line, f"`{_OP_TEXT[type(op)]}` -> `{_OP_TEXT[neg]}`"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            out.append(Site(module, i, "bool-const", 0, line, f"`{node.value}` -> `{not node.value}`"))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out.append(Site(module, i, "int+1", 0, line, f"`{node.value}` -> `{node.value + 1}`"))
            out.append(Site(module, i, "int-1", 0, line, f"`{node.value}` -> `{node.value - 1}`"))
        elif isinstance(node, ast.BoolOp):
            a, b = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            out.append(Site(module, i, "bool-op", 0, line, f"`{a}` -> `{b}`"))
        elif isinstance(node, ast.Raise):
            out.append(Site(module, i, "raise-pass", 0, line, "`raise ...` -> `pass`"))
        elif isinstance(node, ast.If):
            out.append(Site(module, i, "if-negate", 0, line, "`if c:` -> `if not (c):`"))
    return out


def mutate(source: str, site: Site) -> str:
    """The module's source with `site` mutated (unparsed from the AST)."""
    tree = ast.parse(source)
    node = list(ast.walk(tree))[site.index]
    if site.kind == "compare":
        node.ops[site.op] = _NEGATE[type(node.ops[site.op])]()
    elif site.kind == "bool-const":
        node.value = not node.value
    elif site.kind in ("int+1", "int-1"):
        node.value += 1 if site.kind == "int+1" else -1
    elif site.kind == "bool-op":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif site.kind == "raise-pass":
        replacement = ast.Pass()
        ast.copy_location(replacement, node)
        _replace_stmt(tree, node, replacement)
    elif site.kind == "if-negate":
        node.test = ast.UnaryOp(op=ast.Not(), operand=copy.deepcopy(node.test))
    ast.fix_missing_locations(tree)
    return ast.unparse(tree) + "\n"


def _replace_stmt(tree: ast.AST, old: ast.stmt, new: ast.stmt) -> None:
    for parent in ast.walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers"):
            seq = getattr(parent, field, None)
            if isinstance(seq, list) and old in seq:
                seq[seq.index(old)] = new
                return
    raise AssertionError("statement not found")


def build_extension(build_dir: Path, python: str, jobs: int) -> Path:
    """Build the extension (_core) of this checkout into `build_dir`, as `make
    sanitize-python` does without sanitizers; return the built module."""
    venv = Path(python).parent
    cmd = [str(venv / "cmake"), "-S", str(REPO), "-B", str(build_dir), "-G", "Ninja",
           "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={python}", "-DPQLOADER_BUILD_PYTHON=ON",
           "-DPQLOADER_BUILD_TESTS=OFF", f"-DCMAKE_MAKE_PROGRAM={venv / 'ninja'}"]
    for step in (cmd, [str(venv / "cmake"), "--build", str(build_dir), f"-j{jobs}", "--target", "_core"]):
        r = subprocess.run(step, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            sys.exit("py_mutants: building the extension failed:\n" + r.stdout[-4000:])
    built = sorted((build_dir / "python" / "src").glob("_core*.so"))
    if not built:
        sys.exit(f"py_mutants: no _core*.so in {build_dir}/python/src")
    return built[0]


def stage(site_dir: Path, extension: Path) -> None:
    """This checkout's python/pqloader (every file but compiled ones) and the extension
    built from it, in `site_dir`/pqloader."""
    if site_dir.exists():
        shutil.rmtree(site_dir)
    shutil.copytree(PKG, site_dir / "pqloader", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copyfile(extension, site_dir / "pqloader" / extension.name)


def run_tests(python: str, site_dir: Path, tests: list[str], timeout: float) -> tuple[bool, str]:
    env = dict(os.environ, PYTHONPATH=str(site_dir), PYTHONDONTWRITEBYTECODE="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--timeout=60", *tests]
    try:
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "(timed out)"
    failed = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith("FAILED ")]
    first = failed[0] if failed else (r.stdout.strip().splitlines() or [""])[-1]
    return r.returncode == 0, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=70, help="mutants sampled from all sites")
    ap.add_argument("--seed", type=int, default=13, help="seed of the sample")
    ap.add_argument("--only", default="", help="comma-separated sample numbers (1-based) to run")
    ap.add_argument("--list", action="store_true", help="list the sampled mutants and exit")
    ap.add_argument("--scratch", default="build/mutants/py", help="scratch dir (repo-relative)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per mutant's test run")
    ap.add_argument("--report", default="build/mutants/py-report.md", help="markdown report (repo-relative)")
    ap.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"))
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")))
    args = ap.parse_args()

    sources = {m: (PKG / m).read_text() for m in MODULES}
    all_sites = [s for m in MODULES for s in sites_of(m, ast.parse(sources[m]))]
    sample = sorted(random.Random(args.seed).sample(all_sites, min(args.count, len(all_sites))),
                    key=lambda s: (MODULES.index(s.module), s.line, s.index, s.kind))
    numbered = list(enumerate(sample, 1))
    if args.only:
        keep = {int(x) for x in args.only.split(",")}
        numbered = [(n, s) for n, s in numbered if n in keep]
    if args.list:
        print(f"{len(all_sites)} sites; sample of {len(sample)} (seed {args.seed})")
        for n, s in numbered:
            print(f"{n:3} {s.module}:{s.line} {s.kind} {s.what}")
        return 0

    t_start = time.monotonic()
    site_dir = (REPO / args.scratch / "site").resolve()
    print("py_mutants: building the extension ...", flush=True)
    stage(site_dir, build_extension((REPO / args.scratch / "ext-build").resolve(), args.python, args.jobs))
    env = dict(os.environ, PYTHONPATH=str(site_dir))
    where = subprocess.run([args.python, "-c", "import pqloader; print(pqloader.__file__)"],
                           env=env, capture_output=True, text=True).stdout.strip()
    if not where.startswith(str(site_dir)):
        sys.exit(f"py_mutants: `import pqloader` does not take the scratch copy (got {where!r})")
    all_tests = list(dict.fromkeys(t for m in MODULES for t in TESTS[m]))
    t0 = time.monotonic()
    ok, first = run_tests(args.python, site_dir, all_tests, args.timeout * 3)
    if not ok:
        sys.exit(f"py_mutants: the unmutated tests fail on the scratch copy ({first})")
    print(f"py_mutants: baseline passes ({time.monotonic() - t0:.0f} s); {len(all_sites)} sites, "
          f"{len(numbered)} mutants (seed {args.seed})", flush=True)

    results = []
    for n, s in numbered:
        path = site_dir / "pqloader" / s.module
        t0 = time.monotonic()
        try:
            path.write_text(mutate(sources[s.module], s))
            ok, first = run_tests(args.python, site_dir, TESTS[s.module], args.timeout)
        finally:
            path.write_text(sources[s.module])
        status = "survived" if ok else "killed"
        results.append((n, s, status, "" if ok else first))
        print(f"[{n}] {s.module}:{s.line} {s.kind} {s.what}: {status} ({time.monotonic() - t0:.0f} s)",
              flush=True)

    killed = sum(r[2] == "killed" for r in results)
    rate = 100.0 * killed / max(1, len(results))
    lines = ["| # | where | mutation | result | first failure |", "| --- | --- | --- | --- | --- |"]
    for n, s, status, first in results:
        lines.append(f"| {n} | {s.module}:{s.line} | {s.kind}: {s.what} | {status} | {first} |")
    lines += ["", f"Python mutants: {len(results)} of {len(all_sites)} sites (seed {args.seed}), "
                  f"killed {killed}, survived {len(results) - killed}; kill rate {rate:.1f} %; "
                  f"{time.monotonic() - t_start:.0f} s"]
    report = "\n".join(lines)
    out = REPO / args.report
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report + "\n")
    print()
    print(report)
    print(f"\n(report written to {args.report})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
