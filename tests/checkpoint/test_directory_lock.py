"""One run at a time on a job's checkpoint directory and on a committing sink's directory:
a second process fails at start naming the holder; a killed holder releases the lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reactive import CheckpointConfig, Dataflow, PushSource
from reactive.connectors.files import CommittingFileSink
from reactive.runtime.directory_lock import DirectoryLockedError

_HOLDER = textwrap.dedent("""
    import asyncio, sys
    from reactive import CheckpointConfig, Dataflow, PushSource
    from reactive.connectors.files import CommittingFileSink

    async def main(chk, out):
        flow = Dataflow("locked", parallelism=1)
        flow.source(PushSource()).uid("src").sink(CommittingFileSink(out)).uid("out")
        await flow.start(checkpoints=CheckpointConfig(interval=None, directory=chk))
        print("RUNNING", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


def _flow(out: Path) -> Dataflow:
    flow = Dataflow("locked", parallelism=1)
    flow.source(PushSource()).uid("src").sink(CommittingFileSink(out)).uid("out")
    return flow


@pytest.fixture
def holder(tmp_path):  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / "chk"),
                             str(tmp_path / "out")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "RUNNING"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.e2e
async def test_a_second_process_fails_at_start_naming_the_holder(tmp_path, holder):
    # the same job on the same checkpoint directory
    with pytest.raises(DirectoryLockedError) as info:
        await _flow(tmp_path / "out2").start(
            checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk"), resume=True)
    message = str(info.value)
    assert f"pid {holder.pid} on host {socket.gethostname()}" in message
    assert "checkpoint directory of job 'locked'" in message and "started 20" in message
    assert info.value.holder["pid"] == holder.pid
    # another checkpoint directory, but the same sink directory
    with pytest.raises(DirectoryLockedError, match=f"output directory of sink 'out'.*pid "
                                                   f"{holder.pid}"):
        await _flow(tmp_path / "out").start(
            checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk2"))
    # the refused run locked nothing: its own checkpoint directory is free
    job = await _flow(tmp_path / "out3").start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk2"))
    await job.cancel()


@pytest.mark.e2e
async def test_a_killed_holder_releases_the_lock(tmp_path, holder):
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    source = PushSource()
    flow = Dataflow("locked", parallelism=1)
    flow.source(source).uid("src").sink(CommittingFileSink(tmp_path / "out")).uid("out")
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk"),
                           resume=True)
    for i in range(5):
        await source.send(i)
    source.close()
    await job.wait()
    assert job.status == "finished"


async def test_runs_one_after_another_in_one_process(tmp_path):
    config = CheckpointConfig(interval=None, directory=tmp_path / "chk")
    first = _flow(tmp_path / "out")
    job = await first.start(checkpoints=config)
    with pytest.raises(DirectoryLockedError, match=f"pid {os.getpid()}"):
        await _flow(tmp_path / "other").start(checkpoints=config)
    await job.cancel()
    job = await _flow(tmp_path / "out").start(checkpoints=config, resume=True)
    await job.cancel()
