"""The toolchains step commands run with: found where users install them, and mounted.

The sandbox hides the user's home, so a Rust, Node or Go toolchain installed there is
out of a command's reach unless its folders are bound read-only at their own paths and
put on PATH. ``find_toolchain`` finds a kind's main program (``cargo``, ``node``,
``go``; Python is the environment's business) and says what the sandbox needs for it.
It looks, in order:

1. on the worker's PATH (``shutil.which``); a hit inside one of the places below is
   mounted as that place says, any other as "system PATH";
2. Rust: ``$CARGO_HOME/bin`` (``~/.cargo/bin``) or the folder of ``rustup``: rustup's
   proxies, which need ``$RUSTUP_HOME`` (``~/.rustup``) and ``RUSTUP_HOME`` set (the
   worker's ``RUSTUP_TOOLCHAIN`` and ``RUSTUP_AUTO_INSTALL`` are passed on);
   Node: nvm (``$NVM_BIN``, then the newest ``$NVM_DIR/versions/node/*/bin``), fnm
   (``$FNM_DIR``, ``~/.local/share/fnm``, ``~/.fnm``: the newest
   ``node-versions/*/installation/bin``), volta (``$VOLTA_HOME/bin``, ``~/.volta``);
   Go: ``$GOROOT/bin``, ``/usr/local/go/bin``, ``~/go/bin``, the newest ``~/sdk/go*/bin``;
3. every kind: asdf's shims (``$ASDF_DATA_DIR``, ``~/.asdf``) and mise's
   (``$MISE_DATA_DIR``, ``~/.local/share/mise``), when the program's shim exists.

A program is mounted with its folder, the folder its symlink leads to and, for a plain
install, its install root (``bin``'s parent: nvm's ``npm`` is a symlink into
``../lib``). Nothing under ``/usr`` (or ``/bin``, ``/lib*``, ``/etc``) is bound: the
sandbox has it. No variable but the tool's own is set: not ``CARGO_HOME`` (the
environment sets its own), not ``GOROOT`` (go finds it from its own path).

Safety: a folder is never bound when it is ``/``, the home folder or a folder holding
it; a catch-all of the home (``~/.config``, ``~/.local``, ``~/.local/share``,
``~/.cache``); the cargo home (``~/.cargo`` holds ``credentials.toml``: only its
``bin`` is bound); named like a secret (``.ssh``, ``.aws``, ``credentials``,
``token``...); or when it directly holds a file named like one (``credentials.toml``,
``.netrc``, ``.npmrc``, ``id_rsa``, ``*.pem``...). A place that would need such a folder
is passed over; an install root that is one is left out.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from merlin_flow.workspace.exit_commands import ProjectKind
from merlin_flow.workspace.sandbox import SYSTEM_PATH

PROGRAMS: dict[ProjectKind, tuple[str, ...]] = {
    ProjectKind.RUST: ("cargo", "rustc"),
    ProjectKind.NODE: ("node", "npm", "npx", "pnpm", "yarn"),
    ProjectKind.GO: ("go", "gofmt"),
}
"""The programs of each kind's toolchain, its main program first."""
VERSION_COMMANDS: dict[ProjectKind, tuple[str, ...]] = {
    ProjectKind.RUST: ("cargo", "--version"),
    ProjectKind.NODE: ("node", "--version"),
    ProjectKind.GO: ("go", "version"),
}
"""A command that runs each kind's toolchain and prints its version (``merlin doctor``)."""
SEARCHED: dict[ProjectKind, str] = {
    ProjectKind.RUST: "PATH, $CARGO_HOME/bin or ~/.cargo/bin (rustup, with ~/.rustup)",
    ProjectKind.NODE: "PATH, nvm (~/.nvm), fnm (~/.local/share/fnm, ~/.fnm), volta (~/.volta)",
    ProjectKind.GO: "PATH, $GOROOT/bin, /usr/local/go/bin, ~/go/bin, ~/sdk/go*/bin",
}
"""Where ``find_toolchain`` looks for each kind, as users are told (asdf and mise too)."""
SYSTEM_ROOTS = tuple(
    Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
)
"""Host folders the sandbox binds already."""
SECRET_NAME = re.compile(
    r"credential|secret|token|passw|^\.(ssh|gnupg|aws|azure|docker|kube|password-store)$", re.I
)
"""A folder whose name (or that of a folder above it, up to the home) matches is never bound."""
SECRET_FILE = re.compile(
    r"^(\.?credentials(\.\w+)?|\.git-credentials|\.netrc|\.npmrc|\.pypirc|\.env"
    r"|id_(rsa|dsa|ecdsa|ed25519))$|\.(pem|key)$",
    re.I,
)
"""A folder directly holding a file whose name matches is never bound."""


@dataclass(frozen=True)
class Toolchain:
    """A kind's toolchain as found on the host, and what the sandbox needs to run it."""

    kind: ProjectKind
    program: Path
    """The host path of the kind's main program as found (not resolved)."""
    source: str
    """How it was found: "system PATH", "rustup (~/.cargo, ~/.rustup)", "nvm"..."""
    path: tuple[str, ...] = ()
    """Folders put first on the command's PATH (host paths, bound at the same path)."""
    read_only: tuple[Path, ...] = ()
    """Host folders bound read-only at their own paths (never under /usr, never the home)."""
    variables: Mapping[str, str] = field(default_factory=dict)
    """Variables the commands need (``RUSTUP_HOME``, ``VOLTA_HOME``...)."""


@dataclass(frozen=True)
class _Place:
    """An install location of a kind: where to look, and how a program there is mounted."""

    source: str
    roots: tuple[Path, ...] = ()
    """A program inside one of these (or leading into one) belongs to this place."""
    folders: tuple[Path, ...] = ()
    """The folders to look in for the program, in order."""
    binds: tuple[Path, ...] = ()
    """Folders bound besides the program's own; the place is passed over without them."""
    variables: Mapping[str, str] = field(default_factory=dict)
    extra_path: tuple[str, ...] = ()
    install_root: bool = True
    """Bind the install root (the parent of the resolved program's ``bin``)."""


def find_toolchain(
    kind: ProjectKind, home: Path | None = None, environ: Mapping[str, str] | None = None
) -> Toolchain | None:
    """The kind's toolchain as the worker's user installed it, or None when none is found.

    ``home`` and ``environ`` default to the worker's; see the module doc for the order.
    """
    if kind not in PROGRAMS:
        return None
    home = Path.home() if home is None else home
    env = os.environ if environ is None else environ
    name = PROGRAMS[kind][0]
    places = [p for p in _places(kind, home, env) if all(b.is_dir() for b in p.binds)]
    holders = {home / ".config", home / ".local", home / ".local" / "share", home / ".cache"}
    holders.add(_var(env, "CARGO_HOME") or home / ".cargo")
    candidates = [(place, folder / name) for place in places for folder in place.folders]
    hit = shutil.which(name, path=env.get("PATH", ""))
    if hit:  # first; mounted as the place it lies in says
        program = Path(hit).absolute()
        place = next((p for p in places if _belongs(program, p)), _Place("system PATH"))
        candidates.insert(0, (place, program))
    for place, program in candidates:
        if program.is_file() and os.access(program, os.X_OK):
            found = _mount(kind, place, program, home, holders)
            if found is not None:
                return found
    return None


def toolchain_mounts(
    toolchains: Iterable[Toolchain],
) -> tuple[tuple[str, ...], tuple[Path, ...], dict[str, str]]:
    """(path, read_only, variables) of several toolchains merged, without duplicates.

    A folder inside another bound folder is left out: it is seen through its parent.
    """
    path: list[str] = []
    read_only: list[Path] = []
    variables: dict[str, str] = {}
    for toolchain in toolchains:
        path += [p for p in toolchain.path if p not in path]
        read_only += [f for f in toolchain.read_only if f not in read_only]
        variables.update(toolchain.variables)
    return tuple(path), _outermost(read_only), variables


def _places(kind: ProjectKind, home: Path, env: Mapping[str, str]) -> list[_Place]:
    """The kind's install locations after PATH, in the order they are tried."""
    places: list[_Place] = []
    if kind is ProjectKind.RUST:
        cargo_bin = (_var(env, "CARGO_HOME") or home / ".cargo") / "bin"
        rustup = shutil.which("rustup", path=env.get("PATH", ""))
        bins = _unique([cargo_bin, *([Path(rustup).absolute().parent] if rustup else [])])
        rustup_home = _var(env, "RUSTUP_HOME") or home / ".rustup"
        chosen = {n: env[n] for n in ("RUSTUP_TOOLCHAIN", "RUSTUP_AUTO_INSTALL") if env.get(n)}
        variables = {"RUSTUP_HOME": str(rustup_home), **chosen}
        source = f"rustup ({cargo_bin.parent}, {rustup_home})".replace(f"{home}/", "~/")
        places.append(_Place(source, bins, bins, (rustup_home,), variables, install_root=False))
    elif kind is ProjectKind.NODE:
        nvm = _var(env, "NVM_DIR") or home / ".nvm"
        nvm_bin = [Path(env["NVM_BIN"])] if env.get("NVM_BIN") else []
        newest = _newest(nvm / "versions" / "node", "*/bin")
        places.append(_Place("nvm", (nvm, *nvm_bin), (*nvm_bin, *newest)))
        data = _var(env, "XDG_DATA_HOME") or home / ".local" / "share"
        fnm = _unique([_var(env, "FNM_DIR") or data / "fnm", data / "fnm", home / ".fnm"])
        found = [f for d in fnm for f in _newest(d / "node-versions", "*/installation/bin")]
        places.append(_Place("fnm", tuple(fnm), tuple(found)))
        volta = _var(env, "VOLTA_HOME") or home / ".volta"
        variables = {"VOLTA_HOME": str(volta)}
        places.append(_Place("volta", (volta,), (volta / "bin",), (volta,), variables))
    elif kind is ProjectKind.GO:
        goroot = _var(env, "GOROOT")
        roots = [("GOROOT", goroot)] if goroot else []
        for source, root in [
            *roots,
            ("/usr/local/go", Path("/usr/local/go")),
            ("~/go", home / "go"),
        ]:
            places.append(_Place(source, (root,), (root / "bin",)))
        places.append(_Place("~/sdk", (home / "sdk",), _newest(home / "sdk", "go*/bin")))
    return places + _shim_places(home, env)


def _shim_places(home: Path, env: Mapping[str, str]) -> list[_Place]:
    """The shims of asdf and mise: the tool's own data folder bound, its variables set."""
    asdf_data = _var(env, "ASDF_DATA_DIR") or home / ".asdf"
    asdf_dir = _var(env, "ASDF_DIR") or home / ".asdf"
    asdf_binds = _unique([asdf_data, *([asdf_dir] if asdf_dir.is_dir() else [])])
    asdf_vars = {"ASDF_DATA_DIR": str(asdf_data)}
    if asdf_dir.is_dir():
        asdf_vars["ASDF_DIR"] = str(asdf_dir)
    asdf = shutil.which("asdf", path=env.get("PATH", ""))  # newer shims run `asdf exec`
    asdf_bin = Path(asdf).absolute().parent if asdf else asdf_dir / "bin"
    asdf_path = (str(asdf_bin),) if asdf_bin.is_dir() and not _system(asdf_bin) else ()
    data = _var(env, "XDG_DATA_HOME") or home / ".local" / "share"
    mise = _var(env, "MISE_DATA_DIR") or data / "mise"
    asdf_place = _Place("asdf", (asdf_data,), (asdf_data / "shims",), asdf_binds, asdf_vars)
    mise_vars = {"MISE_DATA_DIR": str(mise)}
    return [
        replace(asdf_place, extra_path=asdf_path, install_root=False),
        _Place("mise", (mise,), (mise / "shims",), (mise,), mise_vars, install_root=False),
    ]


def _mount(
    kind: ProjectKind, place: _Place, program: Path, home: Path, holders: set[Path]
) -> Toolchain | None:
    """``program`` found in ``place``, with its mounts; None when one would be unsafe."""
    folder = program.parent
    target = program.resolve().parent
    root = [target.parent] if place.install_root and target.name == "bin" else []
    read_only: list[Path] = []
    for candidate in [folder, target, *place.binds, *root]:
        if _system(candidate) or candidate in read_only:
            continue
        if not _bindable(candidate, home, holders):
            if candidate in root:
                continue  # the install root is a nicety: without it, the program may run
            return None
        read_only.append(candidate)
    path = [] if str(folder) in SYSTEM_PATH.split(":") else [str(folder)]
    for extra in (Path(p) for p in place.extra_path):  # asdf itself: left out if unsafe
        if str(extra) not in path and _bindable(extra, home, holders):
            path.append(str(extra))
            read_only.append(extra)
    return Toolchain(
        kind, program, place.source, tuple(path), _outermost(read_only), dict(place.variables)
    )


def _bindable(folder: Path, home: Path, holders: set[Path]) -> bool:
    """False for a folder the sandbox must never see (module doc, "Safety")."""
    for path in {folder, folder.resolve()}:
        for own in {home, home.resolve()}:
            if own.is_relative_to(path):  # the home, a folder holding it, or /
                return False
            parts = path.relative_to(own).parts if path.is_relative_to(own) else (path.name,)
            if any(SECRET_NAME.search(part) for part in parts):
                return False
        if path in holders or any(path == h.resolve() for h in holders):
            return False
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return False
    return not any(SECRET_FILE.search(name) for name in names)


def _belongs(program: Path, place: _Place) -> bool:
    """True when ``program`` (or the file it leads to) lies inside one of place's roots."""
    target = program.resolve()
    return any(program.is_relative_to(r) or target.is_relative_to(r.resolve()) for r in place.roots)


def _system(folder: Path) -> bool:
    """True for a folder the sandbox binds anyway (``/usr``, ``/bin``, ``/lib*``, ``/etc``)."""
    return any(folder.is_relative_to(root) for root in SYSTEM_ROOTS)


def _outermost(folders: Iterable[Path]) -> tuple[Path, ...]:
    """``folders`` less those inside another of them (they are bound at their own paths)."""
    kept = _unique(list(folders))
    return tuple(f for f in kept if not any(f != o and f.is_relative_to(o) for o in kept))


def _newest(parent: Path, pattern: str) -> tuple[Path, ...]:
    """The folders under ``parent`` matching ``pattern``, the highest version first."""

    def version(folder: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", folder.relative_to(parent).as_posix()))

    if not parent.is_dir():
        return ()
    return tuple(sorted((f for f in parent.glob(pattern) if f.is_dir()), key=version, reverse=True))


def _var(env: Mapping[str, str], name: str) -> Path | None:
    """The folder the variable ``name`` names (made absolute), or None when it is unset."""
    return Path(env[name]).absolute() if env.get(name) else None


def _unique(paths: list[Path]) -> tuple[Path, ...]:
    """``paths`` without repeats, in order."""
    return tuple(dict.fromkeys(paths))
