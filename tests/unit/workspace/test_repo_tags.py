"""The tags of one file: tree-sitter definitions, identifier references, skipped files."""

from __future__ import annotations

import pytest

from merlin_flow.workspace import repo_tags
from merlin_flow.workspace.repo_tags import Definition, FileTags, extract_all, extract_tags

SAMPLES = {
    "python": (
        b"import os\nLIMIT = 3\n\nclass Engine(Base):\n    @property\n    def speed(self):\n"
        b"        return helper(self)\n\ndef helper(value):\n    return os.path.join(value)\n",
        {("LIMIT", "constant"), ("Engine", "class"), ("speed", "function"), ("helper", "function")},
    ),
    "javascript": (
        b"class Engine extends Base {\n  speed() { return helper(this) }\n}\n"
        b"function helper(value) { return value }\nconst arrow = (x) => x\n"
        b"app.listen = function listen() {}\n",
        {("Engine", "class"), ("speed", "method"), ("helper", "function")}
        | {("arrow", "function"), ("listen", "function")},
    ),
    "typescript": (
        b"interface Options { retry: number }\ntype Hook = () => void\nenum Mode { A }\n"
        b"export class Engine implements Options {\n  retry = 1\n"
        b"  speed(): number { return helper(this.retry) }\n}\n"
        b"export function helper(value: number): number { return value }\n",
        {("Options", "interface"), ("Hook", "type"), ("Mode", "enum"), ("Engine", "class")}
        | {("speed", "method"), ("helper", "function")},
    ),
    "tsx": (
        b"export function App(): JSX.Element { return helper(<div/>) }\n"
        b"const Item = () => <li/>\nfunction helper(node: JSX.Element) { return node }\n",
        {("App", "function"), ("Item", "function"), ("helper", "function")},
    ),
    "go": (
        b'package engine\n\nimport "fmt"\n\nconst Limit = 3\n\ntype Engine struct{ speed int }\n'
        b"\nfunc (e *Engine) Speed() int { return helper(e.speed) }\n\n"
        b"func helper(v int) int { fmt.Println(v); return v }\n",
        {("Limit", "constant"), ("Engine", "type"), ("Speed", "method"), ("helper", "function")},
    ),
    "rust": (
        b"pub struct Engine { speed: i32 }\npub trait Fast { fn go(&self); }\n"
        b"impl Fast for Engine {\n    fn go(&self) { helper(self.speed); }\n}\n"
        b"fn helper(v: i32) -> i32 { v }\nmacro_rules! twice { () => {} }\n",
        {("Engine", "class"), ("Fast", "interface"), ("go", "function"), ("Engine", "impl")}
        | {("helper", "function"), ("twice", "macro")},
    ),
}


@pytest.mark.parametrize("language", sorted(SAMPLES))
def test_each_language_gives_its_definitions_and_references(language: str) -> None:
    data, expected = SAMPLES[language]
    tags = extract_tags(data, language)
    assert tags.skipped == ""
    assert {(d.name, d.kind) for d in tags.definitions} >= expected
    assert tags.references["helper"] >= 2  # defined once and used once
    assert all(len(word) > 1 for word in tags.references)
    keywords = {"return", "def", "function", "func", "fn", "class", "impl", "const"}
    assert not keywords & set(tags.references)


def test_a_definition_keeps_its_line_and_the_definition_around_it() -> None:
    tags = extract_tags(SAMPLES["python"][0], "python")
    by_name = {d.name: d for d in tags.definitions}
    speed = by_name["speed"]
    assert speed.line == 5
    assert speed.text == "    def speed(self):"
    assert tags.definitions[speed.parent].name == "Engine"
    assert by_name["helper"].parent == -1


def test_a_test_file_is_tagged_by_its_references_alone() -> None:
    tags = extract_tags(SAMPLES["python"][0], "python:refs")
    assert tags.definitions == ()
    assert tags.references["Engine"] == 1


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\x01\x02binary" * 10, "binary"),
        (b"x = 1\n" * 200_000, "huge"),
        (b"var a=1;" * 1000, "minified"),
    ],
)
def test_binary_huge_and_minified_files_are_skipped(data: bytes, reason: str) -> None:
    assert extract_tags(data, "javascript") == FileTags(skipped=reason)


def test_a_file_that_does_not_parse_gives_what_it_can_without_failing() -> None:
    data = b"def ok():\n    pass\n\nclass (((:\n    def \xff\xfe broken(\n"
    tags = extract_tags(data, "python")
    assert [d.name for d in tags.definitions][:1] == ["ok"]


def test_a_parser_that_fails_marks_the_file_unparsable(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(data: bytes, language: str) -> tuple[Definition, ...]:
        raise ValueError("the parser gave up")

    monkeypatch.setattr(repo_tags, "_definitions", refuse)
    assert extract_tags(b"def f(): pass\n", "python") == FileTags(skipped="unparsable")


def test_tags_read_back_as_they_were_written() -> None:
    tags = extract_tags(SAMPLES["rust"][0], "rust")
    encoded = tags.encode()
    assert FileTags.decode(encoded) == tags
    assert FileTags.decode(encoded, references=False).references == {}
    assert FileTags.decode(FileTags(skipped="binary").encode()) == FileTags(skipped="binary")


def test_spawned_workers_give_what_this_process_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repo_tags, "PARALLEL_BYTES", 0)
    work = [(data, language) for language, (data, _expected) in sorted(SAMPLES.items())] * 3
    here = extract_all(work, workers=1)
    shared = extract_all(work, workers=2)
    assert [tags for tags, _encoded in shared] == [tags for tags, _encoded in here]
    assert [encoded for _tags, encoded in shared] == [encoded for _tags, encoded in here]


def test_a_pool_that_cannot_start_leaves_the_work_to_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_children(*args: object) -> object:
        raise AssertionError("daemonic processes are not allowed to have children")

    monkeypatch.setattr(repo_tags, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(repo_tags, "_share", no_children)
    work = [(SAMPLES["go"][0], "go")] * 2
    assert extract_all(work, workers=2) == extract_all(work, workers=1)
