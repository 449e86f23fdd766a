"""The generation protocol end to end: publishing gate, stale detection, convergence after a
failure, and a reader serving while a build runs in another process."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from mtrag_resources.publish.manifest import load_current
from mtrag_resources.core.layout import current_path
from mtrag_resources.serving.reader import IndexReader
from mtrag_resources.ingest.sources import load_sources
from mtrag_resources.stages.fts_db import build_fts_db
from mtrag_resources.stages.index_manifest import PublishRefused, build_index_manifest
from mtrag_resources.stores import neo4j_store
from mtrag_resources.stores.connect import open_neo4j
from tests.build_helpers import build, settings

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]


def _spec(source_id):
    return next(s for s in load_sources(settings().sources_file) if s.id == source_id)


def _edit_tax(env, marker: str) -> None:
    tax = env["pkg"] / "tax.py"
    tax.write_text(tax.read_text().replace("round to cents.", f"round to cents ({marker})."))


def test_lagging_store_is_reported_stale_and_its_hits_are_not_mixed(mtrag_env):
    build()
    reader = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    try:
        assert reader.status()["stale"] == []
        # FTS moves to N+1 for `shop` (as a build in progress would); Qdrant and Neo4j stay at N.
        _edit_tax(mtrag_env, "zebra-marker")
        from mtrag_resources.stages.cas_chunks import build_cas_chunks
        from mtrag_resources.stages.raw_source import build_raw_source
        s = settings()
        build_raw_source(s, _spec("shop"))
        build_cas_chunks(s, _spec("shop"))
        build_fts_db(s, _spec("shop"))
        status = reader.status()
        stale = {(x["source"], x["store"]) for x in status["stale"]}
        assert stale == {("shop", "fts")}
        assert status["sources"]["shop"]["fts"]["generation"] != status["sources"]["shop"]["qdrant"]["generation"]
        result = reader.query("zebra-marker", mode="lexical")
        assert result["hits"] == []
        assert any(s["source"] == "shop" and s["store"] == "fts" for s in result["stale"])
        # Dense hits of `shop` still come from the published Qdrant copy, hydrated from the CAS.
        dense = reader.query("apply the regional tax", mode="dense")
        assert any(h["source_id"] == "shop" and "zebra" not in h["text"] for h in dense["hits"])
        # Publishing refuses while the other stores lag, and CURRENT stays as it was.
        before = current_path(s.manifest_dir).read_text()
        from mtrag_assets.resources import MtragResource
        with pytest.raises(PublishRefused, match="markers_committed|counts_reconcile"):
            build_index_manifest(s, load_sources(s.sources_file), MtragResource().embedder())
        assert current_path(s.manifest_dir).read_text() == before
        build()  # converges: every store at N+1, published
        assert reader.status()["stale"] == []
        assert reader.query("zebra-marker", mode="lexical")["hits"]
    finally:
        reader.close()


def test_failure_mid_neo4j_write_leaves_begin_and_next_build_converges(mtrag_env, monkeypatch):
    build()
    _edit_tax(mtrag_env, "second")
    original = neo4j_store.Neo4jStore._merge_relations

    def fail(self, *args, **kwargs):
        raise RuntimeError("injected failure during the relationship merge")

    monkeypatch.setattr(neo4j_store.Neo4jStore, "_merge_relations", fail)
    with pytest.raises(RuntimeError, match="injected failure during the relationship merge"):
        build()
    neo = open_neo4j(settings())
    try:
        assert neo.marker("shop").state == "begin"
    finally:
        neo.close()
    assert load_current(settings().manifest_dir)["generation"] == 1
    assert any(s["store"] == "neo4j" for s in IndexReader(home=str(mtrag_env["home"])).status()["stale"])
    monkeypatch.setattr(neo4j_store.Neo4jStore, "_merge_relations", original)
    build()
    manifest = load_current(settings().manifest_dir)
    assert manifest["generation"] == 2
    assert manifest["sources"]["shop"]["stores"]["neo4j"]["state"] == "committed"


def _frozen(proc: subprocess.Popen) -> bool:
    """Has the process stopped itself at its fault point (state T in /proc)?"""
    try:
        return Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, uses SIGSTOP")
def test_reader_serves_while_a_build_runs_in_another_process(mtrag_env):
    build()
    _edit_tax(mtrag_env, "concurrent")
    (mtrag_env["docs"] / "more.md").write_text("# More\n\n" + "Taxes are rounded to cents. " * 40 + "\n")
    reader = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    # The build stops itself once every store holds generation 2 and manifest-2.json is written,
    # just before CURRENT moves (MTRAG_FAULT_SIGNAL=STOP); SIGCONT lets it publish.
    env = {**os.environ, "MTRAG_FAULT": "manifest:before_current", "MTRAG_FAULT_SIGNAL": "STOP"}
    proc = subprocess.Popen([sys.executable, "-m", "mtrag_assets.app.cli", "build"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    generations, errors = [], []

    def ask() -> None:
        try:
            r = reader.query("apply the regional tax", k=5)
            generations.append(r["generation"])
            assert r["hits"], "the published generation must keep answering"
            if r["generation"] == 1:
                assert not any("concurrent" in h["text"] for h in r["hits"])
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - any error is the failure we look for
            errors.append(repr(exc))

    try:
        deadline = time.monotonic() + 600  # only so that a lost build cannot hang the test
        while not _frozen(proc):  # queries all through the build's writes
            assert proc.poll() is None, f"the build exited before publishing:\n{proc.communicate()[0][-3000:]}"
            if time.monotonic() > deadline:
                pytest.fail("the build never reached its publish")
            ask()
            time.sleep(0.2)
        ask()
        assert generations[-1] == 1  # every store written, CURRENT not moved: generation 1 answers
        os.kill(proc.pid, signal.SIGCONT)
        while proc.poll() is None and time.monotonic() < deadline:
            ask()
            time.sleep(0.2)
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, out[-3000:]
        assert errors == []
        assert set(generations) <= {1, 2}
        final = reader.query("rounded to cents", k=10)
        assert final["generation"] == 2 and final["stale"] == []
        assert any(h["file_path"] == "more.md" for h in final["hits"])
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.close()


def test_second_build_of_the_same_source_is_refused(mtrag_env):
    from mtrag_resources.publish.build_state import SourceBusy, source_lock
    s = settings()
    with source_lock(s, "shop"):
        with pytest.raises(SourceBusy, match="already being built"):
            with source_lock(s, "shop"):
                pass
        with pytest.raises(SourceBusy):
            build(only=["shop"])


def test_cli_no_change_shortcut(mtrag_env):
    build()
    instance = dg.DagsterInstance.get()
    runs = len(instance.get_runs())
    current = current_path(settings().manifest_dir)
    published = current.read_bytes(), current.stat().st_mtime_ns
    out = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "build"], capture_output=True, text=True,
                         env=dict(os.environ), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nothing changed" in out.stdout
    # the shortcut: no Dagster run started, nothing published again
    assert len(instance.get_runs()) == runs
    assert (current.read_bytes(), current.stat().st_mtime_ns) == published
    _edit_tax(mtrag_env, "third")
    out = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "build"], capture_output=True, text=True,
                         env=dict(os.environ), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "built ['shop']" in out.stdout


def test_build_rebuilds_a_source_whose_store_lost_it_without_force(mtrag_env):
    """Files unchanged, but Neo4j lost one source (wiped by hand): the next build of another change
    rebuilds that source too and publishes, instead of refusing at the gate."""
    build()
    neo = open_neo4j(settings())
    try:
        neo.delete_source("shop-docs")
    finally:
        neo.close()
    _edit_tax(mtrag_env, "after-loss")
    result = build()
    assert result["built"] == ["shop", "shop-docs"]
    manifest = load_current(settings().manifest_dir)
    assert manifest["generation"] == 2
    assert manifest["sources"]["shop-docs"]["stores"]["neo4j"]["state"] == "committed"
    assert IndexReader(home=str(mtrag_env["home"]), log_proposals=False).status()["stale"] == []


def test_an_embedder_change_rebuilds_every_source(mtrag_env, monkeypatch):
    """A new backend changes the fingerprint: every source is re-embedded, not just changed files."""
    build()
    before = load_current(settings().manifest_dir)["embedder"]["fingerprint_id"]
    monkeypatch.setenv("MTRAG_EMBED_BACKEND", "torch")
    _edit_tax(mtrag_env, "new-embedder")  # one source's files change as well
    result = build()
    assert sorted(result["built"]) == ["shop", "shop-docs"]
    manifest = load_current(settings().manifest_dir)
    assert manifest["generation"] == 2 and manifest["embedder"]["fingerprint_id"] != before


def test_a_switch_keeps_the_shards_of_collections_it_did_not_change(mtrag_env):
    """A generation that changed only code goes on with the docs collection's loaded Edge shard
    (loading one holds the GIL, and every query waits meanwhile) and loads the code collection
    from its own version; both answer. A closed generation's private folder is kept exactly while
    a served shard lives in it (the multilingual docs collection, which no edit here changes,
    stays adopted from the first), and closing the reader leaves no private folder of its own."""
    build()
    reader = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    readers = Path(load_current(settings().manifest_dir)["stores"]["qdrant_snapshot"]).parent / ".readers"
    try:
        assert reader.query("apply the regional tax", k=5)["generation"] == 1
        core = reader._core().generations  # the loaded generation and its switch
        first = core.qdrant.client
        docs_shard, code_shard, first_copy = first._shards["mtrag_docs"], first._shards["mtrag_code"], core.qdrant_copy
        _edit_tax(mtrag_env, "switched")
        build()
        second = reader.query("round to cents (switched)", k=5)
        assert second["generation"] == 2 and second["stale"] == []
        client = core.qdrant.client
        assert client._shards["mtrag_docs"] is docs_shard and client._shards["mtrag_code"] is not code_shard
        assert client.adopted == set()  # taken over: the docs shard is this generation's to close
        assert str(client.homes["mtrag_docs"]).startswith(first_copy) and Path(first_copy).is_dir()
        docs = reader.query("Rounding happens to cents", k=5, kind="docs")
        assert any(h["file_path"] == "notes.md" for h in docs["hits"])
        assert any("tax.py" in h["file_path"] for h in second["hits"])

        (mtrag_env["docs"] / "notes.md").write_text("# Notes\n\nRounding happens to cents, always.\n")
        build()
        third = reader.query("Rounding happens to cents, always", k=5, kind="docs")
        assert third["generation"] == 3 and any(h["file_path"] == "notes.md" for h in third["hits"])
        client = core.qdrant.client
        assert client._shards["mtrag_docs"] is not docs_shard and str(client.homes["mtrag_docs"]).startswith(core.qdrant_copy)
        deadline = time.monotonic() + 10  # the old generations close on a thread of their own
        while len(core._open_qdrants) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert core._open_qdrants == [core.qdrant]
        # a closed generation's folder is kept exactly while a served shard lives in it
        served = {str(home) for home in client.homes.values()}
        for folder in {first_copy, *core._retired}:
            assert Path(folder).exists() == any(home.startswith(folder + os.sep) for home in served), folder
    finally:
        reader.close()
    assert not [p for p in readers.iterdir() if p.name.startswith(f"{os.getpid()}-") and p.is_dir()]


def test_a_switch_keeps_the_live_graph_connection(mtrag_env):
    """A reader that switches to a new generation goes on with the graph connection it has (one
    server whatever the generation) instead of opening a new one per switch; the new generation's
    graph answers through it."""
    build()
    reader = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    try:
        first = reader.query("apply the regional tax", k=5)
        core = reader._core().generations  # the loaded generation and its switch
        connection = core.graph.live()
        assert first["generation"] == 1 and connection is not None
        _edit_tax(mtrag_env, "switched")
        build()
        second = reader.query("apply the regional tax", k=5)
        assert second["generation"] == 2 and second["stale"] == []
        assert core.graph.live() is connection
        assert connection.markers()  # not closed with generation 1's stores
        paths = reader.paths("shopcart.cart.Cart.total", rel_types=["CALLS"], max_hops=3)
        assert paths["generation"] == 2 and paths["paths"]
    finally:
        reader.close()


def test_a_serving_reader_loads_a_changed_collection_only_when_no_query_is_in_flight(mtrag_env, monkeypatch):
    """Loading an Edge shard holds the GIL, so a query in flight would stall for it: a serving
    reader's switch (watch_current) waits for the queries in flight to end before it loads the
    changed collection, and serves the loaded generation meanwhile."""
    from mtrag_resources.serving import generations as generations_module
    monkeypatch.setattr(generations_module, "SWITCH_QUIET_WAIT_S", 60.0)  # no giving up within the test
    build()
    reader = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    in_flight, done = threading.Event(), threading.Event()
    try:
        assert reader.query("apply the regional tax", k=5)["generation"] == 1
        core = reader._core().generations  # the loaded generation and its switch
        reader.watch_current()

        def query_in_flight():
            with core.lock.shared():  # what a query holds while it reads the loaded generation
                in_flight.set()
                done.wait(60)

        holder = threading.Thread(target=query_in_flight)
        holder.start()
        in_flight.wait(10)
        _edit_tax(mtrag_env, "paced")
        build()
        time.sleep(1.0)  # many switch polls: the new generation is linked, its code shard not loaded
        assert core.manifest["generation"] == 1
        assert core._open_qdrants == [core.qdrant]  # generation 2's store is not open yet
        done.set()
        holder.join(10)
        deadline = time.monotonic() + 30
        while core.manifest["generation"] != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert core.manifest["generation"] == 2
        answer = reader.query("round to cents (paced)", k=5)
        assert answer["generation"] == 2 and any("tax.py" in h["file_path"] for h in answer["hits"])
    finally:
        done.set()
        reader.close()


def _wait(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.02)


def test_a_serving_reader_opens_a_published_version_before_the_manifest_names_it(mtrag_env, monkeypatch):
    """A serving reader's switch thread (watch_current) opens the Qdrant version a publish made as
    soon as the `qdrant-published` link names it, while the gate still reads the stores: it serves
    the loaded generation until the manifest names the version, then swaps to the store it opened.
    A version no manifest names (a refused publish) is closed once the next publish replaces it."""
    from mtrag_resources.stages import index_manifest
    real_gather = index_manifest.gather_views
    build()
    reader = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    tax = mtrag_env["pkg"] / "tax.py"
    seen: dict = {}
    try:
        assert reader.query("apply the regional tax", k=5)["generation"] == 1
        core = reader._core().generations  # the loaded generation and its switch
        reader.watch_current()

        def prefetched_now() -> bool:
            return core._prefetched is not None and core._prefetched[0] == os.path.realpath(
                settings().qdrant_published_dir)

        def gate_after_prefetch(name: str, refuse: bool = False):
            def gather(*args, **kwargs):
                # the candidate's version is made: the reader opens it and still serves the loaded one
                _wait(prefetched_now, f"the reader opens the {name} version")
                seen[name] = core._prefetched
                assert core.manifest["generation"] == reader.query("apply the regional tax", k=5)["generation"]
                if refuse:
                    raise RuntimeError("refused by the test")
                return real_gather(*args, **kwargs)
            return gather

        monkeypatch.setattr(index_manifest, "gather_views", gate_after_prefetch("second"))
        _edit_tax(mtrag_env, "prefetched")
        build()
        version, store = seen["second"][:2]
        assert load_current(settings().manifest_dir)["stores"]["qdrant_snapshot"] == version
        _wait(lambda: core.manifest["generation"] == 2, "the switch to generation 2")
        assert core.qdrant is store and core._prefetched is None
        answer = reader.query("round to cents (prefetched)", k=5)
        assert answer["generation"] == 2 and any("tax.py" in h["file_path"] for h in answer["hits"])

        def closed(name: str):
            store, folder = seen[name][1:3]
            return lambda: store not in core._open_qdrants and not Path(folder).exists()

        # a refused publish's version stays opened, unserved; the next version replaces it
        marker = "prefetched"
        for name in ("refused", "refused again"):
            monkeypatch.setattr(index_manifest, "gather_views", gate_after_prefetch(name, refuse=True))
            tax.write_text(tax.read_text().replace(f"({marker})", f"({name})"))
            marker = name
            with contextlib.suppress(Exception):
                build()
            assert load_current(settings().manifest_dir)["generation"] == 2
            assert core._prefetched is not None and core._prefetched[1] is seen[name][1]
            assert reader.query("apply the regional tax", k=5)["generation"] == 2
        _wait(closed("refused"), "the first refused version's store closed and its folder removed")

        # a manifest that names another version than the one opened (not looked at in between):
        # the switch closes the opened one and opens the manifest's
        monkeypatch.setattr(index_manifest, "gather_views", real_gather)
        monkeypatch.setattr(core, "_prefetch", lambda: None)
        tax.write_text(tax.read_text().replace(f"({marker})", "(third)"))
        build()
        _wait(lambda: core.manifest["generation"] == 3, "the switch to generation 3")
        assert core.qdrant is not seen["refused again"][1] and core._prefetched is None
        _wait(closed("refused again"), "the second refused version's store closed and its folder removed")
        answer = reader.query("round to cents (third)", k=5)
        assert answer["generation"] == 3 and any("tax.py" in h["file_path"] for h in answer["hits"])
    finally:
        reader.close()


def test_a_collection_new_in_a_prefetched_generation_is_warmed_at_the_switch(mtrag_env, monkeypatch):
    """The prefetch warms the collections the loaded manifest names; a publish that adds a source
    of another kind adds a collection, which the switch to the prefetched store warms itself."""
    from mtrag_resources.serving import generations as generations_module
    from mtrag_resources.stages import index_manifest
    sources = mtrag_env["sources"]
    both = sources.read_text()
    sources.write_text("\n".join(line for line in both.splitlines() if "shop-docs" not in line) + "\n")
    build()
    warmed: list[set] = []
    real_warm = generations_module._warm_vectors

    def recorded(qdrant, manifest, skip=frozenset()):
        names = (manifest.get("stores", {}).get("qdrant_collections") or {}).values()
        warmed.append({n for n in names if n not in skip})
        return real_warm(qdrant, manifest, skip)

    monkeypatch.setattr(generations_module, "_warm_vectors", recorded)
    reader = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    try:
        assert reader.query("apply the regional tax", k=5)["generation"] == 1
        core = reader._core().generations  # the loaded generation and its switch
        reader.watch_current()
        real_gather = index_manifest.gather_views
        opened: list = []

        def gather(*args, **kwargs):
            _wait(lambda: core._prefetched is not None, "the reader opens the new version")
            opened.append(core._prefetched[1])
            return real_gather(*args, **kwargs)

        monkeypatch.setattr(index_manifest, "gather_views", gather)
        sources.write_text(both)
        build()
        _wait(lambda: core.manifest["generation"] == 2, "the switch to generation 2")
        assert core.qdrant is opened[0]  # the prefetched store is served
        # the prefetch warmed what the loaded manifest names (no docs collection); the switch, last,
        # warmed the collection the new manifest adds
        assert len(warmed) >= 2 and all("mtrag_docs" not in w for w in warmed[:-1])
        assert "mtrag_docs" in warmed[-1]
        assert reader.query("apply the regional tax", k=5)["generation"] == 2
    finally:
        reader.close()
    assert core._prefetched is None
