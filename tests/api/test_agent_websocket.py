"""The agent push channel `/ws/agent/runs/<id>/`, in-process with WebsocketCommunicator.

No Origin header anywhere: agents are not browsers.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from api import consumers
from api.models import Denial
from console.asgi import application
from runs import services
from runs.actors import Actor
from runs.models import Run, StopRequest
from tests.support.api import stop
from tests.support.scenarios import make_run, make_running

pytestmark = pytest.mark.django_db(transaction=True)


def bearer(token) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {token.raw}".encode())]


async def open_socket(path: str, headers=None) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path, headers=headers or [])
    connected, _ = await communicator.connect(timeout=3)
    assert connected
    return communicator


async def close_code(path: str, headers=None) -> int:
    communicator = await open_socket(path, headers)
    message = await communicator.receive_output(timeout=3)
    await communicator.wait()
    assert message["type"] == "websocket.close"
    return message["code"]


async def test_a_stop_is_pushed_the_moment_it_commits(team, agent_token):
    run, _ = await database_sync_to_async(make_running)(team)
    socket = await open_socket(f"/ws/agent/runs/{run.pk}/", bearer(agent_token))
    assert await socket.receive_nothing(timeout=0.1)
    outcome = await database_sync_to_async(stop)(run)
    frame = await socket.receive_json_from(timeout=3)
    assert frame == {
        "type": "cancel_requested",
        "reason": "user_stop",
        "requested_by": "test",
        "stop_epoch": 2,
        "stop_request_id": outcome.stop_request.pk,
        "run_id": run.pk,
        "requested_at": outcome.stop_request.requested_at.isoformat(),
    }
    delivered = None
    for _ in range(40):
        delivered = await database_sync_to_async(
            lambda: StopRequest.objects.get(pk=outcome.stop_request.pk).signal_delivered_at
        )()
        if delivered:
            break
        await asyncio.sleep(0.05)
    assert delivered is not None
    await socket.disconnect()


async def test_the_worker_acks_over_the_socket(team, agent_token):
    run, _ = await database_sync_to_async(make_running)(team)
    socket = await open_socket(f"/ws/agent/runs/{run.pk}/", bearer(agent_token))
    await database_sync_to_async(stop)(run)
    await socket.receive_json_from(timeout=3)
    await socket.send_json_to({"type": "ack"})
    assert await socket.receive_json_from(timeout=3) == {
        "type": "ack",
        "status": "draining",
        "stop_epoch": 2,
    }
    assert (await database_sync_to_async(Run.objects.get)(pk=run.pk)).status == "draining"
    await socket.disconnect()


def _stop_request(run) -> StopRequest:
    return StopRequest.objects.get(run=run)


async def _signalled(team, agent_token, monkeypatch, *, grace: float):
    """A running run whose worker's socket has just received its stop signal, with the
    consumer's grace for recording the delivery set to `grace`: (run, lease, socket, frame)."""
    monkeypatch.setattr(consumers, "DELIVERY_RECORD_GRACE_SECONDS", grace)
    run, lease = await database_sync_to_async(make_running)(team)
    socket = await open_socket(f"/ws/agent/runs/{run.pk}/", bearer(agent_token))
    await database_sync_to_async(stop)(run)
    frame = await socket.receive_json_from(timeout=3)
    return run, lease, socket, frame


async def test_the_ack_records_the_signals_delivery_in_its_own_transaction(
    team, agent_token, monkeypatch
):
    # No transaction of its own before the ack (it would hold up the ack, and the drained
    # answer behind it): with a grace no test waits out, only the ack can have recorded it.
    run, _, socket, _ = await _signalled(team, agent_token, monkeypatch, grace=60)
    assert (await database_sync_to_async(_stop_request)(run)).signal_delivered_at is None
    await socket.send_json_to({"type": "ack"})
    assert (await socket.receive_json_from(timeout=3))["status"] == "draining"
    recorded = await database_sync_to_async(_stop_request)(run)
    # The time of the write to the socket, not of the ack's transaction.
    assert recorded.requested_at < recorded.signal_delivered_at < recorded.acknowledged_at
    await socket.disconnect()


async def test_an_ack_after_the_drained_records_the_earlier_delivery(
    team, agent_token, monkeypatch
):
    run, lease, socket, frame = await _signalled(team, agent_token, monkeypatch, grace=60)
    await database_sync_to_async(services.run_drained)(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=Actor.system("test")
    )
    before = await database_sync_to_async(_stop_request)(run)
    # The drained acknowledges with its own time: it knows nothing of the socket's write.
    assert before.acknowledged_at is not None
    await socket.send_json_to({"type": "ack", "stop_epoch": frame["stop_epoch"]})
    assert (await socket.receive_json_from(timeout=3))["status"] == "stopped_cleanly"
    after = await database_sync_to_async(_stop_request)(run)
    # The socket's write came first: the earliest time known is kept.
    assert after.requested_at < after.signal_delivered_at < before.signal_delivered_at
    assert after.acknowledged_at == before.acknowledged_at
    await socket.disconnect()


async def test_without_an_ack_the_delivery_is_recorded_after_the_grace(
    team, agent_token, monkeypatch
):
    run, _, socket, _ = await _signalled(team, agent_token, monkeypatch, grace=0.05)
    recorded = None
    for _ in range(60):
        recorded = await database_sync_to_async(_stop_request)(run)
        if recorded.signal_delivered_at:
            break
        await asyncio.sleep(0.05)
    assert recorded is not None and recorded.signal_delivered_at is not None
    assert recorded.acknowledged_at is None and recorded.signal_delivered_at > recorded.requested_at
    await socket.disconnect()


async def test_a_socket_closed_before_its_ack_records_the_delivery(team, agent_token, monkeypatch):
    run, _, socket, _ = await _signalled(team, agent_token, monkeypatch, grace=60)
    await socket.disconnect()
    recorded = await database_sync_to_async(_stop_request)(run)
    assert recorded.signal_delivered_at is not None and recorded.acknowledged_at is None


async def test_connecting_to_a_run_already_stopping_gets_the_signal_at_once(team, agent_token):
    run, _ = await database_sync_to_async(make_running)(team)
    await database_sync_to_async(stop)(run)
    socket = await open_socket(f"/ws/agent/runs/{run.pk}/?token={agent_token.raw}")
    frame = await socket.receive_json_from(timeout=3)
    assert (frame["type"], frame["stop_epoch"]) == ("cancel_requested", 2)
    await socket.disconnect()


async def test_a_pending_run_sends_nothing_and_answers_pings(team, agent_token):
    run = await database_sync_to_async(make_run)(team)
    socket = await open_socket(f"/ws/agent/runs/{run.pk}/", bearer(agent_token))
    assert await socket.receive_nothing(timeout=0.2)
    await socket.send_json_to({"type": "ping"})
    assert await socket.receive_json_from(timeout=3) == {"type": "pong"}
    await socket.send_to(text_data="{not json")
    assert (await socket.receive_json_from(timeout=3))["error"] == "invalid_json"
    await socket.send_json_to(["ack"])
    assert (await socket.receive_json_from(timeout=3))["error"] == "unknown_frame"
    await socket.disconnect()


@pytest.mark.parametrize(
    "headers", [[], [(b"authorization", b"Bearer ss_wrong")], [(b"authorization", b"Basic x")]]
)
async def test_a_bad_or_missing_token_is_refused_with_4401(team, headers):
    run = await database_sync_to_async(make_run)(team)
    assert await close_code(f"/ws/agent/runs/{run.pk}/", headers) == 4401


async def test_another_teams_run_is_refused_like_a_missing_one(other_team, agent_token):
    theirs = await database_sync_to_async(make_run)(other_team)
    assert await close_code(f"/ws/agent/runs/{theirs.pk}/", bearer(agent_token)) == 4404
    assert await close_code("/ws/agent/runs/run_000000000000/", bearer(agent_token)) == 4404
    denial = await database_sync_to_async(Denial.objects.get)()
    assert (denial.reason, denial.credential) == ("wrong_team", "token:agent-1")


async def test_another_teams_stop_is_never_pushed_to_this_token(
    team, other_team, agent_token, outsider_token
):
    mine, _ = await database_sync_to_async(make_running)(team)
    socket = await open_socket(f"/ws/agent/runs/{mine.pk}/", bearer(agent_token))
    theirs, _ = await database_sync_to_async(make_running)(other_team)
    await database_sync_to_async(stop)(theirs)
    assert await socket.receive_nothing(timeout=0.3)
    await socket.disconnect()


async def test_revoking_a_token_closes_its_open_sockets_at_once(team, agent_token):
    from runs.actors import Actor
    from runs.tokens import api_token_revoke

    run, _ = await database_sync_to_async(make_running)(team)
    socket = await open_socket(f"/ws/agent/runs/{run.pk}/", bearer(agent_token))
    assert await socket.receive_nothing(timeout=0.1)
    await database_sync_to_async(api_token_revoke)(
        token_id=agent_token.token.pk, actor=Actor.system("test")
    )
    message = await socket.receive_output(timeout=3)
    assert message == {"type": "websocket.close", "code": 4401}
    # the next stop is not delivered to it: the socket is gone, and a new one is refused
    assert await close_code(f"/ws/agent/runs/{run.pk}/", bearer(agent_token)) == 4401


async def test_an_ack_with_a_token_revoked_since_connect_moves_nothing(team, agent_token):
    from runs.models import ApiToken

    run, _ = await database_sync_to_async(make_running)(team)
    socket = await open_socket(f"/ws/agent/runs/{run.pk}/", bearer(agent_token))
    await database_sync_to_async(stop)(run)
    await socket.receive_json_from(timeout=3)
    # revoked behind the service's back: no message reaches the socket, only the re-check can
    await database_sync_to_async(
        lambda: ApiToken.objects.filter(pk=agent_token.token.pk).update(
            revoked_at="2026-01-01T00:00Z"
        )
    )()
    await socket.send_json_to({"type": "ack"})
    message = await socket.receive_output(timeout=3)
    assert message == {"type": "websocket.close", "code": 4401}
    assert (await database_sync_to_async(Run.objects.get)(pk=run.pk)).status == "cancel_requested"
