"""Reading a shell command as the simple commands it runs, for ``[permissions]`` rules.

``split_command("cd x && FOO=1 sudo git push 2>&1 | tee log")`` gives ``cd x``,
``git push`` and ``tee log``: compound commands are split (``&&``, ``||``, ``;``, ``|``,
``&``, newlines, subshells), substituted ones read (``$(...)``, backticks, ``<(...)``,
unquoted here-documents), ``VAR=value``, redirections and wrappers (``env``, ``command``,
``sudo``, ``nohup``, ``time``, ``timeout``, ``xargs``...) stripped, and the scripts of
``sh -c``/``bash -c``, ``eval`` and ``env -S`` read in turn, to a depth of 10. Words are
split with ``shlex``, so quotes are removed as the shell would.

This reads words, not what they mean at run time: variables (``$CMD``), functions,
aliases, scripts and other interpreters (``python -c``) are opaque. Each simple command
carries every reading a deny rule should be tried on (with and without its wrappers,
every word after a wrapper, a command named by path as its base name, ``find -exec``),
erring towards a match; allow rules see only what runs.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

MAX_DEPTH = 10
"""How deep scripts within scripts are read; deeper is an error (the check refuses)."""


@dataclass(frozen=True)
class SimpleCommand:
    """One command of a shell script, as rules see it."""

    words: tuple[str, ...]
    """What runs, without assignments, redirections and wrappers (allow rules see this)."""
    readings: tuple[tuple[str, ...], ...]
    """Every reading deny and ask rules are tried on: with its wrappers, without, ..."""
    script_runner: bool = False
    """A shell or ``eval`` running a script: allow rules judge the script's commands."""


def split_command(command: str) -> list[SimpleCommand]:
    """The simple commands ``command`` runs; ValueError when it cannot be read."""
    return _commands(command, 0)


def _commands(script: str, depth: int) -> list[SimpleCommand]:
    if depth > MAX_DEPTH:
        raise ValueError("commands nested too deeply to check")
    segments, inner = _segments(script)
    found: list[SimpleCommand] = []
    for segment in segments:
        try:
            words = shlex.split(segment)
        except ValueError as exc:
            raise ValueError(f"cannot split {segment.strip()!r}: {exc}") from None
        found += _unwrap(words, depth)
    for body in inner:
        found += _commands(body, depth + 1)
    return found


_OPERATORS = ("&&", "||", "|&", ";;", "&", "|", ";", "\n", "(", ")")
_PROCESS = ("<(", ">(")


def _segments(script: str) -> tuple[list[str], list[str]]:
    """The top-level segments of ``script`` and the scripts substituted inside it."""
    segments: list[str] = []
    inner: list[str] = []
    heredocs: list[tuple[str, bool]] = []
    chars: list[str] = []
    i, quote = 0, ""
    while i < len(script):
        c = script[i]
        if quote == "'" or (quote == '"' and c not in "\\`$"):
            quote = "" if c == quote else quote
            chars.append(c)
        elif c == "\\":
            chars.append("" if script.startswith("\\\n", i) else script[i : i + 2])
            i += 1
        elif script.startswith("$((", i):
            end = _closing(script, i + 1)
            chars.append(script[i : end + 1])
            i = end
        elif (
            c == "`" or script.startswith("$(", i) or (not quote and script[i : i + 2] in _PROCESS)
        ):
            end = _closing(script, i + 1) if c != "`" else script.find("`", i + 1)
            if end < 0:
                raise ValueError("unclosed `")
            inner.append(script[i + (1 if c == "`" else 2) : end])
            chars.append("$(...)")
            i = end
        elif quote or c in "'\"":
            quote = quote or c
            chars.append(c)
        elif c == "#" and (not chars or chars[-1][-1:].isspace()):
            i = len(script) if script.find("\n", i) < 0 else script.find("\n", i) - 1
        elif script.startswith("<<", i) and not script.startswith("<<<", i):
            i = _heredoc(script, i, chars, heredocs) - 1
        elif op := _operator(script, i, chars):
            segments.append("".join(chars))
            chars = []
            i += len(op) - 1
            if op == "\n":
                i = _heredoc_bodies(script, i + 1, heredocs, inner) - 1
                heredocs = []
        else:
            chars.append(c)
        i += 1
    if quote:
        raise ValueError(f"unclosed {quote}")
    return [s for s in [*segments, "".join(chars)] if s.strip()], inner


def _operator(script: str, i: int, chars: list[str]) -> str:
    previous = chars[-1][-1:] if chars else ""
    if script[i] == "&" and (previous in ("<", ">") or script.startswith("&>", i)):
        return ""  # >&2, 2>&1, &>file
    if script[i] == "|" and previous == ">":
        return ""  # >|file
    return next((op for op in _OPERATORS if script.startswith(op, i)), "")


def _closing(script: str, start: int) -> int:
    """The index of the parenthesis closing the one at ``start``."""
    depth, quote, i = 0, "", start
    while i < len(script):
        c = script[i]
        if c == "\\" and quote != "'":
            i += 1
        elif quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "()":
            depth += 1 if c == "(" else -1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unclosed $(")


def _heredoc(script: str, i: int, chars: list[str], heredocs: list[tuple[str, bool]]) -> int:
    """Note the here-document starting at ``i`` (read at the next newline); its end."""
    j = i + 2 + script.startswith("-", i + 2)
    while j < len(script) and script[j] in " \t":
        j += 1
    end = j
    while end < len(script) and not script[end].isspace() and script[end] not in ";|&<>()":
        end += 1
    delimiter = re.sub(r"[\\'\"]", "", script[j:end])
    heredocs.append((delimiter, delimiter == script[j:end]))  # unquoted: $(...) runs
    chars.append(script[i:end])
    return end


def _heredoc_bodies(script: str, i: int, heredocs: list[tuple[str, bool]], inner: list[str]) -> int:
    for delimiter, expands in heredocs:
        body = []
        while i < len(script):
            end = len(script) if script.find("\n", i) < 0 else script.find("\n", i)
            line, i = script[i:end], end + 1
            if line.lstrip("\t") == delimiter:
                break
            body.append(line)
        if expands:  # quotes are plain text in a body: scan it as if double-quoted
            text = "\n".join(body).replace("\\", "\\\\").replace('"', '\\"')
            inner += _segments(f'"{text}"')[1]
    return min(i, len(script))


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\[[^]]*\])?\+?=")
_REDIRECT = re.compile(r"^(?:\d+|&)?(?:>>?|<<?-?|<>|>&|<&|>\|)(.*)$", re.DOTALL)
_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until"})
_KEYWORDS |= {"!", "{", "}", "esac", "coproc"}
_HEADERS = frozenset({"for", "select", "case"})
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash"})
_WRAPPERS: dict[str, frozenset[str]] = {
    name: frozenset(options.split())
    for name, options in {
        "env": "-u --unset -C --chdir",
        "command": "",
        "busybox": "",
        "builtin": "",
        "exec": "-a",
        "nohup": "",
        "time": "-f --format -o --output",
        "sudo": "-u --user -g --group -h --host -p --prompt -C -D --chdir -r -t -U",
        "doas": "-u -C",
        "nice": "-n --adjustment",
        "ionice": "-c -n -p",
        "setsid": "",
        "stdbuf": "-i -o -e",
        "timeout": "-s --signal -k --kill-after",
        "xargs": "-I -n -P -L -d -s -E -a --max-args --max-procs --delimiter",
    }.items()
}
"""Commands that run the command after their options (options taking a value listed)."""


def _unwrap(words: list[str], depth: int) -> list[SimpleCommand]:
    words = _without_redirections(words)
    readings: list[tuple[str, ...]] = []
    i = start = 0
    while True:
        while i < len(words) and (_ASSIGNMENT.match(words[i]) or words[i] in _KEYWORDS):
            i += 1
        if i >= len(words) or words[i] in _HEADERS:
            if not readings:
                return []
            i = start  # a wrapper alone (`env`): it is what runs
            break
        if words[i] == "function":  # function NAME { ...
            i += 2
            continue
        name = posixpath.basename(words[i])
        script = _script(name, words[i + 1 :])
        if script is not None:
            outer = SimpleCommand(tuple(words[i:]), (*readings, tuple(words[i:])), True)
            return [outer, *_commands(script, depth + 1)]
        if name not in _WRAPPERS:
            break
        readings += [tuple(words[k:]) for k in range(i, len(words))]  # every start
        start, i = i, i + 1
        while i < len(words) and words[i].startswith("-") and words[i] != "-":
            option = words[i]
            i += 1
            if option == "--":
                break
            i += option in _WRAPPERS[name]
        i += name == "timeout"  # its duration
    run = tuple(words[i:])
    readings.append(run)
    if "/" in run[0]:
        readings.append((posixpath.basename(run[0]), *run[1:]))
    if posixpath.basename(run[0]) == "find":  # find -exec CMD ... ;
        readings += [run[k + 1 :] for k, w in enumerate(run) if w.startswith(("-exec", "-ok"))]
    return [SimpleCommand(run, tuple(dict.fromkeys(readings)))]


def _script(name: str, args: list[str]) -> str | None:
    """The script a shell (``-c``), ``eval`` or ``env -S`` runs, else None."""
    if name == "eval":
        return " ".join(args)
    if name == "env":
        split = next((k for k, a in enumerate(args) if a.startswith(("-S", "--split-string"))), -1)
        if split >= 0 and all(a.startswith("-") for a in args[:split]):
            first = args[split].partition("=")[2] if args[split][1] == "-" else args[split][2:]
            return " ".join([first, *args[split + 1 :]] if first else args[split + 1 :])
    if name not in _SHELLS:
        return None
    runs_c, k = False, 0
    while k < len(args) and args[k][:1] in ("-", "+") and args[k] != "--":
        runs_c |= args[k][:1] == "-" and not args[k].startswith("--") and "c" in args[k]
        k += 1 + (args[k] in ("-o", "+o", "--rcfile", "--init-file"))
    k += k < len(args) and args[k] == "--"
    return args[k] if runs_c and k < len(args) else None


def _without_redirections(words: list[str]) -> list[str]:
    kept, skip = [], False
    for word in words:
        match = None if skip else _REDIRECT.match(word)
        if not skip and match is None:
            kept.append(word)
        skip = match is not None and not match.group(1)
    return kept
