"""Hostile sizes (issue #58): what one input may cost stays bounded. An alias bomb in
`sources.yaml` is refused in one line naming the file and line; a minified bundle of thousands of
functions gives at most the source's `max_file_chunks` chunks; an export of more issues than the
source's `max_issues` keeps the most recently updated. A file cut says so by name (its warning, the
stage's `files_cut`, the build's output), and a good source beside it still builds and publishes.
The figures (peak RSS before and after): bench/memory.py."""
from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.chunking.code import chunk_code
from mtrag_resources.ingest.sources import SourceConfigError, load_sources
from mtrag_resources.stages.cas_chunks import build_cas_chunks
from mtrag_resources.stages.raw_source import build_raw_source
from tests.hostile_corpus import alias_bomb, github_issues, minified_js


# ------------------------------------------------------------------------------ the sources file

@pytest.mark.unit
def test_an_alias_bomb_in_sources_yaml_is_refused_in_one_line_naming_the_file_and_line(tmp_path):
    (tmp_path / "src").mkdir()
    path = tmp_path / "sources.yaml"
    # Six levels: 9**6 "lol"s, a 43 MB string where `repository` was printed from it; a ninth, gigabytes.
    path.write_text("sources:\n  - {id: good, kind: code, path: src}\n"
                    f"  - id: bomb\n    kind: code\n    path: src\n    repository: {alias_bomb(6)}\n")
    started = time.perf_counter()
    with pytest.raises(SourceConfigError) as err:
        load_sources(path)
    message = str(err.value)
    assert message.startswith(f"{path}: line 6 column ") and "aliases expand past 100,000 characters" in message
    assert "\n" not in message and time.perf_counter() - started < 5

    # an alias inside its own anchor (a recursive value) is refused too, naming its line
    path.write_text("sources:\n  - &me {id: one, kind: code, path: src, exclude: [*me]}\n")
    with pytest.raises(SourceConfigError, match=r"line 2 column \d+: alias \*me is inside its own anchor"):
        load_sources(path)


@pytest.mark.unit
def test_shared_glob_lists_stay_within_the_alias_bound_and_repository_must_be_a_string(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    globs = ", ".join(f'"pkg{i}/**/*.py"' for i in range(20))
    entries = "".join(f"  - {{id: s{i}, kind: code, path: a, include: *globs, exclude: *skip}}\n" for i in range(200))
    path = tmp_path / "sources.yaml"
    path.write_text(f"sources:\n  - {{id: first, kind: code, path: b, include: &globs [{globs}], "
                    f"exclude: &skip [\"tests/**\"]}}\n{entries}")
    specs = load_sources(path)
    assert len(specs) == 201 and specs[-1].include == specs[0].include and len(specs[-1].include) == 20

    path.write_text("sources:\n  - {id: one, kind: code, path: a, repository: [acme, shop]}\n")
    with pytest.raises(SourceConfigError, match=r"sources\[0\] id='one': repository must be a string"):
        load_sources(path)
    path.write_text("sources:\n  - {id: one, kind: code, path: a, max_file_chunks: 0}\n")
    with pytest.raises(SourceConfigError, match=r"max_file_chunks must be a positive integer"):
        load_sources(path)


# ------------------------------------------------------------------------------ one large file

@pytest.mark.unit
def test_a_minified_bundle_gives_at_most_max_chunks_and_says_where_it_was_cut():
    text = minified_js(3000)
    parsed = chunk_code("web", "dist/app.min.js", text, "javascript", max_chunks=200)
    assert len(parsed.chunks) <= 200
    # the walk stops past the limit: the rest of the file is not even extracted
    cut = [w for w in parsed.warnings if w.startswith("dist/app.min.js: cut: more than 200 definitions, over "
                                                      "max_file_chunks=200")]
    assert len(cut) == 1 and "indexed the first 100, to line 1 column " in cut[0]
    symbols = {c.symbol for c in parsed.chunks if c.chunk_type == "function"}
    assert {"dist.app.min.f0", "dist.app.min.f99"} <= symbols and "dist.app.min.f100" not in symbols
    # every node and fact left is one of a chunk that is kept
    kept = {c.chunk_id for c in parsed.chunks}
    assert all(n.chunk_id in kept for n in parsed.nodes)
    assert {c.content_hash for c in parsed.chunks} >= {r.evidence_hash for r in parsed.relations}

    # Python (ast) counts them all; a class's members stay with it
    source = "".join(f"def f{i}(a):\n    return a + {i}\n\n\n" for i in range(300))
    python = chunk_code("shop", "shop/big.py", source, "python", max_chunks=200)
    assert len(python.chunks) <= 200
    assert [w for w in python.warnings if w.startswith("shop/big.py: cut: 300 definitions, over max_file_chunks=200; "
                                                       "indexed the first 100, to line 401 column 1")]
    assert "shop.big.f99" in {c.symbol for c in python.chunks} and "shop.big.f100" not in {c.symbol for c in python.chunks}

    # a file that does not parse is windowed, and cut the same way
    windows = chunk_code("web", "dist/data.min.js", "{" + "x" * 400_000, "javascript", max_chunks=20)
    assert len(windows.chunks) == 20 and windows.chunks[0].role == "parent"
    assert [w for w in windows.warnings if w.startswith("dist/data.min.js: cut: over max_file_chunks=20 chunks")]


@pytest.mark.unit
def test_a_minified_line_of_many_definitions_is_cut_and_read_in_one_pass():
    # 40k definitions on one 1.4 MB line: each definition's text was found by slicing the rest of
    # its line (~30 GB of copies in all), and every one was extracted before any cut
    started = time.perf_counter()
    parsed = chunk_code("web", "app.min.js", minified_js(40_000), "javascript")
    assert len(parsed.chunks) <= 2000 and [w for w in parsed.warnings if ": cut: more than 2000 definitions" in w]
    assert time.perf_counter() - started < 30
    # under the limit too, a long line is read once: no definition's text is cut short
    from mtrag_resources.ingest.chunking.code_treesitter import extract_treesitter
    whole = extract_treesitter("app.min.js", minified_js(1500), "javascript", "app")
    assert len(whole.definitions) == 1500 and not whole.more_definitions
    assert whole.definitions[-1].text == "function f1499(a,b){return a*1499+b}\n"


@pytest.mark.unit
def test_an_export_past_max_issues_keeps_the_most_recently_updated_and_names_the_file(tmp_path):
    from mtrag_resources.ingest.issues import chunk_issue_export
    parsed = chunk_issue_export("tracker", "issues.json", github_issues(60), max_issues=10)
    keys = sorted({c.issue_key for c in parsed.chunks}, key=lambda k: int(k.rsplit("#", 1)[1]))
    # updated in December (n % 12 == 11) and November (n % 12 == 10), newest first, 10 of them
    assert keys == [f"acme/shop#{n}" for n in (10, 11, 22, 23, 34, 35, 46, 47, 58, 59)]
    assert [w for w in parsed.warnings if w.startswith("issues.json: cut: 60 issues over max_issues=10; indexed the "
                                                       "10 most recently updated (updated 2024-11-01T00:00:00Z or later)")]
    assert {n.qualified_name for n in parsed.nodes} == set(keys)


@pytest.mark.unit
def test_the_stage_reports_cut_files_by_name_and_a_good_file_beside_them_is_whole(tmp_path):
    web, good = tmp_path / "web", tmp_path / "good"
    web.mkdir(), good.mkdir()
    (web / "app.min.js").write_text(minified_js(2000))
    (web / "cart.js").write_text("export function total(items) {\n  return items.length;\n}\n")
    (tmp_path / "issues.json").write_text(github_issues(30))
    (tmp_path / "sources.yaml").write_text(textwrap.dedent("""\
        sources:
          - {id: web, kind: code, path: web, max_file_chunks: 50}
          - {id: tracker, kind: issues, path: issues.json, max_issues: 5}
        """))
    settings = Settings(home=tmp_path / "home", sources=tmp_path / "sources.yaml").ensure()
    specs = {s.id: s for s in load_sources(settings.sources_file)}
    meta = {}
    for sid, spec in specs.items():
        build_raw_source(settings, spec)
        meta[sid] = build_cas_chunks(settings, spec)
    web_rows = meta["web"].value
    assert sum(r["file_path"] == "app.min.js" for r in web_rows) <= 50
    assert {r["symbol"] for r in web_rows if r["file_path"] == "cart.js"} >= {"cart.total"}
    assert list(meta["web"].metadata["files_cut"]) == ["app.min.js"]
    assert meta["web"].metadata["files_cut"]["app.min.js"].startswith("app.min.js: cut: more than 50 definitions")
    assert [w for w in meta["web"].metadata["new_warnings"] if w.startswith("app.min.js: cut: ")]
    assert list(meta["tracker"].metadata["files_cut"]) == ["issues.json"]
    assert len({r["issue_key"] for r in meta["tracker"].value}) == 5

    # raising the limit parses the file again (its facts key has the limits), uncut
    (tmp_path / "sources.yaml").write_text(textwrap.dedent("""\
        sources:
          - {id: web, kind: code, path: web, max_file_chunks: 5000}
        """))
    spec = load_sources(settings.sources_file)[0]
    build_raw_source(settings, spec)
    again = build_cas_chunks(settings, spec)
    assert again.metadata["files_cut"] == {} and again.metadata["files_parsed"] == 2
    assert sum(r["file_path"] == "app.min.js" for r in again.value) > 2000


# ------------------------------------------------------------------------------ a build

@pytest.mark.integration
@pytest.mark.neo4j
def test_a_build_cuts_the_hostile_files_says_so_and_publishes_the_good_source(tmp_path, monkeypatch, neo4j_uri, capsys):
    from mtrag_assets.app.cli import main
    from mtrag_resources.publish.manifest import load_current
    from tests.conftest import use_fresh_home
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "tax.py").write_text('def compute_tax(amount):\n    """Tax on an amount."""\n    return amount * 0.2\n')
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "app.min.js").write_text(minified_js(400))
    (tmp_path / "issues.json").write_text(github_issues(12))
    sources = tmp_path / "sources.yaml"
    sources.write_text(textwrap.dedent("""\
        sources:
          - {id: shop, kind: code, path: shop}
          - {id: web, kind: code, path: web, max_file_chunks: 20}
          - {id: tracker, kind: issues, path: issues.json, max_issues: 4}
        """))
    use_fresh_home(monkeypatch, tmp_path / "home", sources, neo4j_uri)
    monkeypatch.setenv("MTRAG_BUILD_SERVER", "off")
    assert main(["build"]) == 0
    out = capsys.readouterr()
    said = out.out + out.err
    assert "app.min.js: cut: more than 20 definitions, over max_file_chunks=20" in said
    assert "issues.json: cut: 12 issues over max_issues=4" in said
    manifest = load_current(Settings.from_env().manifest_dir)
    assert set(manifest["sources"]) == {"shop", "web", "tracker"}
    for entry in manifest["sources"].values():
        assert all(v["state"] == "committed" for v in entry["stores"].values())
    assert main(["query", "--json", "--mode", "exact", "compute_tax"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits and hits[0]["source_id"] == "shop"
