"""ReplayReport: the verdict, and the reasons given when a replay does not reproduce."""

from __future__ import annotations

from merlin_flow.replay import ReplayReport, StepComparison


def _report(replay_path: str, same_tree: bool, resumes: int = 0) -> ReplayReport:
    step = StepComparison("s0", "execute@local, escalate@premium", replay_path, "a", "b", same_tree)
    status = "completed" if replay_path.endswith("premium") else "failed"
    return ReplayReport("j1", "j2", "completed", status, [step], 3, 3, resumes)


def test_a_reproduction_has_no_differences() -> None:
    report = _report("execute@local, escalate@premium", same_tree=True)
    assert report.reproduced
    assert report.differences == []
    assert report.to_json()["differences"] == []


def test_each_difference_is_named() -> None:
    report = _report("execute@local", same_tree=False, resumes=1)
    assert not report.reproduced
    assert report.differences == [
        "the original completed, the replay failed",
        "step s0: the original's attempts were execute@local, escalate@premium, "
        "the replay's execute@local",
        "the original was resumed 1 time(s) (merlin resume): the replay runs in one go, "
        "without the failure, the wait or the tier chosen at resume",
    ]
    other_files = _report("execute@local, escalate@premium", same_tree=False)
    assert other_files.differences == ["step s0: same attempts, but they ended on other files"]
