"""A TCP proxy on loopback that adds latency and caps bandwidth, like a slow link.

    python bench/throttle_proxy.py --listen 127.0.0.1:9001 --target 127.0.0.1:9000 \\
        --rtt-ms 20 --rate-mbps 40

Every byte is delayed by half the round-trip time in each direction, and all bytes in
one direction (over all connections) share one link of ``--rate-mbps`` MB/s (10^6
bytes), served first come, first served. Without ``--rtt-ms``/``--rate-mbps`` it just
forwards (the tests use it so to take an endpoint down and bring it back). It writes
its port to ``--ready-file`` once listening, and runs until killed. With ``--count-file``
it keeps the bytes forwarded each way there (JSON ``{"to_server": n, "to_client": n,
"requests": n, "lists": n, "held": n}``: also the HTTP requests, the S3 listings among
them, and the reads held; rewritten every 0.1 s while they change): what a server
served, measured outside the clients. With ``--hold-reads`` a request for a byte range
(a Range header: every object read) is never forwarded, and its connection stalls: a
store that lists but does not answer reads. Standard library only; refuses targets off
loopback.
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import time

CHUNK = 64 * 1024
QUEUE_CHUNKS = 16  # per direction and connection: backpressure on the reader


class Link:
    """One direction of the link: a delay, then a shared serial line of a given rate."""

    def __init__(self, delay_s: float, rate_bps: float | None, hold_reads: bool = False) -> None:
        self.delay_s = delay_s
        self.hold_reads = hold_reads  # requests with a Range header stall their connection
        self.held = 0
        self.rate_bps = rate_bps
        self.free_at = 0.0  # when the line has sent everything queued so far
        self.bytes = 0  # forwarded so far
        self.requests = 0  # HTTP requests forwarded (to the server: one Host header each)
        self.lists = 0  # of them, S3 ListObjectsV2 requests (a list-type=2 query each)
        self._tail = b""

    async def send(self, arrived: float, data: bytes, writer: asyncio.StreamWriter) -> None:
        if self.hold_reads and b"\r\nrange:" in (self._tail + data).lower():
            self.held += 1
            await asyncio.Event().wait()  # until the proxy is killed
        now = time.monotonic()
        start = max(now, arrived + self.delay_s)
        if self.rate_bps:
            start = max(start, self.free_at)
            self.free_at = start + len(data) / self.rate_bps
            start = self.free_at  # the last byte is out when the line has sent it
        if start > now:
            await asyncio.sleep(start - now)
        writer.write(data)
        self.bytes += len(data)
        # Requests: each has one Host header. The tail of the last chunk is kept so that
        # a header split across chunks counts once.
        window, tail = (self._tail + data).lower(), self._tail.lower()
        self.requests += window.count(b"\r\nhost:") - tail.count(b"\r\nhost:")
        self.lists += window.count(b"list-type=2") - tail.count(b"list-type=2")
        self._tail = (self._tail + data)[-16:]
        await writer.drain()


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link) -> None:
    queue: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)

    async def read() -> None:
        try:
            while data := await reader.read(CHUNK):
                await queue.put((time.monotonic(), data))
        except (ConnectionError, OSError):
            pass
        await queue.put(None)

    reading = asyncio.ensure_future(read())  # referenced here until the pump ends
    try:
        while (item := await queue.get()) is not None:
            await link.send(item[0], item[1], writer)
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        reading.cancel()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free)")
    p.add_argument("--target", required=True, help="HOST:PORT of the server")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="round-trip latency added")
    p.add_argument("--rate-mbps", type=float, default=0.0, help="MB/s per direction; 0: no cap")
    p.add_argument("--ready-file", help="write the listening port here once ready")
    p.add_argument("--count-file", help="keep the bytes forwarded each way here (JSON)")
    p.add_argument("--hold-reads", action="store_true",
                   help="never forward a request with a Range header (an object read)")
    args = p.parse_args()
    lhost, lport = args.listen.rsplit(":", 1)
    thost, tport = args.target.rsplit(":", 1)
    for host in (lhost, thost):
        if not ipaddress.ip_address(host).is_loopback:
            raise SystemExit(f"{host} is not a loopback address")
    rate = args.rate_mbps * 1e6 if args.rate_mbps > 0 else None
    up = Link(args.rtt_ms / 2000, rate, hold_reads=args.hold_reads)
    down = Link(args.rtt_ms / 2000, rate)

    # asyncio holds tasks weakly: a connection's task, waiting on its pumps, could be
    # collected mid-connection when clients drop connections.
    live: set[asyncio.Task] = set()

    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        live.add(task)
        try:
            try:
                sreader, swriter = await asyncio.open_connection(thost, int(tport))
            except OSError:
                cwriter.close()
                return
            await asyncio.gather(pump(creader, swriter, up), pump(sreader, cwriter, down))
            for w in (swriter, cwriter):
                w.close()
        finally:
            live.discard(task)

    server = await asyncio.start_server(handle, lhost, int(lport), reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    if args.ready_file:
        with open(args.ready_file, "w") as f:
            f.write(str(port))
    if args.count_file:
        live.add(asyncio.ensure_future(count(args.count_file, up, down)))
    async with server:
        await server.serve_forever()


async def count(path: str, up: Link, down: Link) -> None:
    """Rewrite `path` with the bytes forwarded each way, the requests forwarded to the
    server and how many of them were S3 listings, whenever they change."""
    last = None
    while True:
        now = (up.bytes, down.bytes, up.requests, up.lists, up.held)
        if now != last:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump({"to_server": now[0], "to_client": now[1], "requests": now[2],
                           "lists": now[3], "held": now[4]}, f)
            os.replace(tmp, path)
            last = now
        await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main())
