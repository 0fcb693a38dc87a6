"""Writing one change's frame to many browser sockets of a daphne process: framed once, written
straight to each socket.

Through ASGI, each socket's copy of a frame costs daphne its whole write path: channels' session
wrapper, daphne's `handle_reply` → autobahn's `sendMessage` (which frames the same payload again
for every socket) → Twisted's `transport.write`, which only buffers and asks the reactor to watch
the socket for writability (an `epoll_ctl`), sends on the next loop turn, then stops watching
(another). With a thousand viewers that was most of the fan-out's CPU (docs/BENCHMARKS.md,
fan-out). Here:

1. a change becomes one `Frame`: its `websocket.send` message (for sockets not under daphne)
   and, on first use, its WebSocket frame bytes, made once per process with autobahn's
   `prepareMessage` (the broadcast API: an unmasked server frame is the same for every socket);
2. a socket under daphne has a `SocketWire` (found by `with_wire` from the ASGI `send` daphne
   hands the application), which writes those bytes with one `send()` on the socket when
   nothing of the socket's is waiting in Twisted's or autobahn's buffers, and otherwise appends
   them to Twisted's buffer as `transport.write` would. Either way the bytes land after
   everything written before them (the accept, earlier frames) and before anything written
   later (a close), so frames keep their order with the socket's other sends;
3. a socket whose connection negotiated permessage-deflate (daphne's factory declines browsers'
   offers unless configured otherwise) or is not plain TCP (TLS terminated in daphne) goes
   through autobahn's `sendPreparedMessage`, which compresses or frames per socket as it must;
4. anything else (channels' test communicators, another ASGI server) has no wire and gets the
   `websocket.send` message through its ASGI `send`.

A socket that is slow or gone does not hold the others: a partial `send()` leaves the rest in
Twisted's buffer for the reactor; an error is handed to Twisted the same way, whose next write
attempt finds the connection lost and closes it (`websocket.disconnect` follows as usual).
"""

from __future__ import annotations

import errno
import functools
import sys
from typing import Any

# Where `with_wire` leaves a socket's wire in the scope (absent when there is none).
WIRE = "safestop.wire"

# Twisted `tcp.Connection` attributes the direct write reads; should a Twisted release rename
# them, the socket goes through autobahn instead of failing.
_TRANSPORT_STATE = (
    "socket",
    "dataBuffer",
    "offset",
    "_tempDataLen",
    "connected",
    "disconnecting",
    "_writeDisconnected",
)

_RETRY_LATER = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EINTR})


class Frame:
    """One change's frame as every socket of the process is handed it."""

    __slots__ = ("_prepared", "outgoing", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.outgoing: dict[str, Any] = {"type": "websocket.send", "text": text}
        self._prepared: Any = None

    def prepared(self, factory: Any) -> Any:
        """autobahn's PreparedMessage, made on the first socket that needs it: every daphne
        socket of a process shares one server factory, and a server frame is never masked."""
        if self._prepared is None:
            self._prepared = factory.prepareMessage(self.text.encode(), False)
        return self._prepared


class SocketWire:
    """Writes frames to one daphne websocket (see the module docstring)."""

    __slots__ = ("_direct", "protocol")

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self._direct: bool | None = None  # decided at the first write: the handshake is over

    def write(self, frame: Frame) -> None:
        protocol = self.protocol
        if protocol.state != protocol.STATE_OPEN:
            return  # closing or closed: daphne drops a send on such a socket too
        prepared = frame.prepared(protocol.factory)
        if self._direct is None:
            self._direct = self._may_write_directly()
        if not self._direct or protocol.send_queue:
            protocol.sendPreparedMessage(prepared)
            return
        transport = protocol.transport
        data = prepared.payloadHybi
        if (
            not transport.connected
            or transport.disconnecting
            or transport._writeDisconnected
            or transport._tempDataLen
            or transport.offset < len(transport.dataBuffer)
        ):
            # Earlier bytes are still buffered (a slow reader) or the connection is ending:
            # behind them, through Twisted, exactly as autobahn would have written.
            transport.write(data)
            return
        try:
            sent = transport.socket.send(data)
        except OSError as error:
            if error.errno not in _RETRY_LATER:
                # Twisted's own write attempt meets the same error and closes the connection.
                transport.write(data)
                return
            sent = 0
        if sent < len(data):
            transport.write(data[sent:])

    def _may_write_directly(self) -> bool:
        protocol = self.protocol
        if protocol._perMessageCompress is not None:
            return False
        tcp = sys.modules.get("twisted.internet.tcp")
        transport = protocol.transport
        return (
            tcp is not None
            and isinstance(transport, tcp.Connection)
            and all(hasattr(transport, name) for name in _TRANSPORT_STATE)
        )


def daphne_protocol(send: Any) -> Any:
    """The daphne websocket protocol behind an ASGI `send`, or None if `send` is not daphne's.

    daphne hands each application `functools.partial(server.handle_reply, protocol)`; nothing
    else is recognised. Looked up in sys.modules rather than imported: importing daphne.server
    installs Twisted's reactor, which only daphne itself should do."""
    server = sys.modules.get("daphne.server")
    ws_protocol = sys.modules.get("daphne.ws_protocol")
    if server is None or ws_protocol is None or not isinstance(send, functools.partial):
        return None
    if send.keywords or len(send.args) != 1:
        return None
    if getattr(send.func, "__func__", None) is not server.Server.handle_reply:
        return None
    if not isinstance(getattr(send.func, "__self__", None), server.Server):
        return None
    protocol = send.args[0]
    return protocol if isinstance(protocol, ws_protocol.WebSocketProtocol) else None


def with_wire(app: Any) -> Any:
    """ASGI middleware for the websocket routes: a socket served by daphne gets its
    `SocketWire` in `scope[WIRE]`."""

    async def wired(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        protocol = daphne_protocol(send) if scope.get("type") == "websocket" else None
        if protocol is not None:
            scope = {**scope, WIRE: SocketWire(protocol)}
        return await app(scope, receive, send)

    return wired
