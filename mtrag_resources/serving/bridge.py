"""The doc -> code bridge of a query: published MENTIONS / IMPLEMENTS edges from the doc hits (docs
and issues), and for doc hits with no edge, identifiers resolved through exact aliases (proposals,
appended to a log the links stage reads; never written into the live generation)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from mtrag_resources.publish.gate import GateState
from mtrag_resources.serving.query_text import identifiers_in
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
    symbols the query itself names (`query_code`: rows the exact channel resolved from the
    query's identifiers, e.g. a pasted doc section), then for each of the best BRIDGE_DOC_HITS doc
    hits, in rank order, its MENTIONS / IMPLEMENTS edges (VERIFIED before INFERRED) or, when it has
    none, the identifiers in its text resolved through exact aliases (PROPOSED; logged as
    proposals, never written into the live generation). Each entry names the doc hit it came from
    (`from_chunk_id`, `from_title`, `from_rank`) and the code's `source_id`. `scope` (a scoped
    query's sources): only code of these sources is bridged to; a doc hit whose edges all lead
    elsewhere is resolved through the scope's aliases instead. Returns (entries, proposals to log)."""
    entries = [_entry(QUERY_TITLE, 0, "", row, "MENTIONS", "VERIFIED",
                      {"matched_text": row.get("symbol"), "in": "query"}, "query")
               for row in (query_code or [])]
    doc_hits = [h for h in hits if h["source_kind"] in PROSE_KINDS]
    if query_code and _is_pasted(query_text):
        # A pasted doc section that names code: only its own passages' edges (doc hits whose text
        # is inside the query) are about it; other doc hits add noise.
        doc_hits = [h for h in doc_hits if _inside(h["text"], query_text)]
    doc_hits = doc_hits[:BRIDGE_DOC_HITS]
    proposals: list[dict] = []
    if doc_hits:
        by_doc: dict[str, list[dict]] = {}
        if neo is not None and not state.is_stale(LINKS_SOURCE, "neo4j"):
            for b in neo.bridge([h["chunk_id"] for h in doc_hits]):
                by_doc.setdefault(b["from_chunk_id"], []).append(b)
        for h in doc_hits:
            edges = sorted((b for b in by_doc.get(h["chunk_id"], [])
                            if scope is None or b.get("source_id") in scope),
                           key=lambda b: CONFIDENCE_ORDER.get(b.get("confidence"), 9))
            for b in edges:
                entries.append(_entry(h["title"], h["rank"], h["chunk_id"], b, b.get("relation"),
                                      b.get("confidence"), b.get("evidence"), "graph"))
            if not edges:
                found, wanted = _aliases(fts, manifest, h, state, scope)
                entries.extend(found)
                proposals.extend(wanted)
    out, seen = [], set()
    for e in sorted(entries, key=lambda e: (e["from_rank"], CONFIDENCE_ORDER.get(e["confidence"], 9))):
        if e["symbol"] and e["symbol"] in seen:
            continue
        seen.add(e["symbol"])
        out.append(e)
    return out[:BRIDGE_CAP], proposals


def resolve_identifier(fts, ident: str, found: list[dict], allowed: set[str]) -> str | None:
    """The one code chunk an identifier written in prose names, or None when it names none or
    several: an exact alias (written the same way when case alone tells two apart, all chunks of
    one symbol counting once), else a symbol that ends with the identifier's dotted tail and starts
    with its package (`click.Context.invoke` is re-exported `click.core.Context.invoke`). `found`:
    the store's exact lookup of `ident` (channels.AliasLookups)."""
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
    near = [h for h in found if h["match"] == "last_part" and (h.get("symbol") or "").endswith(tail)
            and (len(parts) == 2 or (h.get("symbol") or "").split(".")[0] == parts[0])]
    return _one_symbol(fts, near) if near else None


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
