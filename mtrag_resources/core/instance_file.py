"""What `$DAGSTER_HOME/dagster.yaml` must say for mtrag, and how an existing file differs from it:
pure logic over YAML text (no Dagster import, no file access); `mtrag_assets.runner` reads and
writes the file.

mtrag needs the `default_limit` pool, the per-partition run limit and the asked-for storage. A file
mtrag wrote carries `MARKER` and is rewritten; the user's is never rewritten, each difference is one
line, and a wrong storage is an error (docs/configuration.md#the-instance-file)."""
from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

import yaml

# Pools: one step at a time per pool (qdrant_writer: embedded Qdrant allows one writer process).
# Runs: at most one queued-then-launched run per source partition (UI backfills, sensors, the
# schedule); `mtrag build` executes in process and takes a per-source file lock instead.
# Also the whole text an mtrag without the marker line wrote (`plan(..., legacy=(BASE_YAML,))`).
BASE_YAML = """\
telemetry:
  enabled: false
concurrency:
  pools:
    default_limit: 1
  runs:
    tag_concurrency_limits:
      - key: dagster/partition
        value:
          applyLimitPerUniqueValue: true
        limit: 1
"""
PG_URL_ENV = "MTRAG_DAGSTER_PG_URL"
MARKER = ("# Written by mtrag (mtrag_assets/runner.py) and rewritten when what mtrag needs changes; "
          "delete this line to keep the file as your own.")
STORAGES = ("run_storage", "event_log_storage", "schedule_storage")
QUEUED = "QueuedRunCoordinator"


class InstanceFileError(ValueError):
    """The existing file cannot be used as it is (the caller turns this into its ConfigError)."""


@dataclass(frozen=True)
class Difference:
    """One way the existing file differs from what mtrag needs: `key` (a dotted path in the YAML),
    what mtrag wants, what the file has; `storage` marks the storage (an error for a user's file)."""
    key: str
    want: str
    have: str
    storage: bool = False
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.key}: mtrag needs {self.want}, the file has {self.have}" + (f" ({self.hint})" if self.hint else "")


@dataclass
class InstancePlan:
    """What to do with the file. `action`: "write" (missing), "rewrite" (mtrag's own file that
    differs), "keep" (equal, or a user's file); `text`: the file mtrag wants; `differences`: one
    per line to tell; `errors`: the differences that forbid going on (a user's file, or a storage
    that cannot work)."""
    action: str
    text: str
    managed: bool
    differences: list[Difference] = field(default_factory=list)
    errors: list[Difference] = field(default_factory=list)


def wanted_document(base_yaml: str, pg_url: str | None) -> dict:
    """The instance mtrag wants: `base_yaml` (telemetry, pools, run limits) plus, when a
    PostgreSQL URL is configured, `storage.postgres.postgres_url` read from MTRAG_DAGSTER_PG_URL."""
    doc = yaml.safe_load(base_yaml) or {}
    if pg_url:
        doc["storage"] = {"postgres": {"postgres_url": {"env": PG_URL_ENV}}}
    return doc


def render(base_yaml: str, pg_url: str | None) -> str:
    text = MARKER + "\n" + base_yaml
    if pg_url:
        text += (f"# run, event-log and schedule storage in the PostgreSQL that {PG_URL_ENV} names "
                 "(read when the instance loads; the URL holds the password, so the file does not)\n"
                 + yaml.safe_dump({"storage": wanted_document("", pg_url)["storage"]}, sort_keys=False))
    return text


def is_managed(text: str, legacy: tuple[str, ...] = ()) -> bool:
    """mtrag wrote it: the marker on the first line, or exactly a text an earlier mtrag wrote."""
    return text.splitlines()[:1] == [MARKER] or text in legacy


def _get(doc, path: str):
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def _show(value) -> str:
    if value is None:
        return "nothing"
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip().removesuffix("...").strip()


def _url_source(config) -> tuple[str, object]:
    """('env', NAME) or ('url', literal) or ('db', {...}) of a postgres storage's config."""
    if not isinstance(config, dict):
        return ("none", None)
    url = config.get("postgres_url")
    if isinstance(url, dict) and "env" in url:
        return ("env", url["env"])
    if isinstance(url, str):
        return ("url", url)
    if isinstance(config.get("postgres_db"), dict):
        return ("db", config["postgres_db"])
    return ("none", None)


def storage_of(doc: dict) -> dict[str, tuple[str, object]]:
    """Per storage (runs, event log, schedules): (kind, where) with kind `sqlite` (Dagster's
    default when nothing is configured), `postgres`, `mysql` or a class name; `where` is the
    postgres URL source (see `_url_source`) or None."""
    storage = doc.get("storage") if isinstance(doc, dict) else None
    if isinstance(storage, dict) and storage:
        kind = next(iter(storage))
        where = _url_source(storage[kind]) if kind == "postgres" else None
        return {s: (kind, where) for s in STORAGES}
    out = {}
    for name in STORAGES:
        block = doc.get(name) if isinstance(doc, dict) else None
        if not isinstance(block, dict):
            out[name] = ("sqlite", None)
            continue
        cls = str(block.get("class", ""))
        if cls.startswith("Postgres"):
            out[name] = ("postgres", _url_source(block.get("config") or {}))
        elif cls.startswith("Sqlite") or cls.startswith("ConsolidatedSqlite"):
            out[name] = ("sqlite", None)
        else:
            out[name] = (cls or "unknown", None)
    return out


def _same_server(url: str, db: dict) -> bool:
    """A `postgres_db` block naming the host, port and database of `url`."""
    parts = urlsplit(url)
    return (str(db.get("hostname", "")) == (parts.hostname or "")
            and str(db.get("port", 5432)) == str(parts.port or 5432)
            and str(db.get("db_name", "")) == parts.path.lstrip("/"))


def _storage_differences(doc: dict, pg_url: str | None) -> list[Difference]:
    have = storage_of(doc)
    # one line for the file's storage when the three are configured alike (`storage:` or nothing)
    items = [("storage", next(iter(have.values())))] if len(set(map(repr, have.values()))) == 1 else list(have.items())
    diffs = []
    for key, (kind, where) in items:
        if pg_url:
            ok = kind == "postgres" and (where == ("env", PG_URL_ENV) or where == ("url", pg_url)
                                         or (where[0] == "db" and _same_server(pg_url, where[1])))
            if ok:
                continue
            if kind != "postgres":
                shown = ("nothing (Dagster's default: SQLite files under DAGSTER_HOME)"
                         if kind == "sqlite" and not doc.get("storage") and key == "storage" else f"{kind} storage")
            else:
                shown = "postgres with " + {"env": f"postgres_url {{env: {where[1]}}}",
                                            "url": "postgres_url of another server",
                                            "db": "postgres_db of another server"}.get(where[0], "no URL")
            diffs.append(Difference(key, f"postgres with postgres_url {{env: {PG_URL_ENV}}} ({PG_URL_ENV} is set)",
                                    shown, storage=True))
        elif kind == "postgres" and where and where[0] == "env" and where[1] == PG_URL_ENV:
            diffs.append(Difference(key, f"a storage that does not read {PG_URL_ENV} (it is not set)",
                                    f"postgres_url {{env: {PG_URL_ENV}}}", storage=True,
                                    hint=f"set {PG_URL_ENV}, or delete the file to return to SQLite"))
    return diffs


def _coordinator_tag_limits(doc: dict):
    """The tag concurrency limits of an explicitly configured run coordinator (the pre-1.10 form)."""
    return _get(doc, "run_coordinator.config.tag_concurrency_limits")


def differences(text: str, base_yaml: str, pg_url: str | None) -> list[Difference]:
    """Each way the YAML `text` differs from what mtrag needs; [] when it has everything."""
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InstanceFileError(f"is not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(doc, dict):
        raise InstanceFileError(f"is not a YAML mapping (a {type(doc).__name__})")
    want = wanted_document(base_yaml, pg_url)
    diffs: list[Difference] = []

    key = "concurrency.pools.default_limit"
    if _get(doc, key) != _get(want, key):
        diffs.append(Difference(key, _show(_get(want, key)), _show(_get(doc, key))))

    key = "concurrency.runs.tag_concurrency_limits"
    have_limits = _get(doc, key)
    if have_limits is None and _coordinator_tag_limits(doc) is not None:
        key, have_limits = "run_coordinator.config.tag_concurrency_limits", _coordinator_tag_limits(doc)
    for rule in _get(want, "concurrency.runs.tag_concurrency_limits") or []:
        if not isinstance(have_limits, list) or rule not in have_limits:
            same_key = [r for r in have_limits or [] if isinstance(r, dict) and r.get("key") == rule.get("key")]
            diffs.append(Difference(key, "an entry " + _show(rule),
                                    _show(same_key) if same_key else f"no limit on {rule.get('key')}"))
    coordinator = str(_get(doc, "run_coordinator.class") or "")
    if coordinator and coordinator != QUEUED:
        diffs.append(Difference("run_coordinator.class", f"{QUEUED} (the run tag limits apply to queued runs)",
                                coordinator))

    diffs += _storage_differences(doc, pg_url)
    return diffs


def plan(existing: str | None, base_yaml: str, pg_url: str | None, legacy: tuple[str, ...] = ()) -> InstancePlan:
    """What to do with `$DAGSTER_HOME/dagster.yaml` whose text is `existing` (None: missing)."""
    text = render(base_yaml, pg_url)
    if existing is None:
        return InstancePlan("write", text, managed=True)
    managed = is_managed(existing, legacy)
    diffs = differences(existing, base_yaml, pg_url)
    if not diffs:
        return InstancePlan("keep", text, managed)
    if managed:
        # A storage that reads an unset variable cannot be fixed by rewriting: the variable is the
        # user's switch, and flipping an instance that has runs in PostgreSQL back to SQLite (while a
        # daemon may still use it) would split its history silently.
        errors = [d for d in diffs if d.storage and not pg_url]
        return InstancePlan("keep" if errors else "rewrite", text, managed, diffs, errors)
    return InstancePlan("keep", text, managed, diffs, [d for d in diffs if d.storage])
