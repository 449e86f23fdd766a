"""The version of each stage's output for the same input. Dagster shows a stage and everything
downstream as stale when its version changes; the chunk-set generation and the no-change check
of `mtrag build` include them, so a new version rebuilds what it shapes."""
from __future__ import annotations

# Bump a stage's version when its output for the same input changes; Dagster then shows the
# stage and everything downstream as stale, and the generation digest changes.
CODE_VERSIONS = {
    "raw_source": "2",  # 2: git sources (`git:` + `ref:`, ingest/git_source.py): entries carry `blob`,
                        # the inventory `ref`, `repository`, `origin`; a git snapshot's digest has its commit
    "cas_chunks": "6",  # 2: chunk rows carry `script` (cjk or empty); 3: `embed_hash` (code children's
                        # embedding text), `declaration`; overload stubs fold into their implementation;
                        # 4: every byte in some child: long module-level code, class bodies and lines
                        # windowed, complete class outlines, heading-only sections get a passage;
                        # per-file facts files (graph facts only) instead of one facts.json.gz;
                        # 5: rows carry `commit_sha` (was `commit`; kept rows keep theirs) and `ref`;
                        # 6: Python files' facts carry web routes (ingest/routes.py)
    "canonical_graph": "2",  # 2: Endpoint nodes (`GET /login`) and ROUTES_TO edges to their handlers
    "embedding_cache": "2",  # 2: code children embed their embedding text (`embed_hash`)
    "qdrant_collection": "5",  # 2: the payload names the kind source_kind (was source_type); 3: vectors
                               # by embed_hash, payload `declaration`; 4: payload `point_digest`, payload
                               # indexes only on filter fields; 5: payload `commit_sha` (was `commit`), `ref`
    "fts_db": "3",  # 2: code rows' camelCase identifiers indexed as words too (fts_cjk); 3: web endpoints
                    # (`GET /login`, `/login`) are exact aliases of their handlers' chunks
    "neo4j_graph": "1",
    "cross_source_links": "1",
    "index_manifest": "2",  # 2: a git source's entry has `commit_sha`, `ref`, `repository`
}
