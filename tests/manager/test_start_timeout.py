"""A start that does not finish in time fails with a message that says what was missing and how to give it time."""

import asyncio

import pytest

from laminar.manager.supervisor import _within


def test_a_wait_past_the_timeout_names_what_is_missing_and_the_setting():
    async def ready(x):
        return x

    async def never():
        await asyncio.Event().wait()

    async def main():
        assert await _within("things", [ready(1), ready(2)], 1.0, "") == [1, 2]
        await _within(
            "rollout replicas started",
            [ready(1), never()],
            0.05,
            "a larger one helps",
            "rollout.start_timeout_s",
        )

    with pytest.raises(TimeoutError) as err:
        asyncio.run(main())
    msg = str(err.value)
    assert "rollout replicas started: 1 of 2 not done after rollout.start_timeout_s = 0.05 s" in msg
    assert "a larger one helps" in msg
