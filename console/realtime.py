"""Channels publisher for run changes (registered in `console.apps`): browser frames, and the
agents' frames that `api.agent_sends` names, sent together.

Group names (`runs.groups`) and channel layers are the contract between publishers and consumers:
- `run_<id>`: viewers of one run (browser) — every change, with its sequence number;
- `team_<team_id>`: the runs page of a team — every change of any of its runs;
- `user_<user_id>`: every browser socket of one user — `access.changed` when the user's
  memberships, access flags or password change, or the user logs out, so open sockets re-check
  what they may watch and whether their session still logs them in;
  all three on the `VIEWER_LAYER` alias (consumers in `console/consumers.py`);
- `agent_<id>` and `token_<id>`: agent workers — what they get is decided next to their
  consumer (`api/agent_sends.py`, consumer in `api/consumers.py`); on the "default" alias.

Why two layers (console/settings.py): with Redis, "viewers" is Pub/Sub — one PUBLISH per change
however many browsers watch, but at most once. A lost browser frame costs a refetch (the next
frame's `seq` shows the gap; console.js refetches). A lost stop signal would leave a worker
running until its next heartbeat, so it stays on the core layer, which queues per channel.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import json
import logging
import os
import threading
import weakref
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction
from django.utils.crypto import salted_hmac

from api.agent_sends import agent_sends, for_agents_only
from runs.groups import run_group, team_group, user_group

logger = logging.getLogger(__name__)

# The event loop of the daphne process we run in (set by `manage.py serve`). The in-memory
# channel layer's queues belong to that loop, so a send from a thread that is not one of
# Django's sync_to_async workers (the embedded background loop) must run *on that loop*, or the
# waiting consumer is never woken. asgiref's own thread-local does exactly that routing.
_bound_loop: asyncio.AbstractEventLoop | None = None


def bind_event_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _bound_loop
    _bound_loop = loop


def _route_detached_thread_to_bound_loop() -> None:
    if _bound_loop is None or getattr(SyncToAsync.threadlocal, "main_event_loop", None) is not None:
        return
    try:
        asyncio.get_running_loop()
        return
    except RuntimeError:
        pass
    SyncToAsync.threadlocal.main_event_loop = _bound_loop
    SyncToAsync.threadlocal.main_event_loop_pid = os.getpid()


# The channel-layer alias of browser frames; `console.consumers` listens on the same one.
VIEWER_LAYER = "viewers"


# A process with no event loop to route to (a Celery worker, a management command) publishes
# through one long-lived loop of its own. `async_to_sync` there would start a new thread and a
# new event loop per call — and channels-redis keeps its connection pool per loop, so every
# frame paid for a fresh Redis connection (docs/BENCHMARKS.md: ~10 ms per group_send).
_publisher_lock = threading.Lock()
_publisher: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None


def _publisher_loop() -> asyncio.AbstractEventLoop:
    global _publisher
    with _publisher_lock:
        # After a fork (Celery's prefork pool) the parent's loop thread does not exist here.
        if _publisher is None or _publisher[0] != os.getpid() or not _publisher[2].is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="safestop-publisher", daemon=True
            )
            thread.start()
            _publisher = (os.getpid(), loop, thread)
        return _publisher[1]


def _has_loop_to_route_to() -> bool:
    return (
        getattr(SyncToAsync.threadlocal, "main_event_loop", None) is not None
        and getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) == os.getpid()
    )


# What a browser gets: small, no HTML, no ORM (the page decides what to refetch).
BROWSER_FRAME_FIELDS = ("type", "run_id", "team", "status", "stop_epoch", "seq", "kind")


def browser_frame(event: dict[str, Any]) -> str:
    return json.dumps(
        {key: event.get(key) for key in BROWSER_FRAME_FIELDS} | {"type": "run.updated"}
    )


def publish(event: dict[str, Any]) -> None:
    """The listener of `runs.notify`: the worker's frames (`api.agent_sends`) first, then the
    browsers', all in one hop to the event loop."""
    sends = agent_sends(event)
    workers = len(sends)
    if not for_agents_only(event):
        sends += viewer_sends(event)
    _send(sends, wait_for=workers)


def viewer_sends(event: dict[str, Any]) -> list[tuple[Any, str, dict[str, Any]]]:
    viewers = get_channel_layer(VIEWER_LAYER)
    if viewers is None:
        return []
    # The frame's JSON is encoded here, once per change, not by each of the 200 consumers that
    # forward it (docs/BENCHMARKS.md, fan-out).
    message = {**event, "type": "run.updated", "frame": browser_frame(event)}
    return [
        (viewers, run_group(event["run_id"]), message),
        (viewers, team_group(event["team"]), message),
    ]


# How long a request thread waits for a worker's frame to reach the channel layer before it
# answers anyway (the frame stays queued; the worker's next heartbeat carries a stop too).
WORKER_FRAME_WAIT_SECONDS = 5.0


def _send(sends: list[tuple[Any, str, dict[str, Any]]], *, wait_for: int = 0) -> None:
    """Send in order. `wait_for`: how many of the first sends are a worker's frames (a stop
    signal, an approval's decision, a revocation), which a daphne request thread waits for."""
    if not sends:
        return
    _route_detached_thread_to_bound_loop()

    async def send_all() -> None:
        # One hop to the event loop for all of an event's groups (not one per group), in order:
        # the worker's stop signal first.
        for layer, group, frame in sends:
            await layer.group_send(group, frame)

    in_memory = any(isinstance(layer, InMemoryChannelLayer) for layer, _, _ in sends)
    if _has_loop_to_route_to() and not in_memory and _routed_loop_runs():
        # A daphne request thread with Redis layers: hand the sends to the loop and return.
        # Django runs every sync view of the process in this one thread, so waiting here for
        # the loop and the PUBLISHes' round trips held up every other request (the single-event
        # ingestion figure, docs/BENCHMARKS.md). Order is kept: one queue per loop, drained by
        # one task (`_LoopOutbox`).
        #   A worker's frame is the exception: the thread waits until it is sent (not for the
        # browsers' frames after it). Left to the loop while this thread went on building its
        # answer (the loop's sends and this thread share one interpreter), a stop reached its
        # worker after the answer to its POST (docs/BENCHMARKS.md, "its answer → signal").
        sent = _LoopOutbox.of(SyncToAsync.threadlocal.main_event_loop).post(sends, wait_for)
        if sent is not None:
            _wait_for_worker_frames(sent)
    elif _has_loop_to_route_to() or in_memory:
        # The embedded process (in-memory layers) runs it on daphne's loop and waits: the
        # in-memory layer's queues must stay on the loop they were used from.
        async_to_sync(send_all)()
    else:
        asyncio.run_coroutine_threadsafe(send_all(), _publisher_loop()).result(timeout=10)


def _wait_for_worker_frames(sent: concurrent.futures.Future[None]) -> None:
    try:
        sent.result(timeout=WORKER_FRAME_WAIT_SECONDS)
    except concurrent.futures.TimeoutError:
        logger.warning("a worker's frame is still queued after %ss", WORKER_FRAME_WAIT_SECONDS)


def _routed_loop_runs() -> bool:
    """The loop this thread would route to is alive (a thread-local can outlive its loop: a
    test's, a server's that stopped); else the send takes the waiting path, as before."""
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    return loop is not None and loop.is_running()


class _LoopOutbox:
    """The sends of one event loop's process, in the order they were committed: posted from
    any thread, sent one after another by one task on the loop (a stop signal before the
    browser frames of the same change, and one change's frames before the next's). A post may
    ask to hear when its first sends (a worker's frames) have gone out."""

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopOutbox] = (
        weakref.WeakKeyDictionary()
    )
    _lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: collections.deque[_Posted] = collections.deque()
        self.draining = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LoopOutbox:
        with cls._lock:
            outbox = cls._by_loop.get(loop)
            if outbox is None:
                outbox = cls._by_loop[loop] = cls(loop)
            return outbox

    def post(
        self, sends: list[tuple[Any, str, dict[str, Any]]], wait_for: int = 0
    ) -> concurrent.futures.Future[None] | None:
        """Queue `sends`; with `wait_for`, a future done once the first `wait_for` went out
        (sent, or failed and logged)."""
        sent: concurrent.futures.Future[None] | None = (
            concurrent.futures.Future() if wait_for else None
        )
        # call_soon_threadsafe runs callbacks in the order they were posted.
        self.loop.call_soon_threadsafe(self._accept, _Posted(sends, wait_for, sent))
        return sent

    def _accept(self, posted: _Posted) -> None:
        self.queue.append(posted)
        if not self.draining:
            self.draining = True
            self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self.queue:
                posted = self.queue.popleft()
                for index, (layer, group, frame) in enumerate(posted.sends, start=1):
                    try:
                        await layer.group_send(group, frame)
                    except Exception:  # committed already; a browser refetches at the seq gap,
                        # a worker hears of a stop at its next heartbeat
                        logger.exception("publishing to %s failed", group)
                    if index == posted.wait_for and posted.sent is not None:
                        posted.sent.set_result(None)
        finally:
            self.draining = False


@dataclasses.dataclass(frozen=True)
class _Posted:
    """One change's sends, as posted to a loop's outbox."""

    sends: list[tuple[Any, str, dict[str, Any]]]
    # How many of the first sends the posting thread waits for, and what it waits on.
    wait_for: int
    sent: concurrent.futures.Future[None] | None


# --- access changes -----------------------------------------------------------------------
# A browser socket authorises at connect; after that, a membership or an access flag that
# changes must reach the user's open sockets, or a user removed from a team keeps receiving its
# frames until the tab closes. The message carries no access data: each socket re-reads the
# user's access itself (console/consumers.py). The viewers layer is at most once, so the
# consumers also re-check on a timer (SAFESTOP_WS_ACCESS_RECHECK_SECONDS).
#
# The same re-check asks whether the socket's session still logs its user in, so a logout or a
# password change must notify as well (an admin deleting sessions sends nothing: the timer).

ACCESS_CHANGED = "access.changed"
_ACCESS_FLAGS = frozenset({"is_active", "is_staff", "is_superuser"})
# `get_session_auth_hash()` is an HMAC of the password hash: changing it ends every session
# made before (django.contrib.auth.get_user stops accepting them), so sockets must re-check.
_SESSION_FIELDS = frozenset({"password"})


def session_digest(session_key: str) -> str:
    """What a logout's message says of the ended session: never the key itself (a credential)
    on the channel layer, only an HMAC of it that a socket compares with its own."""
    return salted_hmac("safestop.console.ended-session", session_key).hexdigest()


def _send_access_changed(user_id: int, ended_session: str | None = None) -> None:
    viewers = get_channel_layer(VIEWER_LAYER)
    if viewers is None:
        return
    message: dict[str, Any] = {"type": ACCESS_CHANGED, "user_id": user_id}
    if ended_session:
        message["ended_session"] = ended_session
    try:
        _send([(viewers, user_group(user_id), message)])
    except Exception:  # the change is committed; the sockets' timer re-check still catches it
        logger.exception("access-change notification failed for user %s", user_id)


def membership_changed(user_id: int, *, ended_session: str | None = None) -> None:
    """Tell `user_id`'s open browser sockets to re-check their access, once the change commits.
    `ended_session` (a `session_digest`) closes the socket of that session without a look."""
    if ended_session is None:
        transaction.on_commit(lambda: _send_access_changed(user_id))
    else:
        transaction.on_commit(lambda: _send_access_changed(user_id, ended_session))


def on_membership_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    """post_save / post_delete of `runs.models.Membership` (wired in `console.apps`)."""
    membership_changed(instance.user_id)


def on_user_saved(
    sender: Any, instance: Any, created: bool = False, update_fields: Any = None, **kwargs: Any
) -> None:
    """post_save of the user model: a new user has no open sockets; a save that names its fields
    and none of the access flags nor the password (login's `last_login`) cannot change access or
    end a session. Any other save notifies — a spurious message costs each of the user's sockets
    one query. `save(update_fields=["password"])` (what `check_password` does when it upgrades a
    hash, and a common way to store `set_password`) names the password only: it must notify,
    since the new hash ends the user's other sessions."""
    if created or (
        update_fields is not None and not (_ACCESS_FLAGS | _SESSION_FIELDS) & set(update_fields)
    ):
        return
    membership_changed(instance.pk)


def on_user_logged_out(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    """`user_logged_out` (wired in `console.apps`): the user's sockets re-check, and the one on
    the ended session closes. Django sends the signal *before* it flushes the session (and
    outside a transaction `on_commit` runs at once), so a socket re-checking the database might
    still find the session: the message names it instead (`session_digest`). `user` is None
    when the request was not logged in."""
    if user is None or getattr(user, "pk", None) is None:
        return
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    membership_changed(user.pk, ended_session=session_digest(session_key) if session_key else None)
