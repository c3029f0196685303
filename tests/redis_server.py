"""A Redis server of the tests' own: a developer's Redis is never touched.

``MERLIN_TEST_REDIS_URL`` names a server given to the tests alone (its databases 1-15
are flushed). Without it, the tests start ``redis-server`` on a free port, in a
temporary folder, with nothing saved to disk, and stop it at the end.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

GIVEN_URL = os.environ.get("MERLIN_TEST_REDIS_URL")


class NoRedisServer(RuntimeError):
    """Neither MERLIN_TEST_REDIS_URL nor a redis-server binary to start."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def own_redis_server(folder: Path) -> Iterator[str]:
    """The base URL (no database number) of a Redis server for the tests only."""
    if GIVEN_URL:
        yield GIVEN_URL.rstrip("/")
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise NoRedisServer(
            "redis-server is not installed (apt-get install redis-server), and "
            "MERLIN_TEST_REDIS_URL names no server for the tests"
        )
    port = _free_port()
    folder.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise NoRedisServer(f"redis-server did not start on port {port}") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)
