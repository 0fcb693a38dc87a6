"""One subscription per group and process for the browsers' run frames (`run_<id>`, `team_<id>`).

Without it every browser socket is its own member of the group: on each change the viewers
layer puts the message in each socket's queue, and each socket's consumer wakes its own task,
decodes the whole message again (msgpack, once per socket), goes through channels'
`await_many_dispatch` (a wait over two tasks and a new receive task per message) and builds
its own `websocket.send`. With 500 viewers of a run in one daphne process that was ~500 times
the same work per change, and the last viewer waited for all of it (docs/BENCHMARKS.md,
fan-out).

Here a process joins each group once, through a `GroupFeed` whose one task receives the
message, takes the frame the publisher encoded once (`console.realtime.browser_frame`), makes
one `console.wire.Frame` of it, and offers that same object to each local socket in one
synchronous pass (`_BrowserConsumer.offer`): per socket only the access filter and the write
remain, and under daphne the write is the frame's bytes, framed once per process, put straight
on the socket (console/wire.py) — no coroutine, no ASGI `send` per socket. A socket without a
wire (channels' test communicators) declines the offer and is awaited afterwards through its
ASGI `send` (`forward`). The frames' contract is unchanged — one frame per change, in commit
order, carrying its `seq` — so a page that sees a gap still refetches, and nothing is rendered
per viewer.

A feed lives on the event loop that made it (daphne's one loop; a test's own loop) and ends
when its last socket leaves. The user's group (`access.changed`) is a feed too: were it the
socket's own channel, a frame committed just after an access change could reach the socket
through its feed before the socket had even seen the change. Its feed tells each socket at
once; the socket holds its frames until it has re-read its access (console/consumers.py).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Protocol

from console.realtime import ACCESS_CHANGED, browser_frame
from console.wire import Frame

logger = logging.getLogger(__name__)


class FeedMember(Protocol):
    def offer(self, event: dict[str, Any], frame: Frame) -> bool: ...

    async def forward(self, event: dict[str, Any], frame: Frame) -> None: ...

    def access_message(self, event: dict[str, Any]) -> None: ...


class GroupFeed:
    """This process's one member of `group` on `layer`, and the local sockets it serves."""

    def __init__(self, layer: Any, group: str) -> None:
        self.layer = layer
        self.group = group
        # Insertion-ordered: sockets get a change in the order they joined.
        self.members: dict[FeedMember, None] = {}
        self.channel: str | None = None
        self._reader: asyncio.Task[None] | None = None
        self.subscribed = asyncio.get_running_loop().create_task(self._subscribe())

    async def _subscribe(self) -> None:
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(self.group, self.channel)
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.channel is not None
        while True:
            message = await self.layer.receive(self.channel)
            await self.deliver(message)

    async def deliver(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == ACCESS_CHANGED:
            # Through the same feeds as the frames, so that a frame committed after the access
            # change cannot overtake it: each socket holds its frames from here until it has
            # re-read its access (`_BrowserConsumer.access_message`).
            for member in list(self.members):
                member.access_message(message)
            return
        if kind != "run.updated":
            logger.warning("feed %s: ignored a %r message", self.group, kind)
            return
        # Encoded by the publisher once per change; a message from an older publisher (a
        # rolling deploy) is encoded here, still once per process.
        frame = Frame(message.get("frame") or browser_frame(message))
        declined = []
        for member in list(self.members):
            try:
                if not member.offer(message, frame):
                    declined.append(member)
            except Exception:  # one broken socket must not starve the others of the change
                logger.exception("feed %s: a socket's write failed", self.group)
        # After the synchronous pass, so that no socket waits on another's ASGI send. Each
        # socket still gets this change before the next: `_read` awaits this delivery first.
        for member in declined:
            try:
                await member.forward(message, frame)
            except Exception:
                logger.exception("feed %s: a socket's write failed", self.group)

    async def close(self) -> None:
        try:
            await self.subscribed
        except Exception:
            logger.exception("feed %s: the subscription had failed", self.group)
            return
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
        if self.channel is not None:
            await self.layer.group_discard(self.group, self.channel)


# event loop → (layer, group) → its feed. Keyed by the loop: a feed's task and the in-memory
# layer's queues belong to the loop they were made on.
_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, str], GroupFeed]] = (
    weakref.WeakKeyDictionary()
)


def _of_this_loop() -> dict[tuple[Any, str], GroupFeed]:
    loop = asyncio.get_running_loop()
    feeds = _feeds.get(loop)
    if feeds is None:
        feeds = _feeds[loop] = {}
    return feeds


async def feed_join(layer: Any, group: str, member: FeedMember) -> None:
    """`member` gets the group's frames from now on; returns once the process is subscribed,
    so a change committed after this call reaches it."""
    feeds = _of_this_loop()
    feed = feeds.get((layer, group))
    if feed is None:
        feed = feeds[(layer, group)] = GroupFeed(layer, group)
    feed.members[member] = None
    try:
        await asyncio.shield(feed.subscribed)
    except Exception:
        await feed_leave(layer, group, member)
        raise


async def feed_leave(layer: Any, group: str, member: FeedMember) -> None:
    feeds = _of_this_loop()
    feed = feeds.get((layer, group))
    if feed is None or member not in feed.members:
        return
    del feed.members[member]
    if not feed.members:
        del feeds[(layer, group)]
        await feed.close()


def feed_sizes() -> dict[str, int]:
    """Sockets per group in this loop's feeds (tests, a debugging shell)."""
    return {group: len(feed.members) for (_layer, group), feed in _of_this_loop().items()}
