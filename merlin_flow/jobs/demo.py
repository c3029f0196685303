"""``merlin demo``: a throwaway repository with a real bug, and a job that fixes it.

The bundled example (``examples/demo``) is a small Python project whose ``mean()``
truncates. The TaskList has three steps; the models are scripted: the cheap tier's
first fix and its repair both fail pytest, so the step escalates to the premium tier,
which passes. The other two steps pass on the cheap tier; on workers
(``merlin demo --submit``) they run side by side, and the second to pass is merged onto
the first. The scripts answer every attempt the engine may ask for (a catch-all rule
finishes any other), so no call is left unanswered.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from merlin_flow.config import MerlinConfig, load_config
from merlin_flow.resources import resource_dir
from merlin_flow.tasklist import TaskList, load_tasklist
from merlin_flow.workspace.git import git


def demo_dir() -> Path:
    """The bundled demo: project, TaskList, config and scripts."""
    return resource_dir("examples") / "demo"


def make_demo_repository(target: Path) -> Path:
    """Copy the demo project to ``target`` and commit it as a fresh git repository."""
    shutil.copytree(demo_dir() / "project", target)
    git("init", "-q", "-b", "main", cwd=target)
    git("add", "-A", cwd=target)
    git("commit", "-q", "-m", "calc: mean() and its tests", cwd=target)
    return target


def prepare_demo() -> tuple[Path, TaskList, MerlinConfig]:
    """A new demo repository, the demo TaskList and the demo's scripted configuration."""
    repo = make_demo_repository(Path(tempfile.mkdtemp(prefix="merlin-demo-")) / "calc")
    tasklist = load_tasklist(demo_dir() / "tasklist.yaml")
    config = load_config(repo, demo_dir() / "merlin.toml")
    return repo, tasklist, config
