"""Many browser viewers of one run page, in one asyncio process (no Django here).

Each viewer opens `/ws/runs/<run_id>/` the way a browser does: its session cookie and an
Origin header (the consumer sits behind AllowedHostsOriginValidator + AuthMiddlewareStack).
It stamps every frame with time.monotonic() on arrival and checks the frames' `seq`: a viewer
that sees seq jump by more than one has missed an update (that is how the console page knows
to refetch). Driven by JSON lines on stdin:

    {"op": "report", "quiet": 1.0, "max_wait": 30}
        → waits until no frame arrived for `quiet` s (late frames are late, not lost), then
          {"arrivals": {seq: [t, ...]}, "missed_in_sequence": n, "duplicates": n, ...}; exits
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import emit  # noqa: E402


class Viewer:
    def __init__(self, index: int) -> None:
        self.index = index
        self.seqs: list[int] = []
        self.times: list[float] = []
        self.closed_code: int | None = None

    def gaps(self) -> tuple[int, int, int]:
        """(updates missed between the first and last seq seen, duplicate frames, out of order)."""
        missed = duplicates = out_of_order = 0
        for previous, current in zip(self.seqs, self.seqs[1:], strict=False):
            if current == previous:
                duplicates += 1
            elif current > previous + 1:
                missed += current - previous - 1
            elif current < previous:
                out_of_order += 1
        return missed, duplicates, out_of_order


async def watch(
    viewer: Viewer,
    url: str,
    cookie: str,
    origin: str,
    opened: asyncio.Event,
    ready: list[int],
    failures: list[str],
    stop: asyncio.Event,
) -> None:
    from websockets.asyncio.client import connect

    try:
        async with connect(
            url,
            additional_headers={"Cookie": cookie},
            origin=origin,
            open_timeout=30,
            max_size=2**20,
            ping_interval=None,
        ) as socket:
            ready.append(viewer.index)
            opened.set()
            receiver = asyncio.ensure_future(_receive(viewer, socket))
            stopper = asyncio.ensure_future(stop.wait())
            done, _pending = await asyncio.wait(
                {receiver, stopper}, return_when=asyncio.FIRST_COMPLETED
            )
            if receiver in done and receiver.exception() is not None:
                failures.append(f"viewer {viewer.index}: {receiver.exception()!r}")
            receiver.cancel()
            stopper.cancel()
            viewer.closed_code = socket.close_code
    except Exception as error:  # a refused handshake or a reset: reported, never hidden
        failures.append(f"viewer {viewer.index}: {error!r}")


async def _receive(viewer: Viewer, socket: Any) -> None:
    async for message in socket:
        now = time.monotonic()
        frame = json.loads(message)
        seq = frame.get("seq")
        if isinstance(seq, int):
            viewer.seqs.append(seq)
            viewer.times.append(now)


async def main_async(args: argparse.Namespace) -> None:
    cookies = args.cookies.split(",")
    viewers = [Viewer(index) for index in range(args.count)]
    ready: list[int] = []
    failures: list[str] = []
    stop = asyncio.Event()
    tasks = []
    started = time.monotonic()
    # Open in waves, as tabs do; each handshake reads the session from the database.
    for wave in range(0, args.count, args.wave):
        opened = asyncio.Event()
        for viewer in viewers[wave : wave + args.wave]:
            tasks.append(
                asyncio.ensure_future(
                    watch(
                        viewer,
                        args.url,
                        cookies[viewer.index % len(cookies)],
                        args.origin,
                        opened,
                        ready,
                        failures,
                        stop,
                    )
                )
            )
        deadline = time.monotonic() + 30
        while (
            len(ready) + len(failures) < min(args.count, wave + args.wave)
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.02)
    emit(
        {
            "connected": len(ready),
            "failed": len(failures),
            "connect_seconds": time.monotonic() - started,
            "failures": failures[:5],
        }
    )

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    command: dict[str, Any] = {}
    while True:
        line = await reader.readline()
        command = json.loads(line) if line else {}
        if not line or command.get("op") == "report":
            break
    # Frames still on their way are late, not lost: wait until none has arrived for `quiet`
    # seconds (at most `max_wait`), so "never arrived" counts real losses only.
    quiet, deadline = (
        float(command.get("quiet", 1.0)),
        time.monotonic() + float(command.get("max_wait", 30)),
    )
    while time.monotonic() < deadline:
        last = max((viewer.times[-1] for viewer in viewers if viewer.times), default=0.0)
        if time.monotonic() - last >= quiet:
            break
        await asyncio.sleep(0.1)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    arrivals: dict[int, list[float]] = defaultdict(list)
    missed = duplicates = out_of_order = 0
    per_viewer_first: list[int] = []
    for viewer in viewers:
        gap, dup, late = viewer.gaps()
        missed += gap
        duplicates += dup
        out_of_order += late
        if viewer.seqs:
            per_viewer_first.append(viewer.seqs[0])
        for seq, at in zip(viewer.seqs, viewer.times, strict=True):
            arrivals[seq].append(at)
    emit(
        {
            "arrivals": {str(seq): times for seq, times in arrivals.items()},
            "missed_in_sequence": missed,
            "duplicates": duplicates,
            "out_of_order": out_of_order,
            "frames": sum(len(v.seqs) for v in viewers),
            "viewers_with_frames": sum(1 for v in viewers if v.seqs),
            "failures": failures[:5],
            "first_seqs": sorted(set(per_viewer_first))[:5],
        }
    )


def raise_fd_limit() -> None:
    """One socket per viewer: past ~1,000 viewers in one process the usual soft limit (1,024)
    would refuse connections, which would read as gaps."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--origin", required=True)
    parser.add_argument(
        "--cookies", required=True, help="comma-separated Cookie header values, reused round robin"
    )
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--wave", type=int, default=25)
    args = parser.parse_args()
    raise_fd_limit()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
