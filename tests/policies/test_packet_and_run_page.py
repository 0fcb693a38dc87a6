"""A policy stop is named where people look: the stop packet and the run page say which
policy acted, its expression and the values it saw (DESIGN §14)."""

from __future__ import annotations

import pytest
from django.test import Client

from handoff.models import StopPacket
from runs import services
from runs.errors import RunNotRunning
from tests.support.policies import permit, policy
from tests.support.scenarios import AGENT, make_running, reload

pytestmark = pytest.mark.django_db


def test_the_packet_and_the_run_page_name_the_policy(team, bob):
    policy(team, "loop", 'call.repeats >= 2 && call.tool == "search"')
    run, lease = make_running(team)
    permit(run, "c1")
    with pytest.raises(RunNotRunning):
        permit(run, "c2")
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    packet = StopPacket.objects.get(run=run)
    note = packet.snapshot["stop_note"]
    assert packet.snapshot["requested_by"] == "policy:loop"
    assert 'call.repeats >= 2 && call.tool == "search"' in note
    assert "call.repeats=2" in note and "call.tool='search'" in note
    client = Client()
    client.force_login(bob)
    body = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-testid="run-policy-stop"' in body and "policy loop matched" in body
    assert 'data-testid="run-policy-hits"' in body
    assert reload(run).stop_reason == "policy_violation"
