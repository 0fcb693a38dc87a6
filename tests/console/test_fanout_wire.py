"""Frames written straight to daphne's sockets (console/wire.py).

Over real sockets (`live_stack_redis`: daphne in another process): every browser socket of a run
reads the same bytes, each change's frame framed as RFC 6455 says, in commit order. In this
process, with daphne's own objects: the `send` daphne hands an application is recognised (and
nothing else is), a frame is framed once for all sockets, and a write never jumps ahead of bytes
the socket still has buffered, survives a partial send, and compresses where the connection
negotiated permessage-deflate.

Counted, never timed: bytes on the wire, frames prepared, writers registered with the reactor."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from autobahn.websocket.compress_deflate import PerMessageDeflate
from channels.layers import get_channel_layer
from daphne.server import Server
from daphne.ws_protocol import WebSocketFactory
from django.conf import settings
from django.test import Client
from twisted.internet import reactor as global_reactor
from twisted.internet import tcp

from console import realtime
from console.wire import WIRE, Frame, SocketWire, daphne_protocol, with_wire
from tests.support.livestack import LiveStack
from tests.support.scenarios import new_run


def _ws_frame(text: str) -> bytes:
    """An unmasked, unfragmented text frame, as a server sends it (RFC 6455 §5.2)."""
    payload = text.encode()
    if len(payload) <= 125:
        header = bytes([0x81, len(payload)])
    elif len(payload) <= 0xFFFF:
        header = bytes([0x81, 126]) + struct.pack("!H", len(payload))
    else:
        header = bytes([0x81, 127]) + struct.pack("!Q", len(payload))
    return header + payload


def _event(run_id: str, team: int, seq: int) -> dict[str, Any]:
    event = {
        "type": "run.updated",
        "kind": "run.step_started",
        "run_id": run_id,
        "team": team,
        "status": "running",
        "stop_epoch": 1,
        "seq": seq,
    }
    return {**event, "frame": realtime.browser_frame(event)}


# --------------------------------------------------------------------------------------------
# Real daphne, real sockets


def _open_raw(stack: LiveStack, path: str, cookie: str) -> tuple[socket.socket, bytes]:
    """A browser's websocket handshake by hand, so the test reads the frames' bytes."""
    raw = socket.create_connection(("127.0.0.1", stack.port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    raw.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{stack.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            # Offered as browsers do: daphne does not take it, so the frames are plain.
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
            f"Origin: http://127.0.0.1:{stack.port}\r\nCookie: {cookie}\r\n\r\n"
        ).encode()
    )
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = raw.recv(4096)
        assert chunk, received
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    assert b"permessage-deflate" not in head.lower()
    return raw, rest


def _read_exactly(raw: socket.socket, already: bytes, size: int) -> bytes:
    received = already
    deadline = time.monotonic() + 10
    while len(received) < size and time.monotonic() < deadline:
        chunk = raw.recv(size - len(received))
        if not chunk:
            break
        received += chunk
    return received


def test_every_socket_of_a_run_reads_the_same_frames_in_order(live_stack_redis, team, bob):
    stack = live_stack_redis
    run = new_run(team)
    client = Client()
    client.force_login(bob)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    sockets = [_open_raw(stack, f"/ws/runs/{run.pk}/", cookie) for _ in range(6)]
    try:
        time.sleep(0.3)  # subscribed before accept(); give Redis a moment all the same
        events = [_event(run.pk, team.pk, seq) for seq in range(1, 6)]
        layer = get_channel_layer(realtime.VIEWER_LAYER)
        for event in events:
            async_to_sync(layer.group_send)(realtime.run_group(run.pk), event)
        expected = b"".join(_ws_frame(event["frame"]) for event in events)
        received = [_read_exactly(raw, rest, len(expected)) for raw, rest in sockets]
        assert received == [expected] * len(sockets)
    finally:
        for raw, _rest in sockets:
            raw.close()


# --------------------------------------------------------------------------------------------
# daphne's objects in this process


class CountingFactory(WebSocketFactory):
    prepared = 0

    def prepareMessage(self, *args: Any, **kwargs: Any) -> Any:
        self.prepared += 1
        return super().prepareMessage(*args, **kwargs)


@pytest.fixture
def factory() -> CountingFactory:
    made = CountingFactory(Server, server="safestop-test")
    made.setProtocolOptions(openHandshakeTimeout=0)  # no timer: the reactor does not run here
    return made


@pytest.fixture
def wired(factory: CountingFactory) -> Iterator[Any]:
    """Open daphne websocket protocols on real TCP connections (a socket pair each), their
    transports Twisted's `tcp.Connection` on the process's reactor (which is not running: a
    buffered write waits for the test to call `doWrite`)."""
    made: list[tuple[Any, socket.socket]] = []

    def make(*, compress: bool = False, send_buffer: int | None = None) -> tuple[Any, Any]:
        ours, peer = socket.socketpair()
        if send_buffer is not None:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, send_buffer)
        protocol = factory.buildProtocol(None)
        transport = tcp.Connection(ours, protocol, reactor=global_reactor)
        transport.connected = True
        protocol.transport = transport
        protocol.peer = "tcp:socketpair"
        protocol._connectionMade()  # autobahn's connection state, as on a new connection
        protocol.state = protocol.STATE_OPEN  # as after the handshake
        if compress:
            protocol._perMessageCompress = PerMessageDeflate(True, False, False, 15, 15, 8)
        peer.setblocking(False)
        made.append((transport, peer))
        return protocol, peer

    yield make
    for transport, peer in made:
        transport.stopWriting()
        transport.socket.close()
        peer.close()


def _drain(peer: socket.socket) -> bytes:
    received = b""
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            return received
        if not chunk:
            return received
        received += chunk


def test_a_frame_is_framed_once_and_sent_without_a_reactor_turn(wired, factory):
    pairs = [wired() for _ in range(5)]
    frames = [Frame(_event("r1", 1, seq)["frame"]) for seq in (1, 2)]
    for frame in frames:
        for protocol, _peer in pairs:
            SocketWire(protocol).write(frame)
    assert factory.prepared == 2  # one per change, not one per socket
    expected = b"".join(_ws_frame(frame.text) for frame in frames)
    # Already in each peer's receive buffer: the reactor never ran, nor was asked to write.
    assert [_drain(peer) for _protocol, peer in pairs] == [expected] * 5
    assert not any(protocol.transport in global_reactor.getWriters() for protocol, _ in pairs)


def test_a_frame_waits_behind_the_sockets_buffered_bytes(wired):
    protocol, peer = wired()
    protocol.sendMessage(b'{"earlier": true}')  # through autobahn and Twisted, still buffered
    frame = Frame(_event("r1", 1, 1)["frame"])
    SocketWire(protocol).write(frame)
    assert _drain(peer) == b""
    protocol.transport.doWrite()  # the reactor's turn
    assert _drain(peer) == _ws_frame('{"earlier": true}') + _ws_frame(frame.text)


def test_what_a_partial_send_leaves_follows_through_twisted(wired):
    protocol, peer = wired(send_buffer=4096)
    big = Frame(json.dumps({"seq": 1, "pad": "x" * 300_000}))
    after = Frame(json.dumps({"seq": 2}))
    wire = SocketWire(protocol)
    wire.write(big)
    wire.write(after)
    received = _drain(peer)
    assert 0 < len(received) < len(_ws_frame(big.text))  # the kernel took only part of it
    assert protocol.transport in global_reactor.getWriters()  # the rest is Twisted's to write
    for _ in range(10_000):
        if protocol.transport not in global_reactor.getWriters():
            break
        protocol.transport.doWrite()
        received += _drain(peer)
    received += _drain(peer)
    assert received == _ws_frame(big.text) + _ws_frame(after.text)


def test_a_compressed_connection_gets_its_frames_compressed(wired):
    protocol, peer = wired(compress=True)
    frame = Frame(_event("r1", 1, 1)["frame"])
    SocketWire(protocol).write(frame)
    protocol.transport.doWrite()  # through autobahn's sendMessage: Twisted's buffer
    received = _drain(peer)
    assert received[0] == 0xC1  # FIN, RSV1 (compressed), text
    length = received[1] & 0x7F
    assert length <= 125 and len(received) == 2 + length
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    assert inflater.decompress(received[2:] + b"\x00\x00\xff\xff").decode() == frame.text


def test_nothing_is_written_to_a_closing_socket(wired):
    protocol, peer = wired()
    protocol.state = protocol.STATE_CLOSING
    SocketWire(protocol).write(Frame(_event("r1", 1, 1)["frame"]))
    protocol.transport.doWrite()
    assert _drain(peer) == b""


def test_a_reset_connection_is_left_to_twisted_to_close(wired):
    protocol, peer = wired()
    peer.close()
    frame = Frame(_event("r1", 1, 1)["frame"])
    SocketWire(protocol).write(frame)  # EPIPE: not raised at the feed
    assert isinstance(protocol.transport.doWrite(), Exception)  # Twisted's connection lost


async def test_daphnes_send_is_recognised_and_the_socket_gets_a_wire(factory):
    seen: list[tuple[dict[str, Any], Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append((scope, send))

    # Never run: nothing listens; only its way of handing an application `send` is used.
    server = Server(application=with_wire(app), endpoints=["tcp:port=0:interface=127.0.0.1"])
    server.connections = {}
    protocol = factory.buildProtocol(None)
    server.protocol_connected(protocol)
    server.create_application(protocol, {"type": "websocket", "path": "/ws/runs/"})
    await server.connections[protocol]["application_instance"]
    [(scope, send)] = seen
    assert daphne_protocol(send) is protocol
    assert scope[WIRE].protocol is protocol


async def test_any_other_send_has_no_wire():
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)

    async def asgi_send(message: dict[str, Any]) -> None:
        pass

    queue: asyncio.Queue[Any] = asyncio.Queue()
    for send in (asgi_send, queue.put, functools.partial(asgi_send)):
        await with_wire(app)({"type": "websocket", "path": "/ws/runs/"}, queue.get, send)
        assert daphne_protocol(send) is None
    assert [WIRE in scope for scope in seen] == [False, False, False]
