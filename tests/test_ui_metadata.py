"""What a maintainer reads in the Dagster UI: materialization metadata (to_metadata), a pip sdist's
snapshot naming its pin, descriptions of every job, sensor and schedule, and `mtrag build`'s runs
as runs of the code location's jobs, with tags to filter them by."""
from __future__ import annotations

import dagster as dg
import pytest

from mtrag_assets.metadata import counter_table, readable_bytes, round_duration, round_float, to_metadata
from mtrag_assets.policies import HIDDEN_TAG_PREFIX, HOST_TAG, PID_TAG, PROC_START_TAG


# ------------------------------------------------------------------ to_metadata

@pytest.mark.unit
def test_floats_are_rounded_and_durations_typed():
    meta = to_metadata({"seconds": 0.10105200700002115, "embed_seconds": 5.529970808000002,
                        "neo4j_seconds": 376.23456, "golden_seconds": 3, "latency_ms": 12.345678,
                        "texts_per_s": 78.23657903658012, "points_per_s": 4900.202968919226,
                        "golden_drop": 0.0333333333, "huge": 1234567.891, "zero": 0.0})
    assert all(isinstance(v, dg.FloatMetadataValue) for v in meta.values()), meta
    values = {k: v.value for k, v in meta.items()}
    assert values == {"seconds": 0.101, "embed_seconds": 5.53, "neo4j_seconds": 376.2, "golden_seconds": 3.0,
                      "latency_ms": 12.35, "texts_per_s": 78.24, "points_per_s": 4900.0,
                      "golden_drop": 0.03333, "huge": 1234568.0, "zero": 0.0}
    assert round_duration(0.00004) == 0.0 and round_float(0.00012344) == 0.0001234


@pytest.mark.unit
def test_numeric_keys_stay_numeric_for_scripts():
    """bench/build.py and the tests read `.value` of these as numbers."""
    meta = to_metadata({"seconds": 1.5, "embedded": 12, "embed_seconds": 0.25, "total_relationships": 608,
                        "chunks": 694, "points": 429, "qdrant_publish_bytes_written": 64593510,
                        "qdrant_publish_bytes_shared": 0, "cache_hits": 0, "generation": 3, "dim": 384})
    for key in ("embedded", "total_relationships", "chunks", "points", "qdrant_publish_bytes_written",
                "qdrant_publish_bytes_shared", "cache_hits", "generation", "dim"):
        assert isinstance(meta[key], dg.IntMetadataValue) and isinstance(meta[key].value, int), key
    assert meta["embedded"].value == 12 and meta["cache_hits"].value == 0  # a zero is a value, not empty
    assert isinstance(meta["seconds"].value, float) and isinstance(meta["embed_seconds"].value, float)


@pytest.mark.unit
def test_byte_counts_are_ints_with_a_readable_size_beside_them():
    meta = to_metadata({"bytes": 227679, "db_bytes": 15179776, "qdrant_publish_bytes_written": 64593510,
                        "qdrant_publish_bytes_shared": 512})
    assert meta["bytes"].value == 227679 and meta["bytes_readable"].value == "222.3 KiB"
    assert meta["db_bytes_readable"].value == "14.5 MiB"
    assert meta["qdrant_publish_bytes_written_readable"].value == "61.6 MiB"
    assert "qdrant_publish_bytes_shared_readable" not in meta  # under 1 KiB the number says it all
    assert readable_bytes(1023) == "1023 B" and readable_bytes(3 * 1024 ** 3) == "3.0 GiB"


@pytest.mark.unit
def test_counters_are_markdown_tables_largest_first():
    meta = to_metadata({"by_type": {"section": 265, "passage": 429},
                        "nodes_by_label": {"Page": 39, "Section": 265, "Source": 1},
                        "relationships": {"CONTAINS": 304, "HAS_CHUNK": 304},
                        "by_language": {"python": 3, "": 1},
                        "skipped_too_large": {"src/big_file.py": 3_000_000}})
    for key in ("by_type", "nodes_by_label", "relationships", "by_language", "skipped_too_large"):
        assert isinstance(meta[key], dg.MarkdownMetadataValue), key
        assert "{" not in meta[key].value, meta[key].value  # not JSON text
    assert meta["by_type"].value == "| type | count |\n| --- | ---: |\n| passage | 429 |\n| section | 265 |"
    assert meta["nodes_by_label"].value.splitlines()[0] == "| label | count |"
    assert meta["nodes_by_label"].value.splitlines()[2:] == ["| Section | 265 |", "| Page | 39 |", "| Source | 1 |"]
    assert meta["relationships"].value.splitlines()[0] == "| relationships | count |"
    assert "| (none) | 1 |" in meta["by_language"].value
    # A path's markdown characters are escaped; a size counter has a readable column.
    assert meta["skipped_too_large"].value.splitlines() == [
        "| file | bytes | size |", "| --- | ---: | ---: |", "| src/big\\_file.py | 3000000 | 2.9 MiB |"]


@pytest.mark.unit
def test_a_long_counter_is_cut_with_the_rest_counted():
    text = counter_table("by_type", {f"t{i:02d}": i + 1 for i in range(30)})
    lines = text.splitlines()
    assert lines[2] == "| t29 | 30 |" and lines[21] == "| t10 | 11 |" and lines[22] == ""  # 20 rows
    assert lines[-1] == "and 10 more (total 55)"
    assert len(text) < 1000  # the UI shows it inline, not behind "[Show Markdown]"


@pytest.mark.unit
def test_no_empty_rows():
    meta = to_metadata({"commit": None, "skipped_reasons": {}, "warnings": [], "note": "", "removed": [],
                        "files": 0, "skipped": False, "changed": ["shop"], "reasons": {"a.py": "binary"}})
    assert sorted(meta) == ["changed", "files", "reasons", "skipped"]
    assert not any(getattr(v, "value", None) in ("None", "", {}, []) for v in meta.values())
    assert meta["skipped"].value == "False" and meta["files"].value == 0
    # Lists and non-counter dicts stay JSON (tests and scripts read them as such).
    assert meta["changed"].value == ["shop"] and meta["reasons"].value == {"a.py": "binary"}


@pytest.mark.unit
def test_paths_texts_and_given_values():
    table = dg.MetadataValue.md("| a |\n| --- |\n| 1 |")
    meta = to_metadata({"root": "/src/shop", "path": "relative/x", "model": "all-MiniLM-L6-v2", "given": table})
    assert isinstance(meta["root"], dg.PathMetadataValue) and meta["root"].value == "/src/shop"
    assert isinstance(meta["path"], dg.TextMetadataValue)  # not absolute: plain text
    assert meta["model"].value == "all-MiniLM-L6-v2" and meta["given"] is table


# ------------------------------------------------------------------ descriptions

@pytest.mark.unit
def test_every_job_sensor_and_schedule_has_a_description():
    from mtrag_assets.definitions import defs
    repo = defs.get_repository_def()
    jobs = [j for j in repo.get_all_jobs() if not j.name.startswith("__")]  # Dagster's implicit asset job
    assert {j.name for j in jobs} == {"build_source", "build_source_and_publish", "publish_generation",
                                      "shadow_build", "shadow_cutover", "shadow_rollback"}
    assert {s.name for s in repo.sensor_defs} >= {"publish_automation", "source_changes", "sources_sync"}
    for definition in [*jobs, *repo.sensor_defs, *repo.schedule_defs]:
        assert definition.description and len(definition.description) > 40, definition.name


# ------------------------------------------------------------------ raw_source of an sdist

@pytest.mark.unit
def test_an_sdist_snapshot_names_its_pin_not_the_enclosing_repositorys_commit(tmp_path, monkeypatch):
    """An sdist unpacked under a MTRAG_HOME inside a git work tree: `git rev-parse HEAD` there is
    that repository's commit, which says nothing about the package."""
    import subprocess

    from mtrag_resources.core.config import Settings
    from mtrag_resources.ingest.sources import SourceSpec
    from mtrag_resources.stages import raw_source as stage

    repo = tmp_path / "repo"
    unpacked = repo / "data" / "sdists" / "demo-1.0"
    unpacked.mkdir(parents=True)
    (unpacked / "demo.py").write_text("def f():\n    return 1\n")
    folder = repo / "src"
    folder.mkdir()
    (folder / "m.py").write_text("X = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "src"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    settings = Settings(home=repo / "data").ensure()
    monkeypatch.setattr("mtrag_resources.ingest.sources.fetch_sdist", lambda requirement, sdist_dir: unpacked)
    sdist = stage.build_raw_source(settings, SourceSpec(id="demo", kind="code", pip_sdist="demo==1.0"))
    assert sdist.metadata["sdist"] == "demo==1.0" and "commit" not in sdist.metadata
    assert sdist.value.commit == ""  # nor do its chunks and the manifest carry the repository's HEAD
    shown = to_metadata(sdist.metadata)
    assert shown["sdist"].value == "demo==1.0" and "commit" not in shown

    plain = stage.build_raw_source(settings, SourceSpec(id="src", kind="code", path=str(folder)))
    assert plain.metadata["commit"] == head and "sdist" not in plain.metadata


# ------------------------------------------------------------------ CLI runs as job runs

@pytest.mark.integration
@pytest.mark.neo4j
def test_cli_build_runs_are_job_runs_with_tags(mtrag_env):
    from tests.build_helpers import build
    instance_runs = lambda: dg.DagsterInstance.get().get_runs()  # noqa: E731

    result = build()
    assert result["built"] == ["shop", "shop-docs"]
    runs = {r.run_id: r for r in instance_runs()}
    first, last = runs[result["runs"]["shop"]], runs[result["runs"]["shop-docs"]]
    assert result["runs"]["__publish__"] == last.run_id and len(runs) == 2  # one run per source, the last publishes
    assert first.job_name == "build_source" and last.job_name == "build_source_and_publish"
    for run, sid, publish in ((first, "shop", "false"), (last, "shop-docs", "true")):
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags["mtrag/trigger"] == "cli" and run.tags["mtrag/source"] == sid
        assert run.tags["mtrag/publish"] == publish and run.tags["dagster/partition"] == sid
        assert run.tags["dagster/code_location"] == "mtrag_assets.definitions"
        # The runs list shows the tags maintainers filter by; the build process's identity (read by
        # release_dead_runs) is under Dagster's hidden prefix.
        hidden = {k for k in run.tags if k.startswith(HIDDEN_TAG_PREFIX)}
        assert hidden == {HOST_TAG, PID_TAG, PROC_START_TAG}
        assert set(run.tags) - hidden == {"mtrag/trigger", "mtrag/source", "mtrag/publish", "dagster/partition",
                                          "dagster/partition_set", "dagster/code_location"}
        # The code location as origin: what the UI's Overview timeline needs to list the run.
        origin = run.remote_job_origin
        assert origin is not None and origin.job_name == run.job_name
        assert (origin.location_name, origin.repository_origin.repository_name) == \
            ("mtrag_assets.definitions", "__repository__")
    # The same asset selection as before: the source's stages (and their checks), plus publishing.
    stages = {"raw_source", "cas_chunks", "canonical_graph", "embedding_cache", "qdrant_collection", "fts_db",
              "neo4j_graph"}
    assert {k.to_user_string() for k in first.asset_selection} == stages
    assert {k.to_user_string() for k in last.asset_selection} == stages | {"cross_source_links", "index_manifest"}

    # Nothing changed: one publishing run, of publish_generation, without a source.
    again = build()
    assert again["built"] == []
    run = dg.DagsterInstance.get().get_run_by_id(again["runs"]["__publish__"])
    assert run.job_name == "publish_generation" and run.status == dg.DagsterRunStatus.SUCCESS
    assert run.tags["mtrag/trigger"] == "cli" and run.tags["mtrag/publish"] == "true"
    assert "mtrag/source" not in run.tags and "dagster/partition" not in run.tags
    assert {k.to_user_string() for k in run.asset_selection} == {"cross_source_links", "index_manifest"}
    assert run.remote_job_origin.job_name == "publish_generation"
