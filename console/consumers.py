"""Browser websocket consumers: run-change frames for the console's live pages.

They are thin: authorise, join groups, forward `run.updated` messages as small JSON frames.
The page decides what to refetch (see static/console/console.js); no HTML and no ORM work
happens per message. Run and team frames come through the process's one feed per group
(console/consumers_fanout.py): the message is received, decoded and made into one frame once
per process, and each socket only filters and writes it (`offer`; under daphne the frame's
bytes go straight to the socket, console/wire.py). Every route is wrapped by
`console.routing.browser_only` (Origin check + session), and each consumer refuses an anonymous
user before accepting.

Access is not only checked at connect. Every socket also joins its user's `user_<id>` group:
a membership saved or deleted, or a change of the user's is_active / is_staff / is_superuser,
sends `access.changed` there (`console.realtime.membership_changed`, wired in `console.apps`),
and the socket re-reads the user's access — the runs page joins the teams it gained and leaves
the ones it lost; a socket that may no longer watch anything is closed with 4403. The viewers
layer is at most once, so each socket also re-checks on a timer
(`SAFESTOP_WS_ACCESS_RECHECK_SECONDS`): a lost message delays a revocation, never forgets it.
Only these re-checks touch the database; a `run.updated` frame never does.

A socket is also tied to the session it connected with. The same re-check (in the same single
database hop) asks whether that session would still log the user in, as
`django.contrib.auth.get_user` would judge it: the session still exists, names this user, and
its auth hash still matches (a password change rotates it). A logout (`user_logged_out`) and a
password change send `access.changed` too; an admin deleting sessions is caught by the timer.
A logout's message names the ended session (a digest of its key), so that socket closes without
the database: Django flushes the session only after the signal, and a re-check in another
process could otherwise still find it.

Close codes: 4401 no session (at connect; after it, the session ended), 4403 not allowed to
watch (before `accept()` the handshake itself is refused; after it, access was revoked), 1011
access could not be re-checked (the browser reconnects, and the connect authorises again).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable
from importlib import import_module
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.core.exceptions import ValidationError
from django.utils.crypto import constant_time_compare

from console.access import user_may_view_run, user_team_ids
from console.consumers_fanout import feed_join, feed_leave
from console.realtime import (
    VIEWER_LAYER,
    browser_frame,
    run_group,
    session_digest,
    team_group,
    user_group,
)
from console.wire import WIRE, Frame, SocketWire

logger = logging.getLogger(__name__)


def _current_user(user_id: int) -> Any:
    """The user as the database has it now (the session's copy is from the connect)."""
    return get_user_model().objects.filter(pk=user_id).first()


def _session_logs_in(session_key: str | None, user: Any) -> bool:
    """Would `django.contrib.auth.get_user` still find `user` in this session? It exists in the
    store (and has not expired), names this user, and its auth hash matches the user's current
    one (or one made with a SECRET_KEY_FALLBACKS key, which get_user accepts too)."""
    if not session_key:
        return False
    # A fresh store, not the scope's session: that one holds the data read at connect.
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    try:
        if user._meta.pk.to_python(session[SESSION_KEY]) != user.pk:
            return False
    except (KeyError, ValidationError):  # gone, expired, flushed, or not a login session
        return False
    if not hasattr(user, "get_session_auth_hash"):
        return True  # as get_user: a user model without the hash is not verified
    stored = session.get(HASH_SESSION_KEY)
    if not stored:
        return False
    return constant_time_compare(stored, user.get_session_auth_hash()) or any(
        constant_time_compare(stored, fallback)
        for fallback in user.get_session_auth_fallback_hash()
    )


# Handshake and close: their only database work (the access check at connect) goes through
# database_sync_to_async, which closes stale connections itself before and after. Channels'
# extra close_old_connections() hop through the one sync thread would be a third of a
# handshake's hops and a close's only one: a reconnect storm's cost (docs/BENCHMARKS.md,
# scale-out).
_OWN_CONNECTION_HANDLING = frozenset({"websocket.connect", "websocket.disconnect"})


# Frames a socket keeps while it may not send them yet (before accept, during an access
# re-check): far more than a re-check's few milliseconds of a busy team's changes.
_MAX_WAITING = 1000

# What `_access_now` returns when the socket's session no longer logs its user in.
_SESSION_ENDED: Any = object()


class _BrowserConsumer(AsyncJsonWebsocketConsumer):
    # Browser frames travel on their own layer (Pub/Sub with Redis: one PUBLISH per change, at
    # most once; a lost frame shows as a `seq` gap and the page refetches). The agent consumer
    # stays on "default": the stop signal must not be lost. See console/realtime.py.
    channel_layer_alias = VIEWER_LAYER
    # Groups this socket is in: through its own channel (the user's group: `access.changed`,
    # which reads the database for this socket alone) ...
    joined: set[str]
    # ... and through the process's one feed per group (run and team frames:
    # console/consumers_fanout.py), which calls `forward`.
    fed: set[str]
    user_id: int
    # The key of the session the socket connected with (the session cookie's).
    session_key: str | None = None
    # Under daphne: writes frames to this socket without its ASGI send (console/wire.py).
    # Every other send (accept, close) still goes through ASGI; both reach the socket in the
    # order they are made, since daphne writes an ASGI send before the `await` returns.
    wire: SocketWire | None = None
    # Set once access is revoked: nothing more is forwarded while the close goes out.
    revoked = False
    accepted = False
    # Access changes announced but not yet re-read: frames wait meanwhile.
    _access_pending = 0
    # Frames handed over before `accept()` went out or while an access change is re-read:
    # sent (if the socket may still see them) once neither holds; see `_held`.
    _waiting: list[tuple[dict[str, Any], Frame]]
    _releasing = False
    _access_tasks: set[asyncio.Task[None]]
    _recheck_task: asyncio.Task[None] | None = None
    _access_lock: asyncio.Lock | None = None

    async def connect(self) -> None:
        user = self._user()
        if user is None:
            await self.close(code=4401)
            return
        self.user_id = user.pk
        self.wire = self.scope.get(WIRE)
        self.session_key = getattr(self.scope.get("session"), "session_key", None)
        self.joined = set()
        self.fed = set()
        self._waiting = []
        self._access_tasks = set()
        self._access_lock = asyncio.Lock()
        # The user's group first: an access change committed after this point reaches us, so
        # none can slip in between the check below and the subscription.
        await self._follow([user_group(user.pk)])
        if not await self._authorise(user):
            await self._leave([*self.joined, *self.fed])
            await self.close(code=4403)
            return
        await self.accept()
        self.accepted = True
        await self._release()
        interval = float(getattr(settings, "SAFESTOP_WS_ACCESS_RECHECK_SECONDS", 60) or 0)
        if interval > 0:
            self._recheck_task = asyncio.get_running_loop().create_task(
                self._recheck_every(interval)
            )

    async def _authorise(self, user: Any) -> bool:
        """At connect, with the session's user: may it watch? Join the groups if so."""
        raise NotImplementedError

    def _access_of(self, user: Any) -> Any:
        """Later, inside the re-check's database hop (sync): what may the user as the database
        has it now (None if deleted) watch? Read only; `_apply_access` acts on it."""
        raise NotImplementedError

    async def _apply_access(self, access: Any) -> bool:
        """With `_access_of`'s answer: may the socket still watch? Adjust groups."""
        raise NotImplementedError

    def _access_now(self) -> Any:
        """The re-check's one database hop: the session first, then the access."""
        user = _current_user(self.user_id)
        if user is not None and not _session_logs_in(self.session_key, user):
            return _SESSION_ENDED
        return self._access_of(user)

    async def _join(self, groups: Iterable[str]) -> None:
        for group in groups:
            if group not in self.joined:
                self.joined.add(group)
                await self.channel_layer.group_add(group, self.channel_name)

    async def _follow(self, groups: Iterable[str]) -> None:
        """Run and team frames: through the process's feed of each group."""
        for group in groups:
            if group not in self.fed:
                self.fed.add(group)
                await feed_join(self.channel_layer, group, self)

    async def _leave(self, groups: Iterable[str]) -> None:
        for group in groups:
            if group in self.joined:
                self.joined.discard(group)
                await self.channel_layer.group_discard(group, self.channel_name)
            if group in self.fed:
                self.fed.discard(group)
                await feed_leave(self.channel_layer, group, self)

    async def disconnect(self, code: int) -> None:
        if self._recheck_task is not None:
            self._recheck_task.cancel()
        for task in getattr(self, "_access_tasks", ()):
            task.cancel()
        await self._leave([*getattr(self, "joined", ()), *getattr(self, "fed", ())])

    def _user(self) -> Any:
        user = self.scope.get("user")
        return user if user is not None and user.is_authenticated and user.is_active else None

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Browsers only listen; anything they send is ignored."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        # `run.updated` only forwards a frame (no ORM): skip channels' per-message
        # close_old_connections(), a hop through the one sync thread that HTTP views also need.
        # That hop is the fan-out bottleneck with many viewers of a busy run (docs/BENCHMARKS.md).
        # `access.changed` (rare) takes the ordinary path: it reads the database.
        kind = message.get("type")
        if kind == "run.updated":
            await self.run_updated(message)
            return
        if kind in _OWN_CONNECTION_HANDLING:
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)

    async def run_updated(self, event: dict[str, Any]) -> None:
        """A frame sent to this socket's own channel (not through a feed): forwarded the same."""
        await self.forward(event, Frame(event.get("frame") or browser_frame(event)))

    def offer(self, event: dict[str, Any], frame: Frame) -> bool:
        """A change this socket's groups carry, in its feed's synchronous pass over the
        process's sockets (console/consumers_fanout.py); `frame` is the same object for all.
        False when the frame must go through the ASGI send: the feed then awaits `forward`."""
        if self.wire is None:
            return False
        if not self._held(event, frame) and self.may_see(event):
            self.wire.write(frame)
        return True

    async def forward(self, event: dict[str, Any], frame: Frame) -> None:
        """`offer` for a socket without a wire."""
        if not self._held(event, frame) and self.may_see(event):
            await self._write(frame)

    def _held(self, event: dict[str, Any], frame: Frame) -> bool:
        """Not to be written now: revoked (never), or kept until the socket is open and its
        access settled (`_release`)."""
        if self.revoked:
            return True
        if not self.accepted or self._access_pending or self._releasing:
            # Judged later, against the access as it is then; a socket that falls this far
            # behind loses the oldest, and the page refetches at the `seq` gap.
            if len(self._waiting) >= _MAX_WAITING:
                del self._waiting[0]
            self._waiting.append((event, frame))
            return True
        return False

    async def _write(self, frame: Frame) -> None:
        if self.wire is not None:
            self.wire.write(frame)
        else:
            await self.base_send(frame.outgoing)

    async def _release(self) -> None:
        """Send what waited, in order, once the socket is open and its access settled."""
        self._releasing = True
        try:
            while self._waiting and self.accepted and not self._access_pending:
                event, frame = self._waiting.pop(0)
                if not self.revoked and self.may_see(event):
                    await self._write(frame)
        finally:
            self._releasing = False
        if self.revoked:
            self._waiting.clear()

    def may_see(self, event: dict[str, Any]) -> bool:
        return True

    def access_message(self, event: dict[str, Any]) -> None:
        """`access.changed` from the user's feed: hold frames from now on, and re-read the
        access through channels' ordinary dispatch (its connection handling included)."""
        self._access_pending += 1
        task = asyncio.get_running_loop().create_task(self._access_message(event))
        self._access_tasks.add(task)
        task.add_done_callback(self._access_tasks.discard)

    async def _access_message(self, event: dict[str, Any]) -> None:
        try:
            await super().dispatch(event)
        finally:
            self._access_pending -= 1
            await self._release()

    async def access_changed(self, event: dict[str, Any]) -> None:
        """The user's memberships, access flags, password or sessions changed
        (console.realtime.membership_changed)."""
        ended = event.get("ended_session")
        if (
            ended
            and self.session_key
            and constant_time_compare(ended, session_digest(self.session_key))
        ):
            # This socket's own session logged out: Django flushes it after the signal, so the
            # database may still have it; no need to look.
            await self._recheck_access(session_ended=True)
            return
        await self._recheck_access()

    async def _recheck_every(self, interval: float) -> None:
        """A lost `access.changed` (the viewers layer is at most once) must not leave a leak."""
        while not self.revoked:
            # Jittered, so sockets opened together (a deploy, a reconnect storm) query apart.
            await asyncio.sleep(interval * random.uniform(0.8, 1.2))
            await self._recheck_access()

    async def _recheck_access(self, *, session_ended: bool = False) -> None:
        assert self._access_lock is not None
        async with self._access_lock:  # the message and the timer never adjust groups at once
            if self.revoked:
                return
            if session_ended:
                await self._revoke(code=4401)
                return
            try:
                access = await database_sync_to_async(self._access_now)()
                allowed = access is not _SESSION_ENDED and await self._apply_access(access)
            except Exception:
                # Fail closed: the browser reconnects, and connect authorises it again.
                logger.exception("browser socket of user %s: access re-check failed", self.user_id)
                await self._revoke(code=1011)
                return
            if access is _SESSION_ENDED:
                await self._revoke(code=4401)
            elif not allowed:
                await self._revoke(code=4403)

    async def _revoke(self, *, code: int) -> None:
        self.revoked = True
        await self._leave([*self.joined, *self.fed])
        if self._recheck_task is not None and self._recheck_task is not asyncio.current_task():
            self._recheck_task.cancel()
        await self.close(code=code)


class RunConsumer(_BrowserConsumer):
    """`/ws/runs/<run_id>/`: every change of one run, for its run page and stop packet."""

    run_id: str

    async def _authorise(self, user: Any) -> bool:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        if not await database_sync_to_async(user_may_view_run)(user, self.run_id):
            return False
        await self._follow([run_group(self.run_id)])
        return True

    def _access_of(self, user: Any) -> bool:
        return user is not None and user_may_view_run(user, self.run_id)

    async def _apply_access(self, access: bool) -> bool:
        return access


class TeamRunsConsumer(_BrowserConsumer):
    """`/ws/runs/`: every change of every run in the user's teams, for the runs page and inbox."""

    # The teams whose frames are forwarded; a frame of any other team (one already queued when
    # its group was left) is dropped. Staff hold every team that existed at the last check.
    team_ids: frozenset[int] = frozenset()

    async def _authorise(self, user: Any) -> bool:
        return await self._watch(await database_sync_to_async(user_team_ids)(user))

    def _access_of(self, user: Any) -> list[int]:
        return user_team_ids(user) if user is not None else []

    async def _apply_access(self, access: list[int]) -> bool:
        return await self._watch(access)

    async def _watch(self, team_ids: list[int]) -> bool:
        if not team_ids:
            return False
        wanted = frozenset(team_ids)
        gained, lost = wanted - self.team_ids, self.team_ids - wanted
        self.team_ids = wanted  # before the unsubscribe: a lost team's frames stop here
        await self._leave(team_group(team_id) for team_id in sorted(lost))
        await self._follow(team_group(team_id) for team_id in sorted(gained))
        return True

    def may_see(self, event: dict[str, Any]) -> bool:
        # A frame of a team left a moment ago (already in its feed's queue) is dropped here.
        return event.get("team") in self.team_ids
