"""The source list (`MTRAG_SOURCES`): parsing, validation and materialising pip sdists.

Every error names the entry it is about, so a maintainer can fix the YAML without guessing."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mtrag_resources.core.errors import ConfigError
from mtrag_resources.core.models import SOURCE_KINDS

SOURCE_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
SDIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+$")
DEFAULT_MAX_FILE_BYTES = 2 * 1024 * 1024


class SourceConfigError(ConfigError):
    """The sources file is unusable; the message names the file and the entry."""


@dataclass(frozen=True)
class SourceSpec:
    id: str
    kind: str
    path: str | None = None
    pip_sdist: str | None = None
    include: tuple[str, ...] = ("**/*",)
    exclude: tuple[str, ...] = ()
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    repository: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def root(self, sdist_dir: Path, base_dir: Path) -> Path:
        """The directory this source is read from (sdists unpack on first use)."""
        if self.pip_sdist:
            return fetch_sdist(self.pip_sdist, sdist_dir)
        p = Path(self.path).expanduser()
        return (p if p.is_absolute() else base_dir / p).resolve()


def load_sources(path: Path) -> list[SourceSpec]:
    path = Path(path)
    if not path.exists():
        raise SourceConfigError(f"{path}: sources file not found (set MTRAG_SOURCES or create it)")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SourceConfigError(f"{path}: invalid YAML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise SourceConfigError(f"{path}: not UTF-8 text (byte {exc.start}): {exc.reason}") from exc
    except OSError as exc:
        raise SourceConfigError(f"{path}: cannot read the sources file: {exc.strerror or exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("sources"), list):
        raise SourceConfigError(f"{path}: expected a mapping with a 'sources' list")
    specs: list[SourceSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(doc["sources"]):
        spec = _parse_entry(path, i, entry)
        if spec.id in seen:
            raise SourceConfigError(f"{path}: sources[{i}] id={spec.id!r}: duplicate source id")
        seen.add(spec.id)
        specs.append(spec)
    return specs


def validate_roots(specs: list[SourceSpec], sources_file: Path) -> None:
    """Missing local paths are an error naming the entry (sdists are checked when fetched)."""
    base = Path(sources_file).resolve().parent
    for spec in specs:
        if spec.path is not None:
            root = spec.root(Path("/nonexistent"), base)
            if not root.is_dir():
                raise SourceConfigError(
                    f"{sources_file}: source id={spec.id!r}: path {spec.path!r} does not exist or is not a directory ({root})"
                )


def _parse_entry(path: Path, i: int, entry: object) -> SourceSpec:
    where = f"{path}: sources[{i}]"
    if not isinstance(entry, dict):
        raise SourceConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
    sid = entry.get("id")
    if not isinstance(sid, str) or not SOURCE_ID_RE.match(sid):
        raise SourceConfigError(f"{where}: id {sid!r} must match {SOURCE_ID_RE.pattern}")
    where = f"{path}: sources[{i}] id={sid!r}"
    kind = entry.get("kind")
    if kind not in SOURCE_KINDS:
        raise SourceConfigError(f"{where}: unknown kind {kind!r} (expected one of {', '.join(SOURCE_KINDS)})")
    has_path, has_sdist = "path" in entry, "pip_sdist" in entry
    if has_path == has_sdist:
        raise SourceConfigError(f"{where}: give exactly one of 'path' or 'pip_sdist'")
    sdist = entry.get("pip_sdist")
    if has_sdist and (not isinstance(sdist, str) or not SDIST_RE.match(sdist)):
        raise SourceConfigError(f"{where}: pip_sdist {sdist!r} must be a pinned requirement like 'click==8.5.1'")
    if has_path and not isinstance(entry["path"], str):
        raise SourceConfigError(f"{where}: path must be a string")
    globs = {}
    for key in ("include", "exclude"):
        value = entry.get(key, ["**/*"] if key == "include" else [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
            raise SourceConfigError(f"{where}: {key} must be a list of glob strings")
        globs[key] = tuple(value)
    max_bytes = entry.get("max_file_bytes", DEFAULT_MAX_FILE_BYTES)
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise SourceConfigError(f"{where}: max_file_bytes must be a positive integer")
    known = {"id", "kind", "path", "pip_sdist", "include", "exclude", "max_file_bytes", "repository"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise SourceConfigError(f"{where}: unknown keys {unknown}")
    return SourceSpec(id=sid, kind=kind, path=entry.get("path"), pip_sdist=sdist,
                      include=globs["include"], exclude=globs["exclude"], max_file_bytes=max_bytes,
                      repository=str(entry.get("repository", "")))


def fetch_sdist(requirement: str, sdist_dir: Path) -> Path:
    """Download and unpack a pinned sdist once; later calls return the unpacked folder."""
    name, version = requirement.split("==", 1)
    target = Path(sdist_dir) / f"{name}-{version}"
    if (target / ".mtrag-complete").exists():
        return target
    sdist_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=sdist_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--quiet", "-d", tmp, requirement]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            why = " ".join(proc.stderr.split())[-500:]  # one line: pip's own message, its tail
            raise SourceConfigError(f"pip_sdist {requirement!r}: pip download failed: {why}")
        archives = [p for p in Path(tmp).iterdir() if p.name.endswith((".tar.gz", ".tgz"))]
        if not archives:
            raise SourceConfigError(f"pip_sdist {requirement!r}: no .tar.gz sdist was downloaded")
        unpack = Path(tmp) / "unpacked"
        with tarfile.open(archives[0]) as tar:
            tar.extractall(unpack, filter="data")  # the 'data' filter refuses links and paths leaving the folder
        tops = list(unpack.iterdir())
        top = tops[0] if len(tops) == 1 and tops[0].is_dir() else unpack
        (top / ".mtrag-complete").write_text(requirement)
        if target.exists():
            shutil.rmtree(target)
        top.rename(target)
    return target
