"""The suite's servers are its own: a developer's Redis and Postgres data stay untouched."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from tests.conftest import POSTGRES_ADMIN_URL


def test_redis_tests_use_a_server_the_suite_started(redis_url: str) -> None:
    if os.environ.get("MERLIN_TEST_REDIS_URL"):
        pytest.skip("MERLIN_TEST_REDIS_URL names the tests' server")
    client = redis.Redis.from_url(redis_url)
    try:
        folder = Path(client.config_get("dir")["dir"])
        persistence = client.config_get("save")["save"]
    finally:
        client.close()
    assert urlsplit(redis_url).port != 6379
    assert "pytest-of-" in str(folder)  # started in pytest's temporary folder
    assert persistence == ""  # and it writes nothing to disk


def test_postgres_tests_get_a_database_of_their_own(postgres_url: str) -> None:
    name = urlsplit(postgres_url).path.lstrip("/")
    assert name.startswith("merlin_test_")
    assert name != urlsplit(POSTGRES_ADMIN_URL).path.lstrip("/")
