from __future__ import annotations

import threading
import time

import httpx
import pytest

from safestop_agent import ApiError, Cancelled, CancelToken, Refused, retry


def cancel_later(token: CancelToken, delay: float, **kwargs: object) -> threading.Timer:
    timer = threading.Timer(delay, token.cancel, kwargs=kwargs)
    timer.start()
    return timer


# -- CancelToken -------------------------------------------------------------------


def test_new_token_is_not_cancelled_and_raises_nothing() -> None:
    token = CancelToken()
    assert not token.cancelled
    assert token.reason is None
    assert token.wait(0.01) is False
    token.raise_if_cancelled()


def test_first_cancel_wins_and_later_ones_change_nothing() -> None:
    token = CancelToken()
    assert token.cancel("user_stop", stop_epoch=5, requested_by="alice") is True
    assert token.cancel("lease_revoked", stop_epoch=6) is False
    assert token.cancelled
    assert (token.reason, token.stop_epoch, token.requested_by) == ("user_stop", 5, "alice")


def test_raise_if_cancelled_carries_reason_and_epoch() -> None:
    token = CancelToken()
    token.cancel("manual_takeover", stop_epoch=7, requested_by="bob")
    with pytest.raises(Cancelled) as caught:
        token.raise_if_cancelled()
    assert caught.value.reason == "manual_takeover"
    assert caught.value.stop_epoch == 7
    assert caught.value.requested_by == "bob"


def test_wait_wakes_promptly_when_cancelled_from_another_thread() -> None:
    token = CancelToken()
    cancel_later(token, 0.05, reason="user_stop")
    started = time.monotonic()
    assert token.wait(5) is True
    assert time.monotonic() - started < 1.0


def test_concurrent_cancels_set_the_token_exactly_once() -> None:
    token = CancelToken()
    outcomes: dict[int, bool] = {}
    barrier = threading.Barrier(8)

    def race(n: int) -> None:
        barrier.wait()
        outcomes[n] = token.cancel(f"reason-{n}")

    threads = [threading.Thread(target=race, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [n for n, won in outcomes.items() if won]
    assert len(winners) == 1
    assert token.reason == f"reason-{winners[0]}"


# -- retry -------------------------------------------------------------------------


def test_retry_returns_once_a_transient_failure_passes() -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise httpx.ConnectError("down")
        return "ok"

    assert retry(flaky, token=CancelToken(), attempts=5, base_delay=0.001, jitter=False) == "ok"
    assert len(attempts) == 3


def test_cancel_during_backoff_ends_the_wait_and_starts_no_other_attempt() -> None:
    token = CancelToken()
    attempts: list[float] = []

    def always_down() -> None:
        attempts.append(time.monotonic())
        raise httpx.ConnectError("down")

    cancel_later(token, 0.1, reason="user_stop", stop_epoch=9)
    started = time.monotonic()
    with pytest.raises(Cancelled) as caught:
        retry(always_down, token=token, attempts=5, base_delay=5.0, max_delay=5.0, jitter=False)
    elapsed = time.monotonic() - started

    assert elapsed < 1.0, "the 5 s backoff must end when the token is set"
    assert caught.value.reason == "user_stop"
    assert caught.value.stop_epoch == 9
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    time.sleep(0.2)
    assert len(attempts) == 1, "no attempt may start after the stop"


def test_already_cancelled_token_prevents_even_the_first_attempt() -> None:
    token = CancelToken()
    token.cancel("user_stop")
    calls: list[int] = []
    with pytest.raises(Cancelled):
        retry(lambda: calls.append(1), token=token)
    assert calls == []


def test_a_refusal_is_never_retried() -> None:
    calls: list[int] = []

    def refused() -> None:
        calls.append(1)
        raise Refused(409, "stale_epoch", "stale", {"stop_epoch": 4})

    with pytest.raises(Refused):
        retry(refused, token=CancelToken(), attempts=5, base_delay=0.001)
    assert calls == [1]


def test_client_errors_are_not_retried_but_server_errors_are() -> None:
    calls: list[int] = []

    def bad_request() -> None:
        calls.append(1)
        raise ApiError(400, "invalid", "bad field")

    with pytest.raises(ApiError):
        retry(bad_request, token=None, attempts=3, base_delay=0.001)
    assert calls == [1]

    calls.clear()

    def server_error() -> None:
        calls.append(1)
        raise ApiError(503, "http_503", "busy")

    with pytest.raises(ApiError):
        retry(server_error, token=None, attempts=3, base_delay=0.001)
    assert calls == [1, 1, 1]


def test_cancelled_raised_by_the_function_is_not_retried() -> None:
    calls: list[int] = []

    def stops() -> None:
        calls.append(1)
        raise Cancelled("user_stop")

    with pytest.raises(Cancelled):
        retry(stops, token=CancelToken(), attempts=4, base_delay=0.001)
    assert calls == [1]
