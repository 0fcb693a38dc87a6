"""Browser websocket consumers: run-change frames for the console's live pages.

They are thin: authorise, join groups, forward `run.updated` messages as small JSON frames.
The page decides what to refetch (see static/console/console.js); no HTML and no ORM work
happens per message. Every route is wrapped by `console.routing.browser_only` (Origin check +
session), and each consumer refuses an anonymous user before accepting.

Close codes: 4401 no session, 4403 not allowed to watch. Both are sent before `accept()`,
so the handshake itself is refused.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.access import user_may_view_run, user_team_ids
from console.realtime import VIEWER_LAYER, browser_frame, run_group, team_group


class _BrowserConsumer(AsyncJsonWebsocketConsumer):
    # Browser frames travel on their own layer (Pub/Sub with Redis: one PUBLISH per change, at
    # most once; a lost frame shows as a `seq` gap and the page refetches). The agent consumer
    # stays on "default": the stop signal must not be lost. See console/realtime.py.
    channel_layer_alias = VIEWER_LAYER
    joined: list[str]

    async def _join(self, groups: list[str]) -> None:
        self.joined = groups
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    def _user(self) -> Any:
        user = self.scope.get("user")
        return user if user is not None and user.is_authenticated and user.is_active else None

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Browsers only listen; anything they send is ignored."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        # `run.updated` only forwards a frame (no ORM): skip channels' per-message
        # close_old_connections(), a hop through the one sync thread that HTTP views also need.
        # With 200 viewers of a busy run that hop was the fan-out bottleneck (docs/BENCHMARKS.md).
        if message.get("type") == "run.updated":
            await self.run_updated(message)
            return
        await super().dispatch(message)

    async def run_updated(self, event: dict[str, Any]) -> None:
        # The publisher encodes the frame once per change; a message without it (published by
        # an older process during a rolling deploy) is encoded here.
        await self.send(text_data=event.get("frame") or browser_frame(event))


class RunConsumer(_BrowserConsumer):
    """`/ws/runs/<run_id>/`: every change of one run, for its run page and stop packet."""

    async def connect(self) -> None:
        user = self._user()
        if user is None:
            await self.close(code=4401)
            return
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        if not await database_sync_to_async(user_may_view_run)(user, run_id):
            await self.close(code=4403)
            return
        await self._join([run_group(run_id)])
        await self.accept()


class TeamRunsConsumer(_BrowserConsumer):
    """`/ws/runs/`: every change of every run in the user's teams, for the runs page and inbox."""

    async def connect(self) -> None:
        user = self._user()
        if user is None:
            await self.close(code=4401)
            return
        team_ids = await database_sync_to_async(user_team_ids)(user)
        if not team_ids:
            await self.close(code=4403)
            return
        await self._join([team_group(team_id) for team_id in team_ids])
        await self.accept()
