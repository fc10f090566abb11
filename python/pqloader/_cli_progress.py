"""A minimal one-line progress indicator for the command line (no dependency).

It draws on stderr only when stderr is a terminal (and ``TERM`` is not ``dumb``) and the
command was not given ``--quiet``: piped or redirected output, logs and tests see nothing.
The line is redrawn at most every ``interval`` seconds and erased when the work ends, so
what the command prints on stdout is the same with or without it.

``ticker=True`` also redraws from a background thread (elapsed time keeps moving) for
calls into the engine that release the GIL (inspect, index, the cache commands);
``counter`` (the engine's ``_core.Progress``, with ``done`` and ``total``) makes that
line count: ``inspect DIR: reading footers  1234/100000 files  5,000 files/s  0.3 s``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Any


# The line being drawn (one command draws one at a time): a warning printed meanwhile
# erases it first (clear_current), else it went on after the line's text
# ("bench  0/1000 batches  0.0 spqloader: warning: ...").
_current: "Progress | None" = None


def clear_current(stream: IO[str] | None) -> None:
    """Erase the progress line drawn on `stream`, if any, so that a message printed there
    starts at the line's start; the line is drawn again at its next redraw."""
    progress = _current
    if progress is not None and progress.stream is stream:
        progress.clear()


def enabled_for(stream: IO[str] | None, quiet: bool = False) -> bool:
    """Whether progress should be drawn on `stream`: a TTY, not ``--quiet``, not TERM=dumb."""
    if quiet or stream is None or os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """``label  n/total unit  rate/s  elapsed`` on one line, redrawn in place.

    Args:
        label: What is being done.
        total: Expected count, or None (shows the count alone).
        unit: Name of what is counted (``"batches"``).
        stream: Where to draw (default ``sys.stderr``).
        enabled: Draw at all; default :func:`enabled_for` (stream).
        interval: Least seconds between redraws.
        ticker: Redraw from a background thread every `interval` too.
        counter: An object whose ``done`` and ``total`` (-1: unknown) give the count and
            total, read at each redraw (the engine updates them from its threads).
    """

    def __init__(self, label: str, total: int | None = None, unit: str = "", *,
                 stream: IO[str] | None = None, enabled: bool | None = None,
                 interval: float = 0.1, ticker: bool = False, counter: Any = None) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.counter = counter
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled_for(self.stream) if enabled is None else enabled
        self.interval = interval
        self.count = 0
        self.extra = ""
        self._start = time.monotonic()
        self._last_draw = float("-inf")
        self._width = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.enabled:
            global _current
            _current = self
            self._draw()
            if ticker:
                self._thread = threading.Thread(target=self._tick, name="pqloader-progress",
                                                daemon=True)
                self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw()

    def text(self) -> str:
        """The line as it would be drawn now."""
        elapsed = time.monotonic() - self._start
        if self.counter is not None:
            self.count = int(self.counter.done)
            total = int(self.counter.total)
            self.total = total if total >= 0 else None
        parts = [self.label]
        if self.total is not None:
            parts.append(f"{self.count}/{self.total} {self.unit}".rstrip())
        elif self.count:
            parts.append(f"{self.count} {self.unit}".rstrip())
        if self.count and elapsed > 0:
            parts.append(f"{self.count / elapsed:,.0f} {self.unit or 'items'}/s")
        if self.extra:
            parts.append(self.extra)
        parts.append(f"{elapsed:.1f} s")
        return "  ".join(parts)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if self._stop.is_set() and not force:
                return
            if not force and now - self._last_draw < self.interval:
                return
            self._last_draw = now
            line = self.text()
            pad = " " * max(self._width - len(line), 0)
            self._width = len(line)
            try:
                self.stream.write("\r" + line + pad)
                self.stream.flush()
            except (OSError, ValueError):
                self.enabled = False
                self._stop.set()

    def update(self, n: int = 1, extra: str | None = None) -> None:
        """Count `n` more; `extra` replaces the free text shown after the rate."""
        if not self.enabled:
            return
        self.count += n
        if extra is not None:
            self.extra = extra
        self._draw()

    def clear(self) -> None:
        """Erase the line now (it is drawn again at the next redraw)."""
        with self._lock:
            if not self.enabled or not self._width:
                return
            try:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._width = 0
            self._last_draw = float("-inf")

    def close(self) -> None:
        """Stop redrawing and erase the line."""
        global _current
        if _current is self:
            _current = None
        if not self.enabled:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            try:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass
        self.enabled = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
