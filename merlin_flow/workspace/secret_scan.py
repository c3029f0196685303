"""Secrets kept out of an attempt's commit: its staged changes scanned before it is made.

Every line an attempt adds (``git diff --cached -U0 --text`` after ``git add -A``) is
looked at twice (and every file name for the first):

- for the worker's own secrets (``merlin_flow.store.redaction.secret_values``: the
  values of its secret-looking variables and the credentials of URLs in any variable),
  in every file and in file names, with no exception;
- for well-known key formats, with detect-secrets' format-specific plugins
  (:data:`FORMAT_DETECTORS`), except in the paths ``[secrets] allow`` names.

A hit names the file, the line and the variable or the format; never the value.
``merlin_flow.workspace.staging`` then discards every change of the attempt, so its
commit is empty: nothing the attempt wrote reaches the branch, the patch, a pull request
or the repository's object store (the change is scanned in a quarantine).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from merlin_flow.errors import GitError
from merlin_flow.store.redaction import REDACTED, secret_values, url_credentials
from merlin_flow.tool_config import is_secret_name, path_glob
from merlin_flow.workspace.git_command import run_git_process

FORMAT_DETECTORS = (
    "ArtifactoryDetector",
    "AWSKeyDetector",
    "AzureStorageKeyDetector",
    "CloudantDetector",
    "DiscordBotTokenDetector",
    "GitHubTokenDetector",
    "GitLabTokenDetector",
    "MailchimpDetector",
    "NpmDetector",
    "OpenAIDetector",
    "PrivateKeyDetector",
    "PypiTokenDetector",
    "SendGridDetector",
    "SlackDetector",
    "SoftlayerDetector",
    "SquareOAuthDetector",
    "StripeDetector",
    "TelegramBotTokenDetector",
    "TwilioKeyDetector",
)
"""The detect-secrets (1.5) plugins used: each knows one vendor's key format (a prefix, a
length, an alphabet, or the vendor's name beside it). Left out, because ordinary code and
data set them off: the entropy plugins (lock-file hashes), `KeywordDetector` (any
`password = ...`), `IbmCloudIamDetector` and `IbmCosHmacDetector` (any `key = ` or
`secret_key = ` with a long value: keyword rules in effect), `BasicAuthDetector` (the
placeholder `postgresql://user:password@localhost` of tests and docs; the worker's own
URL credentials are found by value), `JwtTokenDetector` (sample and public tokens, such
as front-end keys, are JWTs) and `IPPublicDetector` (an address is no secret)."""

FILTERS = (
    "detect_secrets.filters.heuristic.is_sequential_string",
    "detect_secrets.filters.heuristic.is_potential_uuid",
    "detect_secrets.filters.heuristic.is_templated_secret",
)
"""detect-secrets' filters that are kept: obvious non-secrets (`ABCDEF...`, a UUID,
`<key>`). Not its inline `pragma: allowlist secret` (a model could write it: the
allowlist is `[secrets] allow`), nor any verification (no key is ever sent anywhere)."""

NEVER_WRITE = (
    "Never write credentials (API keys, tokens, passwords, private keys) into files, "
    "not even in tests or examples: code reads them from the environment at run time, "
    "and examples use obvious placeholders such as `YOUR_API_KEY`."
)

_DETECT_SECRETS = threading.Lock()
"""detect-secrets keeps its settings in one global: one scan at a time per process."""
_HUNK = re.compile(rb"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_ESCAPE = re.compile(rb'\\([0-7]{3}|[abtnvfr"\\])')
_C_ESCAPES = {b"a": 7, b"b": 8, b"t": 9, b"n": 10, b"v": 11, b"f": 12, b"r": 13}
_PLAIN = (
    *("--no-color", "--no-ext-diff", "--no-textconv", "--find-renames", "--no-relative"),
    *("--src-prefix=a/", "--dst-prefix=b/"),
)
"""A diff as git prints it whatever a user's configuration (prefixes, drivers); a moved
file's lines are not added ones, only the lines its move changed."""


@dataclass(frozen=True)
class SecretHit:
    """A secret in an attempt's changes: where, and what it is (never its value)."""

    path: str
    line: int
    """The added line's number in the new file; 0 when the secret is in the file's name."""
    what: str
    """``the value of OPENAI_API_KEY``, ``an AWS Access Key``..."""

    def __str__(self) -> str:
        """``notes.txt:3: the value of OPENAI_API_KEY``."""
        if self.line == 0:
            return f"{self.path}: {self.what}, in the file's name"
        return f"{self.path}:{self.line}: {self.what}"


def scan_staged(
    worktree: Path,
    allow: Sequence[str],
    environ: Mapping[str, str] | None = None,
    base: str = "HEAD",
    env: Mapping[str, str] | None = None,
) -> list[SecretHit]:
    """The secrets in the changes staged in ``worktree`` since ``base``: names, then lines.

    ``allow``: path globs (``[secrets] allow``) whose lines are not scanned for key
    formats. ``environ`` (default ``os.environ``) holds the worker's secrets, which are
    looked for everywhere. ``env``: git's variables for the index and objects to read (a
    quarantine's, ``merlin_flow.workspace.staging``).
    """
    own = _own_secrets(environ)
    args = ("diff", "--cached", "--name-only", "-z", *_PLAIN, "--diff-filter=d", base)
    names = _git(worktree, *args, env=env)
    hits = [
        SecretHit(_redacted(name.decode("utf-8", "replace"), own), 0, what)
        for name in names.split(b"\0")
        for what in _values_in(name, own)
    ]
    if not names.strip(b"\0"):  # nothing added, changed or renamed: no line was added
        return hits
    args = ("diff", "--cached", "-U0", "--text", *_PLAIN, "--submodule=short", base)
    patch = _git(worktree, *args, env=env)
    globs = [path_glob(pattern) for pattern in allow]
    allowed: dict[str, bool] = {}
    found: list[tuple[int, SecretHit]] = []
    to_scan: list[tuple[int, str, int, str]] = []
    for index, (path, number, line) in enumerate(added_lines(patch)):
        found += [(index, SecretHit(path, number, what)) for what in _values_in(line, own)]
        if path not in allowed:
            allowed[path] = any(glob.matches_path(path) for glob in globs)
        if not allowed[path]:
            to_scan.append((index, path, number, line.decode("utf-8", "replace")))
    found += _formats_in(to_scan)
    return hits + [hit for _, hit in sorted(found, key=lambda item: item[0])]


def added_lines(patch: bytes) -> Iterator[tuple[str, int, bytes]]:
    """The lines a ``-U0`` patch adds: (path, line number in the new file, content)."""
    path: str | None = None
    number, in_header = 0, False
    for raw in patch.split(b"\n"):
        if raw.startswith(b"diff --git "):
            path, in_header = None, True
        elif in_header and raw.startswith(b"+++ "):
            target = raw[4:].removesuffix(b"\t")  # git adds a tab after a name with a space
            name = _unquote(target) if target.startswith(b'"') else target
            path = None if target == b"/dev/null" else name[2:].decode("utf-8", "replace")
        elif hunk := _HUNK.match(raw):
            number, in_header = int(hunk[1]), False
        elif not in_header and path is not None and raw.startswith(b"+"):
            yield path, number, raw[1:]
            number += 1


SECRETS_REFUSED = "the attempt wrote secrets into files, so none of its changes were committed"
"""How the error of an attempt whose changes were discarded for secrets begins."""


def secret_error(hits: Sequence[SecretHit]) -> str:
    """The attempt's error: where the secrets were, that nothing was kept, and the rule."""
    where = "".join(f"\n  {line}" for line in hit_lines(hits))
    return (
        f"{SECRETS_REFUSED} (the working tree went back to where the attempt started):"
        f"{where}\n{NEVER_WRITE}"
    )


def hit_lines(hits: Sequence[SecretHit], most: int = 20) -> list[str]:
    """The hits as the events and the error name them: the first ``most``, then a count."""
    more = [f"... and {len(hits) - most} more"] if len(hits) > most else []
    return [str(hit) for hit in hits[:most]] + more


def _own_secrets(environ: Mapping[str, str] | None) -> list[tuple[bytes, str]]:
    """The worker's secrets as bytes, longest first, each with what a hit calls it.

    A value of several lines (a PEM key) is looked for line by line: its lines of 16
    characters or more without a space (not its ``-----BEGIN`` armor).
    """
    env = os.environ if environ is None else environ
    found: list[tuple[bytes, str]] = []
    for value in secret_values(env):
        name = next(
            (n for n in sorted(env) if is_secret_name(n) and value in (env[n], env[n].strip())),
            None,
        )
        if name is not None:
            what = f"the value of {name}"
        else:
            name = next((n for n in sorted(env) if value in url_credentials(env[n])), "?")
            what = f"a credential in the URL of {name}"
        lines = [line.strip() for line in value.splitlines()]
        if len(lines) > 1:
            parts = [p for p in lines if len(p) >= 16 and not p.startswith("-----")]
            found += [(part.encode(), what) for part in parts if not re.search(r"\s", part)]
        else:
            found.append((value.encode(), what))
    return sorted(found, key=lambda item: -len(item[0]))


def _values_in(line: bytes, own: list[tuple[bytes, str]]) -> list[str]:
    found: list[str] = []
    for value, what in own:
        if value in line and what not in found:
            found.append(what)
    return found


def _redacted(path: str, own: list[tuple[bytes, str]]) -> str:
    for value, _ in own:
        path = path.replace(value.decode("utf-8", "replace"), REDACTED)
    return path


def _formats_in(lines: list[tuple[int, str, int, str]]) -> list[tuple[int, SecretHit]]:
    """Key formats in ``lines`` (index, path, number, text), by detect-secrets' plugins."""
    if not lines:
        return []
    # Imported here: 47 ms that `merlin status` (which reads this module's constants
    # through engine.feedback) must not pay.
    from detect_secrets.core.scan import scan_line
    from detect_secrets.settings import transient_settings

    hits: list[tuple[int, SecretHit]] = []
    settings = {
        "plugins_used": [{"name": name} for name in FORMAT_DETECTORS],
        "filters_used": [{"path": path} for path in FILTERS],
    }
    with _DETECT_SECRETS, transient_settings(settings):
        for index, path, number, text in lines:
            kinds = sorted({secret.type for secret in scan_line(text)})
            hits += [(index, SecretHit(path, number, _with_article(kind))) for kind in kinds]
    return hits


def _with_article(kind: str) -> str:
    """``an AWS Access Key``, ``a Slack Token``; a plural (``NPM tokens``) as it is."""
    if kind.endswith("s"):
        return kind
    return ("an " if kind[0] in "AEIOU" else "a ") + kind


def _unquote(quoted: bytes) -> bytes:
    """A path git quoted C-style (its escapes and octal bytes decoded), as its bytes."""

    def one(match: re.Match[bytes]) -> bytes:
        code = match[1]
        if len(code) == 3:
            return bytes([int(code, 8)])
        return bytes([_C_ESCAPES[code]]) if code in _C_ESCAPES else code

    return _ESCAPE.sub(one, quoted[1:-1])


def _git(worktree: Path, *args: str, env: Mapping[str, str] | None = None) -> bytes:
    """Run git in ``worktree`` as merlin's git runs (``git_command``); its stdout.

    Bytes, not text: a changed file need not be UTF-8.
    """
    proc = run_git_process(args, worktree, env, text=False)
    if proc.returncode != 0:
        error = proc.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"git {' '.join(args)} failed in {worktree}: {error}")
    return proc.stdout
