"""The source list (`MTRAG_SOURCES`): parsing, validation and materialising pip sdists.

Every error names the entry it is about, so a maintainer can fix the YAML without guessing. A
source's origin is one of `path` (a folder), `pip_sdist` (a pinned sdist) or `git` + `ref` (a local
repository at the commit a branch, tag or sha names; ingest/git_source.py). A malformed file or
entry refuses the whole file (a key given twice in one mapping and a top-level key other than
`sources` too: YAML would keep the last value unseen; YAML aliases that expand past
MAX_ALIAS_EXPANSION characters, an alias bomb's gigabytes); what is wrong with an entry's origin (a
`path` folder that does not exist; `path` and `git` both given, no `ref`; later: not a repository,
a ref that does not exist) is that source's error alone (`SourceSpec.error`,
`snapshot.source_problem`): the other sources still build. An issues source (`kind: issues`) reads
one export file, `path: FILE` (ingest/issues.py); a missing, unreadable or malformed export is
likewise that source's error alone."""
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
from mtrag_resources.core.real_paths import resolved_name
from mtrag_resources.core.session import session_cache
from mtrag_resources.ingest.chunking.limits import DEFAULT_MAX_FILE_CHUNKS, DEFAULT_MAX_ISSUES

SOURCE_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
SDIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+$")
DEFAULT_MAX_FILE_BYTES = 2 * 1024 * 1024


class SourceConfigError(ConfigError):
    """The sources file is unusable; the message names the file and the entry."""


TOP_LEVEL_KEYS = ("sources",)


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _AliasBomb(yaml.composer.ComposerError):
    pass


# What aliases may repeat in one document, in characters of the scalars they stand for (a
# collection counts 1): sharing a few glob lists stays far below it, while an alias bomb (each
# level nine or ten aliases of the one before) passes it within a few levels.
MAX_ALIAS_EXPANSION = 100_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load's loader, refusing a key given twice in one mapping (PyYAML keeps the last) and
    aliases that expand past MAX_ALIAS_EXPANSION (PyYAML shares an alias's object, but anything
    that walks or prints it, `str()` of a value included, pays the whole expansion)."""

    def compose_document(self):
        self._expansion, self._weights = 0, {}
        return super().compose_document()

    def compose_node(self, parent, index):
        if not self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            self._weights[id(node)] = self._weight(node)  # children first: each node costs one look
            return node
        event = self.peek_event()
        node = super().compose_node(parent, index)
        weight = self._weights.get(id(node))
        if weight is None:
            raise _AliasBomb(None, None, f"alias *{event.anchor} is inside its own anchor: a recursive "
                             "value has no place in a sources file", event.start_mark)
        self._expansion += weight
        if self._expansion > MAX_ALIAS_EXPANSION:
            raise _AliasBomb(None, None, f"aliases expand past {MAX_ALIAS_EXPANSION:,} characters "
                             f"(at *{event.anchor}): an alias bomb? a sources file needs few", event.start_mark)
        return node

    def _weight(self, node) -> int:
        if isinstance(node, yaml.ScalarNode):
            return max(1, len(node.value))
        items = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
        return 1 + sum(self._weights.get(id(n), 1) for n in items)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict = {}
            for key_node, _value in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges defaults, which keys override
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = first_line.get(key)
                except TypeError:  # an unhashable key: construct_mapping's own error names it
                    continue
                if first is not None:
                    raise _DuplicateKey(
                        None, None, f"duplicate key {key!r} (first at line {first}): one value would silently "
                        "replace the other", key_node.start_mark)
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


@dataclass(frozen=True)
class SourceSpec:
    id: str
    kind: str
    path: str | None = None
    pip_sdist: str | None = None
    include: tuple[str, ...] = ("**/*",)
    exclude: tuple[str, ...] = ()
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_file_chunks: int = DEFAULT_MAX_FILE_CHUNKS
    max_issues: int = DEFAULT_MAX_ISSUES
    repository: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    git: str | None = None   # a local repository (its root, its .git folder or a bare one)
    ref: str | None = None   # with `git`: a branch, tag or commit sha, resolved at each build
    error: str = ""          # a git entry's origin that cannot work, naming the entry (built: never)

    def root(self, sdist_dir: Path, base_dir: Path) -> Path:
        """The directory this source is read from (sdists unpack on first use; a git source's is
        its repository, whose objects are read, never its work tree)."""
        if self.error:
            raise SourceConfigError(self.error)
        if self.pip_sdist:
            return fetch_sdist(self.pip_sdist, sdist_dir)
        p = Path(self.git if self.git is not None else self.path).expanduser()
        return (p if p.is_absolute() else base_dir / p).resolve()


# Parsed sources files by path and content: every asset and check of a build or watch batch asks
# for its spec (~3 ms of YAML each, 14 times a batch); reading the small file again is not the
# cost. The specs are frozen.
_PARSED = session_cache("sources.parsed", max_entries=4)  # one sources file in use at a time, a few in tests


def load_sources(path: Path) -> list[SourceSpec]:
    path = Path(path)
    try:
        key = (resolved_name(path), path.read_bytes())
    except OSError:
        key = None
    if key in _PARSED:
        return list(_PARSED[key])
    specs = _load_sources(path)
    if key is not None:
        _PARSED[key] = specs
    return list(specs)


def _load_sources(path: Path) -> list[SourceSpec]:
    if not path.exists():
        raise SourceConfigError(f"{path}: sources file not found (set MTRAG_SOURCES or create it)")
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except (_DuplicateKey, _AliasBomb) as exc:
        mark = exc.problem_mark
        raise SourceConfigError(f"{path}: line {mark.line + 1} column {mark.column + 1}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise SourceConfigError(f"{path}: invalid YAML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise SourceConfigError(f"{path}: not UTF-8 text (byte {exc.start}): {exc.reason}") from exc
    except OSError as exc:
        raise SourceConfigError(f"{path}: cannot read the sources file: {exc.strerror or exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("sources"), list):
        raise SourceConfigError(f"{path}: expected a mapping with a 'sources' list")
    unknown = sorted(map(str, set(doc) - set(TOP_LEVEL_KEYS)))
    if unknown:
        raise SourceConfigError(f"{path}: unknown top-level keys {unknown} (a sources file holds only "
                                f"{list(TOP_LEVEL_KEYS)})")
    specs: list[SourceSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(doc["sources"]):
        spec = _parse_entry(path, i, entry)
        if spec.id in seen:
            raise SourceConfigError(f"{path}: sources[{i}] id={spec.id!r}: duplicate source id")
        seen.add(spec.id)
        specs.append(spec)
    return specs


def folder_problem(spec: SourceSpec, sources_file: Path) -> str | None:
    """Why a `path` source's folder cannot be read (it does not exist, or is a file), naming the
    entry; None for a folder, and for every other origin (an export file: snapshot.export_problem;
    sdists are checked when fetched). That source alone fails: the others build."""
    if spec.path is None or spec.kind == "issues" or spec.error:
        return None
    root = spec.root(Path("/nonexistent"), Path(sources_file).resolve().parent)
    if root.is_dir():
        return None
    return f"{sources_file}: source id={spec.id!r}: path {spec.path!r}: does not exist or is not a directory ({root})"


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
    has_path, has_sdist, has_git = "path" in entry, "pip_sdist" in entry, "git" in entry
    if "ref" in entry and not has_git:
        raise SourceConfigError(f"{where}: 'ref' is for git sources: give 'git' (a local repository) with it")
    if has_git:
        return _parse_git_entry(where, entry, sid, kind)
    if has_path == has_sdist:
        raise SourceConfigError(f"{where}: give exactly one of 'path', 'pip_sdist' or 'git'")
    sdist = entry.get("pip_sdist")
    if has_sdist and (not isinstance(sdist, str) or not SDIST_RE.match(sdist)):
        raise SourceConfigError(f"{where}: pip_sdist {sdist!r} must be a pinned requirement like 'click==8.5.1'")
    if has_path and not isinstance(entry["path"], str):
        raise SourceConfigError(f"{where}: path must be a string")
    common = _common_fields(where, entry)
    error = f"{where}: {ISSUES_NEED_PATH} not 'pip_sdist'" if kind == "issues" and has_sdist else ""
    return SourceSpec(id=sid, kind=kind, path=entry.get("path"), pip_sdist=sdist, error=error, **common)


# An issues source's origin is one export file (ingest/issues.py).
ISSUES_NEED_PATH = "an issues source reads one export file: give 'path' (a GitHub or Jira JSON export),"


LIMITS = {"max_file_bytes": DEFAULT_MAX_FILE_BYTES, "max_file_chunks": DEFAULT_MAX_FILE_CHUNKS,
          "max_issues": DEFAULT_MAX_ISSUES}
KNOWN_KEYS = {"id", "kind", "path", "pip_sdist", "git", "ref", "include", "exclude", "repository", *LIMITS}


def _common_fields(where: str, entry: dict) -> dict:
    """The SourceSpec fields every origin shares: globs, limits and repository."""
    globs = {}
    for key in ("include", "exclude"):
        value = entry.get(key, ["**/*"] if key == "include" else [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
            raise SourceConfigError(f"{where}: {key} must be a list of glob strings")
        globs[key] = tuple(value)
    limits = {key: entry.get(key, default) for key, default in LIMITS.items()}
    for key, value in limits.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SourceConfigError(f"{where}: {key} must be a positive integer")
    repository = entry.get("repository", "")
    if not isinstance(repository, str):
        raise SourceConfigError(f"{where}: repository must be a string (the repository's name or URL)")
    unknown = sorted(set(entry) - KNOWN_KEYS)
    if unknown:
        raise SourceConfigError(f"{where}: unknown keys {unknown}")
    return {"include": globs["include"], "exclude": globs["exclude"], "repository": repository, **limits}


def _parse_git_entry(where: str, entry: dict, sid: str, kind: str) -> SourceSpec:
    """A git entry. Its globs and keys are checked like any entry's (a bad one refuses the file);
    an origin that cannot work is kept as the spec's `error`, so only this source fails."""
    common = _common_fields(where, entry)
    git, ref = entry.get("git"), entry.get("ref")
    others = [k for k in ("path", "pip_sdist") if k in entry]
    error = ""
    if kind == "issues":
        error = f"{ISSUES_NEED_PATH} not 'git'"
    elif others:
        error = f"give exactly one of 'path', 'pip_sdist' or 'git' (this entry has 'git' and {others[0]!r})"
    elif not isinstance(git, str) or not git.strip():
        error = f"git must be the path of a local repository, got {git!r}"
    elif ref is None:
        error = "a git source needs 'ref': the branch, tag or commit sha to index"
    elif not isinstance(ref, str) or not ref.strip():
        error = f"ref must be a branch, tag or commit sha, got {ref!r}"
    return SourceSpec(id=sid, kind=kind, git=git if isinstance(git, str) else None,
                      ref=ref if isinstance(ref, str) else None, error=f"{where}: {error}" if error else "",
                      **common)


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
