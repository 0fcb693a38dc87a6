"""A session's lane (`gateway.lane.Lane`): jobs in the order asked, on the gateway's threads,
each caller answered as soon as its job is done; a failing job answers its error and the next
one still runs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.lane import Lane


def test_jobs_run_in_order_on_a_thread_and_answer_each_caller() -> None:
    done: list[str] = []
    release = threading.Event()

    def job(name: str, wait: bool = False) -> str:
        if wait:
            release.wait(5)
        done.append(name)
        return f"{name} on {threading.current_thread().name}"

    async def scenario() -> list[str]:
        lane = Lane()
        first = lane.submit(job, "first", wait=True)  # keeps the lane busy
        second = lane.submit(job, "second")
        third = lane.submit(job, name="third")
        await asyncio.sleep(0.05)
        assert not second.done()  # queued behind the first
        release.set()
        answers = [await first, await second, await third]
        await lane.idle()
        return answers

    answers = asyncio.run(scenario())
    assert done == ["first", "second", "third"]
    assert all(answer.split(" on ")[1].startswith("mcp-gateway-db") for answer in answers)


def test_a_failing_job_answers_its_error_and_the_next_still_runs() -> None:
    def fail() -> None:
        raise ValueError("refused")

    async def scenario() -> str:
        lane = Lane()
        failing = lane.submit(fail)
        after = lane.submit(lambda: "after")
        with pytest.raises(ValueError, match="refused"):
            await failing
        return await after

    assert asyncio.run(scenario()) == "after"


def test_idle_waits_for_every_job_asked_so_far() -> None:
    done: list[int] = []

    def job(index: int) -> None:
        threading.Event().wait(0.02)
        done.append(index)

    async def scenario() -> None:
        lane = Lane()
        for index in range(3):
            lane.submit(job, index)
        await lane.idle()
        assert done == [0, 1, 2]
        lane.submit(job, 3)  # the lane starts again after going idle
        await lane.idle()

    asyncio.run(scenario())
    assert done == [0, 1, 2, 3]
