"""Configuration: every environment variable mtrag reads is declared in `ENVIRONMENT` and read
through `env()` (a test holds both the code and the README's configuration table to this list).
`Settings` is one MTRAG_HOME: its paths come from `HomeLayout`, its other settings from here.

Values are read when asked for, not at import, so a test or a bench that sets a variable after
importing mtrag still gets what it set."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from mtrag_resources.core.errors import ConfigError
from mtrag_resources.core.layout import HomeLayout
from mtrag_resources.core.real_paths import resolved
from mtrag_resources.core.session import session_cache


@dataclass(frozen=True)
class Variable:
    default: str   # as the README shows it
    meaning: str


ENVIRONMENT: dict[str, Variable] = {
    "MTRAG_HOME": Variable("./data", "stage outputs, CAS, stores, manifests, the Dagster instance"),
    "MTRAG_SOURCES": Variable("$MTRAG_HOME/sources.yaml", "the source list"),
    "MTRAG_GOLDEN": Variable("golden.yaml beside the sources file",
                             "golden queries the publish gate holds each generation to (no file: no gate)"),
    "DAGSTER_HOME": Variable("$MTRAG_HOME/dagster_home", "Dagster instance used by `mtrag build` and `dagster dev`"),
    "MTRAG_EMBED_MODEL": Variable("all-MiniLM-L6-v2", "any sentence-transformers model name or path"),
    "MTRAG_EMBED_DEVICE": Variable("cpu", "`cuda` for a GPU"),
    "MTRAG_EMBED_BACKEND": Variable("onnx-int8 on the CPU", "onnx-int8, onnx or torch"),
    "MTRAG_RANKER": Variable("on", "`off` keeps the fused order instead of the learned ranker's (serving/ranker.py)"),
    "MTRAG_EMBED_BATCH": Variable("32 (ONNX), 64 (torch)", "texts per embedding batch"),
    "MTRAG_EMBED_ALLOW_DOWNLOAD": Variable("unset", "`1` lets a model be fetched from the Hugging Face hub"),
    "MTRAG_CACHE_DIR": Variable("$XDG_CACHE_HOME/mtrag", "ONNX exports, weight fingerprints, Neo4j jars"),
    "XDG_CACHE_HOME": Variable("~/.cache", "the base of the default cache folder"),
    "MTRAG_QDRANT_ENGINE": Variable("edge (a folder keeps the engine that built it)",
                                    "`local`: qdrant-client's local mode for the embedded store"),
    "MTRAG_QDRANT_DISK_RESERVE_MB": Variable("8", "free disk an embedded Qdrant write leaves untouched"),
    "QDRANT_URL": Variable("embedded local mode", "a Qdrant server instead"),
    "QDRANT_API_KEY": Variable("none", "the Qdrant server's API key"),
    "NEO4J_URI": Variable("a local Community server mtrag starts", "another Neo4j server"),
    "NEO4J_USER": Variable("none", "the Neo4j user"),
    "NEO4J_PASSWORD": Variable("none", "the Neo4j password"),
    "MTRAG_NEO4J_VERSION": Variable("the pinned version", "the local Neo4j Community version"),
    "MTRAG_NEO4J_HEAP": Variable("1g", "the local Neo4j's Java heap"),
    "MTRAG_NEO4J_PAGECACHE": Variable("64m", "the local Neo4j's page cache (the store files it keeps in memory)"),
    "MTRAG_NEO4J_JIT": Variable("tiered", "the local Neo4j's JIT mode (tiered, c1)"),
    "MTRAG_NEO4J_CDS": Variable("on", "`off`: the local Neo4j neither makes nor maps a class-data archive"),
    "MTRAG_NEO4J_BOLT_PORT": Variable("a free port", "the local Neo4j's Bolt port"),
    "MTRAG_NEO4J_CACHE": Variable("$MTRAG_CACHE_DIR/neo4j", "where the local Neo4j's jars are resolved to"),
    "MTRAG_MVN": Variable("`mvn` on PATH", "the Maven used to resolve Neo4j's jars"),
    "MTRAG_JAVA": Variable("$JAVA_HOME/bin/java or `java`", "the Java that runs the local Neo4j"),
    "JAVA_HOME": Variable("unset", "where Java is"),
    "MTRAG_DAGSTER_PG_URL": Variable("unset (SQLite files under DAGSTER_HOME)",
                                     "postgresql://user:password@host:port/db: the Dagster instance's run, "
                                     "event-log and schedule storage in PostgreSQL"),
    "MTRAG_API_KEY": Variable("none", "required by `mtrag serve` for binds other than loopback (or a keys "
                                      "file); reads every source"),
    "MTRAG_API_KEYS_FILE": Variable("none", "a YAML file of team keys (name, key_sha256, sources): each key "
                                            "reads only its team's sources"),
    "MTRAG_MCP_KEY_NAME": Variable("none", "the keys file entry whose sources `mtrag mcp` answers from "
                                           "(none: every source)"),
    "MTRAG_HTTP_READ_DEADLINE_S": Variable("10", "seconds `mtrag serve` gives a request to send its head and "
                                                 "body; a slower one gets a 408 and is closed"),
    "MTRAG_HTTP_CONNECTIONS_PER_CLIENT": Variable("16", "connections of one client address (an IPv6 /64) "
                                                        "`mtrag serve` serves at once; more wait their turn"),
    "MTRAG_QUERY_LOG": Variable("none", "a file `mtrag serve` appends each answered question to (JSON lines, no "
                                        "hit text): `mtrag compare --queries` replays them"),
    "MTRAG_QUERY_LOG_MAX_MB": Variable("10", "the query log's size bound: past it the file becomes `<file>.1` "
                                             "and a new one starts"),
    "MTRAG_BUILD_SERVER": Variable("auto", "`auto`: `mtrag build` hands its work to the home's build server and, "
                                           "where none runs, starts one after building; `use`: only a running "
                                           "one; `off`: never (as `--no-server`)"),
    "MTRAG_WATCH_NICE": Variable("10", "the CPU niceness `mtrag watch` adds to its own (0: none), so a server "
                                       "on the same cores answers queries first"),
    "MTRAG_NIGHTLY_CRON": Variable("0 2 * * *", "the nightly rebuild schedule"),
    "MTRAG_FAULT": Variable("unset", "tests only: a fault point at which the process kills itself"),
    "MTRAG_FAULT_SIGNAL": Variable("KILL", "tests only: `STOP` stops the process at the fault point instead"),
}


# What a cut-over profile sets for the home it serves (publish/cutover.py): the published manifest's
# `serving.environment` answers these where the process environment does not, so every build of
# that home (CLI, build server, schedule, watch) embeds as the generation it serves was embedded.
SERVED_VARIABLES = ("MTRAG_EMBED_MODEL", "MTRAG_EMBED_BACKEND", "MTRAG_EMBED_DEVICE")


def env(name: str, default: str = "") -> str:
    """The variable's value ('' or `default` when unset or empty); only declared names."""
    if name not in ENVIRONMENT:
        raise KeyError(f"{name} is not declared in mtrag_resources.core.config.ENVIRONMENT")
    value = os.environ.get(name)
    if not value and name in SERVED_VARIABLES:
        value = served_environment(resolved(os.environ.get("MTRAG_HOME") or "./data")).get(name)
    return value or default


def chosen(name: str) -> str:
    """The variable as this process's environment sets it ('' when unset), never what a home serves:
    a reader takes the rest from the manifest of the generation it has loaded."""
    if name not in ENVIRONMENT:
        raise KeyError(f"{name} is not declared in mtrag_resources.core.config.ENVIRONMENT")
    return os.environ.get(name) or ""


def serving_environment(manifest: dict) -> dict[str, str]:
    """The variables a manifest's generation serves (`serving.environment`, set by a cut-over
    profile: publish/cutover.py); {} for a generation that serves none."""
    return dict((manifest.get("serving") or {}).get("environment") or {})


def served_environment(home: Path) -> dict[str, str]:
    """The `serving.environment` of the manifest CURRENT names in `home` ({} if none), read again
    only when CURRENT moved."""
    pointer = Path(home) / "08-manifest" / "CURRENT"
    try:
        st = pointer.stat()
    except OSError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    known = _SERVED.get(str(pointer))
    if known is None or known[0] != stamp:
        try:
            served = serving_environment(json.loads((pointer.parent / pointer.read_text().strip()).read_text()))
        except (OSError, ValueError):
            served = {}
        known = _SERVED[str(pointer)] = (stamp, served)
    return known[1]


# CURRENT's path -> (its stamp, what the manifest it names serves)
_SERVED = session_cache("config.served_environment", max_entries=16)


def env_float(name: str, default: float, high: float, what: str) -> float:
    """The variable as a number above 0 and at most `high` (`default` when unset); anything else
    is a ConfigError naming the variable, its value and `what` it should be."""
    raw = env(name, str(default))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= high:
        raise ConfigError(f"{name}={raw!r}: {what}")
    return value


@dataclass(frozen=True)
class Settings(HomeLayout):
    home: Path
    sources: Path | None = None  # the source list; None: MTRAG_SOURCES, else beside the home

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(home=resolved(env("MTRAG_HOME", "./data")))

    @property
    def sources_file(self) -> Path:
        return resolved(self.sources or env("MTRAG_SOURCES") or self.home / "sources.yaml")

    @property
    def golden_file(self) -> Path:
        """The golden queries (publish/golden.py): MTRAG_GOLDEN, else `golden.yaml` beside the sources file."""
        return resolved(env("MTRAG_GOLDEN") or self.sources_file.parent / "golden.yaml")

    @property
    def dagster_home(self) -> Path:
        return resolved(env("DAGSTER_HOME") or self.home / "dagster_home")

    @property
    def qdrant_url(self) -> str | None:
        return env("QDRANT_URL") or None

    @property
    def qdrant_api_key(self) -> str | None:
        return env("QDRANT_API_KEY") or None

    @property
    def neo4j_connection(self) -> tuple[str, str | None, str | None] | None:
        """(uri, user, password) of a Neo4j server named by NEO4J_URI, else None."""
        uri = env("NEO4J_URI")
        return (uri, env("NEO4J_USER") or None, env("NEO4J_PASSWORD") or None) if uri else None

    @property
    def dagster_pg_url(self) -> str | None:
        """The PostgreSQL the Dagster instance stores runs, events and schedules in (None: SQLite)."""
        return env("MTRAG_DAGSTER_PG_URL") or None

    @property
    def api_key(self) -> str | None:
        return env("MTRAG_API_KEY") or None

    def ensure(self) -> "Settings":
        for d in self.stage_dirs():
            if not os.path.isdir(d):  # a stat where mkdir raised and caught EEXIST (~30 calls a batch)
                d.mkdir(parents=True, exist_ok=True)
        return self
