"""QdrantStore against a real embedded Qdrant folder in tmp_path, once per embedded engine
(qdrant-client local mode and Qdrant Edge)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from mtrag_resources.core.models import stable_id
from mtrag_resources.stores.qdrant_store import CollectionDimMismatch, QdrantStore, collection_name, point_id
from mtrag_resources.stores.qdrant_folder import (DISK_RESERVE_ENV, ENGINE_ENV, ENGINES, QdrantDiskFull, QdrantEngineMismatch,
                                                  QdrantStoreLocked, folder_engine, link_for_reader, prune_versions,
                                                  publish_version)

pytestmark = pytest.mark.unit  # embedded Qdrant folders in tmp_path: no service, no model

DIM = 16
REPO_ROOT = Path(__file__).resolve().parents[1]


def vec(seed: int, dim: int = DIM) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def make_points(source_id: str, n: int, start: int = 0, salt: str = "") -> list[dict]:
    pts = []
    for i in range(start, start + n):
        chunk_id = stable_id(source_id, f"pkg/mod{i}.py", f"pkg.mod{i}.f", 0)
        pts.append({"chunk_id": chunk_id, "vector": vec(hash((source_id, i)) % 2**32),
                    "payload": {"file_path": f"pkg/mod{i}.py", "symbol": f"pkg.mod{i}.f",
                                "content_hash": f"h{i}{salt}", "parent_id": None,
                                "graph_ids": [f"g{i}"], "start_line": np.int64(i + 1)}})
    return pts


@pytest.fixture(params=ENGINES)
def engine(request, monkeypatch) -> str:
    """Each embedded engine in turn, through the environment, so that QdrantStore(path=...) here
    and in the subprocesses the tests start all use it."""
    monkeypatch.setenv(ENGINE_ENV, request.param)
    return request.param


@pytest.fixture()
def store(tmp_path: Path, engine: str):
    with QdrantStore(path=tmp_path / "qdrant") as s:
        assert s.engine == engine
        yield s


def test_point_id_and_collection_names() -> None:
    cid = "0123456789abcdef0123456789abcdef"
    assert point_id(cid) == "01234567-89ab-cdef-0123-456789abcdef"
    assert point_id("not-hex") == point_id("not-hex") != point_id("other")
    assert collection_name("code") == "mtrag_code"
    with pytest.raises(ValueError):
        collection_name("Code; drop")
    with pytest.raises(ValueError):
        collection_name("markers")


def test_idempotent_rewrite(store: QdrantStore) -> None:
    pts = make_points("src-a", 30)
    first = store.write_source("src-a", "code", "gen1", pts)
    assert (first["upserted"], first["deleted"], first["points"]) == (30, 0, 30)
    assert store.marker("src-a").generation == "gen1" and store.marker("src-a").committed
    again = store.write_source("src-a", "code", "gen1", pts)
    assert (again["upserted"], again["skipped"], again["deleted"], again["points"]) == (0, 30, 0, 30)
    forced = store.write_source("src-a", "code", "gen2", pts, skip_unchanged=False)
    assert (forced["upserted"], forced["points"]) == (30, 30)
    assert store.count("code", "src-a") == 30
    assert store.marker("src-a").generation == "gen2"
    info = store.collection_info("code")
    assert info["dim"] == DIM and info["points"] == 30 and info["distance"].lower() == "cosine"
    assert store.collection_info("docs") is None


def test_changed_and_deleted_chunks(store: QdrantStore) -> None:
    store.write_source("src-a", "code", "gen1", make_points("src-a", 10))
    store.write_source("src-b", "code", "gen1", make_points("src-b", 5))
    new = make_points("src-a", 8)            # chunks 8, 9 removed
    new[0]["payload"]["content_hash"] = "changed"
    stats = store.write_source("src-a", "code", "gen2", new)
    assert (stats["upserted"], stats["skipped"], stats["deleted"], stats["points"]) == (1, 7, 2, 8)
    assert store.count("code", "src-b") == 5  # other sources untouched
    gone = make_points("src-a", 10)[9]["chunk_id"]
    assert store.vectors_for("code", [gone]) == {}
    hits = store.search("code", new[0]["vector"], k=1, source_ids=["src-a"])
    assert hits[0]["payload"]["content_hash"] == "changed"


def test_interrupted_write_leaves_begin_then_converges(store: QdrantStore, monkeypatch) -> None:
    store.write_source("src-a", "code", "gen1", make_points("src-a", 10))
    real_upsert = store._upsert
    calls = {"n": 0}

    def failing_upsert(name, points):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected failure after the first batch")
        real_upsert(name, points)

    monkeypatch.setattr(store, "_upsert", failing_upsert)
    new = make_points("src-a", 12, start=5, salt="-v2")  # 5 kept ids, all changed, 7 new
    with pytest.raises(RuntimeError, match="injected"):
        store.write_source("src-a", "code", "gen2", new, batch_size=4)
    marker = store.marker("src-a")
    assert (marker.generation, marker.state) == ("gen2", "begin")
    assert not marker.committed
    monkeypatch.setattr(store, "_upsert", real_upsert)
    stats = store.write_source("src-a", "code", "gen2", new, batch_size=4)
    assert store.marker("src-a").committed
    assert stats["skipped"] == 4 and stats["upserted"] == 8 and stats["deleted"] == 5
    assert store.count("code", "src-a") == 12
    got = store.vectors_for("code", [p["chunk_id"] for p in new])
    assert len(got) == 12


def test_search_with_source_filter_and_payload_filters(store: QdrantStore) -> None:
    a = make_points("src-a", 10)
    b = make_points("src-b", 10)
    store.write_source("src-a", "code", "g", a)
    store.write_source("src-b", "code", "g", b)
    q = b[3]["vector"]
    assert store.search("code", q, k=1)[0]["chunk_id"] == b[3]["chunk_id"]
    only_a = store.search("code", q, k=5, source_ids=["src-a"])
    assert len(only_a) == 5 and all(h["payload"]["source_id"] == "src-a" for h in only_a)
    by_file = store.search("code", q, k=5, filters={"file_path": "pkg/mod3.py"})
    assert {h["payload"]["source_id"] for h in by_file} == {"src-a", "src-b"}
    by_files = store.search("code", q, k=5, source_ids=["src-a"],
                            filters={"file_path": ["pkg/mod3.py", "pkg/mod4.py"]})
    assert len(by_files) == 2
    assert store.search("code", q, source_ids=[]) == []
    assert store.search("docs", q) == []
    hit = store.search("code", q, k=1)[0]
    assert hit["payload"]["start_line"] == 4 and hit["payload"]["graph_ids"] == ["g3"]
    assert hit["payload"]["source_kind"] == "code"


def test_vectors_for_returns_the_stored_vector(store: QdrantStore) -> None:
    pts = make_points("src-a", 5)
    raw = pts[2]["vector"] * 3.0  # not unit length: cosine stores the direction
    pts[2]["vector"] = raw
    store.write_source("src-a", "code", "g", pts)
    got = store.vectors_for("code", [pts[2]["chunk_id"], "0" * 32])
    assert list(got) == [pts[2]["chunk_id"]]
    v = got[pts[2]["chunk_id"]]
    cos = float(v @ raw / (np.linalg.norm(v) * np.linalg.norm(raw)))
    assert cos == pytest.approx(1.0, abs=1e-6)
    assert store.search("code", raw, k=1)[0]["score"] == pytest.approx(1.0, abs=1e-5)


def test_dim_mismatch_is_a_clear_error(store: QdrantStore) -> None:
    store.write_source("src-a", "code", "g", make_points("src-a", 3))
    bad = [{"chunk_id": "f" * 32, "vector": vec(1, 8), "payload": {}}]
    with pytest.raises(CollectionDimMismatch, match=r"mtrag_code.*16-d.*8-d"):
        store.write_source("src-x", "code", "g", bad)
    with pytest.raises(CollectionDimMismatch):
        store.search("code", vec(1, 8))
    store.write_source("src-x", "docs", "g", bad)  # another kind, another collection
    assert store.collection_info("docs")["dim"] == 8


def test_markers_and_delete_source(store: QdrantStore) -> None:
    store.write_source("src-a", "code", "g1", make_points("src-a", 4))
    store.write_source("src-d", "docs", "g7", make_points("src-d", 3))
    markers = store.markers()
    assert set(markers) == {"src-a", "src-d"} and markers["src-d"].generation == "g7"
    assert store.marker_record("src-a")["updated_at"]
    assert store.marker("nope") is None
    assert store.delete_source("src-a") == 4
    assert store.count("code", "src-a") == 0 and store.marker("src-a") is None
    assert store.count("docs", "src-d") == 3


def test_source_changing_kind_leaves_nothing_behind(store: QdrantStore) -> None:
    store.write_source("src-a", "code", "g1", make_points("src-a", 4))
    stats = store.write_source("src-a", "docs", "g2", make_points("src-a", 2))
    assert stats["deleted"] == 4
    assert store.count("code", "src-a") == 0 and store.count("docs", "src-a") == 2


def test_reopen_sees_persisted_points(tmp_path: Path, engine: str) -> None:
    with QdrantStore(path=tmp_path / "q") as s:
        s.write_source("src-a", "code", "g1", make_points("src-a", 6))
    with QdrantStore(path=tmp_path / "q") as s:
        assert s.count("code", "src-a") == 6 and s.marker("src-a").committed


# Holds the folder until it reads a line on stdin, then writes one point of its own source and
# lets go: whoever opens the folder next sees that point only if it waited for the release.
HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from mtrag_resources.stores.qdrant_store import QdrantStore
    with QdrantStore(path={path!r}) as s:
        print("ready", flush=True)
        sys.stdin.readline()
        s.write_source("holder", "code", "h1", [{{"chunk_id": "ab" * 16, "vector": [1.0] * {dim}, "payload": {{}}}}])
""")


def _start_holder(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(root=str(REPO_ROOT), path=str(path), dim=DIM)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _release(holder: subprocess.Popen) -> int:
    if holder.poll() is None:
        holder.stdin.write("go\n")
        holder.stdin.flush()
    return holder.wait(60)


def test_second_process_waits_for_the_lock(tmp_path: Path, engine: str) -> None:
    path = tmp_path / "qdrant"
    holder = _start_holder(path)
    opened, seen = threading.Event(), {}

    def second_opener() -> None:
        try:
            with QdrantStore(path=path, lock_timeout=120) as s:
                opened.set()
                seen["holder"] = s.count("code", "holder")
                s.write_source("src-a", "code", "g", make_points("src-a", 2))
                seen["mine"] = s.count("code", "src-a")
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            seen["error"] = repr(exc)

    thread = threading.Thread(target=second_opener, daemon=True)
    thread.start()
    try:
        # While the holder keeps the folder, the second opener must not get in.
        assert not opened.wait(1.0), "a second process opened a folder another process held"
        assert holder.poll() is None
    finally:
        assert _release(holder) == 0
    thread.join(150)
    assert not thread.is_alive()
    assert seen == {"holder": 1, "mine": 2}  # it got in after the holder's last write, and wrote


def test_lock_timeout_names_the_folder(tmp_path: Path, engine: str) -> None:
    path = tmp_path / "qdrant"
    holder = _start_holder(path)
    try:
        with pytest.raises(QdrantStoreLocked, match=str(path)) as refused:
            QdrantStore(path=path, lock_timeout=0.5)
        assert "in use by another process" in str(refused.value) and "waited 0.5 s" in str(refused.value)
        assert holder.poll() is None  # refused; the holder keeps the folder and goes on
    finally:
        assert _release(holder) == 0
    with QdrantStore(path=path, lock_timeout=30) as s:
        assert s.count("code", "holder") == 1 and s.marker("holder").committed


def test_publish_version_publishes_a_readable_copy(tmp_path: Path, engine: str) -> None:
    live = tmp_path / "live"
    published = tmp_path / "pub" / "qdrant"
    with QdrantStore(path=live) as s:
        s.write_source("src-a", "code", "g1", make_points("src-a", 5))
        s.publish_snapshot(published)
        s.write_source("src-a", "code", "g2", make_points("src-a", 7))  # keeps writing
        with QdrantStore(path=published, lock_timeout=1) as reader:
            assert reader.count("code", "src-a") == 5 and reader.marker("src-a").generation == "g1"
    publish_version(live, published)  # takes the live lock itself
    publish_version(live, published)
    with QdrantStore(path=published, lock_timeout=1) as reader:
        assert reader.count("code", "src-a") == 7 and reader.marker("src-a").generation == "g2"
    assert published.is_symlink()
    versions = sorted(p.name for p in published.parent.iterdir() if ".v-" in p.name and p.is_dir())
    assert len(versions) == 2  # keep=2
    assert published.resolve().name == versions[-1]
    assert not any(p.name.endswith(".tmp") for p in published.parent.iterdir())


def test_a_publish_that_leaves_pruning_to_its_caller_keeps_every_version_until_it_prunes(tmp_path: Path,
                                                                                          engine: str) -> None:
    """publish_version(prune=False), as a build publishes before its manifest names the version:
    nothing is removed until prune_versions, which keeps the newest `keep` and the protected one."""
    live = tmp_path / "live"
    published = tmp_path / "pub" / "qdrant"

    def versions() -> list[str]:
        return sorted(p.name for p in published.parent.iterdir() if ".v-" in p.name and p.is_dir())

    with QdrantStore(path=live) as s:
        s.write_source("src-a", "code", "g1", make_points("src-a", 3))
        first = s.publish_snapshot(published, keep=2, prune=False).version
        for i in range(3):
            s.write_source("src-a", "code", f"g{i + 2}", make_points("src-a", 4 + i))
            s.publish_snapshot(published, keep=2, prune=False)
    assert len(versions()) == 4 and published.resolve().name == versions()[-1]
    assert prune_versions(published, keep=2, protect=[first]) == 1
    assert versions() == sorted([first.name, *versions()[-2:]])
    with QdrantStore(path=published, lock_timeout=1) as reader:  # the newest, whole
        assert reader.count("code", "src-a") == 6 and reader.marker("src-a").generation == "g4"
    assert prune_versions(published, keep=2) == 1 and len(versions()) == 2


def test_opening_the_same_folder_twice_in_one_process_fails_fast(store: QdrantStore) -> None:
    # Refused by the in-process check, not after waiting out lock_timeout (that error says "waited").
    with pytest.raises(QdrantStoreLocked, match="already open in this process") as refused:
        QdrantStore(path=store.path, lock_timeout=30)
    assert "waited" not in str(refused.value)
    store.write_source("src-a", "code", "g", make_points("src-a", 1))  # still usable


def test_link_for_reader_opens_privately_and_keeps_holes(tmp_path: Path, engine: str) -> None:
    live, published, private = tmp_path / "live", tmp_path / "pub" / "qdrant", tmp_path / "private"
    with QdrantStore(path=live) as s:
        s.write_source("src-a", "code", "g1", make_points("src-a", 50))
        s.publish_snapshot(published)
    private.mkdir()  # the reader links into a fresh mkdtemp()
    link_for_reader(published, private)
    with QdrantStore(path=private, lock_timeout=1) as reader:
        assert reader.count("code", "src-a") == 50 and reader.marker("src-a").committed

    def allocated(folder: Path) -> int:
        return sum(f.stat().st_blocks * 512 for f in folder.rglob("*") if f.is_file())

    # Edge preallocates sparse files; a plain copy would allocate them in full
    assert allocated(private) <= allocated(published.resolve()) * 1.2 + 65536


def test_a_sparse_copy_keeps_bytes_holes_mode_and_times(tmp_path: Path) -> None:
    """_copy_sparse (publishes and reader folders): the same bytes and size, holes and all-zero
    blocks left unallocated, the source's mode and times; an empty file and a file of one hole too."""
    import os

    from mtrag_resources.stores.qdrant_folder import _copy_sparse
    src = tmp_path / "src.mmap"
    with open(src, "wb") as f:
        f.truncate(8 << 20)  # a preallocated 8 MiB, mostly hole
        f.seek(1 << 20)
        f.write(b"\x01" * 70_000 + b"\x00" * (1 << 20) + b"\x02" * 10)  # data, 1 MiB of zeros in data, data
        f.seek((8 << 20) - 3)
        f.write(b"end")
    os.chmod(src, 0o640)
    os.utime(src, ns=(1_600_000_000_123_456_789, 1_650_000_000_987_654_321))
    dst = tmp_path / "dst.mmap"
    written = _copy_sparse(str(src), str(dst))
    assert dst.read_bytes() == src.read_bytes()
    assert 70_010 <= written <= 70_010 + 65536 * 3
    assert dst.stat().st_blocks * 512 <= (1 << 18) + 65536  # neither the hole nor the zero run written
    assert oct(dst.stat().st_mode & 0o7777) == oct(0o640)
    assert dst.stat().st_mtime_ns == src.stat().st_mtime_ns
    for name, size in (("empty", 0), ("hole", 1 << 20)):
        (tmp_path / name).write_bytes(b"")
        os.truncate(tmp_path / name, size)
        assert _copy_sparse(str(tmp_path / name), str(tmp_path / f"{name}.copy")) == 0
        assert (tmp_path / f"{name}.copy").stat().st_size == size
        assert (tmp_path / f"{name}.copy").read_bytes() == b"\x00" * size


def test_link_for_reader_leaves_the_skipped_collections_out(tmp_path: Path) -> None:
    """A serving reader that adopts a collection's loaded shard links only the others: nothing of
    the skipped one (no file, no folder) is walked into its private folder."""
    live, published = tmp_path / "live", tmp_path / "pub" / "qdrant"
    with QdrantStore(path=live, engine="edge") as s:
        s.write_source("src-a", "code", "g1", make_points("src-a", 20))
        s.write_source("src-a", "docs", "g1", make_points("src-a", 10))
        s.publish_snapshot(published)
    names = {p.name for p in published.resolve().iterdir() if p.is_dir()}
    assert len(names) >= 2
    whole, part = tmp_path / "whole", tmp_path / "part"
    whole.mkdir()
    part.mkdir()
    link_for_reader(published, whole)
    skipped = sorted(names)[0]
    link_for_reader(published, part, skip={skipped})

    def tree(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*")}

    assert tree(part) == {rel for rel in tree(whole) if rel.split("/", 1)[0] != skipped}
    assert not (part / skipped).exists() and tree(part)


def test_opening_a_folder_with_the_other_engine_names_it(tmp_path: Path) -> None:
    for built, other in (ENGINES, ENGINES[::-1]):
        path = tmp_path / built
        with QdrantStore(path=path, engine=built) as s:
            s.write_source("src-a", "code", "g", make_points("src-a", 2))
        assert folder_engine(path) == built
        with pytest.raises(QdrantEngineMismatch, match=rf"{path}.*{built!r}.*{ENGINE_ENV}={built}"):
            QdrantStore(path=path, engine=other, lock_timeout=1)
        with QdrantStore(path=path, engine=built, lock_timeout=1) as s:  # the lock was released
            assert s.count("code") == 2


def test_local_folder_without_engine_file_is_local(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with QdrantStore(path=path, engine="local") as s:
        s.write_source("src-a", "code", "g", make_points("src-a", 2))
    (path / "engine.json").unlink()  # as written before stores recorded their engine
    assert folder_engine(path) == "local"
    with pytest.raises(QdrantEngineMismatch):
        QdrantStore(path=path, engine="edge", lock_timeout=1)


def test_engines_return_the_same_exact_results(tmp_path: Path) -> None:
    sources = {f"src-{i}": make_points(f"src-{i}", 60) for i in range(3)}
    stores = [QdrantStore(path=tmp_path / e, engine=e) for e in ENGINES]
    try:
        for s in stores:
            for sid, pts in sources.items():
                s.write_source(sid, "code", "g", pts)
            s.delete_source("src-2")  # deleted points must not come back in either engine
        for seed in range(10):
            q = vec(1000 + seed)
            for kw in ({}, {"source_ids": ["src-1"]}, {"filters": {"file_path": ["pkg/mod3.py"]}}):
                local, edge = (s.search("code", q, k=25, **kw) for s in stores)
                assert [h["chunk_id"] for h in local] == [h["chunk_id"] for h in edge]
                assert [h["score"] for h in local] == pytest.approx([h["score"] for h in edge],
                                                                     abs=1e-5)
                assert [h["payload"] for h in local] == [h["payload"] for h in edge]
    finally:
        for s in stores:
            s.close()


def _digests(folder: Path) -> dict[str, str]:
    import hashlib
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _points_384(source_id: str, n: int, start: int = 0) -> list[dict]:
    rng = np.random.default_rng(abs(hash(source_id)) % 2**32 + start)
    vectors = rng.standard_normal((n, 384)).astype(np.float32)
    return [{"chunk_id": stable_id(source_id, f"m{i}.py", f"m{i}.f", 0), "vector": vectors[i - start],
             "payload": {"file_path": f"m{i}.py", "text": "x" * 300}} for i in range(start, start + n)]


def test_a_publish_writes_what_changed_and_shares_the_rest(tmp_path: Path) -> None:
    """Edge, with enough 384-d points that the first publish's optimize indexes them into an
    immutable segment: the second version hard-links every file a one-point change did not touch,
    writes a small fraction of the first version's bytes, and each version reads as published."""
    live, published = tmp_path / "live", tmp_path / "pub" / "qdrant"
    with QdrantStore(path=live, engine="edge") as s:
        for sid in ("src-a", "src-b"):
            s.write_source(sid, "code", "g1", _points_384(sid, 3500))
        first = s.publish_snapshot(published, keep=3)
        changed = _points_384("src-a", 3499) + _points_384("src-a", 1, start=9000)
        s.write_source("src-a", "code", "g2", changed)
        second = s.publish_snapshot(published, keep=3)
    assert first.files_linked == 0 and first.files_copied > 0
    assert second.files_linked > 0 and second.bytes_linked > first.bytes_written / 2
    assert second.bytes_written < first.bytes_written / 10, (first, second)
    for version, generation in ((first.version, "g1"), (second.version, "g2")):
        with QdrantStore(path=version, lock_timeout=1) as reader:
            assert reader.count("code", "src-a") == 3500 and reader.marker("src-a").generation == generation
            assert reader.count("code", "src-b") == 3500
    new_point = changed[-1]
    with QdrantStore(path=second.version, lock_timeout=1) as reader:
        assert [h["chunk_id"] for h in reader.search("code", new_point["vector"], k=1)] == [new_point["chunk_id"]]
    with QdrantStore(path=first.version, lock_timeout=1) as reader:
        assert new_point["chunk_id"] not in {h["chunk_id"] for h in reader.search("code", new_point["vector"], k=5)}
    # a reader's private folder links the version; opening and searching it changes no shared file
    before = _digests(second.version)
    private = tmp_path / "private"
    private.mkdir()
    link_for_reader(second.version, private)
    with QdrantStore(path=private, lock_timeout=1) as reader:
        reader.search("code", new_point["vector"], k=10, source_ids=["src-a"])
        assert reader.count("code") == 7000
    assert _digests(second.version) == before
    assert any(p.stat().st_nlink > 1 for p in private.rglob("*") if p.is_file()), "nothing was linked"


def test_a_full_disk_refuses_the_write_before_it_starts(tmp_path: Path, engine: str, monkeypatch) -> None:
    path = tmp_path / "qdrant"
    with QdrantStore(path=path) as s:
        s.write_source("src-a", "code", "g1", make_points("src-a", 5))
        import shutil
        free_mb = shutil.disk_usage(path).free / 2**20
        monkeypatch.setenv(DISK_RESERVE_ENV, str(free_mb + 1024))  # as if the disk were full
        with pytest.raises(QdrantDiskFull, match=rf"the disk is full .*{path}"):
            s.write_source("src-a", "code", "g2", make_points("src-a", 7))
        with pytest.raises(QdrantDiskFull):
            s.publish_snapshot(tmp_path / "pub" / "qdrant")
        monkeypatch.delenv(DISK_RESERVE_ENV)
        assert s.marker("src-a").generation == "g1" and s.marker("src-a").committed
        assert s.count("code", "src-a") == 5
    assert not (tmp_path / "pub" / "qdrant").exists()


def _one_shot_readers(published: Path, home: Path, n: int = 1) -> list[Path]:
    """`n` readers open at once, each in a process of its own that exits without closing, as
    `mtrag query` does; their private folders."""
    code = textwrap.dedent(f"""
        import os, sys
        from mtrag_resources.core.config import Settings
        from mtrag_resources.stores.connect import open_published_qdrant
        store, private = open_published_qdrant(Settings(home={str(home)!r}), {str(published)!r})
        assert store.count("code", "src-a") == 5
        print(private, flush=True)
        sys.stdin.read()  # until the test lets them all go
        os._exit(0)
        """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    folders = [Path(p.stdout.readline().strip()) for p in procs]
    for p in procs:
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    return folders


def test_the_next_reader_of_a_version_takes_a_one_shot_readers_folder_over(tmp_path: Path, engine: str) -> None:
    """A one-shot reader's private folder, whole and opened, is renamed to the next reader of the
    same version instead of being removed while a new one is linked; folders of a reader killed
    before its open finished (no version mark) or of another version are removed, and at most
    IDLE_READERS_KEPT idle ones stay."""
    import time

    from mtrag_resources.core.config import Settings
    from mtrag_resources.stores import connect

    live, published = tmp_path / "live", tmp_path / "pub" / "qdrant"
    with QdrantStore(path=live) as s:
        s.write_source("src-a", "code", "g1", make_points("src-a", 5))
        s.publish_snapshot(published)
    home = tmp_path / "home"
    [left] = _one_shot_readers(published, home)
    assert left.is_dir() and Path(f"{left}.mtrag-version").read_text() == published.resolve().name
    inode = left.stat().st_ino
    torn = left.parent / f"{left.name.split('-')[0]}-torn"  # the same dead pid, killed mid-open: no mark
    (torn / "segments").mkdir(parents=True)
    store, private = connect.open_published_qdrant(Settings(home=home), str(published))
    try:
        assert Path(private).stat().st_ino == inode and Path(private).name.split("-", 1)[1] == left.name.split("-", 1)[1]
        assert not left.exists() and not Path(f"{left}.mtrag-version").exists()
        assert store.count("code", "src-a") == 5
        deadline = time.monotonic() + 10
        while torn.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not torn.exists()  # never taken: it may be half linked
    finally:
        store.close()
    connect.remove_reader_folder(private)
    # idle folders beyond IDLE_READERS_KEPT, and those of a version no longer published, go
    idle = _one_shot_readers(published, home, connect.IDLE_READERS_KEPT + 1)
    assert len(set(idle)) == len(idle) and all(p.is_dir() for p in idle)
    connect._remove_dead_readers(idle[0].parent, published.resolve().name)
    assert sum(p.exists() for p in idle) == connect.IDLE_READERS_KEPT
    connect._remove_dead_readers(idle[0].parent, "qdrant.v-another")
    assert not any(p.exists() for p in idle) and not list(idle[0].parent.glob("*.mtrag-*"))


def test_a_reader_removes_dead_readers_folders_and_keeps_live_ones(tmp_path: Path, engine: str) -> None:
    """A one-shot reader (`mtrag query`) exits without removing its private folder; the next
    reader removes it (in the background) and leaves alone the folders of readers still alive."""
    import time

    from mtrag_resources.core.config import Settings
    from mtrag_resources.stores.connect import open_published_qdrant

    live, published = tmp_path / "live", tmp_path / "pub" / "qdrant"
    with QdrantStore(path=live) as s:
        s.write_source("src-a", "code", "g1", make_points("src-a", 5))
        s.publish_snapshot(published)
    readers = published.parent / ".readers"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = readers / f"{dead_pid}-left"
        (dead / "segments" / "s1").mkdir(parents=True)
        (dead / "segments" / "s1" / "data").write_bytes(b"x" * 100)
        Path(f"{dead}.mtrag.lock").write_text("")
        kept = readers / f"{alive.pid}-open"
        kept.mkdir()
        store, private = open_published_qdrant(Settings(home=tmp_path / "home"), str(published))
        try:
            assert store.count("code", "src-a") == 5
            deadline = time.monotonic() + 10
            while (dead.exists() or Path(f"{dead}.mtrag.lock").exists()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not dead.exists() and not Path(f"{dead}.mtrag.lock").exists()
            assert kept.is_dir() and Path(private).is_dir()
        finally:
            store.close()
    finally:
        alive.kill()
        alive.wait()


def test_an_edge_shard_is_flushed_again_only_after_an_update(tmp_path: Path) -> None:
    """A publish flushes every collection: one with no update since its last flush is skipped, and
    every kind of update (upsert, delete, payload index, an optimize that changed segments) makes
    the next flush run; an optimize that found nothing to do does not."""
    from types import SimpleNamespace

    from qdrant_client import models

    from mtrag_resources.stores.qdrant_edge_client import EdgeClient

    class Counting:  # the real shard, its flushes counted; what its optimizer reports is set here
        def __init__(self, shard):
            self.shard, self.flushes, self.optimized = shard, 0, True

        def flush(self):
            self.flushes += 1
            self.shard.flush()

        def optimize(self):
            self.shard.optimize()
            return self.optimized

        def __getattr__(self, name):
            return getattr(self.shard, name)

    (tmp_path / "q").mkdir()
    client = EdgeClient(tmp_path / "q")
    client.create_collection("c", SimpleNamespace(size=DIM, distance="Cosine"))
    shard = client._shards["c"] = Counting(client._shards["c"])
    client.flush("c")
    client.flush("c")
    assert shard.flushes == 1
    point = SimpleNamespace(id=1, vector=[1.0] * DIM, payload={"k": "v"})
    for update in (lambda: client.upsert("c", [point]),
                   lambda: client.create_payload_index("c", "k", "keyword"),
                   lambda: client.delete("c", models.PointIdsList(points=[1])),
                   lambda: client.upsert("c", [point]),
                   lambda: client.optimize("c")):
        before = shard.flushes
        update()
        client.flush("c")
        client.flush("c")
        assert shard.flushes == before + 1
    shard.optimized = False  # nothing to vacuum or index: the segments are as they were
    client.optimize("c")
    client.flush("c")
    assert shard.flushes == before + 1
    client._shards["c"] = shard.shard
    client.close()
    # what the flushes made durable: a new client of the folder sees the point
    reopened = EdgeClient(tmp_path / "q")
    try:
        assert reopened.count("c").count == 1
    finally:
        reopened.close()


def test_a_collection_indexes_only_the_source_and_loses_the_retired_indexes_on_its_next_write(
        tmp_path: Path, monkeypatch) -> None:
    """Edge loads every payload index with the shard (a serving reader's switch holds the GIL for
    it): a new collection indexes source_id alone; one made with the retired file_path and
    source_kind indexes drops them on its next write and still filters by them, by scanning."""
    from mtrag_resources.stores.qdrant_store import KEYWORD_FIELDS, RETIRED_FIELDS

    monkeypatch.setenv(ENGINE_ENV, "edge")
    name = collection_name("code")
    with QdrantStore(path=tmp_path / "new") as store:
        store.write_source("src-a", "code", "g1", make_points("src-a", 5))
        assert set(store.client.get_collection(name).payload_schema) == set(KEYWORD_FIELDS) == {"source_id"}

    with QdrantStore(path=tmp_path / "old") as store:
        store.write_source("src-a", "code", "g1", make_points("src-a", 5))
        for field in RETIRED_FIELDS:  # as a collection made before they were retired
            store.client.create_payload_index(name, field, store._models.PayloadSchemaType.KEYWORD)
        assert set(store.client.get_collection(name).payload_schema) == {"source_id", *RETIRED_FIELDS}
    with QdrantStore(path=tmp_path / "old") as store:
        store.search("code", vec(1), k=3)  # a read leaves them
        assert set(store.client.get_collection(name).payload_schema) == {"source_id", *RETIRED_FIELDS}
        points = make_points("src-a", 6)
        store.write_source("src-a", "code", "g2", points)
        assert set(store.client.get_collection(name).payload_schema) == {"source_id"}
        store.publish_snapshot(tmp_path / "published")
        hits = store.search("code", points[2]["vector"], k=3, filters={"file_path": "pkg/mod2.py"})
        assert [h["chunk_id"] for h in hits] == [points[2]["chunk_id"]]
    # a build that only deletes drops them when it publishes
    with QdrantStore(path=tmp_path / "old") as store:
        docs = collection_name("docs")
        store.write_source("src-d", "docs", "g3", make_points("src-d", 3))
        store.client.create_payload_index(docs, "file_path", store._models.PayloadSchemaType.KEYWORD)
    with QdrantStore(path=tmp_path / "old") as store:
        assert store.write_source_delta("src-d", "docs", "g4", "g3", {"docs": ([], [])}) is not None
        assert "file_path" in store.client.get_collection(docs).payload_schema
        store.publish_snapshot(tmp_path / "published")
        assert set(store.client.get_collection(docs).payload_schema) == {"source_id"}
    # a reader of the published version opens it without them
    private = tmp_path / "private"
    link_for_reader(tmp_path / "published", private)
    with QdrantStore(path=private) as reader:
        assert set(reader.client.get_collection(name).payload_schema) == {"source_id"}
        assert reader.count("code", "src-a") == 6
