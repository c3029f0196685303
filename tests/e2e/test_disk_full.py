"""A slice of the disk-full campaign (``python -m tests.chaos --disk-full``) for CI.

MERLIN_HOME, the jobs' repositories and the SQLite store and broker lie on a small
tmpfs that is filled to the last byte while jobs run, then freed. Every job completes
once space returns, resumed by the workers' sweeps; neither SQLite file nor any
repository is corrupt; the jobs that met the full disk were parked waiting for space,
never failed.
"""

from __future__ import annotations

import os

import pytest

from tests.chaos.__main__ import parse
from tests.chaos.disk_full import run_disk_full

pytestmark = pytest.mark.e2e


def test_jobs_complete_after_the_disk_was_full() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the disk-full campaign mounts a tmpfs: CI runs as root")
        pytest.skip("mounting a tmpfs needs root")
    args = parse(
        ["--disk-full", "--jobs", "6", "--steps", "2", "--backend", "sqlite", "--disk-mb",
         "200", "--fills", "1", "--full-seconds", "10", "--seed", "3", "--max-minutes", "4"]
    )  # fmt: skip
    report = run_disk_full("sqlite", args)
    assert report.findings.violations == [], report.diagnosis()
    assert report.integrity == []  # PRAGMA integrity_check and git fsck
    assert report.findings.completed == 6, report.diagnosis()
    assert len(report.fills) == 1
    # What met the full disk waited for space, and the sweeps resumed it: nobody did. A
    # step whose park (or lease) the database could not record, SQLite being on the full
    # disk too, was taken over by a sweep once space was back.
    assert report.parks_for_space + report.findings.losses >= 1
    assert report.parks == report.parks_for_space
    assert report.resumes == report.parks_for_space
    assert report.listed  # merlin list answered while the disk was full
