"""Shadow generations (DESIGN "Shadow generations", docs/shadow.md): `mtrag build --profile NAME`
builds every source into `<home>/shadows/NAME/` with the profile's overrides while the live CURRENT
and its answers stay as they were; `mtrag compare live NAME` reports both on the same queries;
a bad profile is refused in one line naming the file and key (exit 2)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import subprocess
import sys
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import current_path
from tests.test_golden_gate import GOLDEN

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))
PROFILES = """\
profiles:
  fts-heavy:
    description: the lexical channel first
    fusion: {dense: 0.25, fts: 4}
    ranker: off
  fp32:
    description: torch's fp32 vectors through onnxruntime
    embedder: {backend: onnx}
    neo4j_uri: local
"""
LIVE_QUERIES = ("total price including tax", "apply_tax", "regional taxes guide")


def mtrag(*args: str, timeout: float = 400, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([MTRAG, *args], env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _answers() -> list[dict]:
    """The live home's answers to LIVE_QUERIES: hits, bridge, paths and stale flags."""
    out = []
    for text in LIVE_QUERIES:
        proc = mtrag("query", "--json", text)
        assert proc.returncode == 0, proc.stderr
        answer = json.loads(proc.stdout)
        out.append({key: answer[key] for key in ("generation", "hits", "bridge", "paths", "stale")})
    return out


@pytest.mark.integration
@pytest.mark.neo4j
@pytest.mark.slow
def test_shadow_build_leaves_live_alone_and_compare_reports_both(mtrag_env, tmp_path):
    from mtrag_resources.stores.neo4j_server import Neo4jServer
    config = mtrag_env["sources"].parent
    (config / "golden.yaml").write_text(GOLDEN.format(name="lookup_rate"))
    (config / "profiles.yaml").write_text(PROFILES)
    live = Settings.from_env()
    built = mtrag("build", "--no-server")
    assert built.returncode == 0, built.stderr
    current, before = current_path(live.manifest_dir).read_bytes(), _answers()
    shadow = live.shadow_home("fts-heavy")
    # before any shadow build: a profile of read-time overrides reads the live generation with them
    compared = mtrag("compare", "live", "fts-heavy", "--out", str(tmp_path / "what-if"))
    assert compared.returncode == 0, compared.stderr
    assert "fts-heavy: no shadow built; its overrides are read-time only" in compared.stdout
    what_if = json.loads((tmp_path / "what-if" / "compare.json").read_text())
    assert what_if["b"]["home"] == str(live.home) and what_if["b"]["weights"] == {"dense": 0.25, "fts": 4.0}
    assert not shadow.exists()
    # real traffic: the questions `mtrag serve` logged, compared by overlap and latency
    log = tmp_path / "queries.jsonl"
    _serve_and_ask(["total price including tax", "apply_tax", "total price including tax"], MTRAG_QUERY_LOG=str(log))
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["query"] for e in lines] == ["total price including tax", "apply_tax", "total price including tax"]
    assert all(e["generation"] == 1 and e["hits"] > 0 and e["ms"] > 0 and "text" not in json.dumps(e) for e in lines)
    traffic = mtrag("compare", "live", "fts-heavy", "--queries", str(log), "--out", str(tmp_path / "traffic"))
    assert traffic.returncode == 0, traffic.stderr
    replay = json.loads((tmp_path / "traffic" / "compare.json").read_text())
    assert sorted(r["query"] for r in replay["queries"]) == ["apply_tax", "total price including tax"]
    assert replay["summary"]["live"]["judged"] == 0 and replay["summary"]["live"]["recall"] is None
    assert all(0.0 <= r["overlap"] <= 1.0 and r["ms_b"] > 0 for r in replay["queries"])
    # a profile of read-time settings has no index of its own to build
    nothing = mtrag("build", "--profile", "fts-heavy")
    assert nothing.returncode == 0 and "has no index of its own to build" in nothing.stdout
    assert "measured its golden queries on live generation 1: recall 1.000" in nothing.stdout
    assert not (shadow / "08-manifest").exists()
    shadow = live.shadow_home("fp32")
    try:
        built = mtrag("build", "--profile", "fp32", MTRAG_NEO4J_HEAP="256m")
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        # another embedder: every text embedded once, for the new fingerprint, beside the live vectors
        embedded = [int(n) for n in re.findall(r"embedded (\d+), cache_hits 0", built.stdout)]
        assert embedded and all(n > 0 for n in embedded), built.stdout[-3000:]
        assert "live CURRENT unchanged (generation 1)" in built.stdout

        # the live home: the same CURRENT, the same answers (graph paths and bridge included)
        assert current_path(live.manifest_dir).read_bytes() == current
        assert _answers() == before
        # the shadow: a generation of its own, sharing the embedding cache and the live files by hard links
        built_manifest = json.loads((shadow / "08-manifest" / "manifest-1.json").read_text())
        assert built_manifest["embedder"]["backend"] == "onnx" and built_manifest["serving"]["profile"] == "fp32"
        assert (shadow / "04-embeddings").resolve() == live.embeddings_dir.resolve()
        blob = next(p for p in (live.cas_dir / "blobs").rglob("*") if p.is_file())  # never rewritten: one file
        assert (shadow / blob.relative_to(live.home)).stat().st_ino == blob.stat().st_ino
        assert json.loads((shadow / "profile.json").read_text())["embedder"] == {"backend": "onnx"}

        out = tmp_path / "report"
        compared = mtrag("compare", "live", "fp32", "--out", str(out))
        assert compared.returncode == 0, compared.stderr
        assert "rank live" in compared.stdout and "rank fp32" in compared.stdout
        report = json.loads((out / "compare.json").read_text())
        rows = {row["id"]: row for row in report["queries"]}
        assert set(rows) == {"lookup-rate", "cart-total", "guide"}
        for row in rows.values():
            assert row["rank_a"] == 1  # the live generation finds every golden item first (its gate says so)
            assert [set(e) >= {"source", "file_path", "rank_a", "rank_b"} for e in row["expected"]] == [True]
            assert 0.0 <= row["overlap"] <= 1.0 and row["ms_a"] > 0 and row["ms_b"] > 0
            assert row["delta"] == 1 - (row["rank_b"] or 4)
        assert report["a"]["stale"] == [] and report["b"]["stale"] == []  # each side served by its own graph
        assert report["summary"]["live"]["recall"] == 1.0
        assert report["worse"] == sorted((r["id"] for r in rows.values() if r["delta"] < 0),
                                         key=lambda i: (rows[i]["delta"], i))
        markdown = (out / "compare.md").read_text()
        assert "| id" in markdown and "cart-total" in markdown and "## Summary" in markdown
        assert current_path(live.manifest_dir).read_bytes() == current
        _cut_over_and_back(live, shadow, before, mtrag_env["docs"], tmp_path)
    finally:
        Neo4jServer(Settings(home=shadow)).stop()


def _manifest(settings: Settings) -> dict:
    return json.loads((settings.manifest_dir / current_path(settings.manifest_dir).read_text().strip()).read_text())


def _same_top_k(name: str, tmp_path: Path) -> None:
    """`compare live NAME` finds the live generation and NAME's answering alike: live serves NAME."""
    same = mtrag("compare", "live", name, "--out", str(tmp_path / f"served-{name}"))
    assert same.returncode == 0, same.stderr
    rows = json.loads((tmp_path / f"served-{name}" / "compare.json").read_text())["queries"]
    assert [r["overlap"] for r in rows] == [1.0] * len(rows) and all(r["delta"] == 0 for r in rows)


def _cut_over_and_back(live: Settings, shadow: Path, before: list[dict], docs: Path, tmp_path: Path) -> None:
    """`mtrag cutover fp32` serves the shadow's stores and vectors as live generation 2 (gated by the
    shadow's own golden ranks); `mtrag rollback` serves generation 1's again as 3; a profile of
    read-time settings is cut over without a shadow (4) and rolled back (5); after a last cut-over
    (6), a live build keeps building and serving the profile, embedding only what changed, and
    there is no cut-over left to roll back."""
    with _asking_throughout(live) as seen:
        _cut_over_steps(live, shadow, before, docs, tmp_path)
    # a long-lived reader answered every question, from each generation in turn (a channel the live
    # build's graph write made stale meanwhile is reported, never mixed: `stale` counts those answers)
    assert seen["errors"] == [] and seen["empty"] == 0 and {1, 2, 3, 4, 5, 6, 7} <= seen["generations"], seen


@contextlib.contextmanager
def _asking_throughout(live: Settings):
    """A reader in this process asking a question every few milliseconds until the block ends."""
    from mtrag_resources.serving.reader import IndexReader
    reader = IndexReader(home=str(live.home))
    seen = {"errors": [], "stale": 0, "empty": 0, "generations": set(), "answers": 0}
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            try:
                answer = reader.query(LIVE_QUERIES[seen["answers"] % 3], k=3)
                seen["generations"].add(answer.generation)
                seen["stale"] += bool(answer.stale)
                seen["empty"] += not answer.hits
                seen["answers"] += 1
            except Exception as exc:  # noqa: BLE001 - every failure is what the test reports
                seen["errors"].append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.02)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(timeout=60)
        reader.close()


def _cut_over_steps(live: Settings, shadow: Path, before: list[dict], docs: Path, tmp_path: Path) -> None:
    cut = mtrag("cutover", "fp32")
    assert cut.returncode == 0, cut.stdout + cut.stderr
    assert ("cut over: live generation 2 is fp32's generation 1 (golden recall 1.000, the golden ranks measured "
            "by its build; gate ") in cut.stdout
    served = _manifest(live)
    assert served["generation"] == 2 and served["stores_home"] == str(shadow)
    assert served["cutover"]["previous"] == 1 and served["quality"]["recall"] == 1.0
    assert served["serving"] == {"profile": "fp32", "fusion": {}, "environment": {"MTRAG_EMBED_BACKEND": "onnx"}}
    assert all(a["generation"] == 2 and a["stale"] == [] for a in _answers())  # the live graph serves it too
    status = mtrag("status")
    assert "serving profile 'fp32' (cut over; `mtrag rollback` restores generation 1)" in status.stdout
    _same_top_k("fp32", tmp_path)  # the shadow's stores, read with its fp32 query embedder
    refused = mtrag("build", "--profile", "fp32")
    assert refused.returncode == 2 and "served from fp32's shadow stores" in refused.stderr

    back = mtrag("rollback")
    assert back.returncode == 0, back.stderr
    assert "live generation 3 is generation 1 again" in back.stdout
    restored = _manifest(live)
    assert "stores_home" not in restored and "serving" not in restored and restored["rollback"]["from"] == 2
    assert [{**a, "generation": 1} for a in _answers()] == before
    again = mtrag("rollback")
    assert again.returncode == 2 and "generation 3 is not a cut-over" in again.stderr

    view = mtrag("cutover", "fts-heavy")
    assert view.returncode == 0, view.stdout + view.stderr
    assert "live generation 4 is generation 3 read with fts-heavy (golden recall 1.000, golden queries asked" \
        in view.stdout
    weighted = _manifest(live)
    assert "stores_home" not in weighted and weighted["serving"]["fusion"] == {"dense": 0.25, "fts": 4.0}
    _same_top_k("fts-heavy", tmp_path)
    assert mtrag("rollback").returncode == 0

    _cut_over_through_dagster(live)
    (docs / "notes.md").write_text("# Notes\n\nRounding happens to cents, half up.\n")
    built = mtrag("build", "--no-server")
    assert built.returncode == 0, built.stderr
    assert "embedded 1, cache_hits" in built.stdout, built.stdout[-3000:]  # the fp32 vectors came from the cache
    rebuilt = _manifest(live)
    assert rebuilt["generation"] == 7 and "stores_home" not in rebuilt and "cutover" not in rebuilt
    assert rebuilt["serving"]["profile"] == "fp32" and rebuilt["embedder"]["backend"] == "onnx"
    assert all(a["generation"] == 7 and a["stale"] == [] for a in _answers())
    late = mtrag("rollback")
    assert late.returncode == 2 and "built after the cut-over of 'fp32'" in late.stderr
    _rollback_refused_through_dagster(live)
    _shown_in_dagster(live)


def _cut_over_through_dagster(live: Settings) -> None:
    """The same cut-over as a run of the `shadow_cutover` job, the profile as run config; a
    rollback run with nothing to roll back fails with the command's error."""
    import dagster as dg
    from mtrag_assets.shadow_jobs import shadow_cutover
    with dg.DagsterInstance.from_config(str(live.dagster_home)) as instance:
        run = shadow_cutover.execute_in_process(run_config={"ops": {"cut_over": {"config": {"profile": "fp32"}}}},
                                                instance=instance)
        assert run.success and _manifest(live)["cutover"]["profile"] == "fp32"
        assert instance.get_run_by_id(run.run_id).tags["mtrag/shadow"] == "cutover"
        (only,) = [r for r in instance.get_runs() if r.job_name == "shadow_cutover"]
        assert only.run_id == run.run_id


def _rollback_refused_through_dagster(live: Settings) -> None:
    import dagster as dg
    from mtrag_assets.shadow_jobs import shadow_rollback
    with dg.DagsterInstance.from_config(str(live.dagster_home)) as instance:
        failed = shadow_rollback.execute_in_process(instance=instance, raise_on_error=False)
        assert not failed.success
        (failure,) = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "built after the cut-over of 'fp32'" in failure.event_specific_data.error.message


def _shown_in_dagster(live: Settings) -> None:
    """The shadow build, the comparisons and each cut-over and rollback, as the live instance holds them."""
    import dagster as dg
    with dg.DagsterInstance.from_config(str(live.dagster_home)) as instance:
        def events(key: str) -> list:
            return [r.event_log_entry.asset_materialization
                    for r in instance.fetch_materializations(dg.AssetKey(key), limit=50, ascending=True).records]
        assert set(instance.get_dynamic_partitions("profiles")) == {"fp32", "fts-heavy"}
        built = events("shadow_generation")
        assert [m.partition for m in built] == ["fp32"]
        assert built[0].metadata["settings"].value == {"embedder": {"backend": "onnx"}, "neo4j_uri": "local",
                                                       "description": "torch's fp32 vectors through onnxruntime"}
        assert built[0].metadata["golden_recall"].value == 1.0
        compared = events("shadow_comparison")
        assert [m.partition for m in compared] == ["fts-heavy", "fts-heavy", "fp32", "fp32", "fts-heavy"]
        assert compared[2].metadata["against_recall"].value == 1.0 and "| id" in compared[2].metadata["report"].value
        published = [m for m in events("index_manifest") if m.tags.get("mtrag/cutover") or m.tags.get("mtrag/rollback")]
        assert [(m.metadata["generation"].value, m.tags) for m in published] == [
            (2, {"mtrag/cutover": "fp32"}), (3, {"mtrag/rollback": "fp32"}), (4, {"mtrag/cutover": "fts-heavy"}),
            (5, {"mtrag/rollback": "fts-heavy"}), (6, {"mtrag/cutover": "fp32"})]


def _serve_and_ask(questions: list[str], **env: str) -> None:
    """`mtrag serve` on a free port asked `questions` over HTTP, then stopped by its pid."""
    import re
    import signal
    import urllib.request
    proc = subprocess.Popen([MTRAG, "serve", "--host", "127.0.0.1", "--port", "0"], env={**os.environ, **env},
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        base = re.match(r"^mtrag serving on (http://127\.0\.0\.1:\d+) ", line)
        assert base and f"questions logged to {env['MTRAG_QUERY_LOG']}" in line, line
        for text in questions:
            req = urllib.request.Request(base.group(1) + "/v1/query", json.dumps({"text": text}).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                assert resp.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        proc.stdout.close()


@pytest.mark.unit
@pytest.mark.parametrize("text, words", [
    ("profiles:\n  p1:\n    chunking: {max_tokens: 100}\n", ["profiles.p1.chunking", "unknown key"]),
    ("profiles:\n  p1:\n    fusion: {dense: -1}\n", ["profiles.p1.fusion.dense", "from 0"]),
    ("profiles:\n  p1:\n    fusion: {graph: 1}\n", ["profiles.p1.fusion.graph", "unknown channel"]),
    ("profiles:\n  p1:\n    embedder: {backend: cuda}\n", ["profiles.p1.embedder.backend"]),
    ("profiles:\n  live: {}\n", ["profiles.live", "not 'live'"]),
    ("profiles:\n  other: {}\n", ["no profile 'p1'", "known: ['other']"]),
    ("profiles:\n  p1: {embedder: {backend: onnx}}\n", ["profiles.p1.neo4j_uri", "NEO4J_URI"]),
    ("- p1\n", ["one top-level key `profiles`"]),
])
def test_a_bad_profile_is_one_line_naming_the_file_and_key(tmp_path, monkeypatch, capsys, text, words):
    from mtrag_assets.app.cli import main
    from tests.corpus import write_corpus
    paths = write_corpus(tmp_path / "corpus")
    (paths["sources"].parent / "profiles.yaml").write_text(text)
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MTRAG_SOURCES", str(paths["sources"]))
    monkeypatch.setenv("NEO4J_URI", "bolt://127.0.0.1:1")  # the live graph's server, which no shadow may share
    capsys.readouterr()
    assert main(["build", "--profile", "p1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(paths["sources"].parent / "profiles.yaml") in err, err
    for word in words:
        assert word in err, err
    assert not (tmp_path / "home" / "shadows").exists()  # refused before anything was made


@pytest.mark.unit
def test_a_shadow_never_writes_the_live_qdrant_server(tmp_path, monkeypatch):
    """With QDRANT_URL set, a profile that changes the index must keep its vectors in its own home."""
    from mtrag_resources.core.profiles import ProfileConfigError, environment, load_profile
    path = tmp_path / "profiles.yaml"
    path.write_text("profiles:\n  p1: {embedder: {backend: onnx}, neo4j_uri: local}\n"
                    "  p2: {embedder: {backend: onnx}, neo4j_uri: local, qdrant: embedded}\n")
    monkeypatch.setenv("QDRANT_URL", "http://127.0.0.1:6333")
    home = tmp_path / "home"
    with pytest.raises(ProfileConfigError, match=r"profiles\.p1\.qdrant: QDRANT_URL names the live vectors' server"):
        environment(load_profile(path, "p1"), path, home / "shadows" / "p1", path, path)
    env = environment(load_profile(path, "p2"), path, home / "shadows" / "p2", path, path)
    assert env["QDRANT_URL"] is None and env["QDRANT_API_KEY"] is None and env["MTRAG_HOME"].endswith("p2")
    path.write_text("profiles:\n  p3: {qdrant: http://other:6333}\n")
    with pytest.raises(ProfileConfigError, match=r"profiles\.p3\.qdrant: must be 'embedded'"):
        load_profile(path, "p3")


@pytest.mark.unit
def test_compare_refuses_a_shadow_never_built(tmp_path, monkeypatch, capsys):
    from mtrag_assets.app.cli import main
    from tests.corpus import write_corpus
    paths = write_corpus(tmp_path / "corpus")
    (paths["sources"].parent / "profiles.yaml").write_text(PROFILES)
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MTRAG_SOURCES", str(paths["sources"]))
    assert main(["compare", "live", "live"]) == 2
    assert main(["compare", "live", "fts-heavy"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "name two different generations" in err[0]
    assert "live:" in err[1] and "has no published generation; run mtrag build" in err[1]
