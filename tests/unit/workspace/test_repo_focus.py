"""A step's words and files as a personalisation of the ranking."""

from __future__ import annotations

from merlin_flow.workspace.repo_files import SourceFile
from merlin_flow.workspace.repo_focus import focus, stem
from merlin_flow.workspace.repo_rank import RepoIndex
from merlin_flow.workspace.repo_tags import Definition, FileTags


def index_of(files: dict[str, tuple[list[str], dict[str, int]]]) -> RepoIndex:
    listing = [SourceFile(path, f"{n:040d}", "python") for n, path in enumerate(files)]
    made = {
        file.blob: FileTags(
            tuple(Definition(name, "function", 0, name) for name in files[file.path][0]),
            files[file.path][1],
        )
        for file in listing
    }
    return RepoIndex.empty().updated(
        listing, lambda missing: {(f.blob, f.kind): made[f.blob] for f in missing}
    )


INDEX = index_of(
    {
        "src/printing/latex.py": (["LatexPrinter", "latex"], {"Printer": 2, "escape": 4}),
        "src/printing/printer.py": (["Printer"], {"Printer": 1}),
        "src/core/merge.py": (["merge_options"], {"options": 3}),
        "src/core/ky.py": (["Ky"], {"beforeError": 2, "merge_options": 1}),
        "src/util.py": (["helper", "latex"], {"Safari": 1, "helper": 9}),
    }
)


def files_of(personal: dict[int, float]) -> list[str]:
    return [INDEX.paths[n] for n in sorted(personal, key=lambda n: -personal[n])]


def test_stems_meet_across_endings() -> None:
    assert stem("merging") == stem("merge") == stem("merged")
    assert stem("printer") == stem("printing") == stem("prints")
    assert stem("Path_URL") == "pathurl"
    assert stem("go") == "go"


def test_paths_and_their_endings_name_files() -> None:
    personal, _boosted = focus(INDEX, ["src/core/merge.py"], ["see latex.py and nothing.py"])
    assert set(files_of(personal)[:2]) == {"src/core/merge.py", "src/printing/latex.py"}


def test_a_defined_name_weighs_on_its_definers_and_is_boosted() -> None:
    personal, boosted = focus(INDEX, [], ["LatexPrinter drops the escape"])
    assert files_of(personal)[0] == "src/printing/latex.py"
    assert {INDEX.words[w] for w in boosted} == {"LatexPrinter"}


def test_a_name_shared_by_files_is_split_among_them() -> None:
    personal, _boosted = focus(INDEX, [], ["latex"])
    latex, util = INDEX.paths.index("src/printing/latex.py"), INDEX.paths.index("src/util.py")
    assert personal[latex] > personal[util] > 0  # latex.py is also named latex


def test_a_code_like_name_weighs_on_the_files_using_it() -> None:
    personal, boosted = focus(INDEX, [], ["ignore what `beforeError` returns"])
    assert files_of(personal)[0] == "src/core/ky.py"
    assert boosted == set()


def test_a_word_is_the_name_of_files_after_stemming() -> None:
    personal, _boosted = focus(INDEX, [], ["merging twice drops keys"])
    assert files_of(personal)[0] == "src/core/merge.py"


def test_a_rare_word_of_a_file_text_counts() -> None:
    personal, _boosted = focus(INDEX, [], ["errors from Safari"])
    assert files_of(personal) == ["src/util.py"]


def test_no_focus_is_no_personalisation() -> None:
    assert focus(INDEX, [], []) == ({}, set())
    assert focus(INDEX, ["missing.py"], ["zz"]) == ({}, set())
