"""The doc -> code bridge of a query: published MENTIONS / IMPLEMENTS edges from the doc hits, and
for doc hits with no edge, identifiers resolved through exact aliases (proposals, appended to a
log the links stage reads; never written into the live generation)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from mtrag_resources.publish.gate import GateState
from mtrag_resources.serving.query_text import identifiers_in
from mtrag_resources.stores.contract import LINKS_SOURCE


def doc_to_code_bridge(neo, fts, manifest: dict, hits: list[dict], state: GateState) -> tuple[list[dict], list[dict]]:
    """Doc hits -> MENTIONS / IMPLEMENTS -> code symbols; when a doc hit has no edge, the
    identifiers in its text resolved through exact aliases (logged as proposals, never
    written into the live generation). Returns (bridge entries, proposals to log)."""
    doc_hits = [h for h in hits if h["source_kind"] == "docs"]
    if not doc_hits:
        return [], []
    out = []
    linked: set[str] = set()
    if neo is not None and not state.is_stale(LINKS_SOURCE, "neo4j"):
        for b in neo.bridge([h["chunk_id"] for h in doc_hits]):
            linked.add(b["from_chunk_id"])
            out.append({"from_chunk_id": b["from_chunk_id"], "symbol": b.get("symbol"),
                        "file_path": b.get("file_path"), "start_line": b.get("start_line"),
                        "relation": b.get("relation"), "confidence": b.get("confidence"),
                        "evidence": b.get("evidence"), "via": "graph"})
    proposals = []
    stale_f = state.stale_for("fts")
    code_sources = {s for s, e in manifest["sources"].items() if e["kind"] == "code"}
    for h in doc_hits:
        if h["chunk_id"] in linked:
            continue
        for ident in identifiers_in(h["text"])[:8]:
            found = [e for e in fts.exact(ident, k=3)
                     if e["source_id"] in code_sources and e["source_id"] not in stale_f
                     and e["match"] == "exact" and e["alias_kind"] in ("symbol", "short_symbol")]
            if len(found) != 1:
                continue  # ambiguous or unknown: no guess
            row = fts.get_chunks([found[0]["chunk_id"]]).get(found[0]["chunk_id"])
            if not row:
                continue
            node_ids = json.loads(row["graph_ids"]) if isinstance(row["graph_ids"], str) else (row["graph_ids"] or [])
            entry = {"from_chunk_id": h["chunk_id"], "symbol": row["symbol"], "file_path": row["file_path"],
                     "start_line": row["start_line"], "relation": "MENTIONS", "confidence": "PROPOSED",
                     "evidence": {"matched_text": ident, "file": h["file_path"], "line": h["start_line"]},
                     "via": "alias"}
            out.append(entry)
            if node_ids:
                proposals.append({"from_chunk_id": h["chunk_id"], "source_id": h["source_id"],
                                  "node_id": node_ids[0], "symbol": row["symbol"], "matched_text": ident,
                                  "file_path": h["file_path"], "line": h["start_line"]})
    return out, proposals


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
