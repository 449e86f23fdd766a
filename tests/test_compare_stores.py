"""`mtrag compare-stores` (seed 000's store comparison, docs/shadow.md#store-comparison): the
published generation's vectors loaded from Qdrant into pgvector on a real PostgreSQL and searched
alike, measured against the exact neighbours; bad arguments are one line with exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mtrag_resources.core.config import Settings
from tests.postgres_fixture import pg_server_url, pg_url  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))


def _mtrag(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MTRAG_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([MTRAG, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.integration
@pytest.mark.postgres
def test_both_stores_return_the_exact_neighbours_of_the_same_vectors(published, pg_url, tmp_path):
    queries = tmp_path / "queries.jsonl"  # `mtrag serve`'s query log
    queries.write_text("".join(json.dumps({"query": q}) + "\n" for q in ("total price including tax",
                                                                          "regional taxes guide")))
    done = _mtrag(published["home"], "compare-stores", "--pg-url", pg_url, "--queries", str(queries),
                  "--k", "3", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "out" / "compare-stores.json").read_text())
    rows = {r["collection"]: r for r in report["collections"]}
    assert set(rows) == {"code", "docs"} and report["queries"] == 2 and report["k"] == 3
    from mtrag_resources.stores.connect import open_published_qdrant, remove_reader_folder
    from mtrag_resources.publish.manifest import load_current
    settings = Settings(home=published["home"])
    store, folder = open_published_qdrant(settings, load_current(settings.manifest_dir)["stores"]["qdrant_snapshot"])
    try:
        for kind, row in rows.items():
            assert row["points"] == sum(1 for _ in store.vectors(kind)) and row["dim"] == 384
            # a corpus this small is searched exactly by both indexes: every neighbour found, the same ones
            assert row["qdrant_recall"] == row["pgvector_recall"] == row["overlap"] == 1.0, row
            assert row["pgvector_bytes"] > 0 and row["pgvector_index_s"] >= 0 and row["qdrant_p50_ms"] > 0
    finally:
        store.close()
        remove_reader_folder(folder)
    import psycopg2
    with psycopg2.connect(pg_url) as conn, conn.cursor() as cur:  # the comparison's tables are gone
        cur.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'mtrag_compare_%'")
        assert cur.fetchone()[0] == 0


@pytest.mark.integration
@pytest.mark.postgres
def test_pgvector_finds_a_vector_it_holds_first_and_escapes_ids(pg_url):
    from mtrag_resources.stores.pgvector_store import PgVectorStore
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(50, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"chunk\t{i}\\'; DROP TABLE x; --" if i == 3 else f"chunk-{i}" for i in range(50)]
    store = PgVectorStore(pg_url)
    try:
        built = store.load("code", zip(ids, vectors), 8, ef_search=100)
        assert built["points"] == 50
        hits = store.search("code", vectors[3], 5)
        assert hits[0][0] == ids[3] and abs(hits[0][1] - 1.0) < 1e-5
        assert [cid for cid, _ in hits] == [ids[i] for i in np.argsort(-(vectors @ vectors[3]))[:5]]
    finally:
        store.drop("code")
        store.close()


@pytest.mark.unit
@pytest.mark.parametrize("args, words", [
    (["--k", "0"], "--k 0: must be 1 to 100"),
    (["--pg-url", "mysql://x"], "--pg-url 'mysql://x': expected postgresql://"),
])
def test_bad_arguments_are_one_line(tmp_path, args, words):
    done = _mtrag(tmp_path / "home", "compare-stores", *args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
