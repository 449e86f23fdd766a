"""What `mtrag build` leaves behind (issue #58): no new generation when only a failing source
"changed", the disk of removed sources and of a mostly free FTS file given back (while a reader
holds it open), one line for a build stopped by SIGTERM or Ctrl-C, and MTRAG_HOME never walked as
part of a source. Real builds through the installed `mtrag` console script in a temp home."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.publish.manifest import load_current

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))


def mtrag(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([MTRAG, *args], env=dict(os.environ), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def built(out: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return out


def manifests(settings: Settings) -> list[str]:
    return sorted(p.name for p in settings.manifest_dir.glob("manifest-*.json"))


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_failing_source_alone_publishes_no_copy_of_the_generation(mtrag_env):
    settings = Settings.from_env()
    built(mtrag("build"))
    docs = mtrag_env["docs"]
    docs.rename(docs.with_name("moved-away"))
    for args in (["build"], ["build"], ["build", "--source", "shop-docs"]):
        out = mtrag(*args)
        assert out.returncode == 1, (args, out.stdout[-3000:], out.stderr[-3000:])
        assert "source id='shop-docs': path 'shop-docs': does not exist" in out.stderr, out.stderr
        assert "mtrag: not built: ['shop-docs'] (see above)" in out.stderr
        assert "Traceback" not in out.stderr
        assert "nothing else changed since the published generation" in out.stdout, out.stdout[-3000:]
        assert manifests(settings) == ["manifest-1.json"] and load_current(settings.manifest_dir)["generation"] == 1
    docs.with_name("moved-away").rename(docs)
    assert "nothing changed since the published generation" in built(mtrag("build")).stdout


@pytest.mark.integration
@pytest.mark.neo4j
def test_removed_sources_and_a_mostly_free_fts_file_are_reclaimed_under_a_reader(mtrag_env):
    from mtrag_resources.serving.reader import IndexReader
    settings = Settings.from_env()
    built(mtrag("build"))
    folders = [settings.raw_dir / "shop-docs", settings.cas_dir / "tables" / "shop-docs",
               settings.graph_dir / "shop-docs"]
    assert all(f.is_dir() for f in folders)
    # free pages as a removed large source leaves them: SQLite reuses them, never gives them back
    with sqlite3.connect(settings.fts_path) as db:
        db.execute("CREATE TABLE junk(x)")
        db.executemany("INSERT INTO junk VALUES (?)", [("x" * 4000,)] * 2000)
        db.commit()
        db.execute("DROP TABLE junk")
        db.commit()
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    bloated = settings.fts_path.stat().st_size
    assert bloated > 8_000_000
    reader = IndexReader(home=str(settings.home))  # holds the FTS file open across the build
    try:
        assert reader.query("apply tax", k=3, mode="lexical")["hits"]
        mtrag_env["sources"].write_text(
            "sources:\n  - {id: shop, kind: code, path: shop, include: [\"src/**/*.py\"]}\n")
        out = built(mtrag("build"))
        lines = out.stdout.splitlines()
        said = [ln for ln in lines if ln.startswith("[publish] reclaimed ")]
        assert len(said) == 1, lines
        assert "of removed sources' build folders ['shop-docs']" in said[0] and " of the FTS file (" in said[0]
        assert not any(f.exists() for f in folders)
        assert (settings.raw_dir / "shop").is_dir() and (settings.graph_dir / "shop").is_dir()
        assert settings.fts_path.stat().st_size < bloated / 10
        with sqlite3.connect(settings.fts_path) as db:
            assert db.execute("PRAGMA freelist_count").fetchone()[0] == 0
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        hits = reader.query("apply tax", k=3, mode="lexical")["hits"]  # the same reader, after the VACUUM
        assert hits and {h["source_id"] for h in hits} == {"shop"}
    finally:
        reader.close()
    assert "reclaimed" not in built(mtrag("build")).stdout  # nothing left to give back


def _stop_build(sig: int, after: str) -> tuple[int, str, str]:
    """`mtrag build` sent `sig` once its output shows `after`."""
    proc = subprocess.Popen([MTRAG, "build"], env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(after):
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=300)
    return proc.returncode, "".join(seen) + out, err


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_build_stopped_by_sigterm_or_ctrl_c_says_so_in_one_line(mtrag_env):
    code, out, err = _stop_build(signal.SIGTERM, "[shop] cas_chunks ...")
    assert code == 143, (out[-3000:], err[-3000:])
    assert err.splitlines() == ["mtrag: build interrupted (SIGTERM); nothing was published; the next "
                                "`mtrag build` converges what this one left"], err[-3000:]
    built(mtrag("build"))
    (mtrag_env["pkg"] / "tax.py").write_text((mtrag_env["pkg"] / "tax.py").read_text() + "\nEXTRA = 1\n")
    code, out, err = _stop_build(signal.SIGINT, "[shop] embedding_cache ...")
    assert code == 130, (out[-3000:], err[-3000:])
    assert err.splitlines() == ["mtrag: build interrupted (SIGINT); generation 1 is still the one served; the "
                                "next `mtrag build` converges what this one left"], err[-3000:]
    assert load_current(Settings.from_env().manifest_dir)["generation"] == 1
    assert "built ['shop']" in built(mtrag("build")).stdout  # the interrupted source is built again


@pytest.mark.integration
@pytest.mark.neo4j
def test_mtrag_home_inside_a_source_is_not_walked_and_a_source_of_its_output_is_refused(mtrag_env, monkeypatch):
    home = mtrag_env["docs"] / "mtrag-home"  # the default home, data/, inside the repository indexed
    monkeypatch.setenv("MTRAG_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster_home"))
    home.mkdir()
    (home / "notes.md").write_text("# Notes\n\nA page in the home must never be indexed.\n")
    docs_files = sorted(p.name for p in mtrag_env["docs"].iterdir() if p.is_file())
    out = built(mtrag("build"))
    assert f"source 'shop-docs': MTRAG_HOME ({home}) is inside its folder, at 'mtrag-home': not walked" \
        in out.stdout, out.stdout[-3000:]
    manifest = load_current(Settings.from_env().manifest_dir)
    assert manifest["sources"]["shop-docs"]["counts"]["files"] == len(docs_files)
    (home / "notes.md").write_text("# Notes\n\nChanged.\n")
    assert "nothing changed since the published generation" in built(mtrag("build")).stdout
    (home / "kept").mkdir()  # a user's folder kept in the home, as the demo's data/samples
    (home / "kept" / "guide.md").write_text("# Guide\n\nA page of the user's own, kept in the home.\n")
    mtrag_env["sources"].write_text(mtrag_env["sources"].read_text()
                                    + "  - {id: own, kind: docs, path: shop-docs/mtrag-home}\n"
                                    + "  - {id: own-stage, kind: docs, path: shop-docs/mtrag-home/02-cas}\n"
                                    + "  - {id: kept, kind: docs, path: shop-docs/mtrag-home/kept}\n")
    out = mtrag("build")
    assert out.returncode == 1, (out.stdout[-3000:], out.stderr[-3000:])
    assert (f"source id='own': path 'shop-docs/mtrag-home': is MTRAG_HOME ({home.resolve()}): mtrag's own output, "
            "not a source") in out.stderr, out.stderr
    assert (f"source id='own-stage': path 'shop-docs/mtrag-home/02-cas': lies in {(home / '02-cas').resolve()}, "
            "a folder of MTRAG_HOME that mtrag writes") in out.stderr, out.stderr
    manifest = load_current(Settings.from_env().manifest_dir)
    assert manifest["generation"] == 2 and manifest["sources"]["kept"]["counts"]["files"] == 1
    assert "own" not in manifest["sources"] and "own-stage" not in manifest["sources"]


@pytest.mark.integration
@pytest.mark.neo4j
def test_cas_blobs_no_source_names_go_in_two_sweeps_and_every_build_input_stays(mtrag_env):
    import hashlib
    import json
    import time
    from mtrag_resources.publish import cas_sweep
    from mtrag_resources.stores.cas import ContentStore
    settings = Settings.from_env()
    cas = ContentStore(settings.cas_dir)
    built(mtrag("build"))
    tax = mtrag_env["pkg"] / "tax.py"
    old_bytes = tax.read_bytes()
    old_digest = hashlib.sha256(old_bytes).hexdigest()
    assert cas.has(old_digest)
    tax.write_text(tax.read_text() + '\n\ndef swept_away(x):\n    """Only here to be edited."""\n    return x\n')
    built(mtrag("build"))  # the old bytes (and the texts of the chunks that changed) are named by nothing now

    first = built(mtrag("build"))  # nothing changed: the first sweep records, deletes nothing
    assert "nothing changed" in first.stdout and "CAS blobs" not in first.stdout
    recorded = json.loads(cas_sweep.candidates_path(settings).read_text())
    assert old_digest in recorded["digests"] and cas.has(old_digest)
    live = cas_sweep.live_digests(settings, cas_sweep.built_sources(settings))
    assert not live & set(recorded["digests"])

    # before GRACE_S nothing more happens; after it, what is still unreferenced goes
    assert cas_sweep.sweep(settings)["swept"] is False and cas.has(old_digest)
    done = cas_sweep.sweep(settings, now=time.time() + cas_sweep.GRACE_S + 1)
    assert done["swept"] and done["deleted"] >= 1 and done["bytes"] > 0
    assert not cas.has(old_digest) and all(cas.has(d) for d in live)

    # every build input is still there: a forced full rebuild reads each file's and chunk's blob
    forced = built(mtrag("build", "--force"))
    assert "published generation" in forced.stdout
    out = json.loads(built(mtrag("query", "swept_away", "--json")).stdout)
    assert out["hits"][0]["symbol"].endswith("swept_away")
    tax.write_bytes(old_bytes)  # the old content back: its blob is written again
    built(mtrag("build"))
    assert cas.has(old_digest)
