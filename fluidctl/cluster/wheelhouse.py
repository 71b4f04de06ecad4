"""The wheelhouse ``fluidctl cluster setup`` builds on this machine, once, for every node.

It holds fluidctl itself (built from this checkout with ``pip wheel --no-deps``, with build
isolation as pip builds for users; or, for an installation from a wheel, packed from the
installed files themselves: "fluidctl" is never fetched by name from an index, where anyone
could publish that name), the user's requirements and, unless ``no_deps``, everything
they depend on (``pip wheel``, so sdists are built here and nodes need no compiler and no
index). ``fluidctl-wheelhouse.json`` beside the wheels records a key of what it was built from
(fluidctl's sources, the requirements file, the options) and every wheel's sha256: a second
build with the same key is a no-op, and nodes compare those hashes to decide what to receive.

No SSH here: pushing and installing on the nodes is ``fluidctl.cluster.setup``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from fluidctl import __version__, envs
from fluidctl.errors import FluidctlError, UsageError
from fluidctl.digest import file_digest

MANIFEST = "fluidctl-wheelhouse.json"
SOURCE_FILES = ("setup.cfg", "setup.py", "pyproject.toml", "MANIFEST.in")


@dataclass
class Wheel:
    file: str            # file name in the wheelhouse
    sha256: str
    size: int
    project: str         # canonical project name (from the file name)
    version: str


@dataclass
class Wheelhouse:
    path: Path
    key: str
    wheels: List[Wheel]
    # canonical requirement name -> the modules `python -c "import ..."` checks on a node
    imports: Dict[str, List[str]] = field(default_factory=dict)
    built: bool = False                  # False: reused as it was

    def wheel(self, project: str) -> Optional[Wheel]:
        return next((w for w in self.wheels if w.project == project), None)

    @property
    def bytes(self) -> int:
        return sum(w.size for w in self.wheels)

    def to_json(self) -> dict:
        return {"key": self.key, "imports": self.imports,
                "wheels": [w.__dict__ for w in self.wheels]}


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(file: str):
    """(canonical project, version) from a wheel file name."""
    parts = file[:-len(".whl")].split("-")
    return canonical(parts[0]), parts[1]


def source_root() -> Optional[Path]:
    """The checkout fluidctl runs from (editable or source tree), None for a wheel install."""
    import fluidctl
    root = Path(fluidctl.__file__).resolve().parent.parent
    return root if any((root / name).is_file() for name in SOURCE_FILES) else None


def _source_files(root: Path) -> List[Path]:
    """Every file a wheel of the checkout is built from: the build's own files, README.md
    (setup.cfg's long_description), bin/ (its scripts) and the package, without bytecode or
    a built native module (the wheel is pure)."""
    files = [root / n for n in (*SOURCE_FILES, "README.md") if (root / n).is_file()]
    for top in ("bin", "fluidctl"):
        for dirpath, dirs, names in os.walk(root / top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(dirpath) / n for n in sorted(names)
                      if not n.endswith((".pyc", ".so"))]
    return files


def _source_copy(root: Path, dest: Path) -> Path:
    """The checkout's build files copied to ``dest``: pip builds a source tree in place
    (setuptools writes build/ and fluidctl.egg-info into it), so a build in the checkout
    itself raced any other build or ``pip install -e`` of it (ENOENT mid-build) and left
    those directories in the user's tree."""
    for path in _source_files(root):
        target = dest / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return dest


def _source_digest(root: Path) -> str:
    """Content of every file a wheel of the checkout is built from."""
    digest = hashlib.sha256()
    for path in _source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def requirement_names(requirements: Optional[Path]) -> List[str]:
    """Canonical names of the requirements a file lists (options and includes skipped)."""
    if requirements is None:
        return []
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:                                   # pragma: no cover - pip vendors it
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    names = []
    for number, raw in enumerate(requirements.read_text().splitlines(), 1):
        line = raw.split(" #")[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            names.append(canonical(Requirement(line).name))
        except InvalidRequirement as exc:
            raise UsageError(f"requirements file {requirements} line {number}: {exc}",
                             "write one requirement per line, e.g. 'numpy==1.26.4'") from None
    return names


def import_names(wheel: Path) -> List[str]:
    """The top-level modules a wheel installs (top_level.txt, else its RECORD's top entries)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        if top:
            found = [m.strip() for m in zf.read(top[0]).decode().splitlines() if m.strip()]
        else:
            found = []
            for name in names:
                parts = name.split("/")
                if parts[0].endswith((".dist-info", ".data")):
                    continue
                if len(parts) == 1 and name.endswith(".py"):
                    module = name[:-3]
                elif len(parts) == 2 and parts[1] == "__init__.py":
                    module = parts[0]
                else:
                    continue
                if module not in found:
                    found.append(module)
    return [m for m in found if m.isidentifier() and not m.startswith("_")]


def _pip(args: List[str], what: str, env: Optional[Dict[str, str]] = None) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check"],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise FluidctlError(f"{what} failed here: {pip_error(proc.stderr + proc.stdout)}",
                            "fix the requirement or the network, then run setup again",
                            exit_code=1)


_PIP_SUMMARY = re.compile(r"(?i)error: [a-z]+(-[a-z]+)+|ERROR: (Failed building wheel|Could not "
                          r"build wheels|Failed to build).*")
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception): .+")


def pip_error(output: str) -> str:
    """The cause in pip's output: the last error line of what failed (a build backend's
    ``error: invalid command 'bdist_wheel'``, an exception), not pip's summary after it
    (``error: metadata-generation-failed``, ``hint: See above for details.``); else pip's own
    last 'ERROR:' line, else the last line it printed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    lines = [line.lstrip("│║ ").strip() for line in lines]
    causes = [line for line in lines if line.lower().startswith("error:")
              and not _PIP_SUMMARY.fullmatch(line)]
    if causes:
        return causes[-1]
    raised = [line for line in lines if _EXCEPTION.fullmatch(line)]
    if raised:
        return raised[-1]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors[-1] if errors else lines[-1] if lines else "no output")


def pack_installed(dest: Path) -> Path:
    """A wheel of the installed fluidctl made from the files its installation recorded
    (RECORD), written to ``dest``; for installations without a checkout to build from."""
    import sysconfig
    from importlib import metadata
    try:
        dist = metadata.distribution("fluidctl")
    except metadata.PackageNotFoundError:
        dist = None
    files = list(dist.files or []) if dist is not None else []
    if not files:
        raise UsageError("this fluidctl is neither a checkout nor an installation that lists "
                         "its files, so no wheel of it can be made for the nodes",
                         "run cluster setup from a fluidctl checkout, or install fluidctl "
                         "with pip from a wheel or a source tree")
    version = dist.version
    info = f"fluidctl-{version}.dist-info"
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    entry_scripts = {ep.name for ep in dist.entry_points if ep.group == "console_scripts"}
    wheel = dest / f"fluidctl-{version}-py3-none-any.whl"
    record = []

    def add(zf, arcname: str, data: bytes, mode: int = 0o644) -> None:
        member = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
        member.external_attr = (0o100000 | mode) << 16           # scripts keep their x bit
        member.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(member, data)
        digest = hashlib.sha256(data).digest()
        import base64
        record.append(f"{arcname},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},"
                      f"{len(data)}")

    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in files:
            rel = str(file).replace(os.sep, "/")
            if rel.endswith((".pyc", ".so")) or "/__pycache__/" in f"/{rel}":
                continue                # a compiled module is this Python's: the wheel is pure
            path = Path(file.locate()).resolve()
            top = rel.split("/")[0]
            if top.endswith(".dist-info"):
                name = rel.split("/", 1)[1]
                if name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "WHEEL"):
                    continue
                arcname = f"{info}/{name}"
            elif top == "..":
                if path.parent != scripts or path.name in entry_scripts:
                    continue            # pip writes console_scripts wrappers itself
                arcname = f"fluidctl-{version}.data/scripts/{path.name}"
            else:
                arcname = rel
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise UsageError(f"the installed fluidctl is incomplete: {path}: "
                                 f"{exc.strerror or exc}", "reinstall fluidctl") from None
            if arcname.startswith(f"fluidctl-{version}.data/scripts/") and data.startswith(b"#!"):
                first, _, rest = data.partition(b"\n")
                if b"python" in first:
                    data = b"#!python\n" + rest       # pip writes each node's interpreter
            add(zf, arcname, data, path.stat().st_mode & 0o755)
        add(zf, f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: fluidctl\n"
                                 b"Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    return wheel


def build_key(requirements: Optional[Path], no_deps: bool) -> str:
    root = source_root()
    parts = {
        "fluidctl": _source_digest(root) if root else __version__,
        "requirements": requirements.read_text() if requirements else "",
        "no_deps": no_deps,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def load(path: Path) -> Optional[Wheelhouse]:
    """The wheelhouse at ``path`` if it is complete (every wheel there, of its recorded size)."""
    try:
        record = json.loads((path / MANIFEST).read_text())
        wheels = [Wheel(**w) for w in record["wheels"]]
        for w in wheels:
            if (path / w.file).stat().st_size != w.size:
                return None
        return Wheelhouse(path, record["key"], wheels, record.get("imports", {}))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build(path: Path, requirements: Optional[Path] = None, no_deps: bool = False,
          echo=None) -> Wheelhouse:
    """Build (or reuse) the wheelhouse in ``path``. The new one is made beside it and renamed
    into place, so an interrupted build leaves the old one whole."""
    if requirements is not None and not requirements.is_file():
        raise UsageError(f"requirements file {requirements} not found",
                         "pass --requirements with an existing file")
    names = requirement_names(requirements)
    key = build_key(requirements, no_deps)
    existing = load(path)
    if existing is not None and existing.key == key:
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        root = source_root()
        if echo:
            echo(f"building the wheelhouse in {path}")
        if root:            # with build isolation: a fresh venv's setuptools has no bdist_wheel
            # pure: without the native module (nodes may run other Pythons; they use the
            # Python path of same-node collectives)
            src = _source_copy(root, tmp.parent / f".{path.name}.src-{os.getpid()}")
            try:
                _pip(["wheel", "-q", "--no-deps", "-w", str(tmp), str(src)],
                     f"pip wheel of {root}", env={**os.environ, envs.PURE_WHEEL: "1"})
            finally:
                shutil.rmtree(src, ignore_errors=True)
        else:
            pack_installed(tmp)
        own = sorted(tmp.glob("fluidctl-*.whl"))
        more = [] if no_deps else [str(own[0])]
        if requirements is not None:
            more += ["-r", str(requirements)]
        if more:
            _pip(["wheel", "-q", *(["--no-deps"] if no_deps else []), "-w", str(tmp), *more],
                 "pip wheel of the requirements")
        wheels = []
        for file in sorted(tmp.glob("*.whl")):
            project, version = wheel_name(file.name)
            wheels.append(Wheel(file.name, file_digest(str(file), "sha256"),
                                file.stat().st_size, project, version))
        house = Wheelhouse(path, key, wheels, built=True)
        for name in names:
            wheel = house.wheel(name)
            if wheel is None:
                raise FluidctlError(f"requirement {name} has no wheel in the wheelhouse",
                                    "check the requirements file", exit_code=1)
            house.imports[name] = import_names(tmp / wheel.file)
        (tmp / MANIFEST).write_text(json.dumps(house.to_json(), indent=1))
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
        return house
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
