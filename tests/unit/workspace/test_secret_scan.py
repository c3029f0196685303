"""The scan of an attempt's staged changes: the worker's secrets, key formats, the allowlist."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.errors import GitError
from merlin_flow.workspace.secret_scan import (
    FORMAT_DETECTORS,
    NEVER_WRITE,
    SecretHit,
    added_lines,
    hit_lines,
    scan_staged,
    secret_error,
)
from tests.conftest import git, make_repo

OPENAI = "sk-test-0123456789abcdefXYZ"
AWS = "AKIAIOSFODNN7EXAMPLE"
ENV = {"OPENAI_API_KEY": OPENAI, "PATH": "/usr/bin", "HOME": "/home/me"}
GITHUB = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5"


def _repo(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    return make_repo(tmp_path / "repo", files or {"app.py": "a = 1\nb = 2\nc = 3\n"})


def _scan(repo: Path, allow: tuple[str, ...] = (), env: dict[str, str] = ENV) -> list[str]:
    git(repo, "add", "-A")
    return [str(hit) for hit in scan_staged(repo, allow, env)]


def test_the_workers_secret_is_named_by_file_line_and_variable_never_by_value(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    (repo / "notes.txt").write_text(f"notes\n\nkey: {OPENAI}\n")
    (repo / "app.py").write_text(f"a = 1\nb = 2\nKEY = '{OPENAI}'\nc = 3\n")
    hits = _scan(repo)
    assert hits == [
        "app.py:3: the value of OPENAI_API_KEY",
        "notes.txt:3: the value of OPENAI_API_KEY",
    ]
    assert not any(OPENAI in hit for hit in hits)


def test_well_known_key_formats_are_found_by_their_detector(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "config.py").write_text(
        f'REGION = "eu"\nAWS_ID = "{AWS}"\nTOKEN = "{GITHUB}"\n'
        "KEY = '''-----BEGIN RSA PRIVATE KEY-----'''\n"
    )
    assert _scan(repo) == [
        "config.py:2: an AWS Access Key",
        "config.py:3: a GitHub Token",
        "config.py:4: a Private Key",
    ]


def test_ordinary_code_hashes_and_placeholders_are_not_secrets(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "code.py").write_text(
        'password = "hunter2hunter2"\n'  # a keyword rule would flag it
        'DATABASE_URL = "postgresql://postgres:postgres@localhost:5432/test"\n'
        'CHECKSUM = "3f786850e387550fdab836ed7e6dc881de23001b8c4f5e1e2a47b3b7a1f2c9d0"\n'
        'ID = "1f0e3dad-9990-4b12-8c3a-1d2b3c4d5e6f"\n'
        'TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.'
        'dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"\n'
        'api_key = os.environ["OPENAI_API_KEY"]\n'
    )
    (repo / "uv.lock").write_text(
        'sdist = { hash = "sha256:0cda5a2a7f6a43f0dde2b4d2d3e41b7d8c79f3a0d0b1c9a1f0e3dad9990" }\n'
        'integrity = "sha512-Lk3YcPkjh3Yn7c2c1cJUMbk4Wh6W0pOG5RQpsxDK2C6eGpQkB6aFpE8Lq0tGX9Q=="\n'
    )
    assert _scan(repo) == []


def test_only_added_lines_count_not_removed_kept_or_moved_ones(tmp_path: Path) -> None:
    repo = _repo(
        tmp_path,
        {
            "keep.py": f'A = "{AWS}"\nB = 1\n',
            "drop.py": f'A = "{AWS}"\n',
            "move.py": f'A = "{AWS}"\n' + "".join(f"x{n} = {n}\n" for n in range(20)),
        },
    )
    (repo / "keep.py").write_text(f'A = "{AWS}"\nB = 2\n')
    (repo / "drop.py").unlink()
    git(repo, "mv", "move.py", "moved.py")
    assert _scan(repo) == []
    (repo / "keep.py").write_text(f'A = "{AWS}"\nB = 2\nC = "{AWS}"\n')
    assert _scan(repo) == ["keep.py:3: an AWS Access Key"]


def test_a_change_that_adds_no_file_is_not_diffed_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from merlin_flow.workspace import secret_scan

    repo = _repo(tmp_path, {"app.py": "a = 1\n", "old.py": f'A = "{AWS}"\n'})
    asked: list[tuple[str, ...]] = []
    real = secret_scan._git
    monkeypatch.setattr(
        secret_scan, "_git", lambda wt, *args, **kw: asked.append(args) or real(wt, *args, **kw)
    )
    assert _scan(repo) == []  # nothing staged
    (repo / "old.py").unlink()
    assert _scan(repo) == []  # a deletion only
    assert [args[:3] for args in asked] == [("diff", "--cached", "--name-only")] * 2
    (repo / "app.py").write_text(f'a = 1\nB = "{AWS}"\n')
    assert _scan(repo) == ["app.py:2: an AWS Access Key"]
    assert [args[2] for args in asked[2:]] == ["--name-only", "-U0"]


def test_the_allowlist_skips_key_formats_but_never_the_workers_secrets(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    fixtures = repo / "tests" / "fixtures"
    fixtures.mkdir(parents=True)
    (fixtures / "aws.json").write_text(f'{{"id": "{AWS}"}}\n')
    (fixtures / "env.txt").write_text(f"OPENAI_API_KEY={OPENAI}\n")
    (repo / "aws.json").write_text(f'{{"id": "{AWS}"}}\n')
    assert _scan(repo, ("tests/fixtures/**",)) == [
        "aws.json:1: an AWS Access Key",
        "tests/fixtures/env.txt:1: the value of OPENAI_API_KEY",
    ]
    everything = _scan(repo, ())
    assert "tests/fixtures/aws.json:1: an AWS Access Key" in everything


def test_an_inline_pragma_does_not_exempt_a_line(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "x.py").write_text(f'A = "{AWS}"  # pragma: allowlist secret\n')
    assert _scan(repo) == ["x.py:1: an AWS Access Key"]


def test_url_credentials_binary_files_and_file_names_are_covered(tmp_path: Path) -> None:
    env = {**ENV, "MERLIN_DATABASE_URL": "postgresql://merlin:pa55w0rd-xyz@db:5432/merlin"}
    repo = _repo(tmp_path)
    (repo / "blob.bin").write_bytes(b"\x00\xff\xfe" + OPENAI.encode() + b"\x00\x01")
    (repo / "conn.txt").write_text("password pa55w0rd-xyz\n")
    (repo / f"{OPENAI}.txt").write_text("hello\n")
    hits = _scan(repo, env=env)
    assert hits == [
        "[REDACTED].txt: the value of OPENAI_API_KEY, in the file's name",
        "blob.bin:1: the value of OPENAI_API_KEY",
        "conn.txt:1: a credential in the URL of MERLIN_DATABASE_URL",
    ]
    assert not any(OPENAI in hit or "pa55w0rd" in hit for hit in hits)


def test_a_secret_of_several_lines_is_found_by_each_of_its_lines(tmp_path: Path) -> None:
    body = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"
    pem = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----\n"
    repo = _repo(tmp_path)
    (repo / "k.txt").write_text(f"start\n{body}\n")
    assert _scan(repo, ("k.txt",), {"DEPLOY_KEY": pem}) == ["k.txt:2: the value of DEPLOY_KEY"]


def test_paths_git_quotes_and_lines_that_look_like_headers_are_read(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "with space.txt").write_text(f"{AWS}\n")
    (repo / "tab\there.txt").write_text(f"ok\n{AWS}\n")
    (repo / "caf\u00e9.txt").write_text(f"{AWS}\n")
    (repo / "plus.txt").write_text(f"++ {AWS}\n--- b/x\n+++ b/other\n{AWS}\n")
    assert _scan(repo) == [
        "caf\u00e9.txt:1: an AWS Access Key",
        "plus.txt:1: an AWS Access Key",
        "plus.txt:4: an AWS Access Key",
        "tab\there.txt:2: an AWS Access Key",
        "with space.txt:1: an AWS Access Key",
    ]


def test_added_lines_numbers_each_hunk_from_its_header() -> None:
    patch = (
        b"diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -2,0 +3,2 @@\n+x\n+y\n"
        b"@@ -9 +11 @@\n-old\n+new\n\\ No newline at end of file\n"
        b"diff --git a/g b/g\ndeleted file mode 100644\n--- a/g\n+++ /dev/null\n@@ -1 +0,0 @@\n-g\n"
    )
    assert list(added_lines(patch)) == [("f", 3, b"x"), ("f", 4, b"y"), ("f", 11, b"new")]


def test_a_git_failure_is_a_git_error(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(GitError, match="failed in"):
        scan_staged(tmp_path / "plain", [], ENV)


def test_the_error_lists_the_hits_and_tells_the_model_never_to_write_credentials() -> None:
    hits = [SecretHit(f"f{n}.py", n, "an AWS Access Key") for n in range(1, 24)]
    error = secret_error(hits)
    assert "none of its changes were committed" in error
    assert "\n  f1.py:1: an AWS Access Key" in error
    assert "f20.py:20" in error
    assert "f21.py" not in error
    assert "... and 3 more" in error
    assert error.endswith(NEVER_WRITE)
    assert hit_lines(hits[:2]) == ["f1.py:1: an AWS Access Key", "f2.py:2: an AWS Access Key"]


def test_every_detector_named_is_a_format_plugin_of_detect_secrets() -> None:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    plugins = {cls.__name__: cls for cls in get_mapping_from_secret_type_to_class().values()}
    assert [name for name in FORMAT_DETECTORS if name not in plugins] == []
    assert all(issubclass(plugins[name], RegexBasedDetector) for name in FORMAT_DETECTORS)
    left_out = {"KeywordDetector", "Base64HighEntropyString", "HexHighEntropyString"}
    assert left_out <= set(plugins) - set(FORMAT_DETECTORS)
