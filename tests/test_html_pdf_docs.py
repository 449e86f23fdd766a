"""HTML and PDF documents in docs sources (issue #17 item 3).

HTML: the stdlib parser's text, <h1>-<h6> as sections, scripts, styles and the site's navigation and
footer dropped, code kept, entities decoded. PDF: pypdf's text layer with page numbers as locators
(each child on one page, `page` in rows, payloads, FTS rows and hits), sections from the outline or
one per page; a scanned, encrypted or corrupt PDF is skipped with its reason, its source still
builds. Every PDF here is written by the test with pypdf's writer and a hand-written content stream."""
from __future__ import annotations

import hashlib
import io
import json
import re

import pytest

from mtrag_resources.ingest import pdf as pdfmod
from mtrag_resources.ingest.chunking.docs import _parse_html, chunk_doc
from mtrag_resources.ingest.chunking.pdf import chunk_pdf, chunk_pdf_text
from mtrag_resources.ingest.inventory import BINARY, scan

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------------------ PDFs made here

def make_pdf(pages: list[list[str]], outline: list[tuple[str, int, int]] = (), password: str | None = None,
             image_pages: tuple[int, ...] = (), title: str = "") -> bytes:
    """A PDF whose page i shows the lines `pages[i]` in Helvetica (a real text layer), or only a
    1x1 grey image when i is in `image_pages`; `outline` is (title, level, 0-based page) in order;
    `password` encrypts it (RC4-128, pypdf's default) with that user password."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject, NumberObject

    w = PdfWriter()
    font = w._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica")}))
    for i, lines in enumerate(pages):
        page = w.add_blank_page(612, 792)
        stream = DecodedStreamObject()
        if i in image_pages:  # a scanned page: an image and no text operator
            image = DecodedStreamObject()
            image.set_data(b"\x80")
            image.update({NameObject("/Type"): NameObject("/XObject"), NameObject("/Subtype"): NameObject("/Image"),
                          NameObject("/Width"): NumberObject(1), NameObject("/Height"): NumberObject(1),
                          NameObject("/ColorSpace"): NameObject("/DeviceGray"),
                          NameObject("/BitsPerComponent"): NumberObject(8)})
            stream.set_data(b"q 500 0 0 700 50 50 cm /Im0 Do Q")
            resources = {NameObject("/XObject"): DictionaryObject({NameObject("/Im0"): w._add_object(image)})}
        else:
            ops = ["BT", "/F1 11 Tf", "14 TL", "72 740 Td"]
            for line in lines:
                ops.append("(" + line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ") Tj T*")
            ops.append("ET")
            stream.set_data("\n".join(ops).encode("latin-1"))
            resources = {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        page[NameObject("/Contents")] = w._add_object(stream)
        page[NameObject("/Resources")] = DictionaryObject(resources)
    parents: dict[int, object] = {}
    for heading, level, page_index in outline:
        parents[level] = w.add_outline_item(heading, page_index, parent=parents.get(level - 1))
    if title:
        w.add_metadata({"/Title": title})
    if password is not None:
        w.encrypt(password)
    buf = io.BytesIO()
    w.write(buf)
    return buf.getvalue()


MANUAL_PAGES = [
    ["Widget Manual", "This manual explains the widget toolkit for operators."],
    ["1 Installation", "Unpack the archive into the target directory before anything else.",
     "The quarterly calibration of the flux regulator happens here.",
     "1.1 Requirements", "A recent kernel and the zorblax driver are needed."],
    ["2 Usage", "Start the widget daemon with the operator console.",
     "Shut it down with the red button."],
]
MANUAL_OUTLINE = [("Widget Manual", 1, 0), ("Installation", 1, 1), ("Requirements", 2, 1), ("Usage", 1, 2)]
PAGE2_PHRASE = "quarterly calibration of the flux regulator"


def manual_pdf() -> bytes:
    return make_pdf(MANUAL_PAGES, MANUAL_OUTLINE)


def scanned_pdf() -> bytes:
    return make_pdf([[], []], image_pages=(0, 1))


def encrypted_pdf() -> bytes:
    return make_pdf([["Top secret plans for the widget."]], password="s3cret")


CORRUPT_PDF = b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n% truncated by a bad upload\n"


def children(pf):
    return [c for c in pf.chunks if c.role == "child"]


def parents(pf):
    return [c for c in pf.chunks if c.role == "parent"]


# ------------------------------------------------------------------------------ HTML

SITE = """\
<!DOCTYPE html>
<html><head><title>Widget docs &mdash; site</title>
<style>.nav { display: none }</style>
<script>window.track("<h2>not a heading</h2>");</script></head>
<body>
<nav class="topbar"><a href="/">Home</a> <a href="/blog">Blog link text</a></nav>
<div class="sphinxsidebar" role="navigation"><h3>Table of contents sidebar</h3><div>nested div</div></div>
<main>
<h1>Widget Guide</h1>
<p>Fish &amp; chips &lt;tags&gt; caf&eacute; &#8220;quoted&#8221; and&nbsp;more.</p>
<h2>Setup</h2>
<p>Install the widget.</p>
<h3>On Linux</h3>
<pre><code>$ make install &amp;&amp; widget --check
</code></pre>
<h3>On Windows</h3>
<p>Run the installer.</p>
<h2>Troubleshooting</h2>
<p>Restart the daemon.</p>
</main>
<footer>Copyright footer boilerplate 2025</footer>
<div class="footer" role="contentinfo">Built with a generator</div>
</body></html>
"""


def test_html_headings_are_nested_sections_with_titles_and_paths():
    pf = chunk_doc("d", "site/guide.html", SITE, "html")
    assert [(c.title, c.symbol) for c in parents(pf)] == [
        ("Widget Guide", "Widget Guide"),
        ("Setup", "Widget Guide > Setup"),
        ("On Linux", "Widget Guide > Setup > On Linux"),
        ("On Windows", "Widget Guide > Setup > On Windows"),
        ("Troubleshooting", "Widget Guide > Troubleshooting"),  # back up from h3 to h2
    ]
    by_symbol = {c.symbol: c for c in children(pf)}
    assert by_symbol["Widget Guide > Setup"].text == "Setup\n\nInstall the widget."
    linux = by_symbol["Widget Guide > Setup > On Linux"]
    assert "$ make install && widget --check" in linux.text  # a code block is kept, its entities decoded
    assert (linux.start_line, linux.end_line) == (13, 14) and linux.locator.startswith("site/guide.html > Widget Guide > Setup > On Linux:")
    page = next(n for n in pf.nodes if n.label == "Page")
    assert page.name == "Widget Guide"
    # each section's parent is the one above it in the heading tree
    by_id = {c.chunk_id: c for c in pf.chunks}
    assert by_id[linux.parent_id].symbol == linux.symbol and all(c.page == 0 for c in pf.chunks)


def test_html_drops_scripts_styles_navigation_and_footers():
    joined = "\n".join(c.text for c in pf_chunks(SITE))
    for gone in ("display: none", "not a heading", "window.track", "Blog link text", "Table of contents sidebar",
                 "nested div", "Copyright footer", "Built with a generator", "Widget docs"):
        assert gone not in joined, gone
    assert "Restart the daemon." in joined  # what follows the dropped blocks is kept


def pf_chunks(html: str):
    return chunk_doc("d", "x.html", html, "html").chunks


def test_html_entities_are_decoded():
    [first] = [c for c in pf_chunks(SITE) if c.role == "child" and c.symbol == "Widget Guide"]
    assert "Fish & chips <tags> café \u201cquoted\u201d and more." in first.text  # &nbsp; is a space
    assert "&amp;" not in first.text and "&eacute;" not in first.text


def test_html_without_headings_is_named_by_its_title():
    pf = chunk_doc("d", "notes/plain.htm", "<html><head><title>Release  notes</title></head>"
                                           "<body><p>Version 2 fixes the widget.</p></body></html>", "html")
    [parent] = parents(pf)
    assert parent.title == "Release notes" and children(pf)[0].text == "Version 2 fixes the widget."


# ------------------------------------------------------------------------------ PDF extraction

def test_pdf_outline_gives_sections_and_every_child_records_its_page():
    data = manual_pdf()
    pf = chunk_pdf("d", "manual.pdf", data)
    assert [(c.symbol, c.page) for c in parents(pf)] == [
        ("Widget Manual", 1), ("Installation", 2), ("Installation > Requirements", 2), ("Usage", 3)]
    assert all(c.language == "pdf" for c in pf.chunks)
    [hit] = [c for c in children(pf) if PAGE2_PHRASE in c.text]
    assert (hit.page, hit.title, hit.symbol) == (2, "Installation", "Installation")
    assert hit.locator == "manual.pdf > Installation:p. 2"
    assert hit.text.startswith("1 Installation\n")  # the heading is the whole line, its number too
    reqs = next(c for c in children(pf) if c.symbol == "Installation > Requirements")
    assert "zorblax driver" in reqs.text and reqs.page == 2
    by_id = {c.chunk_id: c for c in pf.chunks}
    assert by_id[reqs.parent_id].symbol == "Installation > Requirements"
    page_node = next(n for n in pf.nodes if n.label == "Page")
    assert page_node.content_hash == hashlib.sha256(data).hexdigest() and page_node.name == "Widget Manual"
    # every word of each page's text layer is in a child that records that page
    from pypdf import PdfReader
    for number, page in enumerate(PdfReader(io.BytesIO(data)).pages, start=1):
        on_page = " ".join(c.text for c in children(pf) if c.page == number)
        for word in page.extract_text().split():
            assert word in on_page.split(), (number, word)


def test_a_passage_never_spans_two_pages():
    long_pages = [[f"Page {p} sentence {i} about widgets and gadgets." for i in range(40)] for p in range(1, 4)]
    pf = chunk_pdf("d", "long.pdf", make_pdf(long_pages, [("Everything", 1, 0)]), max_tokens=64)
    [parent] = parents(pf)  # one outline entry: one section over three pages
    kids = children(pf)
    assert len(kids) > 6 and {c.page for c in kids} == {1, 2, 3}
    for c in kids:
        numbers = {int(n) for n in re.findall(r"Page (\d) sentence", c.text)}
        assert numbers == {c.page}, (c.page, c.text[:80])
    assert parent.page == 1 and parent.locator == "long.pdf > Everything:p. 1-3"


def test_pdf_without_outline_has_one_section_per_page_with_text():
    pf = chunk_pdf("d", "flat.pdf", make_pdf([["alpha words"], [], ["gamma words"]], image_pages=(1,),
                                             title="Flat Report"))
    assert [(c.symbol, c.page, c.text) for c in children(pf)] == [("Page 1", 1, "alpha words"),
                                                                  ("Page 3", 3, "gamma words")]
    assert next(n for n in pf.nodes if n.label == "Page").name == "Flat Report"  # the metadata title


def test_an_outline_title_missing_from_its_page_is_written_in():
    text = pdfmod.PdfText(pages=["Intro text.", "Body of the second page.\nMore body."],
                          outline=[pdfmod.OutlineEntry("Intro", 1, 0), pdfmod.OutlineEntry("Appendix", 1, 1)])
    pf = chunk_pdf_text("d", "a.pdf", text, "0" * 64)
    assert [(c.symbol, c.page, c.text) for c in children(pf)] == [
        ("Intro", 1, "Intro text."), ("Appendix", 2, "Appendix\nBody of the second page.\nMore body.")]


def test_scanned_encrypted_and_corrupt_pdfs_give_their_reasons():
    assert pdfmod.skip_reason(manual_pdf()) is None
    assert pdfmod.skip_reason(scanned_pdf()) == "no text layer (scanned?)"
    assert pdfmod.skip_reason(make_pdf([[]])) == "no text layer (scanned?)"  # an empty content stream
    assert pdfmod.skip_reason(encrypted_pdf()) == "encrypted"
    reason = pdfmod.skip_reason(CORRUPT_PDF)
    assert reason.startswith("unreadable PDF: ") and len(reason) > len("unreadable PDF: ")
    for data, why in ((scanned_pdf(), "no text layer (scanned?)"), (encrypted_pdf(), "encrypted")):
        with pytest.raises(pdfmod.PdfSkip) as caught:
            chunk_pdf("d", "x.pdf", data)
        assert caught.value.reason == why


def test_a_pdf_encrypted_with_an_empty_user_password_opens():
    """Only an owner password (permissions): readers open it without asking, and so does mtrag."""
    data = make_pdf([["Readable despite the owner password."]], password="")
    from pypdf import PdfReader
    assert PdfReader(io.BytesIO(data)).is_encrypted
    assert pdfmod.skip_reason(data) is None
    assert children(chunk_pdf("d", "owner.pdf", data))[0].text == "Readable despite the owner password."


# ------------------------------------------------------------------------------ the inventory

def _docs_folder(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "manual.pdf").write_bytes(manual_pdf())
    (root / "scanned.pdf").write_bytes(scanned_pdf())
    (root / "secret.pdf").write_bytes(encrypted_pdf())
    (root / "broken.pdf").write_bytes(CORRUPT_PDF)
    (root / "guide.html").write_text(SITE)
    (root / "image.md").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")  # still binary: NUL in the first 8 KiB
    return root


def test_inventory_takes_pdfs_in_docs_sources_only(tmp_path, monkeypatch):
    root = _docs_folder(tmp_path)
    inv = scan("d", root, ["**"], [], 10**7, kind="docs")
    got = {f.path: (f.status, f.reason) for f in inv.files}
    assert got["manual.pdf"] == ("ok", "") and got["guide.html"] == ("ok", "")
    assert got["scanned.pdf"] == ("skipped", "no text layer (scanned?)")
    assert got["secret.pdf"] == ("skipped", "encrypted")
    assert got["broken.pdf"][0] == "skipped" and got["broken.pdf"][1].startswith("unreadable PDF: ")
    assert got["image.md"] == ("skipped", BINARY)
    manual = next(f for f in inv.files if f.path == "manual.pdf")
    assert manual.sha256 == hashlib.sha256((root / "manual.pdf").read_bytes()).hexdigest()
    assert manual.category == "doc" and manual.language == "pdf"
    # unchanged files keep their verdict from the last snapshot: no PDF is opened again
    monkeypatch.setattr(pdfmod, "skip_reason", lambda data: pytest.fail("a PDF was probed again"))
    assert scan("d", root, ["**"], [], 10**7, previous=inv, kind="docs").digest == inv.digest
    # a code source reads no PDF (they are binary there), nor other binaries
    code = {f.path: (f.status, f.reason) for f in scan("c", root, ["**"], [], 10**7, kind="code").files}
    assert code["manual.pdf"] == ("skipped", pdfmod.NOT_IN_DOCS) and code["image.md"] == ("skipped", BINARY)


def test_git_docs_source_applies_the_same_rule(tmp_path):
    from mtrag_resources.ingest.git_source import GitRepository, scan_git
    from tests.test_git_source import Git
    g = Git(tmp_path / "repo")
    for name, data in (("manual.pdf", manual_pdf()), ("scanned.pdf", scanned_pdf()), ("secret.pdf", encrypted_pdf()),
                       ("bin.md", b"a\0b")):
        (g.root / name).write_bytes(data)
    g.commit("docs", {"guide.md": "# Guide\n"})
    kept: list[str] = []
    with GitRepository(g.root) as repo:
        inv, _ = scan_git("d", repo, "main", ("**",), (), 10**7, "repo", keep=lambda data, sha: kept.append(sha),
                          kind="docs")
        got = {f.path: (f.status, f.reason) for f in inv.files}
        assert got == {"bin.md": ("skipped", BINARY), "guide.md": ("ok", ""), "manual.pdf": ("ok", ""),
                       "scanned.pdf": ("skipped", "no text layer (scanned?)"), "secret.pdf": ("skipped", "encrypted")}
        assert hashlib.sha256(manual_pdf()).hexdigest() in kept  # the PDF's bytes go to the CAS
        code, _ = scan_git("c", repo, "main", ("**",), (), 10**7, "repo", kind="code")
        assert {f.path: f.reason for f in code.skipped}["manual.pdf"] == pdfmod.NOT_IN_DOCS


# ------------------------------------------------------------------------------ the stages, no stores

def test_raw_source_and_cas_chunks_report_skipped_pdfs_and_chunk_the_others(tmp_path, monkeypatch):
    from mtrag_resources.core.config import Settings
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages.cas_chunks import build_cas_chunks
    from mtrag_resources.stages.raw_source import build_raw_source
    from mtrag_resources.stores.cas import ContentStore
    root = _docs_folder(tmp_path)
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"sources:\n  - {{id: d, kind: docs, path: {root}, include: ['**']}}\n")
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "home"))
    settings = Settings(home=tmp_path / "home", sources=sources).ensure()
    [spec] = load_sources(sources)
    raw = build_raw_source(settings, spec)
    skipped = raw.metadata["skipped_documents"]
    assert set(skipped) == {"scanned.pdf", "secret.pdf", "broken.pdf"} and skipped["secret.pdf"] == "encrypted"
    assert raw.metadata["skipped_reasons"]["scanned.pdf"] == "no text layer (scanned?)"
    [warning] = [w for w in raw.metadata["skip_warnings"] if "secret.pdf" in w]
    assert warning.startswith("secret.pdf: skipped: encrypted PDF")
    assert raw.metadata["files"] == 2 and raw.metadata["by_language"] == {"pdf": 1, "html": 1}
    cas = ContentStore(settings.cas_dir)
    original = (root / "manual.pdf").read_bytes()
    assert cas.get_bytes(hashlib.sha256(original).hexdigest()) == original  # the original, byte for byte
    chunks = build_cas_chunks(settings, spec)
    assert chunks.metadata["skipped_documents"] == skipped
    rows = chunks.value
    assert {r["file_path"] for r in rows} == {"manual.pdf", "guide.html"}
    assert {r["page"] for r in rows if r["file_path"] == "guide.html"} == {0}
    [row] = [r for r in rows if r["role"] == "child" and PAGE2_PHRASE in cas.get_text(r["content_hash"])]
    assert (row["page"], row["language"], row["title"]) == (2, "pdf", "Installation")


def test_page_travels_in_the_payload_and_the_hit_only_for_pdfs():
    from mtrag_resources.serving.openapi import document
    from mtrag_resources.serving.results import Hit
    from mtrag_resources.stages.qdrant_collection import PAYLOAD_FIELDS, payload_for
    base = {k: "" for k in PAYLOAD_FIELDS} | {"graph_ids": [], "start_line": 1, "end_line": 2, "declaration": False}
    assert payload_for(base | {"page": 3})["page"] == 3
    assert "page" not in payload_for(base | {"page": 0}) and "page" not in payload_for(base)
    hit = {"rank": 1, "chunk_id": "c", "source_id": "d", "source_kind": "docs", "file_path": "m.pdf",
           "start_line": 4, "end_line": 5, "symbol": "Installation", "title": "Installation", "text": "t",
           "score": 0.5, "cosine": None, "channels": {}, "parent": None}
    pdf_hit = Hit.from_dict(hit | {"page": 2})
    assert pdf_hit.page == 2 and list(pdf_hit.to_dict())[-1] == "page" and pdf_hit["page"] == 2
    plain = Hit.from_dict(hit)
    assert plain.page is None and "page" not in plain.to_dict() and "page" not in plain
    schema = document()["components"]["schemas"]["Hit"]
    assert schema["properties"]["page"]["type"] == "integer" and "page" not in schema["required"]


def test_cas_chunks_skips_a_pdf_whose_pages_give_no_text_after_all(tmp_path, monkeypatch):
    """A PDF the snapshot took (its probe found text) but whose full extraction gives none: the stage
    lists it as skipped with its reason and indexes nothing of it; the other files are chunked."""
    from mtrag_resources.core.config import Settings
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages.cas_chunks import build_cas_chunks
    from mtrag_resources.stages.raw_source import build_raw_source
    root = tmp_path / "docs"
    root.mkdir()
    (root / "scanned.pdf").write_bytes(scanned_pdf())
    (root / "guide.html").write_text(SITE)
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"sources:\n  - {{id: d, kind: docs, path: {root}, include: ['**']}}\n")
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "home"))
    settings = Settings(home=tmp_path / "home", sources=sources).ensure()
    [spec] = load_sources(sources)
    with monkeypatch.context() as m:
        m.setattr(pdfmod, "skip_reason", lambda data: None)  # the probe is fooled
        assert build_raw_source(settings, spec).metadata["files"] == 2
    result = build_cas_chunks(settings, spec)
    assert result.metadata["skipped_documents"] == {"scanned.pdf": "no text layer (scanned?)"}
    assert {r["file_path"] for r in result.value} == {"guide.html"}
    assert "scanned.pdf: skipped: no text layer (scanned?)" in result.metadata["warnings"]
    again = build_cas_chunks(settings, spec)  # unchanged: not parsed again, still reported
    assert again.metadata["files_parsed"] == 0 and again.metadata["skipped_documents"] == {
        "scanned.pdf": "no text layer (scanned?)"}
