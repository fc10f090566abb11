"""Fault injection: every fault ends in an exact, documented outcome (issue 12).

Object store (a moto S3 server on loopback, behind a TCP proxy that can be stopped or
replaced): killed, stalled, throttled and restarted servers. Cache: a full disk, cache
writers killed mid-write, entries damaged on disk. Each test asserts the outcome exactly:
the error class and the parts of its message that name the fault and the place, or
batches identical to an undisturbed run. What each guarantees is in docs/reliability.md.

Timing: where a test is about a timeout, it asserts generous bounds around the documented
time (no test depends on a race to pass).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import assert_batch_streams_equal, run_with_timeout, subprocess_env, write_dataset
from test_s3 import HOST, SLOW, Moto, Proxy, _aws_env, big_dataset  # noqa: F401 (_aws_env: autouse)

# -- helpers ----------------------------------------------------------------------------------


class SlowDownFront:
    """A TCP front for `target` that answers every new connection with S3's throttling
    reply (503 SlowDown) while throttling is on, and forwards connections otherwise."""

    REPLY_BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                  b"<Message>Please reduce your request rate.</Message></Error>")

    def __init__(self, target: int) -> None:
        self.target = target
        self.until = 0.0
        self.throttled = 0
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind((HOST, 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def throttle(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def close(self) -> None:
        self.closed = True
        self.server.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        if time.monotonic() < self.until:
            self.throttled += 1
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            body = b"" if data.startswith(b"HEAD") else self.REPLY_BODY
            conn.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(self.REPLY_BODY) + body)
            conn.close()
            return
        try:
            upstream = socket.create_connection((HOST, self.target))
        except OSError:
            conn.close()
            return

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        threading.Thread(target=pipe, args=(conn, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()


@pytest.fixture()
def served(tmp_path):
    """A moto server holding `big/` (40 row groups of 50 rows) and the local reference."""
    paths = big_dataset(tmp_path)
    server = Moto()
    server.upload("data", "big", paths)
    try:
        yield server, tmp_path / "big"
    finally:
        server.stop()


def timed(fn):
    start = time.monotonic()
    try:
        return fn(), time.monotonic() - start
    except Exception as e:  # noqa: BLE001 - re-raised with its duration
        e.elapsed = time.monotonic() - start
        raise


# -- object store: stalled, throttled, restarted, killed ----------------------------------


def test_stalled_server_fails_each_request_after_request_timeout(served, tmp_path):
    """A server that accepts connections and never answers (its proxy stopped with
    SIGSTOP): with request_timeout=1 and no retries the loader fails in about 1 s,
    naming the URL and the timeout; with a 2 s budget, within budget + timeout."""
    server, _ = served
    proxy = Proxy(server.port, tmp=tmp_path)
    try:
        os.kill(proxy.proc.pid, signal.SIGSTOP)
        for budget, low, high in ((0, 0.9, 6.0), (2, 2.0, 12.0)):
            options = server.options(port=proxy.port, request_timeout=1, retry_budget=budget)
            with pytest.raises(pqloader.IOError, match=r"s3://data/big.*(Timeout was reached|too slow)") as e:
                timed(lambda: run_with_timeout(lambda: pqloader.Loader("s3://data/big", storage_options=options), 60))
            assert low <= e.value.elapsed < high, (budget, e.value.elapsed)
    finally:
        os.kill(proxy.proc.pid, signal.SIGCONT)
        proxy.stop()


def test_server_stalled_mid_epoch_raises_io_error_naming_file_and_row_group(served, tmp_path):
    server, _ = served
    proxy = Proxy(server.port, tmp=tmp_path)
    try:
        options = server.options(port=proxy.port, request_timeout=1, retry_budget=1)
        it = iter(pqloader.Loader("s3://data/big", storage_options=options, **SLOW))
        first = next(it)
        os.kill(proxy.proc.pid, signal.SIGSTOP)
        with pytest.raises(pqloader.IOError, match=r"s3://data/big/part-00\d\.parquet', row group \d+"):
            run_with_timeout(lambda: list(it), 60)
        assert len(first["id"]) == 50
    finally:
        os.kill(proxy.proc.pid, signal.SIGCONT)
        proxy.stop()


def test_throttling_is_ridden_out_by_the_default_retries(served):
    """Four seconds of 503 SlowDown on every request (the old default gave up after
    0.6 s): the loader opens and the epoch equals a local read."""
    server, local = served
    front = SlowDownFront(server.port)
    try:
        expected = list(pqloader.Loader(str(local), **SLOW))
        front.throttle(4)
        loader = run_with_timeout(lambda: pqloader.Loader(
            "s3://data/big", storage_options=server.options(port=front.port), **SLOW), 120)
        got = run_with_timeout(lambda: list(loader), 120)
        assert front.throttled >= 3  # requests were refused and retried
        assert_batch_streams_equal(got, expected)
    finally:
        front.close()


def test_throttling_beyond_the_retry_budget_raises_io_error_naming_slowdown(served):
    server, _ = served
    front = SlowDownFront(server.port)
    try:
        front.throttle(120)
        options = server.options(port=front.port, retry_budget=1)
        with pytest.raises(pqloader.IOError, match=r"s3://data/big.*(SlowDown|SLOW_DOWN|503)"):
            run_with_timeout(lambda: pqloader.Loader("s3://data/big", storage_options=options), 60)
        assert front.throttled >= 2
    finally:
        front.close()


def test_server_restarted_mid_epoch_is_ridden_out_by_the_default_retries(served, tmp_path):
    """The endpoint refuses connections for about 5 s (a restart), with default retry
    options: the epoch equals an uninterrupted one."""
    server, local = served
    expected = list(pqloader.Loader(str(local), **SLOW))
    proxy = Proxy(server.port, tmp=tmp_path)
    try:
        it = iter(pqloader.Loader("s3://data/big", storage_options=server.options(port=proxy.port), **SLOW))
        got = [next(it), next(it)]
        port = proxy.port
        proxy.stop()

        def come_back():
            time.sleep(5)
            nonlocal proxy
            proxy = Proxy(server.port, port=port, tmp=tmp_path)

        t = threading.Thread(target=come_back)
        t.start()
        got += run_with_timeout(lambda: list(it), 120)
        t.join()
        assert_batch_streams_equal(got, expected)
    finally:
        proxy.stop()


def test_server_killed_mid_epoch_raises_io_error_then_a_new_epoch_after_restart_works(tmp_path):
    paths = big_dataset(tmp_path)
    server = Moto()
    second = None
    try:
        server.upload("data", "big", paths)
        options = server.options(retry_budget=1, connect_timeout=1, request_timeout=2)
        loader = pqloader.Loader("s3://data/big", storage_options=options, **SLOW)
        it = iter(loader)
        next(it)
        server.stop()
        with pytest.raises(pqloader.IOError, match=r"s3://data/big/part-00\d\.parquet', row group \d+: "):
            run_with_timeout(lambda: list(it), 60)
        second = Moto(port=server.port)  # the same endpoint, the same objects
        second.upload("data", "big", paths)
        expected = list(pqloader.Loader(str(tmp_path / "big"), **SLOW))
        loader.set_epoch(0)  # the loader that failed is still usable
        assert_batch_streams_equal(run_with_timeout(lambda: list(loader), 120), expected)
    finally:
        server.stop()
        if second is not None:
            second.stop()
