"""The managed `dagster.yaml` (mtrag_resources/core/instance_file.py): what an existing file lacks
of what mtrag needs, one difference per line, and what may be rewritten (mtrag's own file) and what
never is (a user's)."""
from __future__ import annotations

import textwrap

import pytest
import yaml

from mtrag_resources.core import instance_file as inst
from mtrag_resources.core.instance_file import MARKER, PG_URL_ENV, InstanceFileError, differences, plan

INSTANCE_YAML = inst.BASE_YAML  # runner.INSTANCE_YAML

pytestmark = pytest.mark.unit

URL = "postgresql://mtrag:pw@127.0.0.1:5999/dagster"
LIMITS = textwrap.dedent("""\
    concurrency:
      pools:
        default_limit: 1
      runs:
        tag_concurrency_limits:
          - key: team
            limit: 4
          - key: dagster/partition
            value:
              applyLimitPerUniqueValue: true
            limit: 1
""")


def lines(p) -> list[str]:
    return [str(d) for d in p.differences]


def test_a_missing_file_is_written_with_the_marker_and_postgres_by_variable_name():
    sqlite = plan(None, INSTANCE_YAML, None)
    assert sqlite.action == "write" and sqlite.text.splitlines()[0] == MARKER
    assert "storage" not in yaml.safe_load(sqlite.text)
    pg = plan(None, INSTANCE_YAML, URL)
    doc = yaml.safe_load(pg.text)
    assert doc["storage"] == {"postgres": {"postgres_url": {"env": PG_URL_ENV}}}
    assert "pw" not in pg.text and "127.0.0.1" not in pg.text  # the file never holds the URL
    assert doc["concurrency"] == yaml.safe_load(INSTANCE_YAML)["concurrency"]
    # what mtrag writes is what it wants: nothing to say the next time
    for url, text in ((None, sqlite.text), (URL, pg.text)):
        again = plan(text, INSTANCE_YAML, url)
        assert (again.action, again.differences, again.errors) == ("keep", [], [])


def test_mtrag_s_own_file_is_rewritten_when_postgres_is_asked_for():
    for own in (plan(None, INSTANCE_YAML, None).text, INSTANCE_YAML):  # marked, or written before the marker
        p = plan(own, INSTANCE_YAML, URL, legacy=(INSTANCE_YAML,))
        assert p.managed and p.action == "rewrite" and p.errors == []
        assert lines(p) == [f"storage: mtrag needs postgres with postgres_url {{env: {PG_URL_ENV}}} "
                            f"({PG_URL_ENV} is set), the file has nothing (Dagster's default: SQLite files under "
                            "DAGSTER_HOME)"]
        assert yaml.safe_load(p.text)["storage"]["postgres"]["postgres_url"] == {"env": PG_URL_ENV}


def test_mtrag_s_own_file_is_rewritten_when_its_limits_changed():
    old = MARKER + "\n" + INSTANCE_YAML.replace("default_limit: 1", "default_limit: 2").replace("limit: 1\n", "limit: 3\n")
    p = plan(old, INSTANCE_YAML, None)
    assert p.action == "rewrite" and p.errors == []
    assert lines(p) == [
        "concurrency.pools.default_limit: mtrag needs 1, the file has 2",
        "concurrency.runs.tag_concurrency_limits: mtrag needs an entry {key: dagster/partition, value: "
        "{applyLimitPerUniqueValue: true}, limit: 1}, the file has [{key: dagster/partition, value: "
        "{applyLimitPerUniqueValue: true}, limit: 3}]",
    ]


def test_a_user_s_file_is_kept_and_each_difference_is_one_line():
    user = "telemetry:\n  enabled: true\nconcurrency:\n  pools:\n    default_limit: 3\n"
    p = plan(user, INSTANCE_YAML, None, legacy=(INSTANCE_YAML,))
    assert (p.action, p.managed, p.errors) == ("keep", False, [])
    assert lines(p) == [
        "concurrency.pools.default_limit: mtrag needs 1, the file has 3",
        "concurrency.runs.tag_concurrency_limits: mtrag needs an entry {key: dagster/partition, value: "
        "{applyLimitPerUniqueValue: true}, limit: 1}, the file has no limit on dagster/partition",
    ]
    # telemetry and other limits are the user's business; the mtrag rule among others is enough
    assert plan(LIMITS, INSTANCE_YAML, None).differences == []


def test_a_user_s_file_without_the_postgres_asked_for_is_an_error():
    p = plan(LIMITS, INSTANCE_YAML, URL)
    assert p.action == "keep" and p.errors == p.differences and len(p.errors) == 1
    assert p.errors[0].storage and p.errors[0].key == "storage"
    sqlite = LIMITS + "storage:\n  sqlite:\n    base_dir: /var/dagster\n"
    assert lines(plan(sqlite, INSTANCE_YAML, URL))[0].endswith("the file has sqlite storage")
    other = LIMITS + "storage:\n  postgres:\n    postgres_url: postgresql://u:p@db.example:5432/other\n"
    assert lines(plan(other, INSTANCE_YAML, URL))[0].endswith("the file has postgres with postgres_url of another server")


@pytest.mark.parametrize("storage", [
    f"storage:\n  postgres:\n    postgres_url:\n      env: {PG_URL_ENV}\n",
    f"storage:\n  postgres:\n    postgres_url: {URL}\n",  # the same URL, written out
    "storage:\n  postgres:\n    postgres_db:\n      username: mtrag\n      password: pw\n"
    "      hostname: 127.0.0.1\n      port: 5999\n      db_name: dagster\n",
    "".join(f"{name}:\n  module: dagster_postgres.{mod}\n  class: {cls}\n  config:\n    postgres_url:\n"
            f"      env: {PG_URL_ENV}\n"
            for name, mod, cls in (("run_storage", "run_storage", "PostgresRunStorage"),
                                   ("event_log_storage", "event_log", "PostgresEventLogStorage"),
                                   ("schedule_storage", "schedule_storage", "PostgresScheduleStorage"))),
])
def test_a_user_s_postgres_storage_for_the_same_server_is_accepted(storage):
    assert plan(LIMITS + storage, INSTANCE_YAML, URL).differences == []


def test_per_storage_blocks_that_mix_postgres_and_sqlite_name_each_one_that_differs():
    mixed = LIMITS + (f"run_storage:\n  module: dagster_postgres.run_storage\n  class: PostgresRunStorage\n"
                      f"  config:\n    postgres_url:\n      env: {PG_URL_ENV}\n")
    p = plan(mixed, INSTANCE_YAML, URL)
    assert [d.key for d in p.errors] == ["event_log_storage", "schedule_storage"]
    assert all(str(d).endswith("the file has sqlite storage") for d in p.errors)


def test_a_file_that_reads_the_unset_variable_is_an_error_even_for_mtrag_s_own():
    own = plan(None, INSTANCE_YAML, URL).text
    for text in (own, LIMITS + f"storage:\n  postgres:\n    postgres_url:\n      env: {PG_URL_ENV}\n"):
        p = plan(text, INSTANCE_YAML, None)
        assert p.action == "keep" and len(p.errors) == 1  # never flipped back to SQLite silently
        assert str(p.errors[0]) == (f"storage: mtrag needs a storage that does not read {PG_URL_ENV} (it is not set), "
                                    f"the file has postgres_url {{env: {PG_URL_ENV}}} (set {PG_URL_ENV}, or delete "
                                    "the file to return to SQLite)")
    # a user's postgres of their own (a literal URL) needs no variable: not mtrag's business
    assert plan(LIMITS + f"storage:\n  postgres:\n    postgres_url: {URL}\n", INSTANCE_YAML, None).differences == []


def test_run_coordinator_forms():
    old_form = ("concurrency:\n  pools:\n    default_limit: 1\nrun_coordinator:\n  module: dagster.core.run_coordinator\n"
                "  class: QueuedRunCoordinator\n  config:\n    tag_concurrency_limits:\n      - key: dagster/partition\n"
                "        value:\n          applyLimitPerUniqueValue: true\n        limit: 1\n")
    assert differences(old_form, INSTANCE_YAML, None) == []
    default = LIMITS + "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: DefaultRunCoordinator\n"
    assert [str(d) for d in differences(default, INSTANCE_YAML, None)] == [
        "run_coordinator.class: mtrag needs QueuedRunCoordinator (the run tag limits apply to queued runs), "
        "the file has DefaultRunCoordinator"]


def test_unreadable_yaml_is_refused_by_name():
    with pytest.raises(InstanceFileError, match="is not valid YAML"):
        plan("concurrency: [\n", INSTANCE_YAML, None)
    with pytest.raises(InstanceFileError, match="not a YAML mapping"):
        plan("- a\n- b\n", INSTANCE_YAML, None)
    assert inst.storage_of({}) == {s: ("sqlite", None) for s in inst.STORAGES}
