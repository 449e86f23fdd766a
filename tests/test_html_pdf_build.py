"""A docs source of HTML and PDF documents built through the real pipeline (Dagster runs, Qdrant,
SQLite FTS, Neo4j): PDF hits name their page, HTML hits their section, the original PDF is in the
CAS, and the PDFs that give no text are skipped with their reasons while the source publishes.
The unit tests of the extraction and the PDFs used here are in tests/test_html_pdf_docs.py."""
from __future__ import annotations

import hashlib
import json
import time

import pytest

from tests.test_html_pdf_docs import CORRUPT_PDF, PAGE2_PHRASE, SITE, encrypted_pdf, manual_pdf, scanned_pdf

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]


@pytest.fixture
def docs_env(tmp_path, monkeypatch, neo4j_uri):
    from tests.conftest import use_fresh_home
    root = tmp_path / "manuals"
    root.mkdir()
    files = {"guide.html": SITE.encode(), "manual.pdf": manual_pdf(), "scanned.pdf": scanned_pdf(),
             "secret.pdf": encrypted_pdf(), "broken.pdf": CORRUPT_PDF}
    for name, data in files.items():
        (root / name).write_bytes(data)
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"sources:\n  - {{id: manuals, kind: docs, path: {root}, include: ['**/*']}}\n")
    home = tmp_path / "home"
    use_fresh_home(monkeypatch, home, sources, neo4j_uri)
    return {"root": root, "home": home, "files": files}


def test_html_and_pdf_documents_build_publish_and_answer_with_pages(docs_env, capsys):
    from mtrag_assets.app.cli import main
    from mtrag_assets.runner import run_build
    from mtrag_resources.core.config import Settings
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.publish.manifest import load_current
    from mtrag_resources.serving.reader import IndexReader
    from mtrag_resources.stores.cas import ContentStore
    from mtrag_resources.stores.connect import open_fts, open_qdrant
    from tests.build_helpers import latest_metadata

    settings = Settings.from_env().ensure()
    lines: list[str] = []
    t0 = time.perf_counter()
    summary = run_build(settings, load_sources(settings.sources_file), log=lines.append)
    seconds = time.perf_counter() - t0
    assert summary["built"] == ["manuals"]
    manifest = load_current(settings.manifest_dir)
    assert manifest["generation"] == 1 and set(manifest["sources"]) == {"manuals"}  # published

    # the PDFs without text are skipped with their reasons, named in both stages' metadata
    raw = latest_metadata("raw_source", "manuals")
    skipped = raw["skipped_documents"]
    assert skipped["scanned.pdf"] == "no text layer (scanned?)" and skipped["secret.pdf"] == "encrypted"
    assert skipped["broken.pdf"].startswith("unreadable PDF: ") and len(skipped) == 3
    assert latest_metadata("cas_chunks", "manuals")["skipped_documents"] == skipped
    assert raw["files"] == 2
    # ... and an encrypted one is a warning line of the build naming the file
    assert any("warning" in ln and "secret.pdf" in ln and "encrypted" in ln for ln in lines), lines
    # the original PDF, byte for byte, is in the CAS under its sha256
    original = docs_env["files"]["manual.pdf"]
    assert ContentStore(settings.cas_dir).get_bytes(hashlib.sha256(original).hexdigest()) == original

    # a phrase from page 2: the lexical hit is the PDF's, on page 2, under its outline heading
    reader = IndexReader(home=str(docs_env["home"]), log_proposals=False)
    try:
        answer = reader.query(PAGE2_PHRASE, k=5, mode="lexical")
        top = answer.hits[0]
        assert (top.file_path, top.page, top.title) == ("manual.pdf", 2, "Installation")
        assert PAGE2_PHRASE in top.text and answer.stale == []
        html = reader.query("Restart the daemon", k=5, mode="lexical").hits[0]
        assert (html.file_path, html.title, html.page) == ("guide.html", "Troubleshooting", None)
        assert html.symbol == "Widget Guide > Troubleshooting" and "page" not in html.to_dict()
        exact = reader.query("Installation", k=5, mode="exact").hits  # the heading is an exact alias
        assert any(h.file_path == "manual.pdf" and h.page == 2 for h in exact)
    finally:
        reader.close()

    # `page` travels in the Qdrant payload and the FTS row of that chunk
    with open_qdrant(settings) as q:
        assert q.payloads_for("docs", [top.chunk_id])[top.chunk_id]["page"] == 2
    fts = open_fts(settings)
    try:
        assert fts.get_chunks([top.chunk_id])[top.chunk_id]["page"] == 2
    finally:
        fts.close()

    # `query --json` carries it for the PDF hit and not for others
    capsys.readouterr()
    assert main(["query", "--json", "--mode", "lexical", "--k", "3", PAGE2_PHRASE]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["hits"][0]["page"] == 2 and printed["hits"][0]["file_path"] == "manual.pdf"
    assert main(["query", "--json", "--mode", "lexical", "--k", "1", "Restart the daemon"]) == 0
    assert "page" not in json.loads(capsys.readouterr().out)["hits"][0]

    chunks = latest_metadata("cas_chunks", "manuals")["chunks"]
    print(f"\nHTML+PDF docs source: built and published in {seconds:.1f} s, {chunks} chunks")
