"""The doc -> code bridge of a query: published MENTIONS / IMPLEMENTS edges from the doc hits (docs
and issues), and for doc hits with no edge, identifiers resolved through exact aliases (proposals,
appended to a log the links stage reads; never written into the live generation). A pasted doc
section is read by the rules its build read the pages by (named_in_query): its references, never
its literals."""
from __future__ import annotations

import json
import os
from pathlib import Path

from mtrag_resources.ingest.chunking.docs import pasted_references
from mtrag_resources.ingest.doc_links import EVIDENCE_TEXT_CHARS, EXACT_ROLES, clean_target, guess_labels
from mtrag_resources.publish.gate import GateState
from mtrag_resources.serving.query_text import identifiers_in, prose_of
from mtrag_resources.stores.contract import LINKS_SOURCE


# At most this many bridge entries per answer: the first ones are the precise ones (the query's
# own identifiers, then the best doc hit's verified edges), the tail is what precision pays for.
BRIDGE_CAP = 12
# Doc hits whose edges are followed, best first: a lower-ranked doc hit is about something else.
BRIDGE_DOC_HITS = 3
CONFIDENCE_ORDER = {"VERIFIED": 0, "INFERRED": 1, "PROPOSED": 2}
# The hits whose text is prose about code: docs, and issues (an issue's body and comments name the
# code they are about as docs do; cross_source_links resolves both the same way).
PROSE_KINDS = ("docs", "issues")
QUERY_TITLE = "(the query)"


def doc_to_code_bridge(neo, fts, manifest: dict, hits: list[dict], state: GateState,
                       query_code: list[dict] | None = None, query_text: str = "",
                       scope: set[str] | None = None) -> tuple[list[dict], list[dict]]:
    """The doc -> code bridge of an answer, ordered and capped (BRIDGE_CAP): first the code
    symbols the query itself names (_query_entries: a pasted doc section's references as the links
    resolved them, else `query_code`, the rows its names resolve to through the aliases), then for
    each of the best BRIDGE_DOC_HITS doc hits, in rank order, its MENTIONS / IMPLEMENTS edges
    (VERIFIED before INFERRED) or, when it has none, the identifiers in its text resolved through
    exact aliases (PROPOSED; logged as proposals, never written into the live generation). For a
    pasted doc section the doc hits are its own passages (those inside the query), all of them,
    and none is guessed from: its references are the query's. Each entry names the doc hit it came
    from (`from_chunk_id`, `from_title`, `from_rank`) and the code's `source_id`. `scope` (a scoped
    query's sources): only code of these sources is bridged to; a doc hit whose edges all lead
    elsewhere is resolved through the scope's aliases instead. Returns (entries, proposals to log)."""
    graph = neo is not None and not state.is_stale(LINKS_SOURCE, "neo4j")
    references = [r.matched_text for r in pasted_references(query_text, docs_default_role(manifest, scope))]
    doc_hits = [h for h in hits if h["source_kind"] in PROSE_KINDS]
    pasted = bool(references) or _is_pasted(query_text)  # doc markup, or several lines
    inside = [h for h in doc_hits if _inside(h["text"], query_text)] if pasted else []
    # A pasted doc section: its own passages' edges are about it; other doc hits add noise.
    own = pasted and bool(query_code or inside or references)
    entries, proposals = _doc_hit_entries(neo if graph else None, fts, manifest, inside if own else
                                          doc_hits[:BRIDGE_DOC_HITS], state, scope, within=query_text if own else None)
    edge_texts = set(map(_evidence_text, entries))
    built = _built_targets(neo, references, scope) if graph and references else {}
    entries += _query_entries(query_code or [], references, built, edge_texts)
    out, seen = [], set()
    for e in sorted(entries, key=lambda e: (e["from_rank"], CONFIDENCE_ORDER.get(e["confidence"], 9))):
        if e["symbol"] and e["symbol"] in seen:
            continue
        seen.add(e["symbol"])
        out.append(e)
    return out[:BRIDGE_CAP], proposals


def _doc_hit_entries(neo, fts, manifest: dict, doc_hits: list[dict], state: GateState, scope: set[str] | None,
                     within: str | None = None) -> tuple[list[dict], list[dict]]:
    """Each doc hit's edges (`neo`: None where the graph is stale), or where it has none the
    identifiers of its text through the aliases; (entries, proposals). `within` (a pasted
    section's text): only the edges whose evidence is in it (a passage of shared example lines
    looks inside any section that shows them), and no guess: its references are the section's."""
    by_doc: dict[str, list[dict]] = {}
    if neo is not None and doc_hits:
        # a scoped query's edges to other sources are left in the graph, not cut from its answer
        for b in neo.bridge([h["chunk_id"] for h in doc_hits], source_ids=None if scope is None else sorted(scope)):
            by_doc.setdefault(b["from_chunk_id"], []).append(b)
    entries: list[dict] = []
    proposals: list[dict] = []
    for h in doc_hits:
        edges = sorted((b for b in by_doc.get(h["chunk_id"], [])
                        if (scope is None or b.get("source_id") in scope)
                        and (within is None or _evidence_text(b) in within)),
                       key=lambda b: CONFIDENCE_ORDER.get(b.get("confidence"), 9))
        for b in edges:
            entries.append(_entry(h["title"], h["rank"], h["chunk_id"], b, b.get("relation"),
                                  b.get("confidence"), b.get("evidence"), "graph"))
        if not edges and within is None:
            found, wanted = _aliases(fts, manifest, h, state, scope)
            entries.extend(found)
            proposals.extend(wanted)
    return entries, proposals


def _evidence_text(edge: dict) -> str:
    evidence = edge.get("evidence")
    return (evidence.get("text") if isinstance(evidence, dict) else None) or "\0"


def _built_targets(neo, texts: list[str], scope: set[str] | None) -> dict[str, dict]:
    """Reference text -> the one code target the links resolved it to wherever the docs make that
    reference (VERIFIED); a text resolved to several (a relative name under two modules) is left out."""
    full = {t[:EVIDENCE_TEXT_CHARS]: t for t in texts}
    by_text: dict[str, list[dict]] = {}
    for row in neo.resolved_references(list(full), source_ids=None if scope is None else sorted(scope)):
        if row.get("confidence") == "VERIFIED" and (scope is None or row.get("source_id") in scope):
            by_text.setdefault(row["text"], []).append(row)
    return {full[t]: rows[0] for t, rows in by_text.items() if t in full and len({r["symbol"] for r in rows}) == 1}


def _query_entries(query_code: list[dict], references: list[str], built: dict[str, dict],
                   edge_texts: set[str]) -> list[dict]:
    """The query's own entries in the order it names them: a reference the build resolved keeps
    the build's target (`built`; resolved with its page's module context, re-exports and bases),
    else its resolution through the aliases (a `query_code` row by its `matched_text`) unless a
    doc hit's edge resolved that very text already."""
    rows = {row.get("matched_text") or row.get("symbol"): row for row in query_code}
    out = []
    for text in dict.fromkeys(references + list(rows)):
        evidence = {"matched_text": text, "in": "query"}
        if text in built:
            out.append(_entry(QUERY_TITLE, 0, "", built[text], built[text].get("relation"), "VERIFIED", evidence, "graph"))
        elif text in rows and text not in edge_texts:
            out.append(_entry(QUERY_TITLE, 0, "", rows[text], "MENTIONS", "VERIFIED", evidence, "query"))
    return out


def resolve_identifier(fts, ident: str, found: list[dict], allowed: set[str]) -> str | None:
    """The one code chunk an identifier written in prose names, or None when it names none or
    several: an exact alias (written the same way when case alone tells two apart, all chunks of
    one symbol counting once), else a symbol that ends with the identifier's dotted tail and starts
    with its package (`click.Context.invoke` is re-exported `click.core.Context.invoke`), else for
    `package.name` the package's one symbol of that name (`click.echo` is `click.utils.echo`).
    `found`: the store's exact lookup of `ident` (channels.AliasLookups)."""
    found = [h for h in found if h["source_id"] in allowed]
    exact = [h for h in found if h["match"] == "exact"]
    if len({h["alias"] for h in exact}) > 1:
        exact = [h for h in exact if h["alias"] == ident] or exact
    if exact:
        return _one_symbol(fts, exact)
    parts = ident.split(".")
    if len(parts) < 2:
        return None
    tail = "." + ".".join(parts[1:]) if len(parts) > 2 else "." + ident
    last = [h for h in found if h["match"] == "last_part"]
    near = [h for h in last if (h.get("symbol") or "").endswith(tail)
            and (len(parts) == 2 or _package(h) == parts[0])]
    if not near and len(parts) == 2:
        near = [h for h in last if _package(h) == parts[0]]
    return _one_symbol(fts, near) if near else None


def _package(hit: dict) -> str:
    return (hit.get("symbol") or "").split(".")[0]


def named_in_query(text: str, default_role: str = "") -> list[tuple[tuple[str, ...], str, str]]:
    """What a query names in code: (the names to try, first that resolves wins; the text naming
    it; its role, "" for none). A text with Sphinx or MyST markup (a pasted doc section) names what
    its references name, read as its build read its pages (docs.pasted_references: roles and autodoc
    directives, rST interpreted text under its project's object `default_role`; a relative target in
    the module its `currentmodule` sets first); its literals (``project_name``, `True`) and the names
    in its examples name nothing. A question names code as prose does (identifiers, inline code)."""
    refs = pasted_references(text, default_role)
    if not refs:
        return [((ident,), ident, "") for ident in identifiers_in(prose_of(text)) if not ident.startswith("__")]
    out = []
    for ref in refs:
        target = clean_target(ref.target)
        if not target or not all(part.isidentifier() for part in target.split(".")):
            continue  # `python:contextlib.contextmanager`: another project's object
        context = "" if ref.role in EXACT_ROLES else ref.module_context
        names = (f"{context}.{target}", target) if context and not target.startswith(context + ".") else (target,)
        out.append((names, ref.matched_text, ref.role))
    return out


def docs_default_role(manifest: dict, scope: set[str] | None = None) -> str:
    """The Sphinx default role the docs sources (of the scope) agree on, "" where they have none
    or several: a pasted section's interpreted text is read by it (index_manifest records it)."""
    roles = {e.get("default_role") or "" for s, e in manifest.get("sources", {}).items()
             if e.get("kind") == "docs" and (scope is None or s in scope)} - {""}
    return roles.pop() if len(roles) == 1 else ""


def code_named(fts, text: str, lookups, allowed: set[str], default_role: str = "",
               limit: int = 32) -> list[tuple[str, str]]:
    """(code chunk id, the text naming it) for each thing the query names (named_in_query) that
    resolves to one code chunk of the `allowed` sources (resolve_identifier), a reference's only
    where that code fits it (_fits), in query order. `lookups(name)`: the store's exact lookup
    (channels.AliasLookups)."""
    found = []
    for names, matched, role in named_in_query(text, default_role)[:limit]:
        for name in names:
            chunk_id = resolve_identifier(fts, name, lookups(name), allowed)
            if chunk_id:
                found.append((chunk_id, matched, name, role and (role, names[-1])))
                break
    references = [c for c, _, _, ref in found if ref]
    rows = fts.get_chunks(references) if references else {}
    out: dict[str, str] = {}
    for chunk_id, matched, name, ref in found:
        if not ref or _fits(rows.get(chunk_id), name, *ref):
            out.setdefault(chunk_id, matched)
    return list(out.items())


def _fits(row: dict | None, name: str, role: str, target: str) -> bool:
    """Does a code row fit a reference that resolved to it through `name`: the kinds of code its
    role may name (doc_links.guess_labels), its name written the same way (Python's names are
    case-sensitive, the aliases are not: `:data:`request`` is not the class `Request`)."""
    if row is None:
        return False
    labels = guess_labels(role, target)
    kind = (row.get("chunk_type") or "").capitalize()
    symbol = row.get("symbol") or ""
    if role in EXACT_ROLES:
        return kind in labels and symbol == name
    return (labels is None or kind in labels) and symbol.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]


def _one_symbol(fts, hits: list[dict]) -> str | None:
    if len(hits) == 1:
        return hits[0]["chunk_id"]
    rows = fts.get_chunks([h["chunk_id"] for h in hits])
    symbols = {r["symbol"] for r in rows.values()}
    return hits[0]["chunk_id"] if len(symbols) == 1 else None


def _is_pasted(query: str) -> bool:
    """A query of several lines is a pasted doc section (a question is one line)."""
    return query.count("\n") >= 2


def _inside(passage: str, query: str) -> bool:
    """Are most of the passage's non-blank lines lines of the query?"""
    lines = [line.strip() for line in passage.splitlines() if line.strip()]
    return bool(lines) and sum(line in query for line in lines) >= 0.6 * len(lines)


def _entry(title: str, rank: int, chunk_id: str, target: dict, relation, confidence, evidence, via: str) -> dict:
    return {"from_chunk_id": chunk_id, "from_title": title, "from_rank": rank, "symbol": target.get("symbol"),
            "file_path": target.get("file_path"), "start_line": target.get("start_line"),
            "relation": relation, "confidence": confidence, "evidence": evidence, "via": via,
            "source_id": target.get("source_id")}


def _aliases(fts, manifest: dict, h: dict, state: GateState,
             scope: set[str] | None = None) -> tuple[list[dict], list[dict]]:
    """A doc hit without edges: the identifiers in its text that name exactly one code symbol
    (of the scope's code sources, for a scoped query)."""
    stale_f = state.stale_for("fts")
    code_sources = {s for s, e in manifest["sources"].items() if e["kind"] == "code"
                    and (scope is None or s in scope)}
    ids = None if scope is None else sorted(code_sources - stale_f)
    if ids == []:
        return [], []
    entries, proposals = [], []
    for ident in identifiers_in(h["text"])[:8]:
        found = [e for e in fts.exact(ident, k=3, source_ids=ids)
                 if e["source_id"] in code_sources and e["source_id"] not in stale_f
                 and e["match"] == "exact" and e["alias_kind"] in ("symbol", "short_symbol")]
        if len(found) != 1:
            continue  # ambiguous or unknown: no guess
        row = fts.get_chunks([found[0]["chunk_id"]]).get(found[0]["chunk_id"])
        if not row:
            continue
        node_ids = json.loads(row["graph_ids"]) if isinstance(row["graph_ids"], str) else (row["graph_ids"] or [])
        entries.append(_entry(h["title"], h["rank"], h["chunk_id"], row, "MENTIONS", "PROPOSED",
                              {"matched_text": ident, "file": h["file_path"], "line": h["start_line"]}, "alias"))
        if node_ids:
            proposals.append({"from_chunk_id": h["chunk_id"], "source_id": h["source_id"],
                              "node_id": node_ids[0], "symbol": row["symbol"], "matched_text": ident,
                              "file_path": h["file_path"], "line": h["start_line"]})
    return entries, proposals


def log_proposals(path: Path, proposals: list[dict]) -> None:
    """Append bridge proposals for the links stage to read; never fails the query."""
    # One write per batch in append mode: lines from concurrent readers do not interleave.
    data = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in proposals)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data.encode("utf-8"))
        finally:
            os.close(fd)
    except OSError:
        pass  # proposals are a by-product: a full disk or read-only home must not fail the query
