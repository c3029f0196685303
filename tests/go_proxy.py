"""A Go module proxy for the tests: Debian's golang-*-dev sources, served on 127.0.0.1.

proxy.golang.org is out of reach here, and in the sandbox nothing is reachable but what
setup is given: this proxy serves modules built from the sources Debian installs under
``/usr/share/gocode/src``, in the layout of the GOPROXY protocol
(https://go.dev/ref/mod#goproxy-protocol): ``<module>/@v/list``, ``<version>.info``,
``<version>.mod`` and ``<version>.zip`` (https://go.dev/ref/mod#zip-files).

The module's version is the Debian package's upstream version (0.5.9-1 gives v0.5.9).
Its content is Debian's, which may differ from the upstream release: a go.sum made
against this proxy holds its own hashes, so the checksum database must be off
(``GOSUMDB=off``, or the module in ``GONOSUMDB``).

    with go_proxy({"github.com/google/go-cmp": "golang-github-google-go-cmp-dev"}) as proxy:
        env["GOPROXY"] = proxy.url
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
import subprocess
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GOCODE = Path("/usr/share/gocode/src")
"""Where Debian's golang-*-dev packages install their sources."""
VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr"})
TIME = "2022-09-26T00:00:00Z"


class NoModuleSource(Exception):
    """A module's Debian package (or its source folder) is not installed."""


@dataclass(frozen=True)
class GoProxy:
    """A running proxy: its URL (for GOPROXY), its folder, and the modules it serves."""

    url: str
    root: Path
    versions: Mapping[str, str] = field(default_factory=dict)
    """Module path → the version served (``v0.5.9``)."""


def debian_version(package: str) -> str:
    """The Go version of a Debian package's upstream release: 0.5.9-1 gives v0.5.9."""
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise NoModuleSource(f"the Debian package {package} is not installed")
    upstream = proc.stdout.strip().split(":", 1)[-1].rsplit("-", 1)[0]
    match = re.match(r"\d+\.\d+\.\d+", upstream)
    if match is None:
        raise NoModuleSource(f"{package} {proc.stdout.strip()} is no semantic version")
    return f"v{match.group(0)}"


def escape_path(module: str) -> str:
    """The module path as the proxy protocol spells it (capitals as ``!`` + lower case)."""
    return re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), module)


def module_files(source: Path) -> list[Path]:
    """The files of the module at ``source`` that its zip holds, sorted.

    Left out, as ``go mod download`` leaves them out: version-control folders, vendor
    folders, nested modules (a folder with its own go.mod) and whatever is no regular file.
    """
    files: list[Path] = []

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            if entry.is_dir():
                if entry.name in VCS_DIRS or entry.name == "vendor":
                    continue
                if (entry / "go.mod").is_file():
                    continue  # a module of its own
                walk(entry)
            elif entry.is_file():
                files.append(entry)

    walk(source)
    return files


def add_module(root: Path, module: str, version: str, source: Path) -> None:
    """Write ``module`` at ``version`` from the source folder ``source`` into ``root``."""
    if not (source / "go.mod").is_file():
        raise NoModuleSource(f"{source} has no go.mod")
    folder = root / escape_path(module) / "@v"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "list").write_text(f"{version}\n")
    (folder / f"{version}.info").write_text(json.dumps({"Version": version, "Time": TIME}))
    shutil.copyfile(source / "go.mod", folder / f"{version}.mod")
    prefix = f"{module}@{version}/"
    with zipfile.ZipFile(folder / f"{version}.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for path in module_files(source):
            # Files are read (symlinks followed): a module zip holds no links.
            archive.writestr(prefix + path.relative_to(source).as_posix(), path.read_bytes())


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request log lines."""


@contextlib.contextmanager
def go_proxy(packages: Mapping[str, str], gocode: Path = GOCODE) -> Iterator[GoProxy]:
    """Serve the modules ``packages`` names (module path → Debian package) over HTTP.

    Raises NoModuleSource when one of the packages is not installed.
    """
    with tempfile.TemporaryDirectory(prefix="goproxy-") as tmp:
        root = Path(tmp)
        versions = {}
        for module, package in packages.items():
            version = debian_version(package)
            source = gocode / module
            if not source.is_dir():
                raise NoModuleSource(f"{package} has no sources at {source}")
            add_module(root, module, version, source)
            versions[module] = version
        handler = functools.partial(_QuietHandler, directory=str(root))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, name="go-proxy", daemon=True)
        thread.start()
        try:
            yield GoProxy(f"http://127.0.0.1:{server.server_address[1]}", root, versions)
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
