"""Over real sockets: daphne in another process (`tests/support/livestack.py`), the `websockets` client."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from runs.models import StopRequest
from tests.support.api import stop
from tests.support.scenarios import make_running


def test_a_stop_posted_over_http_reaches_the_connected_worker(
    live_stack, team, agent_token, reviewer_token
):
    run, _ = make_running(team)
    headers = {"Authorization": f"Bearer {agent_token.raw}"}
    with connect(
        live_stack.agent_ws_url(run.pk), additional_headers=headers, open_timeout=5
    ) as worker:
        started = time.monotonic()
        answer = httpx.post(
            f"{live_stack.url}/api/v1/runs/{run.pk}/cancel/",
            json={"reason": "user_stop"},
            headers={"Authorization": f"Bearer {reviewer_token.raw}"},
            timeout=5,
        )
        assert answer.status_code == 202
        frame = json.loads(worker.recv(timeout=5))
        elapsed = time.monotonic() - started
        assert (frame["type"], frame["stop_epoch"], frame["requested_by"]) == (
            "cancel_requested",
            2,
            "reviewer-bot",
        )
        assert frame["stop_request_id"] == answer.json()["stop_request"]["id"]
        assert elapsed < 2.0
        worker.send(json.dumps({"type": "ack"}))
        assert json.loads(worker.recv(timeout=5))["status"] == "draining"
    delivered = StopRequest.objects.get(run=run).signal_delivered_at
    assert delivered is not None


def test_a_bad_token_is_closed_with_4401_over_a_real_socket(live_stack, team):
    run, _ = make_running(team)
    with connect(
        live_stack.agent_ws_url(run.pk),
        additional_headers={"Authorization": "Bearer ss_nope"},
        open_timeout=5,
    ) as worker:
        with pytest.raises(ConnectionClosed) as closed:
            worker.recv(timeout=5)
    assert closed.value.rcvd.code == 4401


def test_the_live_server_serves_the_docs_and_their_static_files(live_stack):
    docs = httpx.get(f"{live_stack.url}/api/docs/", timeout=5)
    assert docs.status_code == 200
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in docs.text
    bundle = httpx.get(
        f"{live_stack.url}/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js",
        timeout=5,
    )
    assert bundle.status_code == 200
    assert len(bundle.content) > 100_000


def test_with_the_redis_layer_a_stop_made_in_the_test_process_is_pushed(
    live_stack_redis, team, agent_token
):
    run, _ = make_running(team)
    headers = {"Authorization": f"Bearer {agent_token.raw}"}
    with connect(
        live_stack_redis.agent_ws_url(run.pk), additional_headers=headers, open_timeout=5
    ) as worker:
        stop(run)
        frame = json.loads(worker.recv(timeout=5))
    assert (frame["type"], frame["stop_epoch"]) == ("cancel_requested", 2)
