"""Git sources (`git:` + `ref:`): a local repository indexed at the commit its ref names, read from
git objects (never the work tree), rebuilt by the changed paths of a tree diff.

Every repository here is made by the test with the `git` binary. The unit tests read it through
mtrag_resources/ingest/git_source.py and the snapshot; the integration tests build it through the
real pipeline (Dagster runs, Qdrant, SQLite FTS, Neo4j) and query it with the reader."""
from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.ingest import git_source
from mtrag_resources.ingest.git_source import GitError, GitRepository, scan_git
from mtrag_resources.ingest.inventory import Inventory
from mtrag_resources.ingest.snapshot import scan_source, source_problem
from mtrag_resources.ingest.sources import SourceConfigError, load_sources
from tests.corpus import CART_PY, RATES_PY, TAX_PY


class Git:
    """A repository made with the git binary, at `root`."""

    def __init__(self, root: Path, branch: str = "main"):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self("init", "-q", "-b", branch)

    def __call__(self, *args: str) -> str:
        proc = subprocess.run(["git", "-C", str(self.root), "-c", "user.email=t@example.com", "-c", "user.name=t",
                               "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
                              check=True, capture_output=True, text=True)
        return proc.stdout.strip()

    def write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def commit(self, message: str, files: dict[str, str] | None = None) -> str:
        for rel, text in (files or {}).items():
            self.write(rel, text)
        self("add", "-A")
        self("commit", "-qm", message)
        return self("rev-parse", "HEAD")


def _counting(repo: GitRepository) -> list[str]:
    """The blobs `repo.read` returns from now on, in order."""
    seen: list[str] = []
    read = repo.read

    def counted(blob: str) -> bytes:
        seen.append(blob)
        return read(blob)

    repo.read = counted
    return seen


@pytest.fixture
def repo(tmp_path) -> Git:
    """main: one commit (c1), tag v1 (lightweight) and v1-notes (annotated) on it; then c2 on main
    (tax.py edited, old.py renamed to new.py unchanged, gone.md deleted, added.md added); branch
    dev from c1 with one commit of its own."""
    g = Git(tmp_path / "repo")
    g.c1 = g.commit("one", {"pkg/tax.py": TAX_PY, "pkg/rates.py": RATES_PY, "pkg/old.py": CART_PY,
                            "docs/gone.md": "# Gone\n\nThis page is deleted later.\n",
                            "docs/guide.md": "# Guide\n\nHow to use it.\n",
                            ".venv/lib/site.py": "X = 1\n", "notes.bin.py": "a\0b\n"})
    g("tag", "v1")
    g("tag", "-a", "v1-notes", "-m", "annotated")
    g("checkout", "-q", "-b", "dev")
    g.dev = g.commit("dev work", {"pkg/dev_only.py": "def dev_feature():\n    return 'dev'\n"})
    g("checkout", "-q", "main")
    g.write("pkg/tax.py", TAX_PY.replace("Apply the regional tax", "Apply the regional sales tax"))
    g("mv", "pkg/old.py", "pkg/new.py")
    g("rm", "-q", "docs/gone.md")
    g.write("docs/added.md", "# Added\n\nNew page.\n")
    g.c2 = g.commit("two")
    return g


# ---------------------------------------------------------------------------------- unit: reading


@pytest.mark.unit
def test_refs_resolve_branches_tags_and_shas_to_commits(repo):
    with GitRepository(repo.root) as r:
        assert r.resolve("main") == r.resolve("refs/heads/main") == r.resolve("HEAD") == repo.c2
        assert r.resolve("dev") == repo.dev
        assert r.resolve("v1") == repo.c1
        assert r.resolve("v1-notes") == repo.c1            # an annotated tag peels to its commit
        assert r.resolve(repo.c1) == repo.c1                # a full sha
        assert r.resolve(repo.dev[:10]) == repo.dev         # an abbreviated one
        with pytest.raises(GitError, match="ref 'no-such-branch' not found"):
            r.resolve("no-such-branch")
        with pytest.raises(GitError, match="not found"):
            r.resolve("0" * 40)                             # well-formed, but no such commit
        for bad in ("main..dev", "HEAD~1", "../../config", "-x", "a b"):
            with pytest.raises(GitError, match="not a valid ref name"):
                r.resolve(bad)
        blob = repo("rev-parse", "HEAD:docs/guide.md")
        repo("tag", "blob-tag", blob)
        with pytest.raises(GitError, match="names a blob, not a commit"):
            r.resolve("blob-tag")


@pytest.mark.unit
def test_a_folder_that_is_no_repository_is_refused(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(GitError, match="is not a git repository"):
        GitRepository(tmp_path / "plain")
    with pytest.raises(GitError, match="does not exist"):
        GitRepository(tmp_path / "missing")


@pytest.mark.unit
def test_tree_listing_applies_include_exclude_and_skips_what_folders_skip(repo):
    with GitRepository(repo.root) as r:
        everything = [f.path for f in r.files(repo.c2)]
        assert everything == ["docs/added.md", "docs/guide.md", "notes.bin.py", "pkg/new.py", "pkg/rates.py",
                              "pkg/tax.py"]  # .venv/ never; path order
        assert [f.path for f in r.files(repo.c2, include=["pkg/**/*.py"], exclude=["**/rates.py"])] == \
            ["pkg/new.py", "pkg/tax.py"]
        assert [f.path for f in r.files(repo.c1, include=["docs/*.md"])] == ["docs/gone.md", "docs/guide.md"]
        blob = {f.path: f.blob for f in r.files(repo.c2)}["pkg/tax.py"]
        assert blob == repo("rev-parse", "HEAD:pkg/tax.py")
        assert r.read(blob).decode() == TAX_PY.replace("Apply the regional tax", "Apply the regional sales tax")


@pytest.mark.unit
def test_tree_diff_reports_modify_rename_delete_add(repo):
    with GitRepository(repo.root) as r:
        seen = _counting(r)
        changes = sorted(r.diff(repo.c1, repo.c2), key=lambda c: (c.new_path or c.old_path))
        assert [(c.kind, c.old_path, c.new_path) for c in changes] == [
            ("add", None, "docs/added.md"), ("delete", "docs/gone.md", None),
            ("rename", "pkg/old.py", "pkg/new.py"), ("modify", "pkg/tax.py", "pkg/tax.py")]
        rename = changes[2]
        assert rename.old_blob == rename.new_blob
        assert seen == []  # a diff reads trees only: no blob is read to find an exact rename


@pytest.mark.unit
def test_the_snapshot_is_the_commit_not_the_work_tree_and_rereads_only_changed_paths(repo, tmp_path):
    include, exclude = ("**/*",), ()
    with GitRepository(repo.root) as r:
        seen = _counting(r)
        first, stats = scan_git("s", r, "v1", include, exclude, 10_000, "repo")
        assert stats.mode == "full" and first.commit == repo.c1 and first.ref == "v1"
        ok = {f.path: f for f in first.included}
        assert set(ok) == {"docs/gone.md", "docs/guide.md", "pkg/old.py", "pkg/rates.py", "pkg/tax.py"}
        assert {f.path: f.reason for f in first.skipped} == {"notes.bin.py": git_source.BINARY}
        assert len(seen) == 6  # five files and the binary one
        assert all(f.blob for f in first.files)

        # The same commit: the previous snapshot as it is, not one blob read.
        seen.clear()
        again, stats = scan_git("s", r, "v1", include, exclude, 10_000, "repo", previous=first)
        assert stats.mode == "unchanged" and again.digest == first.digest and seen == []

        # The ref moves (a snapshot taken at v1, now at main): a diff; only the edited and the added
        # file are read; the rename reuses its blob's hash; the deletion is gone.
        moved = Inventory.from_json(first.to_json())
        moved.ref = "main"
        second_key = git_source.origin_key(r.path, "main", include, exclude, 10_000, "repo")
        moved.origin = second_key
        seen.clear()
        second, stats = scan_git("s", r, "main", include, exclude, 10_000, "repo", previous=moved)
        assert stats.mode == "diff" and second.commit == repo.c2
        assert sorted(seen) == sorted([repo("rev-parse", "HEAD:pkg/tax.py"), repo("rev-parse", "HEAD:docs/added.md")])
        paths = {f.path: f for f in second.included}
        assert "docs/gone.md" not in paths and "pkg/old.py" not in paths
        assert paths["pkg/new.py"].sha256 == ok["pkg/old.py"].sha256
        assert paths["pkg/tax.py"].sha256 != ok["pkg/tax.py"].sha256
        assert second.digest != first.digest

    # Uncommitted edits and untracked files are not in the snapshot.
    repo.write("pkg/tax.py", "UNCOMMITTED = True\n")
    repo.write("pkg/untracked.py", "def untracked():\n    pass\n")
    with GitRepository(repo.root) as r:
        fresh, _ = scan_git("s", r, "main", include, exclude, 10_000, "repo")
        assert "pkg/untracked.py" not in {f.path for f in fresh.files}
        tax = next(f for f in fresh.included if f.path == "pkg/tax.py")
        assert b"UNCOMMITTED" not in r.read(tax.blob)
        # A smaller size limit skips by size; the blob hashes known are reused, nothing re-read.
        seen = _counting(r)
        small, _ = scan_git("s", r, "main", include, exclude, 60, "repo", previous=fresh)
        assert seen == []
        skipped = {f.path: f.reason for f in small.skipped}
        assert skipped["pkg/tax.py"].startswith("larger than max_file_bytes") and "pkg/tax.py" not in \
            {f.path for f in small.included}


@pytest.mark.unit
def test_symlinks_and_submodules_are_reported_not_followed(tmp_path):
    g = Git(tmp_path / "repo")
    g.write("a.py", "A = 1\n")
    (g.root / "link.py").symlink_to("a.py")
    g("add", "-A")
    sub = g.commit("with a link")
    g("update-index", "--add", "--cacheinfo", f"160000,{sub},vendor/lib")  # a gitlink, as a submodule is
    g("commit", "-qm", "submodule")
    with GitRepository(g.root) as r:
        inv, _ = scan_git("s", r, "main", ("**/*",), (), 10_000, "repo")
    reasons = {f.path: f.reason for f in inv.files}
    assert reasons == {"a.py": "", "link.py": git_source.SYMLINK, "vendor/lib": git_source.SUBMODULE}


# ---------------------------------------------------------------------------------- unit: the spec


def _sources(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sources.yaml"
    path.write_text("sources:\n" + textwrap.indent(textwrap.dedent(body), "  "))
    return path


@pytest.mark.unit
def test_git_entries_parse_and_their_origin_errors_stay_with_their_entry(repo, tmp_path):
    (tmp_path / "plain").mkdir()
    sources = _sources(tmp_path, f"""\
        - {{id: good, kind: code, git: {repo.root}, ref: main, include: ["pkg/*.py"], repository: example/shop}}
        - {{id: rel, kind: code, git: repo, ref: v1}}
        - {{id: both, kind: code, git: {repo.root}, ref: main, path: {repo.root}}}
        - {{id: noref, kind: code, git: {repo.root}}}
        - {{id: notrepo, kind: code, git: plain, ref: main}}
        - {{id: ghost, kind: code, git: {repo.root}, ref: no-such-branch}}
        """)
    specs = {s.id: s for s in load_sources(sources)}
    assert list(specs) == ["good", "rel", "both", "noref", "notrepo", "ghost"]
    assert specs["good"].git == str(repo.root) and specs["good"].ref == "main" and not specs["good"].path
    settings = Settings(home=tmp_path / "home", sources=sources)
    problems = {sid: source_problem(settings, spec) for sid, spec in specs.items()}
    assert problems["good"] is None and problems["rel"] is None  # a relative git: is the sources file's folder's
    assert "sources[2] id='both'" in problems["both"] and "exactly one of 'path', 'pip_sdist' or 'git'" in problems["both"]
    assert "sources[3] id='noref'" in problems["noref"] and "needs 'ref'" in problems["noref"]
    assert "source id='notrepo'" in problems["notrepo"] and "is not a git repository" in problems["notrepo"]
    assert "source id='ghost'" in problems["ghost"] and "ref 'no-such-branch' not found" in problems["ghost"]
    with pytest.raises(SourceConfigError, match="source id='ghost'.*no-such-branch"):
        scan_source(settings, specs["ghost"])

    inv = scan_source(settings, specs["good"])
    assert inv.commit == repo.c2 and inv.ref == "main" and inv.repository == "example/shop"
    assert [f.path for f in inv.included] == ["pkg/new.py", "pkg/rates.py", "pkg/tax.py"]
    assert Inventory.from_json(inv.to_json()).to_json() == inv.to_json()
    assert json.loads(inv.to_json())["ref"] == "main"
    # A file-level mistake still refuses the whole file, as for any entry.
    bad = _sources(tmp_path, f"- {{id: x, kind: code, git: {repo.root}, ref: main, exclde: [a]}}\n")
    with pytest.raises(SourceConfigError, match="unknown keys"):
        load_sources(bad)
    with pytest.raises(SourceConfigError, match="'ref' is for git sources"):
        load_sources(_sources(tmp_path, "- {id: y, kind: code, path: ., ref: main}\n"))


# ---------------------------------------------------------------------------------- integration


def _git_env(tmp_path, monkeypatch, neo4j_uri, repo: Git, ref: str = "main", extra: str = "",
             include: str = "src/**/*.py") -> dict:
    from tests.conftest import use_fresh_home
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"sources:\n  - {{id: shop, kind: code, git: {repo.root}, ref: {ref}, "
                       f"include: ['{include}']}}\n" + extra)
    home = tmp_path / "home"
    use_fresh_home(monkeypatch, home, sources, neo4j_uri)
    return {"home": home, "sources": sources}


def _query(home: Path, text: str, mode: str = "hybrid") -> dict:
    from mtrag_resources.serving.reader import IndexReader
    reader = IndexReader(home=str(home), log_proposals=False)
    try:
        return reader.query(text, k=10, mode=mode).to_dict()
    finally:
        reader.close()


def _rows(source_id: str) -> list[dict]:
    from mtrag_resources.core.layout import SourceLayout
    from mtrag_resources.stores.tables import read_rows
    return read_rows(SourceLayout(Settings.from_env(), source_id).chunks)


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_git_source_builds_at_its_ref_and_rebuilds_by_the_tree_diff(tmp_path, monkeypatch, neo4j_uri):
    from mtrag_resources.publish.build_state import changed_sources
    from mtrag_resources.publish.manifest import load_current
    from mtrag_resources.stores.connect import open_fts, open_qdrant
    from tests.build_helpers import build, latest_metadata

    g = Git(tmp_path / "repo")
    c1 = g.commit("one", {"src/shopcart/__init__.py": '"""Shopcart."""\n', "src/shopcart/tax.py": TAX_PY,
                          "src/shopcart/rates.py": RATES_PY, "src/shopcart/cart.py": CART_PY,
                          "src/shopcart/discounts.py": 'def seasonal_discount(amount: float) -> float:\n'
                                                       '    """Take ten percent off in winter."""\n'
                                                       '    return amount * 0.9\n',
                          "src/shopcart/legacy.py": 'def legacy_checkout_flow():\n'
                                                    '    """The old checkout, to be deleted."""\n'
                                                    '    return None\n'})
    g("checkout", "-q", "-b", "dev")
    dev = g.commit("dev", {"src/shopcart/loyalty.py": 'def loyalty_points(total: float) -> int:\n'
                                                      '    """Points earned for a total on the dev branch."""\n'
                                                      '    return int(total)\n'})
    g("checkout", "-q", "main")
    env = _git_env(tmp_path, monkeypatch, neo4j_uri, g)
    # Uncommitted edits and untracked files in the work tree are not the snapshot.
    g.write("src/shopcart/rates.py", 'def uncommitted_helper():\n    """Only in the work tree."""\n')

    assert build()["built"] == ["shop"]
    manifest = load_current(Settings.from_env().manifest_dir)
    entry = manifest["sources"]["shop"]
    assert (entry["commit_sha"], entry["ref"], entry["repository"]) == (c1, "main", str(g.root.resolve()))
    answer = _query(env["home"], "shopcart.tax.apply_tax", mode="exact")
    assert answer["hits"] and all(h["commit_sha"] == c1 and h["ref"] == "main"
                                  and h["repository"] == str(g.root.resolve()) for h in answer["hits"])
    assert not _query(env["home"], "uncommitted_helper", mode="exact")["exact"]["matched"]
    rows = _rows("shop")
    assert {r["commit_sha"] for r in rows} == {c1} and {r["ref"] for r in rows} == {"main"}
    with open_qdrant(Settings.from_env()) as q:
        payloads = [h["payload"] for h in q.search("code", [0.1] * 384, k=100)]
    assert payloads and all(p["commit_sha"] == c1 and p["ref"] == "main" for p in payloads)
    fts = open_fts(Settings.from_env())
    try:
        fts_rows = fts.get_chunks([r["chunk_id"] for r in rows])
        assert fts_rows and all(r["commit_sha"] == c1 and r["ref"] == "main" for r in fts_rows.values())
    finally:
        fts.close()

    # The same commit: unchanged, decided from the ref alone.
    assert changed_sources(Settings.from_env(), load_sources(env["sources"]), None) == ([], [])

    # A commit touching one file: one blob read, one file re-chunked, its changed chunks embedded.
    g("checkout", "-q", "--", "src/shopcart/rates.py")
    before = {r["chunk_id"]: r for r in _rows("shop")}
    c2 = g.commit("two", {"src/shopcart/tax.py": TAX_PY.replace("round to cents", "round half up to cents")})
    assert build()["built"] == ["shop"]
    raw = latest_metadata("raw_source", "shop")
    assert (raw["git_scan"], raw["git_changed_paths"], raw["git_blobs_read"], raw["commit"]) == ("diff", 1, 1, c2)
    chunks = latest_metadata("cas_chunks", "shop")
    assert (chunks["files_parsed"], chunks["files_reused"]) == (1, 5)
    after = {r["chunk_id"]: r for r in _rows("shop")}
    changed = [cid for cid, r in after.items() if r["role"] == "child" and r["content_hash"] != before[cid]["content_hash"]]
    assert len(changed) >= 1 and latest_metadata("embedding_cache", "shop")["embedded"] == len(changed)
    # Rows of files the commit did not touch keep the commit they were parsed at (their text is the
    # same at both): a commit rewrites the payloads of the files it changed, not of the source.
    assert {r["commit_sha"] for r in after.values() if r["file_path"] == "src/shopcart/tax.py"} == {c2}
    assert {r["commit_sha"] for r in after.values() if r["file_path"] != "src/shopcart/tax.py"} == {c1}
    hits = _query(env["home"], "apply the regional tax and round half up to cents")["hits"]
    assert hits and {h["commit_sha"] for h in hits} == {c2}  # every hit names the published snapshot
    assert hits[0]["symbol"] == "shopcart.tax.apply_tax"

    # A rename with unchanged content and a deletion: nothing embedded, no blob read.
    g("mv", "src/shopcart/discounts.py", "src/shopcart/promotions.py")
    g("rm", "-q", "src/shopcart/legacy.py")
    c3 = g.commit("rename and delete")
    assert build()["built"] == ["shop"]
    raw = latest_metadata("raw_source", "shop")
    assert (raw["git_scan"], raw["git_blobs_read"], raw["commit"]) == ("diff", 0, c3)
    assert latest_metadata("embedding_cache", "shop")["embedded"] == 0
    assert latest_metadata("cas_chunks", "shop")["files_parsed"] == 1  # the renamed path, from the CAS
    rows = _rows("shop")
    paths = {r["file_path"] for r in rows}
    assert "src/shopcart/promotions.py" in paths
    assert not paths & {"src/shopcart/discounts.py", "src/shopcart/legacy.py"}
    assert _query(env["home"], "shopcart.promotions.seasonal_discount", mode="exact")["exact"]["matched"]
    assert not _query(env["home"], "shopcart.legacy.legacy_checkout_flow", mode="exact")["exact"]["matched"]
    s = Settings.from_env()
    with open_qdrant(s) as q:
        assert q.count("code", "shop") == sum(r["role"] == "child" for r in rows)
        qpaths = {h["payload"]["file_path"] for h in q.search("code", [0.1] * 384, k=100)}
    assert "src/shopcart/legacy.py" not in qpaths and "src/shopcart/discounts.py" not in qpaths
    fts = open_fts(s)
    try:
        assert not fts.exact("shopcart.legacy.legacy_checkout_flow")
    finally:
        fts.close()

    # The other branch: its own commit and content, not main's.
    env["sources"].write_text(env["sources"].read_text().replace("ref: main", "ref: dev"))
    assert build()["built"] == ["shop"]
    loyalty = _query(env["home"], "shopcart.loyalty.loyalty_points", mode="exact")
    assert loyalty["exact"]["matched"] and loyalty["hits"][0]["commit_sha"] == dev
    assert loyalty["hits"][0]["ref"] == "dev"
    assert _query(env["home"], "shopcart.legacy.legacy_checkout_flow", mode="exact")["exact"]["matched"]
    assert not _query(env["home"], "shopcart.promotions.seasonal_discount", mode="exact")["exact"]["matched"]
    assert load_current(s.manifest_dir)["sources"]["shop"]["commit_sha"] == dev

    # The ref disappears: that source's error; it stays published at its last snapshot.
    env["sources"].write_text(env["sources"].read_text().replace("ref: dev", "ref: gone-branch"))
    summary = build()
    assert summary["built"] == [] and "ref 'gone-branch' not found" in summary["failed"]["shop"]
    assert load_current(s.manifest_dir)["sources"]["shop"]["commit_sha"] == dev
    assert _query(env["home"], "shopcart.loyalty.loyalty_points", mode="exact")["hits"][0]["commit_sha"] == dev


@pytest.mark.integration
@pytest.mark.neo4j
def test_broken_git_entries_fail_alone_naming_their_entry(tmp_path, monkeypatch, neo4j_uri, capsys):
    from mtrag_assets.app.cli import main
    from mtrag_resources.publish.manifest import load_current
    from tests.corpus import write_corpus

    corpus = write_corpus(tmp_path / "corpus")
    g = Git(tmp_path / "repo")
    g.commit("one", {"m.py": "def f():\n    return 1\n"})
    (tmp_path / "plain").mkdir()
    extra = (f"  - {{id: folder, kind: code, path: {corpus['root'] / 'shop'}, include: ['src/**/*.py']}}\n"
             f"  - {{id: notrepo, kind: code, git: {tmp_path / 'plain'}, ref: main}}\n"
             f"  - {{id: noref, kind: code, git: {g.root}, ref: no-such-tag}}\n"
             f"  - {{id: both, kind: code, git: {g.root}, ref: main, path: {g.root}}}\n")
    env = _git_env(tmp_path, monkeypatch, neo4j_uri, g, extra=extra, include="*.py")
    assert main(["build"]) == 1
    err = capsys.readouterr().err
    assert f"{env['sources']}: source id='notrepo': git '{tmp_path / 'plain'}'" in err and "is not a git repository" in err
    assert "source id='noref'" in err and "ref 'no-such-tag' not found" in err
    assert "sources[4] id='both'" in err and "exactly one of 'path', 'pip_sdist' or 'git'" in err
    assert "Traceback" not in err
    manifest = load_current(Settings.from_env().manifest_dir)
    assert set(manifest["sources"]) == {"shop", "folder"}  # the good ones built and published
    assert _query(env["home"], "shopcart.tax.apply_tax", mode="exact")["exact"]["matched"]
