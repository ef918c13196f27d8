"""No call waits for work with the GIL held.

XLA's CPU client gives an execution queued behind another its output's memory
only when it starts, and answers some PJRT calls on such a buffer (an
external reference, its address, destroying it once donated on PJRT 0.81) by
waiting for that. Two of pjrt_py's calls once made such a call with the GIL
held, stopping every Python thread until the work upstream began
(test_staging, test_donation). Here every call on a queued result, and on the
running result it waits for, runs on one thread while another checks that it
ran before that work was done: on a plain client, and (the transfers) on one
that stages every copy (pjrt_py.runtime.staging).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from conftest import doubling, lets_threads_run, queued_work

import pjrt_py
from pjrt_py.runtime import staging

Call = Callable[[pjrt_py.Buffer], Any]


def transfers() -> dict[str, Call]:
    return {
        "to_numpy_async": lambda b: b.to_numpy_async(),
        "to_numpy": lambda b: b.to_numpy(),
        "np.asarray": np.asarray,
        "pickle": pickle.dumps,
    }


def calls(client: pjrt_py.Client) -> dict[str, Call]:
    """What a program may do with a Buffer whose work has not finished."""
    found: dict[str, Call] = {
        "delete": lambda b: b.delete(),
        "repr": repr,
        "is_ready": lambda b: b.is_ready(),
        "memory": lambda b: b.memory,
        "copy.copy": copy.copy,
        "execute_async": lambda b: doubling(client).execute_async(b),
        "execute_async, donating": lambda b: doubling(client, donate=True).execute_async(b),
        "execute": lambda b: doubling(client).execute(b),
        "block_until_ready": lambda b: b.block_until_ready(),
        "unsafe_pointer": lambda b: b.unsafe_pointer(),
        **transfers(),
    }
    # Copies elsewhere only: a plugin may refuse a copy to where the buffer is.
    if len(client.devices) > 1:
        found["copy_to_device_async"] = lambda b: b.copy_to_device_async(client.devices[1])
    here = client.default_device.default_memory.kind
    for memory in client.default_device.memories:
        if memory.kind != here:
            found[f"copy_to_memory_async {memory.kind}"] = lambda b, kind=memory.kind: (
                b.copy_to_memory_async(kind)
            )
    return found


@pytest.fixture(scope="module", params=["plain", "staged"])
def setup(
    request: pytest.FixtureRequest, client: pjrt_py.Client
) -> Iterator[tuple[pjrt_py.Client, dict[str, Call]]]:
    if request.param == "plain":
        table, c = calls(client), client
    else:
        c = pjrt_py.Client(client.plugin)
        staging.configure(c, mode="on", min_bytes=1, chunk_bytes=16 << 10, slots=2)
        table = transfers()
    doubling(c)
    doubling(c, donate=True)  # compiled before any call is watched
    yield c, table
    if c is not client:
        c.close()


@pytest.mark.parametrize("which", ["queued", "running"])
def test_no_call_on_unfinished_work_holds_the_gil(
    setup: tuple[pjrt_py.Client, dict[str, Call]], which: str
) -> None:
    client, table = setup
    held = []
    for name, call in table.items():
        running, queued = queued_work(client, 0.25)
        # Watched for the end of the work: the promise the call leaves alone
        # (a delete() makes its own unreadable). The queued step is a short
        # add, done just after the running work.
        used, watched = (queued, running) if which == "queued" else (running, queued)
        buf = used.buffer()
        try:
            lets_threads_run(lambda call=call, buf=buf: call(buf), watched)
        except AssertionError as e:
            held.append(f"{name}: {e}")
        pjrt_py.effects_barrier()  # every execution so far has ended (delete() included)
    assert not held, held
