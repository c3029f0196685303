"""The ranking index: updated file by file, and a personalised PageRank over it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from merlin_flow.workspace.repo_files import SourceFile
from merlin_flow.workspace.repo_rank import RepoIndex
from merlin_flow.workspace.repo_tags import Definition, FileTags


def tags(defines: list[str], uses: dict[str, int]) -> FileTags:
    return FileTags(
        tuple(Definition(n, "function", i, f"def {n}():") for i, n in enumerate(defines)), uses
    )


REPO = {
    "core.py": tags(["Engine", "run_engine"], {"Engine": 1}),
    "cli.py": tags(["main"], {"Engine": 2, "run_engine": 1}),
    "web.py": tags(["serve"], {"Engine": 1, "run_engine": 3}),
    "jobs.py": tags(["schedule"], {"run_engine": 1, "serve": 1}),
    "lonely.py": tags(["alone"], {}),
}


def source(path: str, version: int = 0) -> SourceFile:
    return SourceFile(path, f"{abs(hash((path, version))):040d}"[:40], "python")


def build(
    files: dict[str, FileTags],
    start: RepoIndex | None = None,
    versions: dict[str, int] | None = None,
) -> tuple[RepoIndex, list[str]]:
    asked: list[str] = []
    listing = [source(path, (versions or {}).get(path, 0)) for path in files]
    by_blob = {file.blob: files[file.path] for file in listing}

    def tags_of(missing: list[SourceFile]) -> dict[tuple[str, str], FileTags]:
        asked.extend(file.path for file in missing)
        return {(file.blob, file.kind): by_blob[file.blob] for file in missing}

    return (start or RepoIndex.empty()).updated(listing, tags_of), asked


def ordered(
    index: RepoIndex, personal: dict[int, float], **kwargs: Callable[..., object]
) -> list[str]:
    ranking = index.rank(personal)
    return [index.paths[n] for n in ranking.order()]


def test_the_file_everything_uses_ranks_first_without_focus() -> None:
    index, _asked = build(REPO)
    order = ordered(index, {})
    assert order[0] == "core.py"
    assert order.index("web.py") < order.index("lonely.py")
    ranking = index.rank({})
    assert ranking.scores.sum() == pytest.approx(1.0)


def test_a_focus_brings_its_file_and_its_neighbours_first() -> None:
    index, _asked = build(REPO)
    jobs = index.paths.index("jobs.py")
    order = ordered(index, {jobs: 1.0})
    assert order[0] == "jobs.py"
    assert order[1] in ("web.py", "core.py")  # what jobs.py uses
    assert order[-1] == "lonely.py"


def test_definitions_are_scored_by_the_rank_that_flows_into_them() -> None:
    index, _asked = build(REPO)
    scores = index.rank({}).definition_scores([index.paths.index("core.py")])
    core = scores[index.paths.index("core.py")]
    assert set(core) == {"Engine", "run_engine"}
    assert core["run_engine"] > 0
    assert core["Engine"] > 0


def test_demoted_files_keep_a_share_of_their_rank() -> None:
    index, _asked = build(REPO)
    core = index.paths.index("core.py")
    plain = index.rank({}).scores[core]
    assert index.rank({}, demoted=[core]).scores[core] == pytest.approx(plain * 0.3)


def test_an_update_asks_only_for_changed_files_and_keeps_the_rest() -> None:
    index, asked = build(REPO)
    assert sorted(asked) == sorted(REPO)
    same, asked = build(REPO, index)
    assert same is index
    assert asked == []
    changed = {**REPO, "jobs.py": tags(["schedule", "retry"], {"Engine": 5})}
    del changed["lonely.py"]
    updated, asked = build(changed, index, versions={"jobs.py": 1})
    assert asked == ["jobs.py"]
    assert updated.paths == ["core.py", "cli.py", "web.py", "jobs.py"]
    fresh, _asked = build(changed, versions={"jobs.py": 1})
    assert ordered(updated, {}) == ordered(fresh, {})
    jobs = updated.paths.index("jobs.py")
    assert {updated.words[w] for w in updated.def_word[updated.def_file == jobs]} == {
        "schedule",
        "retry",
    }


def test_compaction_drops_words_no_file_holds() -> None:
    index, _asked = build(REPO)
    smaller, _asked = build({"core.py": REPO["core.py"]}, index)
    compact = smaller.compacted()
    assert set(compact.words) == {"Engine", "run_engine"}
    assert ordered(compact, {}) == ordered(smaller, {})


def test_an_empty_index_ranks_nothing() -> None:
    assert RepoIndex.empty().rank({}).order() == []
