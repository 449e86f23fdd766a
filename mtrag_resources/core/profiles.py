"""Shadow profiles: `profiles.yaml` beside the sources file names profiles, each a set of overrides
of what defines an index. `mtrag build --profile NAME` builds every source under those overrides
into a home of its own (`<home>/shadows/NAME/`, publish/shadow_home.py); `mtrag compare` reads it
with them. The format and the namespace: docs/shadow.md.

A profile is applied as environment overrides, the way mtrag is configured everywhere else (the
Dagster assets build a `Settings` from the environment), plus the fusion weights a reader takes."""
from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mtrag_resources.core.config import env as setting
from mtrag_resources.core.errors import ConfigError

LIVE = "live"  # what `mtrag compare` calls the published home; no profile may take the name
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
LOCAL_NEO4J = "local"   # a profile's `neo4j_uri`: a local server in the shadow's own home
LOCAL_QDRANT = "embedded"  # a profile's `qdrant`: the embedded store in the shadow's own home
BACKENDS = ("onnx-int8", "onnx", "torch")
CHANNELS = ("dense", "fts", "exact")

_PROFILE_KEYS = {"embedder", "fusion", "ranker", "neo4j_uri", "qdrant", "description"}
_EMBEDDER_KEYS = {"model", "backend", "device"}


class ProfileConfigError(ConfigError):
    """profiles.yaml is malformed, or names no such profile: the message names the file and key."""


@dataclass(frozen=True)
class Profile:
    name: str
    embedder: dict = field(default_factory=dict)   # model / backend / device overrides
    fusion: dict = field(default_factory=dict)     # channel -> weight (weighted RRF)
    ranker: str | None = None                      # "on" | "off" | None (as live)
    neo4j_uri: str | None = None                   # a server, LOCAL_NEO4J, or None (see graph_uri)
    qdrant: str | None = None                      # LOCAL_QDRANT or None (see vector_store)
    description: str = ""

    @property
    def read_time_only(self) -> bool:
        """Does the profile change only how a generation is read (fusion, ranker)? Then the live
        generation read with it is the candidate, and no shadow build is needed to compare it."""
        return not self.embedder

    def as_dict(self) -> dict:
        return {"name": self.name, "embedder": dict(self.embedder), "fusion": dict(self.fusion),
                "ranker": self.ranker, "neo4j_uri": self.neo4j_uri, "qdrant": self.qdrant,
                "description": self.description}


def profiles_path(sources_file: Path) -> Path:
    return Path(sources_file).parent / "profiles.yaml"


def load_profile(path: Path, name: str) -> Profile:
    """The profile `name` of the file at `path`, validated (the whole file is checked, so a typo in
    another profile is found before it is built)."""
    profiles = load_profiles(path)
    if name not in profiles:
        raise ProfileConfigError(f"{path}: no profile {name!r}; known: {sorted(profiles)}")
    return profiles[name]


def load_profiles(path: Path) -> dict[str, Profile]:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileConfigError(f"{path}: no profiles file (a `profiles:` mapping of NAME: overrides; "
                                 "see docs/shadow.md)") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ProfileConfigError(f"{path}: cannot read it: {' '.join(str(exc).split())}") from None
    if not isinstance(doc, dict) or set(doc) != {"profiles"} or not isinstance(doc["profiles"], dict):
        raise ProfileConfigError(f"{path}: expected one top-level key `profiles` mapping names to overrides")
    return {str(name): _parse(path, name, body) for name, body in doc["profiles"].items()}


def _parse(path: Path, name, body) -> Profile:
    def fail(key: str, msg: str):
        raise ProfileConfigError(f"{path}: profiles.{name}{'.' + key if key else ''}: {msg}")

    if not isinstance(name, str) or not NAME_RE.match(name) or name == LIVE:
        fail("", f"a profile name is 1 to 64 of a-z 0-9 _ - (not {LIVE!r}): it names a folder")
    if not isinstance(body, dict):
        fail("", f"must be a mapping of overrides, got {type(body).__name__}")
    extra = sorted(set(body) - _PROFILE_KEYS, key=str)
    if extra:
        fail(str(extra[0]), f"unknown key; supported: {sorted(_PROFILE_KEYS)}")
    embedder = body.get("embedder") or {}
    if not isinstance(embedder, dict):
        fail("embedder", "must be a mapping {model?, backend?, device?}")
    for key, value in embedder.items():
        if key not in _EMBEDDER_KEYS:
            fail(f"embedder.{key}", f"unknown key; supported: {sorted(_EMBEDDER_KEYS)}")
        if not isinstance(value, str) or not value.strip():
            fail(f"embedder.{key}", f"must be a non-empty string, got {value!r}")
    if embedder.get("backend") and embedder["backend"] not in BACKENDS:
        fail("embedder.backend", f"{embedder['backend']!r} is not one of {list(BACKENDS)}")
    fusion = body.get("fusion") or {}
    if not isinstance(fusion, dict):
        fail("fusion", f"must be a mapping of channel weights {list(CHANNELS)}")
    for key, value in fusion.items():
        if key not in CHANNELS:
            fail(f"fusion.{key}", f"unknown channel; supported: {list(CHANNELS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
            fail(f"fusion.{key}", f"must be a number from 0 (channel off) to 100, got {value!r}")
    ranker = body.get("ranker")
    if ranker is not None:
        ranker = {True: "on", False: "off"}.get(ranker, ranker)  # YAML reads a bare on/off as a bool
        if ranker not in ("on", "off"):
            fail("ranker", f"must be on or off, got {body.get('ranker')!r}")
    uri = body.get("neo4j_uri")
    if uri is not None and (not isinstance(uri, str) or not (uri == LOCAL_NEO4J or "://" in uri)):
        fail("neo4j_uri", f"must be a bolt:// or neo4j:// URI or {LOCAL_NEO4J!r}, got {uri!r}")
    qdrant = body.get("qdrant")
    if qdrant is not None and qdrant != LOCAL_QDRANT:
        fail("qdrant", f"must be {LOCAL_QDRANT!r} (the shadow's vectors in its own home), got {qdrant!r}")
    description = body.get("description") or ""
    if not isinstance(description, str):
        fail("description", "must be a string")
    return Profile(name=name, embedder={k: v.strip() for k, v in embedder.items()},
                   fusion={k: float(v) for k, v in fusion.items()}, ranker=ranker, neo4j_uri=uri,
                   qdrant=qdrant, description=description)


def graph_uri(profile: Profile, path: Path) -> str | None:
    """The Neo4j server the shadow's graph goes to; None: a local server in the shadow's home.
    Neo4j Community holds one database per server, so a shadow never shares the live server: with
    NEO4J_URI set, the profile must name its own server (or `local`)."""
    if profile.neo4j_uri == LOCAL_NEO4J:
        return None
    if profile.neo4j_uri:
        return profile.neo4j_uri
    if setting("NEO4J_URI"):
        raise ProfileConfigError(
            f"{path}: profiles.{profile.name}.neo4j_uri: NEO4J_URI names the live graph's server, which a shadow "
            f"must not write; set neo4j_uri to another server, or to {LOCAL_NEO4J!r} (a local server in the "
            "shadow's home)")
    return None


def vector_store(profile: Profile, path: Path) -> dict[str, str | None]:
    """What the shadow's vectors are written to: its own home's embedded store. With QDRANT_URL set
    (the live vectors' server, whose collections a shadow would overwrite), the profile must say
    `qdrant: embedded`."""
    if profile.qdrant == LOCAL_QDRANT:
        return {"QDRANT_URL": None, "QDRANT_API_KEY": None}
    if setting("QDRANT_URL"):
        raise ProfileConfigError(
            f"{path}: profiles.{profile.name}.qdrant: QDRANT_URL names the live vectors' server, whose collections "
            f"a shadow would overwrite; set qdrant: {LOCAL_QDRANT!r} (the embedded store in the shadow's home)")
    return {}


def environment(profile: Profile, path: Path, shadow_home: Path, sources_file: Path,
                golden_file: Path) -> dict[str, str | None]:
    """The environment a build or reader of the shadow runs under (None: unset the variable)."""
    uri = graph_uri(profile, path)
    env: dict[str, str | None] = {
        "MTRAG_HOME": str(shadow_home), "DAGSTER_HOME": str(shadow_home / "dagster_home"),
        "MTRAG_SOURCES": str(sources_file), "MTRAG_GOLDEN": str(golden_file),
        "MTRAG_BUILD_SERVER": "off", "NEO4J_URI": uri,
    }
    if uri is None:  # the local server needs no credentials; the live server's are not the shadow's
        env.update({"NEO4J_USER": None, "NEO4J_PASSWORD": None})
    for key, variable in EMBEDDER_VARIABLES:
        if key in profile.embedder:
            env[variable] = profile.embedder[key]
    return {**env, **vector_store(profile, path), **read_environment(profile)}


EMBEDDER_VARIABLES = (("model", "MTRAG_EMBED_MODEL"), ("backend", "MTRAG_EMBED_BACKEND"),
                      ("device", "MTRAG_EMBED_DEVICE"))


def serving_block(profile: dict) -> dict:
    """What a manifest records of the profile its generation serves (`Profile.as_dict()`): the
    fusion weights a reader applies and the variables its builds and readers run under (those the
    profile sets). A shadow's manifests carry it, and a cut-over publishes it live."""
    variables = {variable: profile["embedder"][key] for key, variable in EMBEDDER_VARIABLES
                 if (profile.get("embedder") or {}).get(key)}
    if profile.get("ranker"):
        variables["MTRAG_RANKER"] = profile["ranker"]
    return {"profile": profile["name"], "fusion": dict(profile.get("fusion") or {}), "environment": variables}


def read_environment(profile: Profile) -> dict[str, str | None]:
    """What a reader of a generation runs under with the profile's read-time overrides."""
    return {"MTRAG_RANKER": profile.ranker} if profile.ranker else {}


@contextlib.contextmanager
def applied(env: dict[str, str | None]):
    """`env` set in this process for the block, and the variables as they were afterwards."""
    now = dict(os.environ)
    before = {k: now.get(k) for k in env}
    try:
        _set(env)
        yield
    finally:
        _set(before)


def _set(env: dict[str, str | None]) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
