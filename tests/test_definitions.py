"""The code location as maintainers see it: a snapshot of the asset graph (so lineage changes show
in review), sensors and the schedule evaluated on a real instance."""
from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from mtrag_assets.definitions import defs

SNAPSHOT = Path(__file__).parent / "snapshots" / "asset_graph.json"
ASSET_KEYS = ["raw_source", "cas_chunks", "canonical_graph", "embedding_cache", "qdrant_collection", "fts_db",
              "neo4j_graph", "cross_source_links", "index_manifest", "shadow_generation", "shadow_comparison"]


def graph_snapshot() -> dict:
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        spec_freshness = node.freshness_policy
        assets[key.to_user_string()] = {
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "partitioned": node.partitions_def is not None,
            "group": node.group_name,
            "kinds": sorted(node.kinds),
            "code_version": node.code_version,
            "automation": node.automation_condition.get_label() if node.automation_condition else None,
            "freshness": type(spec_freshness).__name__ if spec_freshness else None,
            "checks": sorted(c.name for c in node.check_keys),
            "pools": sorted(node.pools or []),
        }
    repo = defs.get_repository_def()
    return {
        "assets": assets,
        "schedules": sorted(s.name for s in repo.schedule_defs),
        "sensors": sorted(s.name for s in repo.sensor_defs if not s.name.startswith("default_automation")),
        "jobs": sorted(j.name for j in repo.get_all_jobs() if not j.name.startswith("__")),
    }


@pytest.mark.unit
def test_asset_graph_matches_snapshot():
    """The oracle is the committed file; only scripts/update_asset_snapshot.py (run by hand) writes it."""
    current = graph_snapshot()
    assert sorted(current["assets"]) == sorted(ASSET_KEYS)
    assert current == json.loads(SNAPSHOT.read_text()), \
        "asset graph changed: review it, then run .venv/bin/python scripts/update_asset_snapshot.py"


@pytest.mark.unit
def test_every_asset_has_a_description_code_version_and_freshness():
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.description and len(node.description) > 80, key
        assert node.code_version, key
        # the shadow group records what a maintainer's command did (shadow_events.py): no schedule
        # keeps it fresh, so no freshness policy would say anything true
        assert (node.freshness_policy is not None) != (node.group_name == "shadow"), key


@pytest.mark.unit
def test_embedding_cache_kind_is_the_default_backend_not_torch():
    """The UI's kind chip says what embeds on the CPU by default: ONNX Runtime, not PyTorch."""
    from mtrag_resources.embedding.embedder import DEFAULT_BACKEND
    kinds = defs.resolve_asset_graph().get(dg.AssetKey("embedding_cache")).kinds
    assert DEFAULT_BACKEND.startswith("onnx") and "onnx" in kinds and "pytorch" not in kinds


@pytest.mark.unit
def test_ui_launched_runs_execute_in_process_unless_their_config_asks_for_processes():
    """A process per step cost an unchanged partition most of its run (bench/backfill.py): the
    asset job the UI's backfills run and publish_generation default to in_process; multiprocess
    stays one run-config line away (build_source's default: wide job backfills, the schedule)."""
    multiprocess = {"execution": {"config": {"multiprocess": {"max_concurrent": 2}}}}
    for job in (defs.resolve_implicit_global_asset_job_def(), defs.resolve_job_def("publish_generation")):
        (default,) = dg.validate_run_config(job, {})["execution"].values()
        (asked,) = dg.validate_run_config(job, multiprocess)["execution"].values()
        assert list(default) == ["in_process"] and list(asked) == ["multiprocess"], job.name
    assert defs.resolve_job_def("build_source_and_publish").executor_def is dg.in_process_executor
    (default,) = dg.validate_run_config(defs.resolve_job_def("build_source"), {})["execution"].values()
    assert list(default) == ["multiprocess"]


@pytest.mark.integration  # a Dagster instance
def test_sources_sensor_adds_and_removes_partitions(tmp_path, monkeypatch):
    sources = tmp_path / "sources.yaml"
    (tmp_path / "a").mkdir()
    sources.write_text("sources:\n  - {id: a, kind: code, path: a}\n  - {id: b, kind: docs, path: a}\n")
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MTRAG_SOURCES", str(sources))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("sources", ["gone"])
        sensor = defs.get_sensor_def("sources_sync")
        result = sensor(dg.build_sensor_context(instance=instance))
        for request in result.dynamic_partitions_requests:
            if isinstance(request, dg.AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
            else:
                for key in request.partition_keys:
                    instance.delete_dynamic_partition(request.partitions_def_name, key)
        assert sorted(instance.get_dynamic_partitions("sources")) == ["a", "b"]
        again = sensor(dg.build_sensor_context(instance=instance))
        assert not again.dynamic_partitions_requests


@pytest.mark.integration  # a Dagster instance
def test_change_sensor_requests_only_changed_sources(tmp_path, monkeypatch):
    from mtrag_resources.core.config import Settings
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages.raw_source import build_raw_source
    sources = tmp_path / "sources.yaml"
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "m.py").write_text("def f():\n    return 1\n")
    sources.write_text("sources:\n  - {id: a, kind: code, path: a}\n  - {id: b, kind: code, path: b}\n")
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MTRAG_SOURCES", str(sources))
    settings = Settings.from_env().ensure()
    for spec in load_sources(sources):
        build_raw_source(settings, spec)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("sources", ["a", "b"])
        sensor = defs.get_sensor_def("source_changes")
        assert isinstance(sensor(dg.build_sensor_context(instance=instance)), dg.SkipReason)
        (tmp_path / "b" / "m.py").write_text("def f():\n    return 2\n")
        requests = sensor(dg.build_sensor_context(instance=instance))
        assert [r.partition_key for r in requests] == ["b"]
        # one changed source: one run builds it and publishes, without publish_automation's tick
        assert [r.job_name for r in requests] == ["build_source_and_publish"]
        (tmp_path / "a" / "m.py").write_text("def f():\n    return 3\n")
        requests = sensor(dg.build_sensor_context(instance=instance))
        assert sorted(r.partition_key for r in requests) == ["a", "b"]
        assert {r.job_name for r in requests} == {"build_source"}  # publish_automation publishes once


@pytest.mark.integration  # a Dagster instance
def test_nightly_schedule_requests_every_partition():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("sources", ["a", "b", "c"])
        schedule = defs.get_schedule_def("nightly_rebuild")
        import datetime as dt
        when = dt.datetime(2026, 11, 30, 2, 0, tzinfo=dt.timezone.utc)
        requests = list(schedule(dg.build_schedule_context(instance=instance, scheduled_execution_time=when)))
        assert sorted(r.partition_key for r in requests) == ["a", "b", "c"]
        assert len({r.run_key for r in requests}) == 3 and all("2026-11-30" in r.run_key for r in requests)
