"""Retries that sleep on the cancel token, so a stop ends the backoff at once.

Seed §6: "cancel during retry backoff → the wait ends promptly and no further
ordinary retry starts." A `time.sleep` would hold the stop for up to
`max_delay`; `token.wait` wakes the moment the token is set.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from .cancel import Cancelled, CancelToken
from .errors import ApiError, Refused

T = TypeVar("T")


def is_transient(error: Exception) -> bool:
    """The default retry rule: retry anything except a refusal or a client-side 4xx.

    A refusal (409 stopped/stale/revoked) is the server's decision, and a 4xx
    means the request itself is wrong: repeating either changes nothing.
    """
    if isinstance(error, Refused):
        return False
    if isinstance(error, ApiError):
        return error.is_transient
    return True


def backoff_delay(attempt: int, *, base_delay: float, max_delay: float, jitter: bool) -> float:
    """Exponential backoff for the wait after failed attempt number `attempt` (1-based)."""
    delay = min(max_delay, base_delay * (2 ** (attempt - 1)))
    # "Equal jitter": keep at least half the delay so retries never bunch up at zero.
    return delay / 2 + random.uniform(0, delay / 2) if jitter else delay


def retry(
    fn: Callable[[], T],
    *,
    token: CancelToken | None,
    attempts: int = 3,
    base_delay: float = 0.5,
    max_delay: float = 10.0,
    jitter: bool = True,
    retry_if: Callable[[Exception], bool] = is_transient,
) -> T:
    """Call `fn` until it succeeds, at most `attempts` times.

    1. Before every attempt, a cancelled token raises `Cancelled`: no attempt
       ever starts after a stop.
    2. A failure that `retry_if` rejects, or the last failure, is re-raised.
    3. Between attempts the backoff is spent in `token.wait(delay)`; if the
       token is set during the wait, `Cancelled` is raised from the last error.

    `Cancelled` raised by `fn` itself always propagates untouched. Pass
    `token=None` for reporting facts (results, events) that must still reach the
    server after a stop.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    for attempt in range(1, attempts + 1):
        if token is not None:
            token.raise_if_cancelled()
        try:
            return fn()
        except Cancelled:
            raise
        except Exception as error:
            if attempt == attempts or not retry_if(error):
                raise
            delay = backoff_delay(
                attempt, base_delay=base_delay, max_delay=max_delay, jitter=jitter
            )
            _sleep_unless_cancelled(delay, token, error)
    raise AssertionError("unreachable: the loop returns or raises")


def _sleep_unless_cancelled(delay: float, token: CancelToken | None, error: Exception) -> None:
    if token is None:
        time.sleep(delay)
        return
    if token.wait(delay):
        raise Cancelled(
            token.reason, stop_epoch=token.stop_epoch, requested_by=token.requested_by
        ) from error
