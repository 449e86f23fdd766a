"""Issue-tracker exports (`{id, kind: issues, path: FILE}`): GitHub REST and Jira JSON exports read
into issues and comments (mtrag_resources/ingest/issues.py), chunked, linked to each other and to
the code they name, and built through the real pipeline.

Every export here is written by the test, in the shapes the trackers' APIs return. The unit tests
read them through ingest/issues.py, the snapshot and the FTS store; the integration test builds a
code source and an issues source (plus a broken one) through Dagster runs into Qdrant, SQLite FTS
and Neo4j, and queries them with the reader."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.models import DocReference, GraphNode
from mtrag_resources.ingest.doc_links import SymbolIndex, resolve_links
from mtrag_resources.ingest.issues import (IssueExportError, check_export, chunk_issue_export, jira_text,
                                           parse_export)
from mtrag_resources.ingest.snapshot import scan_source, source_problem
from mtrag_resources.ingest.sources import SourceConfigError, folder_problem, load_sources
from mtrag_resources.ingest.chunking.tokens import estimate_tokens
from mtrag_resources.stores.fts_query import derive_aliases, issue_aliases
from mtrag_resources.stores.fts_store import FtsStore

REPO = "acme/shopcart"
API = f"https://api.github.com/repos/{REPO}"
WEB = f"https://github.com/{REPO}"


def gh_issue(number: int, title: str, body: str | None, *, state: str = "open", user: str = "alice",
             labels: tuple[str, ...] = (), pr: bool = False, closed_at: str | None = None,
             created_at: str = "2025-03-01T09:00:00Z", updated_at: str = "2025-03-02T09:00:00Z") -> dict:
    """One object of `GET /repos/{owner}/{repo}/issues` (the fields mtrag reads, and a few it does not)."""
    item = {"url": f"{API}/issues/{number}", "repository_url": API, "id": 900 + number,
            "html_url": f"{WEB}/{'pull' if pr else 'issues'}/{number}", "number": number, "title": title,
            "user": {"login": user, "id": 7, "type": "User"}, "labels": [{"id": 1, "name": l, "color": "d73a4a"}
                                                                        for l in labels],
            "state": state, "locked": False, "comments": 0, "created_at": created_at, "updated_at": updated_at,
            "closed_at": closed_at, "author_association": "MEMBER", "body": body}
    if pr:
        item["pull_request"] = {"url": f"{API}/pulls/{number}", "html_url": f"{WEB}/pull/{number}",
                                "merged_at": closed_at}
    return item


def gh_comment(cid: int, number: int, body: str, user: str = "bob", created_at: str = "2025-03-03T10:00:00Z") -> dict:
    """One object of `GET /repos/{owner}/{repo}/issues/comments`."""
    return {"url": f"{API}/issues/comments/{cid}", "html_url": f"{WEB}/issues/{number}#issuecomment-{cid}",
            "issue_url": f"{API}/issues/{number}", "id": cid, "user": {"login": user, "type": "User"},
            "created_at": created_at, "updated_at": created_at, "author_association": "CONTRIBUTOR", "body": body}


def github_export() -> dict:
    """A closed bug, the pull request that fixed it, an open issue; comments that name code and
    other issues; a `#99` inside a fenced log (not a reference) and `#404` (not in the export)."""
    return {"repository": REPO, "issues": [
        gh_issue(12, "compute_tax rounds twice on discounted carts",
                 "Calling `shopcart.tax.compute_tax` on a discounted cart gives 10.01 instead of 10.00.\r\n\r\n"
                 "The rounding happens in src/shopcart/tax.py and again in the cart.\r\n\r\n"
                 "```\r\nTraceback: see #99 in the CI log\r\n```\r\n",
                 state="closed", labels=("bug", "tax"), closed_at="2025-03-05T12:00:00Z"),
        gh_issue(13, "Round once in compute_tax", "Fixes #12. Also see acme/shopcart#14 and #404.",
                 state="closed", user="carol", pr=True, closed_at="2025-03-05T11:59:00Z"),
        gh_issue(14, "Document the rounding rule", None, labels=("docs",), user="dave"),
    ], "comments": [
        gh_comment(5001, 12, "Reproduced. `shopcart.tax.compute_tax` calls round() and so does `Cart.total`."),
        gh_comment(5002, 12, "Fixed by #13, see https://github.com/acme/shopcart/pull/13", user="carol",
                   created_at="2025-03-05T12:01:00Z"),
        gh_comment(5003, 77, "A comment on an issue this export does not hold."),
    ]}


def jira_export() -> dict:
    """The shape of Jira's `/rest/api/2/search` (wiki markup) with one v3 (ADF) description."""
    def issue(key, summary, description, status, labels=(), comments=()):
        return {"expand": "operations", "id": str(10000 + int(key.split("-")[1])),
                "self": f"https://acme.atlassian.net/rest/api/2/issue/{10000 + int(key.split('-')[1])}",
                "key": key, "fields": {
                    "summary": summary, "description": description, "status": {"name": status, "id": "3"},
                    "labels": list(labels), "reporter": {"displayName": "Li Wei", "accountId": "x1"},
                    "issuetype": {"name": "Bug"}, "created": "2025-02-01T10:00:00.000+0000",
                    "updated": "2025-02-03T10:00:00.000+0000",
                    "resolutiondate": "2025-02-03T10:00:00.000+0000" if status == "Done" else None,
                    "comment": {"comments": [{"id": str(20000 + i), "body": body,
                                              "author": {"displayName": who},
                                              "created": "2025-02-02T08:00:00.000+0000"}
                                             for i, (who, body) in enumerate(comments)],
                                "total": len(comments)}}}
    return {"expand": "schema,names", "startAt": 0, "maxResults": 50, "total": 3, "issues": [
        issue("SHOP-7", "Tax table lookup is slow", "{{shopcart.tax.lookup_rate}} reads the table on every call.",
              "Done", labels=("performance",)),
        issue("SHOP-12", "Totals are off by a cent",
              "Totals differ after SHOP-7 was fixed.\n{code:python}\n# SHOP-99 is only a comment here\n"
              "total = compute(cart)\n{code}\nSee {{shopcart.cart.Cart.total}}.",
              "In Progress", comments=[("Ana Ruiz", "Probably the same as SHOP-7; {{Cart.total}} rounds too.")]),
        issue("SHOP-13", "Explain rounding in the docs",
              {"type": "doc", "version": 1, "content": [
                  {"type": "heading", "attrs": {"level": 2}, "content": [{"type": "text", "text": "Context"}]},
                  {"type": "paragraph", "content": [
                      {"type": "text", "text": "Describe "},
                      {"type": "text", "text": "shopcart.tax.compute_tax", "marks": [{"type": "code"}]},
                      {"type": "text", "text": " for SHOP-12."}]},
                  {"type": "codeBlock", "content": [{"type": "text", "text": "round(x, 2)"}]}]},
              "To Do"),
    ]}


def chunks_by(parsed, key: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for c in parsed.chunks:
        if c.issue_key == key:
            out.setdefault(c.chunk_type, []).append(c)
    return out


# ------------------------------------------------------------------------------------ unit: parsing

@pytest.mark.unit
def test_github_export_reads_issues_pull_requests_and_comments():
    export = parse_export(json.dumps(github_export()).encode())
    assert export.format == "github" and export.repository == REPO
    by_key = {i.key: i for i in export.issues}
    assert list(by_key) == ["acme/shopcart#12", "acme/shopcart#13", "acme/shopcart#14"]
    bug, pr, docs = by_key.values()
    assert (bug.state, bug.labels, bug.author, bug.closed_at) == ("closed", ["bug", "tax"], "alice", "2025-03-05T12:00:00Z")
    assert bug.display == "#12" and bug.url == f"{WEB}/issues/12" and not bug.is_pull_request
    assert pr.is_pull_request and pr.url == f"{WEB}/pull/13" and pr.issue_type == "pull request"
    assert docs.body == "" and docs.comments == []
    assert [(c.comment_id, c.author) for c in bug.comments] == [("5001", "bob"), ("5002", "carol")]
    assert "\r" not in bug.body
    assert export.warnings == ["1 comments are about issues the export does not hold; left out"]


@pytest.mark.unit
def test_a_bare_issues_array_takes_its_repository_from_the_urls():
    items = [gh_issue(3, "First", "body"), gh_issue(4, "Second", "see #3")]
    export = parse_export(json.dumps(items))
    assert export.format == "github" and [i.key for i in export.issues] == ["acme/shopcart#3", "acme/shopcart#4"]
    for item in items:  # no URL at all: the keys are the bare numbers
        del item["html_url"], item["repository_url"]
    assert [i.key for i in parse_export(json.dumps(items)).issues] == ["#3", "#4"]
    parsed = chunk_issue_export("t", "x.json", json.dumps(items))
    refs = [r for r in parsed.relations if r.rel_type == "REFERENCES"]
    assert [(r.src_id, r.dst_id) for r in refs] == [("t:issue:#4", "t:issue:#3")]


@pytest.mark.unit
def test_jira_export_reads_keys_statuses_wiki_markup_and_adf():
    export = parse_export(json.dumps(jira_export()))
    assert export.format == "jira"
    by_key = {i.key: i for i in export.issues}
    assert list(by_key) == ["SHOP-7", "SHOP-12", "SHOP-13"]
    done, wip, todo = by_key.values()
    assert (done.state, done.closed_at, done.author, done.issue_type) == ("Done", "2025-02-03T10:00:00.000+0000", "Li Wei", "Bug")
    assert done.url == "https://acme.atlassian.net/browse/SHOP-7" and done.display == "SHOP-7"
    assert done.body == "`shopcart.tax.lookup_rate` reads the table on every call."
    assert "```\n# SHOP-99 is only a comment here\ntotal = compute(cart)\n```" in wip.body
    assert [(c.author, c.comment_id) for c in wip.comments] == [("Ana Ruiz", "20000")]
    assert todo.state == "To Do" and todo.body.startswith("## Context\n\nDescribe `shopcart.tax.compute_tax` for SHOP-12.")
    assert "```\nround(x, 2)\n```" in todo.body
    assert jira_text(None) == "" and jira_text("plain {{x.y}} text") == "plain `x.y` text"


@pytest.mark.unit
@pytest.mark.parametrize("data, message", [
    (b'{"repository": "acme/shopcart", "issues": [{"number": 1,', "not valid JSON: Expecting property name"),
    (b"", "not a GitHub or Jira export: the file is empty"),
    (b"\xff\xfe{}", "not UTF-8 text (byte 0)"),
    (b'{"total": 3, "values": []}', "not a GitHub or Jira export: expected an array of issues or an object with "
                                    "an \"issues\" array, found an object with keys ['total', 'values']"),
    (b'[{"id": 1, "name": "a"}]', "not a GitHub or Jira export: issues[0] has neither GitHub's \"number\" and "
                                  "\"title\" nor Jira's \"key\" and \"fields\""),
    (b'[{"number": 1, "title": "a"}, {"key": "X-1", "fields": {}}]', "issues[1] lacks GitHub's \"number\" and \"title\""),
    (b'[{"number": "one", "title": "a"}]', "issues[0]: \"number\" must be a whole number"),
    (b'{"issues": [{"key": "not a key", "fields": {}}]}', "\"key\" must be a Jira key like \"PROJ-12\""),
    (b'{"repository": "no slash", "issues": []}', "\"repository\" must be \"owner/repo\""),
    (b'{"issues": [{"number": 1, "title": "a"}], "comments": [{"body": "?"}]}', "comments[0] names no issue"),
    (b'"just a string"', "found a string"),
])
def test_a_corrupt_or_unknown_export_is_one_clear_line(data, message):
    why = check_export(data)
    assert why is not None and message in why and "\n" not in why
    with pytest.raises(IssueExportError):
        parse_export(data)


@pytest.mark.unit
def test_an_empty_export_and_duplicate_pages_are_accepted():
    assert parse_export(b"[]").issues == [] and parse_export(b'{"issues": []}').format == "github"
    items = [gh_issue(5, "old title", "a", updated_at="2025-01-01T00:00:00Z"),
             gh_issue(5, "new title", "b", updated_at="2025-02-01T00:00:00Z")]
    export = parse_export(json.dumps(items))
    assert [i.title for i in export.issues] == ["new title"] and "appears more than once" in export.warnings[0]


# ------------------------------------------------------------------------------------ unit: chunks and graph

@pytest.mark.unit
def test_chunks_carry_the_key_and_state_and_the_graph_links_issues():
    parsed = chunk_issue_export("tracker", "tracker.json", json.dumps(github_export()))
    bug = chunks_by(parsed, "acme/shopcart#12")
    assert set(bug) == {"issue", "issue_body", "issue_comment"}
    parent = bug["issue"][0]
    assert parent.role == "parent" and parent.symbol == "acme/shopcart#12" and parent.state == "closed"
    assert parent.text.startswith("#12 compute_tax rounds twice on discounted carts\nstate: closed · issue · "
                                  "labels: bug, tax · opened by alice on 2025-03-01 · closed 2025-03-05")
    assert all(c.title == "#12 compute_tax rounds twice on discounted carts" and c.source_kind == "issues"
               and c.parent_id == parent.chunk_id and c.state == "closed"
               for c in bug["issue_body"] + bug["issue_comment"])
    assert [c.summary for c in bug["issue_comment"]][0].startswith("bob on 2025-03-03: Reproduced.")
    # the embedder reads each passage with its issue's title and state
    assert bug["issue_body"][0].embed_text.startswith("#12 compute_tax rounds twice on discounted carts (closed)\n\n")
    docs = chunks_by(parsed, "acme/shopcart#14")
    assert [c.text for c in docs["issue_body"]] == [docs["issue"][0].text]  # no body: the title is its text
    nodes = {n.qualified_name: n for n in parsed.nodes}
    assert set(nodes) == {"acme/shopcart#12", "acme/shopcart#13", "acme/shopcart#14"}
    props = json.loads(nodes["acme/shopcart#13"].properties)
    assert props["is_pull_request"] and props["state"] == "closed" and props["number"] == 13 and props["author"] == "carol"
    assert nodes["acme/shopcart#12"].label == "Issue" and nodes["acme/shopcart#12"].name == "#12"
    assert nodes["acme/shopcart#12"].chunk_id == parent.chunk_id
    refs = {(r.src_id.rsplit("#", 1)[1], r.dst_id.rsplit("#", 1)[1]): r for r in parsed.relations
            if r.rel_type == "REFERENCES"}
    # #99 is inside a fenced log, #404 and #77 are not in the export
    assert set(refs) == {("12", "13"), ("13", "12"), ("13", "14")}
    fixed = refs[("13", "12")]
    assert fixed.confidence == "VERIFIED" and fixed.evidence_text == "Fixes #12. Also see acme/shopcart#14 and #404."
    assert fixed.evidence_file == "tracker.json" and fixed.evidence_start == 1 and fixed.evidence_hash
    assert refs[("12", "13")].evidence_text.startswith("Fixed by #13")
    contains = [r for r in parsed.relations if r.rel_type == "CONTAINS"]
    assert {r.dst_id for r in contains} == {f"chunk:{c.chunk_id}" for c in parsed.chunks if c.role == "child"}
    # code the texts name, for the cross-source linker (docs' extractor; a file path too)
    code = [(r.ref_kind, r.target, r.line) for r in parsed.references]
    assert ("code_span", "shopcart.tax.compute_tax", 1) in code and ("file", "src/shopcart/tax.py", 3) in code
    assert ("code_span", "Cart.total", 1) in code
    body_ids = {c.chunk_id for c in bug["issue_body"]}
    assert {r.chunk_id for r in parsed.references if r.target == "src/shopcart/tax.py"} <= body_ids


@pytest.mark.unit
def test_chunk_ids_follow_the_issue_not_its_place():
    doc = github_export()
    before = {c.chunk_id: c for c in chunk_issue_export("t", "x.json", json.dumps(doc)).chunks}
    doc["issues"].insert(0, gh_issue(2, "An older issue", "text"))
    doc["comments"].insert(0, gh_comment(4000, 12, "An earlier comment", created_at="2025-03-02T00:00:00Z"))
    doc["issues"][1]["state"] = "open"  # #12 reopened: its chunks keep their ids, their state changes
    after = {c.chunk_id: c for c in chunk_issue_export("t", "x.json", json.dumps(doc)).chunks}
    assert set(before) < set(after)
    assert {after[c].issue_key for c in set(after) - set(before)} == {"acme/shopcart#2", "acme/shopcart#12"}
    assert all(after[c].state == "open" for c in before if before[c].issue_key == "acme/shopcart#12")


@pytest.mark.unit
def test_long_bodies_and_comments_are_windowed_like_docs():
    para = ("The cart total is computed by summing the line items and applying the regional tax rate, "
            "then rounding to cents; this paragraph repeats to make the body long. ")
    body = "\n\n".join(f"Step {i}: {para * 3}" for i in range(12))
    parsed = chunk_issue_export("t", "x.json", json.dumps([gh_issue(1, "Long", body)]), max_tokens=128)
    kids = chunks_by(parsed, "acme/shopcart#1")["issue_body"]
    assert len(kids) > 4 and all(estimate_tokens(c.text) <= 128 for c in kids)
    assert "".join(c.text for c in kids).replace("\n", "") == body.replace("\n", "")  # nothing left out
    assert [c.start_line for c in kids] == sorted(c.start_line for c in kids) and kids[-1].end_line == 23
    parent = chunks_by(parsed, "acme/shopcart#1")["issue"][0]
    assert len(parent.text) < len(body) and parent.text.endswith("...")  # the head of the body


@pytest.mark.unit
def test_jira_chunks_reference_keys_and_code():
    parsed = chunk_issue_export("jira", "shop.json", json.dumps(jira_export()))
    refs = {(r.src_id.split(":issue:")[1], r.dst_id.split(":issue:")[1]) for r in parsed.relations
            if r.rel_type == "REFERENCES"}
    assert refs == {("SHOP-12", "SHOP-7"), ("SHOP-13", "SHOP-12")}  # SHOP-99 is in a code block
    code = {(r.ref_kind, r.target) for r in parsed.references}
    assert {("code_span", "shopcart.tax.lookup_rate"), ("code_span", "shopcart.cart.Cart.total"),
            ("code_span", "shopcart.tax.compute_tax"), ("code_span", "Cart.total")} <= code
    assert {c.state for c in parsed.chunks if c.issue_key == "SHOP-12"} == {"In Progress"}
    assert all(c.language == "jira" and c.symbol == c.issue_key for c in parsed.chunks)


@pytest.mark.unit
def test_issue_mentions_resolve_to_code_symbols_and_files():
    """The same linker as docs': a qualified name VERIFIED, a name two classes define INFERRED with
    both candidates, a file path by its path or its tail."""
    parsed = chunk_issue_export("tracker", "tracker.json", json.dumps(github_export()))
    code = [GraphNode("shop:function:shopcart.tax.compute_tax", "Function", "compute_tax", "shopcart.tax.compute_tax"),
            GraphNode("shop:method:shopcart.cart.Cart.total", "Method", "total", "shopcart.cart.Cart.total"),
            GraphNode("shop:method:shopcart.legacy.Cart.total", "Method", "total", "shopcart.legacy.Cart.total"),
            GraphNode("shop:file:src/shopcart/tax.py", "File", "tax.py", "src/shopcart/tax.py"),
            GraphNode("other:file:lib/tax.py", "File", "tax.py", "lib/tax.py")]
    index = SymbolIndex()
    index.add_nodes(code)
    links, unresolved = resolve_links(index, parsed.references)
    by_dst = {l.dst_id: l for l in links}
    fn = by_dst["shop:function:shopcart.tax.compute_tax"]
    assert fn.rel_type == "MENTIONS" and fn.confidence == "VERIFIED" and fn.evidence_file == "tracker.json"
    assert fn.src_id.startswith("chunk:") and fn.evidence_text == "`shopcart.tax.compute_tax`"
    total = by_dst["shop:method:shopcart.cart.Cart.total"]
    assert total.confidence == "INFERRED" and total.candidates == ["shopcart.cart.Cart.total", "shopcart.legacy.Cart.total"]
    assert by_dst["shop:file:src/shopcart/tax.py"].confidence == "VERIFIED"
    tail = DocReference("c1", "x.json", 1, "file", "", "tax.py", "`tax.py`")
    assert {n.node_id for n in index.file("tax.py")} == {"shop:file:src/shopcart/tax.py", "other:file:lib/tax.py"}
    assert resolve_links(index, [tail])[0][0].confidence == "INFERRED"
    assert index.file("nothing/tax.py") == [] and unresolved >= 0


# ------------------------------------------------------------------------------------ unit: aliases

@pytest.mark.unit
def test_issue_keys_are_exact_aliases_of_the_first_body_passage(tmp_path):
    gh = chunk_issue_export("tracker", "tracker.json", json.dumps(github_export()))
    jira = chunk_issue_export("jira", "shop.json", json.dumps(jira_export()))
    store = FtsStore(tmp_path / "fts.sqlite")
    for sid, parsed in (("tracker", gh), ("jira", jira)):
        rows = [{k: v for k, v in vars(c).items() if k != "embed_text"} for c in parsed.chunks]
        aliases = list(derive_aliases(rows, sid)) + issue_aliases(rows)
        assert not [a for a in aliases if a[1] == "short_symbol"]  # `#12` has no last part "12"
        store.write_source(sid, "g1", "h1", rows, aliases)
    rows = {c.chunk_id: c for c in gh.chunks + jira.chunks}
    first_body = {c.issue_key: c.chunk_id for c in reversed(gh.chunks + jira.chunks) if c.chunk_type == "issue_body"}
    for query, key in [("#12", "acme/shopcart#12"), ("acme/shopcart#12", "acme/shopcart#12"),
                       ("ACME/shopcart#13", "acme/shopcart#13"), ("SHOP-12", "SHOP-12"), ("shop-7", "SHOP-7")]:
        hits = store.exact(query)
        assert hits[0]["chunk_id"] == first_body[key] and hits[0]["alias_kind"] == "issue", query
        assert {rows[h["chunk_id"]].issue_key for h in hits if h["alias_kind"] in ("issue", "symbol")} == {key}
    # a chunk that only mentions SHOP-7 comes after the issue itself
    mention = store.exact("SHOP-7")
    assert [h["alias_kind"] for h in mention][:1] == ["issue"] and "issue_key" in {h["alias_kind"] for h in mention}
    assert store.exact("12") == [] and store.exact("#404") == []
    row = store.get_chunks([first_body["acme/shopcart#12"]])[first_body["acme/shopcart#12"]]
    assert (row["issue_key"], row["state"], row["source_kind"]) == ("acme/shopcart#12", "closed", "issues")
    store.close()


# ------------------------------------------------------------------------------------ unit: sources

def _sources(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sources.yaml"
    path.write_text("sources:\n" + textwrap.indent(textwrap.dedent(body), "  "))
    return path


@pytest.mark.unit
def test_issue_sources_parse_and_a_broken_export_is_its_source_error(tmp_path):
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "gh.json").write_text(json.dumps(github_export()))
    (tmp_path / "exports" / "jira.json").write_text(json.dumps(jira_export()))
    (tmp_path / "corrupt.json").write_text('{"issues": [{"number": 1, "title": ')
    (tmp_path / "shape.json").write_text('{"data": {"repository": {"issues": {"nodes": []}}}}')
    sources = _sources(tmp_path, """\
        - {id: gh, kind: issues, path: exports/gh.json}
        - {id: jira, kind: issues, path: exports/jira.json}
        - {id: corrupt, kind: issues, path: corrupt.json}
        - {id: shape, kind: issues, path: shape.json}
        - {id: missing, kind: issues, path: nowhere.json}
        - {id: folder, kind: issues, path: exports}
        - {id: small, kind: issues, path: exports/gh.json, max_file_bytes: 100}
        - {id: fromgit, kind: issues, git: ., ref: main}
        - {id: fromsdist, kind: issues, pip_sdist: "tracker==1.0"}
        """)
    specs = {s.id: s for s in load_sources(sources)}
    assert not any(folder_problem(s, sources) for s in specs.values())  # an export file is no folder, and that is fine
    settings = Settings(home=tmp_path / "home", sources=sources)
    problems = {sid: source_problem(settings, spec) for sid, spec in specs.items()}
    assert problems["gh"] is None and problems["jira"] is None
    where = f"{sources}: source id="
    assert problems["corrupt"].startswith(f"{where}'corrupt': path 'corrupt.json': not valid JSON: ")
    assert problems["shape"] == (f"{where}'shape': path 'shape.json': not a GitHub or Jira export: expected an "
                                 "array of issues or an object with an \"issues\" array, found an object with keys ['data']")
    assert problems["missing"] == f"{where}'missing': path 'nowhere.json': no such file ({tmp_path / 'nowhere.json'})"
    assert "path 'exports': is a folder" in problems["folder"]
    assert "larger than max_file_bytes" in problems["small"]
    assert "sources[7] id='fromgit'" in problems["fromgit"] and "give 'path'" in problems["fromgit"]
    assert "sources[8] id='fromsdist'" in problems["fromsdist"] and "not 'pip_sdist'" in problems["fromsdist"]
    assert all("\n" not in p for p in problems.values() if p)
    inv = scan_source(settings, specs["gh"])
    assert inv.root == str(tmp_path / "exports") and [(f.path, f.category, f.status) for f in inv.files] == [
        ("gh.json", "issues", "ok")]
    assert scan_source(settings, specs["gh"], ).digest == inv.digest
    with pytest.raises(SourceConfigError, match="source id='missing'.*no such file"):
        scan_source(settings, specs["missing"])


# ------------------------------------------------------------------------------------ integration

SHOP_TAX = '''\
"""Tax rules for the cart."""

RATES = {"eu": 0.2, "us": 0.07}


def compute_tax(amount: float, region: str) -> float:
    """The tax on an amount for a region, rounded to cents."""
    return round(amount * RATES.get(region, 0.0), 2)
'''
SHOP_CART = '''\
"""The shopping cart."""
from .tax import compute_tax


class Cart:
    """A cart of priced items for one region."""

    def __init__(self, region: str):
        self.region = region
        self.items = []

    def total(self) -> float:
        """Total price including tax."""
        subtotal = sum(self.items)
        return round(subtotal + compute_tax(subtotal, self.region), 2)
'''


def _issues_env(tmp_path, monkeypatch, neo4j_uri) -> dict:
    from tests.conftest import use_fresh_home
    pkg = tmp_path / "shop" / "src" / "shopcart"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Shopcart."""\n')
    (pkg / "tax.py").write_text(SHOP_TAX)
    (pkg / "cart.py").write_text(SHOP_CART)
    (tmp_path / "tracker.json").write_text(json.dumps(github_export(), indent=1))
    (tmp_path / "broken.json").write_text('{"repository": "acme/shopcart", "issues": [{"number": 1, "title": "x"')
    sources = tmp_path / "sources.yaml"
    sources.write_text("sources:\n"
                       "  - {id: shop, kind: code, path: shop, include: ['src/**/*.py']}\n"
                       "  - {id: tracker, kind: issues, path: tracker.json}\n"
                       "  - {id: broken, kind: issues, path: broken.json}\n")
    home = tmp_path / "home"
    use_fresh_home(monkeypatch, home, sources, neo4j_uri)
    return {"home": home, "sources": sources, "tracker": tmp_path / "tracker.json"}


def _reader(home: Path):
    from mtrag_resources.serving.reader import IndexReader
    return IndexReader(home=str(home), log_proposals=False)


@pytest.mark.integration
@pytest.mark.neo4j
def test_an_issues_source_builds_links_to_code_and_leaves_every_store_when_removed(
        tmp_path, monkeypatch, neo4j_uri, capsys):
    from mtrag_assets.app.cli import main
    from mtrag_resources.core.layout import SourceLayout
    from mtrag_resources.publish.manifest import load_current
    from mtrag_resources.stores.connect import open_fts, open_neo4j, open_qdrant
    from mtrag_resources.stores.tables import read_rows

    env = _issues_env(tmp_path, monkeypatch, neo4j_uri)
    assert main(["build"]) == 1  # the broken export fails alone
    err = capsys.readouterr().err
    broken = [line for line in err.splitlines() if "source id='broken'" in line]
    assert len(broken) == 1 and f"{env['sources']}: source id='broken': path 'broken.json': not valid JSON: " in broken[0]
    assert broken[0].endswith("; not built (the other sources are)") and "Traceback" not in err
    settings = Settings.from_env()
    manifest = load_current(settings.manifest_dir)
    assert set(manifest["sources"]) == {"shop", "tracker"} and manifest["sources"]["tracker"]["kind"] == "issues"
    for entry in manifest["sources"].values():  # every store committed the source's generation: the gate passed
        assert all(v["state"] == "committed" and v["generation"] == entry["chunk_generation"]
                   for v in entry["stores"].values())

    rows = read_rows(SourceLayout(settings, "tracker").chunks)
    children = [r for r in rows if r["role"] == "child"]
    fts, neo = open_fts(settings), open_neo4j(settings)
    try:
        with open_qdrant(settings) as q:  # counts reconcile: chunk table, Qdrant, FTS, Neo4j
            assert q.count("issues", "tracker") == len(children)
        counts = fts.counts("tracker")
        assert (counts["child_rows"], counts["parent_rows"]) == (len(children), len(rows) - len(children))
        graph = neo.counts("tracker")
        assert graph["chunks"] == len(rows) and graph["nodes"]["Issue"] == 3
        assert graph["relationships"]["REFERENCES"] == 3 and graph["relationships"]["CONTAINS"] == len(children) + 3
        issue = neo._read("MATCH (i:Issue {qualified_name: $k}) RETURN i.state AS state, i.labels AS labels, "
                          "i.is_pull_request AS pr, i.number AS number, i.closed_at AS closed, i.url AS url",
                          k="acme/shopcart#12")[0]
        assert issue == {"state": "closed", "labels": ["bug", "tax"], "pr": False, "number": 12,
                         "closed": "2025-03-05T12:00:00Z", "url": f"{WEB}/issues/12"}
        assert neo._read("MATCH (i:Issue {qualified_name: 'acme/shopcart#13'}) RETURN i.is_pull_request AS pr")[0]["pr"]
    finally:
        fts.close()
        neo.close()
    # the doc -> code links of the issue's passages, resolved across sources
    links = read_rows(settings.links_dir / "links.parquet")
    chunk_of = {f"chunk:{r['chunk_id']}": r for r in rows}
    fn = [l for l in links if l["dst_id"] == "shop:function:shopcart.tax.compute_tax" and l["src_id"] in chunk_of]
    assert {chunk_of[l["src_id"]]["issue_key"] for l in fn} == {"acme/shopcart#12"}
    assert all(l["rel_type"] == "MENTIONS" and l["confidence"] == "VERIFIED" and "compute_tax" in l["evidence_text"]
               for l in fn)
    assert any(l["dst_id"] == "shop:file:src/shopcart/tax.py" and l["confidence"] == "VERIFIED" for l in links)

    reader = _reader(env["home"])
    try:
        for mode in ("exact", "hybrid"):
            answer = reader.query("#12", k=5, mode=mode).to_dict()
            top = answer["hits"][0]
            assert (top["issue_key"], top["state"], top["source_kind"]) == ("acme/shopcart#12", "closed", "issues"), mode
            assert answer["exact"]["matched"] and top["parent"]["text"].startswith("#12 compute_tax rounds twice")
        closed = reader.query("why is the total rounded twice on a discounted cart", k=5).to_dict()
        assert closed["hits"][0]["issue_key"] == "acme/shopcart#12" and closed["hits"][0]["state"] == "closed"
        assert any(b["symbol"] == "shopcart.tax.compute_tax" and b["confidence"] == "VERIFIED" and b["via"] == "graph"
                   for b in closed["bridge"])  # the issue names the function: the bridge reaches it
        only = reader.query("rounding", k=10, kind="issues").to_dict()
        assert only["hits"] and {h["source_kind"] for h in only["hits"]} == {"issues"}
        code = reader.query("shopcart.tax.compute_tax", k=3).to_dict()
        assert code["hits"][0]["source_kind"] == "code" and "issue_key" not in code["hits"][0]
        refs = reader.paths("acme/shopcart#13", "acme/shopcart#12", rel_types=["REFERENCES"]).to_dict()
        assert refs["paths"] and refs["paths"][0]["edges"][0]["evidence"]["text"].startswith("Fixes #12")
        reach = reader.paths("#12", "shopcart.tax.compute_tax", rel_types=["CONTAINS", "MENTIONS"]).to_dict()
        assert reach["paths"] and [e["type"] for e in reach["paths"][0]["edges"]] == ["CONTAINS", "MENTIONS"]
    finally:
        reader.close()

    # an issue reopened in a new export: the same chunk ids, the new state in every hit
    doc = github_export()
    doc["issues"][0].update(state="open", closed_at=None, updated_at="2025-04-01T00:00:00Z")
    env["tracker"].write_text(json.dumps(doc))
    env["sources"].write_text("sources:\n"
                              "  - {id: shop, kind: code, path: shop, include: ['src/**/*.py']}\n"
                              "  - {id: tracker, kind: issues, path: tracker.json}\n")
    assert main(["build"]) == 0
    assert {r["chunk_id"] for r in read_rows(SourceLayout(settings, "tracker").chunks)} == {r["chunk_id"] for r in rows}
    reader = _reader(env["home"])
    try:
        assert reader.query("#12", k=3, mode="exact").to_dict()["hits"][0]["state"] == "open"
    finally:
        reader.close()

    # the source leaves the file: its points, rows, aliases, nodes and links go
    env["sources"].write_text("sources:\n  - {id: shop, kind: code, path: shop, include: ['src/**/*.py']}\n")
    assert main(["build"]) == 0
    assert set(load_current(settings.manifest_dir)["sources"]) == {"shop"}
    fts, neo = open_fts(settings), open_neo4j(settings)
    try:
        with open_qdrant(settings) as q:
            assert q.count("issues", "tracker") == 0
        assert fts.counts("tracker")["child_rows"] == 0 and fts.exact("#12") == []
        assert neo.counts("tracker")["total_nodes"] == 0 and not neo.resolve_anchors(["acme/shopcart#12"])
        assert neo._read("MATCH ()-[r:MENTIONS]->() RETURN count(r) AS n")[0]["n"] == 0
    finally:
        fts.close()
        neo.close()
