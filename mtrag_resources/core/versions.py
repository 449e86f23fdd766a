"""The version of each stage's output for the same input. Dagster shows a stage and everything
downstream as stale when its version changes; the chunk-set generation and the no-change check
of `mtrag build` include them, so a new version rebuilds what it shapes."""
from __future__ import annotations

# Bump a stage's version when its output for the same input changes; Dagster then shows the
# stage and everything downstream as stale, and the generation digest changes.
CODE_VERSIONS = {
    "raw_source": "1",
    "cas_chunks": "2",  # 2: chunk rows carry `script` (cjk or empty)
    "canonical_graph": "1",
    "embedding_cache": "1",
    "qdrant_collection": "2",  # 2: the payload names the kind source_kind (was source_type)
    "fts_db": "1",
    "neo4j_graph": "1",
    "cross_source_links": "1",
    "index_manifest": "1",
}
