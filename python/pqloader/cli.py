"""The `pqloader` command line: inspect datasets and measure loading speed."""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import resource
import select
import sys
import time
import warnings
from typing import Any, Callable, Sequence

import pqloader
from pqloader import _core, _env
from pqloader._cli_args import column_list, parse_storage_options, parse_transforms
from pqloader._cli_progress import Progress, clear_current, enabled_for
from pqloader._stats_table import stage_seconds


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _column_list(text: str) -> list[str]:
    try:
        return column_list(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _progress(args: argparse.Namespace, label: str, **kw) -> Progress:
    """Progress on stderr: drawn only on a terminal and without --quiet."""
    return Progress(label, enabled=enabled_for(sys.stderr, args.quiet), **kw)


def _shown(text: str) -> str:
    """`text` with control characters escaped (``\\x1b``, ``\\n``): a file or column name
    holding an escape sequence reached the terminal as one, and one holding a newline
    split an error or warning line (a log took its rest for another record)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _inspect(args: argparse.Namespace) -> int:
    what = "footers and row lengths" if args.lengths else "footers"
    counter = _core.Progress()
    with _progress(args, f"inspect {_shown(args.path)}: reading {what}", unit="files", ticker=True,
                   counter=counter):
        info = pqloader.inspect(args.path, lengths=args.lengths,
                                storage_options=parse_storage_options(args.storage_option),
                                filter=args.filter, _progress=counter,
                                coerce_int96_timestamp_unit=args.coerce_int96_timestamp_unit)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['num_files']} file(s), {info['num_row_groups']} row group(s), {info['num_rows']} rows, "
          f"{_human(sum(f['size_bytes'] for f in info['files']))}")
    print("\ncolumns:")
    width = max((len(_shown(c)) for c in info["schema"]), default=4)
    for name, arrow_type in info["schema"].items():
        # The type names a map's field or a struct's; loads_as may quote the column
        print(f"  {_shown(name):<{width}}  {_shown(arrow_type):<32}  -> {_shown(info['loads_as'][name])}")
    if "lengths" in info and not info["lengths"]:
        print("\nrow lengths: no ragged list column among the selected ones (fixed-size lists have one length)")
    elif "lengths" in info:
        print("\nrow lengths (list elements per row):")
        for name, s in info["lengths"].items():
            nulls = f"  nulls={s['nulls']} (as empty lists)" if s.get("nulls") else ""
            print(f"  {_shown(name):<{width}}  rows={s['rows']}  min={s['min']}  median={s['median']}  "
                  f"p99={s['p99']}  max={s['max']}  mean={s['mean']:.1f}  total={s['total']}{nulls}")
    elif info["ragged"]:
        print(f"\nragged: {', '.join(map(_shown, info['ragged']))} (--lengths reads their row lengths: "
              "min/median/p99/max; one pass over each column)")
    print("\nfiles:")
    shown = info["files"] if args.all_files else info["files"][:20]
    for f in shown:
        print(f"  {_shown(f['path'])}  rows={f['num_rows']}  row_groups={f['num_row_groups']}  "
              f"size={_human(f['size_bytes'])}  compression={f['compression']}")
    if len(shown) < len(info["files"]):
        print(f"  ... {len(info['files']) - len(shown)} more (--all-files)")
    if "filter" in info:
        _print_filter(info["filter"])
    if info.get("skipped"):
        print("\nskipped (not Parquet):")
        for f in info["skipped"]:
            print(f"  {_shown(f['path'])}  ({_shown(f['reason'])})")
    return 0


def _print_filter(f: dict) -> None:
    print(f"\nfilter: {_shown(str(f['expression']))}")
    print(f"  partition keys: {f['files_pruned']} of {f['files']} file(s) pruned "
          f"({f['row_groups_pruned_partition']} row group(s)), "
          f"{f['row_groups_all_rows']} row group(s) kept whole")
    print(f"  statistics:     {f['row_groups_pruned_statistics']} row group(s) pruned")
    print(f"  row masks:      {f['row_groups_masked']} row group(s) read "
          f"({_human(f['mask_bytes_read'])} of filter columns), {f['row_groups_pruned_mask']} pruned")
    share = f["bytes_pruned"] / f["bytes"] if f["bytes"] else 0.0
    print(f"  kept: {f['rows_kept']} of {f['rows']} rows; {share:.0%} of the loaded columns' bytes "
          f"not read{' (selection from the cache)' if f['from_store'] else ''}")


def _index(args: argparse.Namespace) -> int:
    counter = _core.Progress()
    with _progress(args, f"index {_shown(args.path)}: reading footers", unit="files", ticker=True,
                   counter=counter):
        r = pqloader.write_index(args.path, storage_options=parse_storage_options(args.storage_option),
                                 _progress=counter)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"wrote {_shown(str(r['metadata_path']))} ({_human(r['bytes'])}): {r['files']} file(s), "
          f"{r['row_groups']} row group(s), {r['rows']} rows; and _pqloader_index beside it")
    return 0


def _bench(args: argparse.Namespace) -> int:
    columns = args.columns
    transforms = parse_transforms(args.transform)
    storage_options = parse_storage_options(args.storage_option)
    tuning = {k: v for k, v in (("io_threads", args.io_threads), ("readahead", args.readahead))
              if v is not None}
    start = time.perf_counter()
    loader = pqloader.Loader(args.path, columns=columns, batch_size=args.batch_size,
                             num_workers=args.num_workers, shuffle=args.shuffle,
                             seed=args.seed, num_epochs=args.epochs, cache_dir=args.cache_dir,
                             transforms=transforms, storage_options=storage_options,
                             filter=args.filter,
                             coerce_int96_timestamp_unit=args.coerce_int96_timestamp_unit, **tuning)
    rows = 0
    first_batch = None
    try:
        per_epoch = len(loader)
    except (pqloader.Error, TypeError, ValueError):
        per_epoch = None
    total = per_epoch * args.epochs if per_epoch is not None else None
    with _progress(args, "bench", total=total, unit="batches") as progress:
        for batch in loader:
            if first_batch is None:
                first_batch = time.perf_counter() - start
            rows += len(next(iter(batch.values()))) if batch else 0
            if progress.enabled:
                epoch = min(progress.count // per_epoch + 1, args.epochs) if per_epoch else None
                progress.update(1, f"epoch {epoch}/{args.epochs}  {rows:,} rows" if epoch
                                else f"{rows:,} rows")
    elapsed = time.perf_counter() - start
    s = loader.stats()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {
        "rows": rows,
        "epochs": args.epochs,
        "seconds": elapsed,
        "rows_per_second": rows / elapsed if elapsed > 0 else 0.0,
        "read_mb_per_second": s["bytes_read"] / elapsed / 1e6 if elapsed > 0 else 0.0,
        "decoded_mb_per_second": s["bytes_decoded"] / elapsed / 1e6 if elapsed > 0 else 0.0,
        "time_to_first_batch_seconds": first_batch,
        "peak_rss_bytes": peak_rss,
        "wait_fraction": s["wait_fraction"],
        # The count the Loader ran with (its default is one worker per CPU it may use), not None.
        "num_workers": args.num_workers if args.num_workers is not None else _env.available_cpus(),
        "stages_seconds": stage_seconds(s),
        "diagnosis": pqloader.diagnose(s),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"rows: {rows} in {elapsed:.3f} s over {args.epochs} epoch(s)")
    print(f"rows/s: {result['rows_per_second']:,.0f}")
    print(f"MB/s: {result['read_mb_per_second']:.1f} read (compressed Parquet), "
          f"{result['decoded_mb_per_second']:.1f} decoded")
    print(f"time to first batch: {first_batch * 1000:.1f} ms" if first_batch is not None
          else "time to first batch: none (no batch)")
    print(f"peak RSS: {_human(peak_rss)}")
    print()
    print(pqloader.format_stats(s))
    return 0


def _not_removed(report: dict, action: str) -> int:
    """Status 1, with one error line, when `clear`/`prune` could not delete some files
    (another user's, in a directory this one may not write): the rest was done."""
    count = report.get("not_removed_count", 0)
    if not count:
        return 0
    first = report["not_removed"][0] if report["not_removed"] else "?"
    print(f"pqloader: error: cache {action}: {count} file(s) could not be deleted and were left "
          f"in place (first: {_shown(first)}); the rest was done", file=sys.stderr)
    return 1


def _cache(args: argparse.Namespace) -> int:
    with _progress(args, f"cache {args.action} {_shown(args.dir)}", ticker=True):
        return _cache_run(args)


def _cache_run(args: argparse.Namespace) -> int:
    if args.action == "clear":
        if args.dataset:
            raise ValueError("--dataset is for `cache stats` and `cache prune`; `cache clear` "
                             "deletes every entry")
        r = pqloader.cache_clear(args.dir)
        if args.json:
            print(json.dumps(r))
            return _not_removed(r, "clear")
        print(f"cleared {_shown(args.dir)}: {r['entries']} entries ({_human(r['bytes'])}), "
              f"{r['other_files']} other pqloader files")
        if r["foreign_count"]:
            print(f"left alone, not pqloader's: {r['foreign_count']} path(s)")
            for path in r["foreign"]:
                print(f"  {_shown(str(path))}")
            if r["foreign_count"] > len(r["foreign"]):
                print(f"  ... {r['foreign_count'] - len(r['foreign'])} more")
        return _not_removed(r, "clear")
    if args.action == "prune":
        r = pqloader.cache_prune(args.dir, dataset=args.dataset,
                                 storage_options=parse_storage_options(args.storage_option))
        if args.json:
            print(json.dumps(r))
            return _not_removed(r, "prune")
        print(f"pruned {_shown(args.dir)}: {r['entries']} stale entries deleted, {_human(r['bytes'])} "
              f"freed; {r['kept']} kept")
        if r["unverified_entries"]:
            print(f"kept unverified (source not checked: unreachable, or not in --dataset): "
                  f"{r['unverified_entries']}")
        return _not_removed(r, "prune")
    s = pqloader.cache_stats(args.dir, dataset=args.dataset,
                             storage_options=parse_storage_options(args.storage_option))
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"entries: {s['entries']}")
    print(f"bytes: {s['bytes']} ({_human(s['bytes'])})")
    print(f"stale entries (source changed or gone; `pqloader cache prune` deletes them): "
          f"{s['stale_entries']} ({_human(s['stale_bytes'])})")
    if s.get("unverified_entries"):
        print(f"unverified entries (source not checked): {s['unverified_entries']}")
    if s.get("temp_files"):
        print(f"temp files (writes in progress or interrupted): {s['temp_files']}")
    if s.get("fetch_markers"):
        print(f"row groups being fetched (in-progress markers): {s['fetch_markers']}")
    if s.get("selections"):  # outside the entries' size limit; `cache clear` deletes them
        print(f"filter selections (outside the size limit): {s['selections']} "
              f"({_human(s['selection_bytes'])})")
    if s.get("lengths"):
        print(f"packing's row lengths (outside the size limit): {s['lengths']} "
              f"({_human(s['lengths_bytes'])})")
    if s.get("footers"):
        print(f"remote footers (outside the size limit): {s['footers']} ({_human(s['footer_bytes'])})")
    for key in ("hits", "misses", "inserts", "evictions", "evicted_stale", "refused_full",
                "refused_later", "refused_too_large", "refused_stale", "waits", "wait_timeouts",
                "corrupt", "read_errors", "write_errors"):
        if key in s:
            print(f"{key}: {s[key]}")
    return 0


def _version() -> str:
    """The version of the code running: ``pqloader.__version__`` (pyproject's version;
    the installed distribution's metadata can lag behind a source checkout)."""
    return pqloader.__version__


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that text it cannot write is an error: argparse drops an
    ``OSError`` of its output, so ``pqloader --help > /dev/full`` printed nothing and said
    status 0 (``cat --help > /dev/full`` fails, status 1)."""

    def _print_message(self, message: str, file=None) -> None:
        stream = file if file is not None else sys.stderr
        if message and stream is not None:  # None: the stream was closed at start (dropped)
            stream.write(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pqloader", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pqloader {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true",
                        help="no progress line on stderr (drawn only when stderr is a terminal)")
    common.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                        help="a storage option of s3:// sources (as Loader's storage_options: "
                             "region, endpoint_override, anonymous, ...); repeat for more (each key once)")
    # Where the data's types come in (inspect, bench): INT96's unit (Spark's 9999-12-31).
    types = argparse.ArgumentParser(add_help=False)
    types.add_argument("--coerce-int96-timestamp-unit", choices=["ns", "us", "ms", "s"], default=None,
                       help="the unit INT96 timestamps load in, as Loader's "
                            "coerce_int96_timestamp_unit (default ns: dates 1677-2262)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="show files, row groups and schema", parents=[common, types])
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--all-files", action="store_true", help="list every file")
    p.add_argument("--lengths", action="store_true",
                   help="read the row lengths of ragged list columns and show min/median/p99/max "
                        "(one pass over each such column; of every row, --filter does not apply)")
    p.add_argument("--filter", metavar="EXPR",
                   help="show what this row filter prunes at each stage (partition keys, "
                        "row-group statistics, row masks), e.g. \"lang == 'en' and year >= 2020\" "
                        "(a column whose name is no Python name in backticks: \"`my-col` > 3\"; "
                        "temporal literals: \"ts >= timestamp('2024-01-01 12:00')\", date('2024-01-01'), "
                        "time('12:00'), duration(90, 's'))")
    p.set_defaults(func=_inspect)
    x = sub.add_parser("index", parents=[common],
                       help="write a summary (_metadata) of a directory's files, so loaders "
                            "read one object instead of every footer")
    x.add_argument("path", help="a local directory or s3://bucket/prefix")
    x.add_argument("--json", action="store_true", help="print JSON")
    x.set_defaults(func=_index)
    b = sub.add_parser("bench", help="stream a dataset and report throughput",
                       parents=[common, types])
    b.add_argument("path")
    b.add_argument("--columns", type=_column_list, help="comma-separated column names (default: all); a name with a comma, "
                        "spaces at an end or a backtick in backticks: '`a,b`,c'")
    b.add_argument("--batch-size", type=_at_least_one, default=1024, help="default 1024")
    b.add_argument("--num-workers", type=_at_least_one, default=None,
                   help="Loader's num_workers (default: the CPUs it may use)")
    b.add_argument("--epochs", type=_at_least_one, default=1, help="default 1")
    b.add_argument("--shuffle", action="store_true")
    b.add_argument("--seed", type=int, default=None)
    b.add_argument("--json", action="store_true", help="print JSON")
    b.add_argument("--cache-dir", help="use (and fill) this cache directory")
    b.add_argument("--transform", action="append", metavar="COLUMN=OPS",
                   help="pqloader.transforms ops of a column, written as in Python, e.g. "
                        "'image=DecodeImage(), Resize(256), CenterCrop(224)'; repeat for more "
                        "columns")
    b.add_argument("--filter", metavar="EXPR",
                   help="Loader's filter, e.g. \"lang == 'en' and year >= 2020\" or "
                        "\"ts >= timestamp('2024-01-01')\" (the syntax of inspect --filter; the mask pass "
                        "runs when the Loader is made, counted in the time)")
    b.add_argument("--io-threads", type=_at_least_one, help="Loader's io_threads (default 16)")
    b.add_argument("--readahead", type=_at_least_one, help="Loader's readahead (row groups)")
    b.set_defaults(func=_bench)
    c = sub.add_parser("cache", help="inspect, prune or clear a cache directory", parents=[common],
                       description="stats: entries, bytes, stale entries and what loaders recorded; "
                                   "prune: delete stale entries (their source file changed or is "
                                   "gone); clear: delete every entry")
    c.add_argument("action", choices=["stats", "prune", "clear"])
    c.add_argument("dir")
    c.add_argument("--dataset", help="stats/prune: check only the entries of this dataset's files "
                                     "(a path, directory, glob or URL, as given to a Loader)")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=_cache)
    return parser


# Exit status when stdout's reader went away (``pqloader inspect X | head``): 128 + SIGPIPE,
# what a shell reports for a command that SIGPIPE ended (``cat``, ``grep``), so
# ``set -o pipefail`` scripts see the same as with those tools. Nothing is printed.
EXIT_BROKEN_PIPE = 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush of what is still
    buffered does not fail again ("Exception ignored ... BrokenPipeError")."""
    if sys.stdout is None:  # started with stdout closed: nothing is buffered
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on it),
    so a BrokenPipeError from elsewhere (a socket) is still reported as an error."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return True  # cannot tell: stdout is the likely one


class _ClosedStdout(io.TextIOBase):
    """``sys.stdout`` for a command started with stdout closed (``pqloader inspect X >&-``,
    where Python sets ``sys.stdout`` to None and ``print`` drops everything silently):
    the first write fails, so the lost output is reported (exit status 1), as coreutils
    report a write error."""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, "cannot write the output: stdout is closed")


def _output_error(e: OSError) -> OSError:
    """The error of a failed write of the command's output: it names stdout, where a full
    disk (``bench --json > out.json``) said only "[Errno 28] No space left on device"."""
    return OSError(e.errno, f"cannot write the output (stdout): {e.strerror or e}")


class _Output:
    """``sys.stdout`` while a command runs: the real one, whose write errors (other than a
    broken pipe, which keeps its own handling) name the output (see _output_error)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, s: str) -> int:
        return self._named(self._stream.write, s)

    def flush(self) -> None:
        self._named(self._stream.flush)

    @staticmethod
    def _named(call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            if e.errno is None:
                raise
            raise _output_error(e) from e

    def __getattr__(self, name: str):  # fileno, isatty, encoding, errors, ...
        return getattr(self._stream, name)


def _run(argv: Sequence[str] | None) -> int:
    stdout = sys.stdout
    if stdout is not None:
        sys.stdout = _Output(stdout)
    try:
        args = build_parser().parse_args(argv)  # --help, --version: argparse copes with None
        if stdout is None:
            sys.stdout = _ClosedStdout()
        return _run_command(args)
    finally:
        if sys.stdout is not stdout and isinstance(sys.stdout, (_ClosedStdout, _Output)):
            sys.stdout = stdout


def _run_command(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except BrokenPipeError as e:
        if _stdout_reader_gone():
            raise
        _print_error(e)
        return 1
    except (pqloader.Error, ValueError, TypeError, OSError, ImportError, MemoryError) as e:
        # ImportError: an optional dependency (pyarrow for --filter) is missing.
        # MemoryError: the engine could not allocate a batch (its message names the batch,
        # its row groups and the bytes asked for), e.g. --transform 'x=PadOrTruncate(1000000000000)'.
        _print_error(e)
        return 1
    except KeyboardInterrupt:
        return 130


def _print_error(e: BaseException) -> None:
    """``pqloader: error: <message>`` on stderr. Started with stderr closed (``2>&-``),
    Python sets ``sys.stderr`` to None and ``print(file=None)`` writes to stdout: the
    message went into the command's output (``inspect X --json 2>&- > out.json``); it is
    dropped, as Python's own, and the status still says 1."""
    if sys.stderr is None:
        return
    print(f"pqloader: error: {_shown(str(e))}", file=sys.stderr)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` while the CLI runs: ``pqloader: warning: <message>``, one
    line, without Python's ``file:line: Category`` prefix and source line (an internal
    path of the package means nothing to a command's user)."""
    text = str(message)
    if text.startswith("pqloader: "):
        text = text[len("pqloader: "):]
    elif text.startswith("pqloader "):  # "pqloader cache: ..." -> "pqloader: warning: cache: ..."
        text = text[len("pqloader "):]
    stream = file if file is not None else sys.stderr
    if stream is None:  # stderr closed (print would take stdout): dropped, as Python's own
        return
    try:
        clear_current(stream)  # a progress line being drawn there: the warning on its own line
        print(f"pqloader: warning: {_shown(text)}", file=stream)
    except (OSError, ValueError):  # a broken or closed stderr: as Python's own
        pass


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings():  # restores showwarning for a caller of main()
        warnings.showwarning = _show_warning
        return _main(argv)


def _escaping_stdout() -> str | None:
    """Make stdout write a character its encoding lacks escaped (``\\xef``), as Python's
    stderr does, instead of failing: with ``PYTHONIOENCODING=ascii`` (or a non-UTF-8
    locale) a non-ASCII file or column name stopped ``inspect`` half-way with "pqloader:
    error: 'ascii' codec can't encode character". Returns the error handler to restore,
    or None when stdout was left as it was."""
    stream = sys.stdout
    errors = getattr(stream, "errors", None)
    if errors != "strict" or not hasattr(stream, "reconfigure"):
        return None
    try:
        stream.reconfigure(errors="backslashreplace")
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None
    return errors


def _flush_output() -> None:
    """Flush stdout: a command's buffered output is written here (see _output_error)."""
    _Output(sys.stdout).flush()


def _main(argv: Sequence[str] | None) -> int:
    stdout, restore = sys.stdout, _escaping_stdout()
    try:
        try:
            rc = _run(argv)
        finally:  # also for argparse's exits (--help, --version): their text is buffered
            try:
                if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
                    _flush_output()
            finally:
                if restore is not None:  # a caller's stdout (main() called in-process)
                    try:
                        stdout.reconfigure(errors=restore)
                    except (OSError, ValueError):  # a broken pipe: reported as before
                        pass
        return rc
    except BrokenPipeError:  # stdout's reader closed early: a quiet exit, as `cat` does
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as e:  # argparse's text (--help, --version) not written: a full disk
        _silence_stdout()
        _print_error(e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
