"""The task mailbox: mail runs in order before the next read, and a suspension of the
default action runs mail but reads nothing until it is resumed."""

from __future__ import annotations

import asyncio

from reactive.runtime.channel import Channel, InputGate
from reactive.runtime.task_mailbox import TaskMailbox


async def _source_loop(mailbox: TaskMailbox, reads: list[int], n: int) -> None:
    """A source task's loop: its mail, then one read (the default action)."""
    for i in range(n):
        if mailbox.queue:
            await mailbox.run_pending()
        reads.append(i)
        await asyncio.sleep(0)


async def test_mail_runs_in_order_with_what_it_posts():
    mailbox = TaskMailbox()
    ran: list[str] = []

    async def second() -> None:
        ran.append("second")
        mailbox.post(lambda: ran.append("posted by second"))

    mailbox.post(lambda: ran.append("first"))
    mailbox.post(second)
    await mailbox.run_pending()
    assert ran == ["first", "second", "posted by second"]


async def test_a_suspension_runs_mail_and_reads_nothing_until_resumed():
    mailbox = TaskMailbox()
    reads: list[int] = []
    ran: list[str] = []
    mailbox.post(lambda: ran.append("barrier"))
    suspension = mailbox.suspend_default_action()
    loop = asyncio.create_task(_source_loop(mailbox, reads, 3))
    for _ in range(10):
        await asyncio.sleep(0)
    assert ran == ["barrier"] and reads == []  # parked right behind the barrier
    mailbox.post(lambda: ran.append("notification"))
    for _ in range(10):
        await asyncio.sleep(0)
    assert ran == ["barrier", "notification"] and reads == []  # mail runs while parked
    suspension.resume()
    await loop
    assert reads == [0, 1, 2]


async def test_a_suspension_resumed_before_it_ran_does_not_park():
    mailbox = TaskMailbox()
    mailbox.suspend_default_action().resume()
    reads: list[int] = []
    async with asyncio.timeout(5):  # a parked loop would never end
        await _source_loop(mailbox, reads, 2)
    assert reads == [0, 1]


async def test_the_gate_wakes_its_reader_for_mail():
    ch = Channel(4)
    gate = InputGate([ch])
    waiting = asyncio.create_task(gate.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    gate.mailbox.post(lambda: None)
    async with asyncio.timeout(5):
        idx, _ = await waiting
    assert idx == -1
