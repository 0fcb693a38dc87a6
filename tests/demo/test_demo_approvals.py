"""The demo's approvals (DESIGN §10): the demo rules hold the simulator's payment, deploy and
customer-email agents, approvals arrive within the first minute, and a reviewer's decision
(taken through `services.approval_decide`, as the console does) lets each agent go on."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from console.demo.accounts import DEMO_APPROVAL_RULES, demo_accounts_ensure
from console.demo.simulator import APPROVAL_SCENARIOS, Simulator, SimulatorConfig
from runs import services
from runs.actors import Actor
from runs.ledger import ledger_verify
from runs.models import (
    Approval,
    ApprovalRule,
    ApprovalStatus,
    Artifact,
    ExecutionRecord,
    ExecutionState,
    OutboxItem,
    OutboxStatus,
    Run,
    RunStatus,
)
from runs.selectors import side_effect_leakage
from tests.support.demo import LIVE, run_statuses, team_credentials
from tests.support.stack import wait_until

PACE = 0.25
# One simulated minute at this pace: approvals must be waiting by then.
FIRST_MINUTE = 60 * PACE
RULES = {"Payments need a reviewer", "Production deploys", "Customer email"}


@pytest.mark.django_db
def test_demo_setup_creates_the_approval_rules_once_and_keeps_an_admins_edits():
    output = io.StringIO()
    call_command("demo_setup", stdout=output)
    rules = {(rule.team.slug, rule.name): rule for rule in ApprovalRule.objects.all()}
    assert set(rules) == {(team, fields["name"]) for team, fields in DEMO_APPROVAL_RULES}
    payments = rules[("payments", "Payments need a reviewer")]
    assert (payments.tool_glob, payments.side_effect, payments.risk) == (
        "payments.*",
        "write",
        "high",
    )
    assert (payments.timeout_seconds, payments.escalate_after_seconds) == (900, 300)
    email = rules[("payments", "Customer email")]
    assert (email.applies_to, email.transport, email.destination_glob) == (
        "outbox",
        "email",
        "*@customer.example",
    )
    assert rules[("platform", "Production deploys")].tool_glob == "deploy.*"
    assert "3 created" in output.getvalue() and "Payments need a reviewer" in output.getvalue()

    # an admin loosens a rule: a second setup leaves it as the admin made it
    services.approval_rule_update(
        rule_id=payments.pk, actor=Actor.system("admin"), timeout_seconds=1800
    )
    again = io.StringIO()
    call_command("demo_setup", stdout=again)
    assert ApprovalRule.objects.count() == 3
    assert ApprovalRule.objects.get(pk=payments.pk).timeout_seconds == 1800
    assert "0 created" in again.getvalue()


def _waiting(run_ids: list[str]) -> dict[str, Approval]:
    """The first waiting approval of each rule."""
    waiting = Approval.objects.filter(run_id__in=run_ids, status=ApprovalStatus.WAITING)
    return {approval.rule_name: approval for approval in waiting.order_by("-requested_at")}


@pytest.mark.django_db(transaction=True)
def test_demo_approvals_arrive_in_the_first_minute_and_decisions_let_the_agents_go_on(
    stack, receiver
):
    demo_accounts_ensure()
    reviewer = Actor.for_user(get_user_model().objects.get(username="reviewer"))
    simulator = Simulator(
        SimulatorConfig(
            url=stack.url,
            teams=team_credentials(),
            receiver_url=receiver.url(""),
            concurrency=0,  # only the approval workers
            pace=PACE,
            reviewer_interval=0,
            approval_workers=len(APPROVAL_SCENARIOS),
            approval_grace=0,  # no approver bot: the decisions below are the reviewer's
            seed=11,
        )
    )
    assert simulator.wait_until_ready(10)
    started = time.monotonic()
    simulator.start()
    try:
        # 1. within the first (simulated) minute, one approval of each demo rule waits
        wait_until(
            lambda: set(_waiting(simulator.run_ids)) >= RULES,
            timeout=FIRST_MINUTE,
            what="an approval for each demo rule",
        )
        arrived_after = time.monotonic() - started
        waiting = _waiting(simulator.run_ids)
        refund, deploy, email = (
            waiting["Payments need a reviewer"],
            waiting["Production deploys"],
            waiting["Customer email"],
        )
        assert refund.subject == "payments.refund" and refund.risk == "high"
        assert refund.summary.startswith("Refund €") and refund.arguments_schema
        assert deploy.subject == "deploy.production"
        assert email.target == "outbox" and email.outbox_item.transport == "email"
        # nothing held has started: no permit for the calls, the email not sent
        assert refund.execution_record.execution_state == ExecutionState.AWAITING_APPROVAL
        assert deploy.execution_record.execution_state == ExecutionState.AWAITING_APPROVAL
        assert email.outbox_item.status == OutboxStatus.AWAITING_APPROVAL

        # 2. the reviewer decides: the refund halved, the deploy refused, the email as is
        halved = {
            **refund.original_arguments,
            "amount_cents": refund.original_arguments["amount_cents"] // 2,
        }
        services.approval_decide(
            approval_id=refund.pk, decision="approve", actor=reviewer, arguments=halved
        )
        services.approval_decide(
            approval_id=deploy.pk,
            decision="reject",
            actor=reviewer,
            message="change freeze until Monday",
        )
        services.approval_decide(approval_id=email.pk, decision="approve", actor=reviewer)

        # 3. each agent goes on: the refund runs with the edited amount ...
        refund_run, deploy_run, email_run = refund.run_id, deploy.run_id, email.run_id
        wait_until(
            lambda: (
                set(run_statuses([refund_run, deploy_run, email_run]).values())
                == {RunStatus.COMPLETED}
            ),
            timeout=20,
            what="the three decided runs to complete",
        )
        payouts = [r for r in receiver.receipts if r.path == "/hooks/payments"]
        assert [r.body for r in payouts if r.run_id == refund_run] == [halved]
        record = ExecutionRecord.objects.get(pk=refund.execution_record_id)
        assert record.arguments == halved
        assert record.execution_state not in (
            ExecutionState.AWAITING_APPROVAL,
            ExecutionState.NOT_STARTED,
        )
        # ... the deploy never ran, and the agent told the model why and carried on
        deploy_record = ExecutionRecord.objects.get(pk=deploy.execution_record_id)
        assert deploy_record.execution_state == ExecutionState.NOT_STARTED
        assert Run.objects.get(pk=deploy_run).result["outcome"] == "deploy rejected"
        told = Artifact.objects.get(run_id=deploy_run, name="deploy: approval rejected")
        assert "change freeze until Monday" in told.content
        assert not ExecutionRecord.objects.filter(run_id=deploy_run, tool="metrics.query").exists()
        # ... and the email goes out through the server's dispatcher
        wait_until(
            lambda: OutboxItem.objects.get(pk=email.outbox_item_id).status == OutboxStatus.SENT,
            timeout=10,
            what="the approved email to be sent",
        )
        # (a worker counts its outcome once its lease is released, just after the completion)
        expected = {
            "release:deploy rejected",
            "customer_email:email approved",
            f"payout:refunded {halved['amount_cents']} cents",
        }
        wait_until(
            lambda: expected <= set(simulator.outcomes),
            timeout=10,
            what=f"the workers to report {expected}",
        )

        # 4. the workers picked new runs, and those wait again
        wait_until(
            lambda: (
                Approval.objects.filter(
                    run_id__in=simulator.run_ids, status=ApprovalStatus.WAITING
                ).count()
                >= 2
            ),
            timeout=FIRST_MINUTE,
            what="the next approvals",
        )
    finally:
        simulator.stop(timeout=15)
    print(f"\napprovals waiting after {arrived_after:.1f}s; outcomes {dict(simulator.outcomes)}")

    assert simulator.errors == 0, dict(simulator.outcomes)
    # the stop on shutdown ended the waits at once: what still waited is void, never started
    wait_until(
        lambda: not [s for s in run_statuses(simulator.run_ids).values() if s in LIVE],
        timeout=10,
        what="the simulator's runs to settle",
    )
    mine = Approval.objects.filter(run_id__in=simulator.run_ids)
    assert not mine.filter(status=ApprovalStatus.WAITING).exists()
    void = mine.filter(status=ApprovalStatus.VOID)
    assert void.exists()
    for approval in void.filter(target="tool_call"):
        assert approval.execution_record.execution_state == ExecutionState.NOT_STARTED
    assert all(ledger_verify(run_id=run_id)[1] is None for run_id in simulator.run_ids)
    now = timezone.now()
    assert side_effect_leakage(since=now - timedelta(hours=1), until=now)["total"] == 0
    assert receiver.duplicates() == {}
