"""Per-caller rate limit: 429 with Retry-After; atomic counters in the database or Redis."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection

from api import ratelimit
from api.models import RateWindow
from api.ratelimit import rate_limit_hit
from tests.support.isolation import suite_redis_url
from tests.support.livestack import redis_reachable

NOW = 1_800_000_030.0  # 30 s into a window: Retry-After is 30


@pytest.fixture
def frozen_clock(monkeypatch):
    monkeypatch.setattr(ratelimit.time, "time", lambda: NOW)


@pytest.mark.django_db
def test_over_the_limit_is_429_with_retry_after(
    api, agent_token, reviewer_token, settings, frozen_clock
):
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 3
    assert [api.get("/api/v1/runs/", agent_token).status_code for _ in range(3)] == [200, 200, 200]
    refused = api.get("/api/v1/runs/", agent_token)
    assert refused.status_code == 429
    assert refused.json()["error"] == "rate_limited"
    assert refused["Retry-After"] == "30"
    # per token: another caller is not held back
    assert api.get("/api/v1/runs/", reviewer_token).status_code == 200


@pytest.mark.django_db
def test_the_limit_resets_in_the_next_window(api, agent_token, settings, monkeypatch):
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 1
    monkeypatch.setattr(ratelimit.time, "time", lambda: NOW)
    assert [api.get("/api/v1/runs/", agent_token).status_code for _ in range(2)] == [200, 429]
    monkeypatch.setattr(ratelimit.time, "time", lambda: NOW + 60)
    assert api.get("/api/v1/runs/", agent_token).status_code == 200


@pytest.mark.django_db
def test_session_users_are_limited_too_and_zero_disables(api, client, bob, settings, frozen_clock):
    client.force_login(bob)
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 1
    assert [api.get("/api/v1/runs/").status_code for _ in range(2)] == [200, 429]
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 0
    assert api.get("/api/v1/runs/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_database_counter_loses_no_increment_under_concurrency(settings):
    settings.REDIS_URL = ""
    threads, per_thread, limit = 8, 25, 50
    decisions: list[ratelimit.RateDecision] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def hammer() -> None:
        try:
            start.wait()
            for _ in range(per_thread):
                decision = rate_limit_hit(bucket="token:race", limit=limit, now=NOW)
                with lock:
                    decisions.append(decision)
        finally:
            connection.close()

    workers = [threading.Thread(target=hammer) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(d.hits for d in decisions) == list(range(1, threads * per_thread + 1))
    assert sum(d.allowed for d in decisions) == limit
    assert RateWindow.objects.get(bucket="token:race").hits == threads * per_thread


@pytest.mark.django_db
def test_old_windows_are_pruned_by_the_callers_next_window(settings):
    settings.REDIS_URL = ""
    rate_limit_hit(bucket="token:old", limit=5, now=NOW - 3600)
    rate_limit_hit(bucket="token:old", limit=5, now=NOW)
    assert list(RateWindow.objects.filter(bucket="token:old").values_list("hits", flat=True)) == [1]


@pytest.mark.django_db
def test_with_redis_the_counter_is_a_redis_key(settings):
    url = suite_redis_url()
    if not redis_reachable(url):
        pytest.fail("Redis is not reachable on 127.0.0.1:6379: run `make services`")
    settings.REDIS_URL = url
    bucket = f"token:{uuid.uuid4().hex}"
    decisions = [rate_limit_hit(bucket=bucket, limit=2, now=NOW) for _ in range(3)]
    assert [(d.hits, d.allowed) for d in decisions] == [(1, True), (2, True), (3, False)]
    client = ratelimit._redis_client(url)
    key = f"safestop:rl:{bucket}:{int(NOW // 60)}"
    assert int(client.get(key)) == 3
    assert 0 < client.ttl(key) <= 120
    client.delete(key)
    assert not RateWindow.objects.exists()


def _redis_for_the_test(settings):
    url = suite_redis_url()
    if not redis_reachable(url):
        pytest.fail("Redis is not reachable on 127.0.0.1:6379: run `make services`")
    settings.REDIS_URL = url
    return ratelimit._redis_client(url)


@pytest.mark.django_db
def test_a_redis_hit_is_one_command(settings, monkeypatch):
    client = _redis_for_the_test(settings)
    sent = []
    real = client.execute_command

    def counted(*args, **options):
        sent.append(args[0])
        return real(*args, **options)

    monkeypatch.setattr(client, "execute_command", counted)
    bucket = f"token:{uuid.uuid4().hex}"
    assert rate_limit_hit(bucket=bucket, limit=5, now=NOW).hits == 1
    assert sent == ["EVALSHA"]  # not MULTI, INCR, EXPIRE, EXEC
    client.delete(f"safestop:rl:{bucket}:{int(NOW // 60)}")


@pytest.mark.django_db
def test_a_later_hit_leaves_the_windows_lifetime_running(settings):
    client = _redis_for_the_test(settings)
    bucket = f"token:{uuid.uuid4().hex}"
    key = f"safestop:rl:{bucket}:{int(NOW // 60)}"
    rate_limit_hit(bucket=bucket, limit=5, now=NOW)
    client.expire(key, 1000)  # as if the first hit had been long ago
    assert rate_limit_hit(bucket=bucket, limit=5, now=NOW).hits == 2
    assert 120 < client.ttl(key) <= 1000  # EXPIRE ... NX: the second hit did not reset it
    client.delete(key)


@pytest.mark.django_db
def test_an_unreachable_redis_falls_back_to_the_database(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert rate_limit_hit(bucket="token:fallback", limit=5, now=NOW).hits == 1
    assert RateWindow.objects.get(bucket="token:fallback").hits == 1
