"""The machine's RabbitMQ for the tests: a virtual host of their own, removed after.

The tests never touch another vhost's queues. ``consumer_timeout`` is node-wide: the test
that lowers it restores the value it found (``lowered_consumer_timeout``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

HOST = os.environ.get("MERLIN_TEST_RABBITMQ_HOST", "127.0.0.1:5672")
"""Where the machine's RabbitMQ listens; its ``guest`` user may connect from localhost."""


def rabbitmqctl(*args: str) -> str:
    """Run ``rabbitmqctl``; its output, or an AssertionError with what it said."""
    result = subprocess.run(
        ["rabbitmqctl", "--quiet", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"rabbitmqctl {' '.join(args)}: {result.stderr}"
    return result.stdout.strip()


def _unreachable() -> str | None:
    """Why the tests cannot use RabbitMQ here, or None."""
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not installed"
    result = subprocess.run(
        ["rabbitmqctl", "--quiet", "status"], capture_output=True, text=True, timeout=60
    )
    return None if result.returncode == 0 else f"rabbitmqctl status: {result.stderr.strip()}"


@contextmanager
def own_vhost() -> Iterator[str]:
    """An ``amqp://`` URL of a new vhost the guest user may use; the vhost goes after."""
    problem = _unreachable()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"RabbitMQ is required in CI but unusable: {problem}")
        pytest.skip(f"no RabbitMQ for the tests: {problem}")
    vhost = f"merlin-test-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@{HOST}/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


@contextmanager
def lowered_consumer_timeout(milliseconds: int, tick_milliseconds: int = 1000) -> Iterator[None]:
    """Set the node's ``consumer_timeout`` for channels opened meanwhile; restore it after.

    A channel checks the timeout on its tick (``channel_tick_interval``, a minute by
    default), which is lowered too, as RabbitMQ's own tests of the timeout do: a test
    then waits seconds past the timeout, not a minute.
    """
    values = {"consumer_timeout": milliseconds, "channel_tick_interval": tick_milliseconds}
    before = {key: rabbitmqctl("eval", f"application:get_env(rabbit, {key}).") for key in values}
    for key, value in values.items():
        rabbitmqctl("eval", f"application:set_env(rabbit, {key}, {value}).")
    try:
        yield
    finally:
        for key, found in before.items():
            if found.startswith("{ok,"):
                value = found.removeprefix("{ok,").removesuffix("}")
                rabbitmqctl("eval", f"application:set_env(rabbit, {key}, {value}).")
            else:
                rabbitmqctl("eval", f"application:unset_env(rabbit, {key}).")
