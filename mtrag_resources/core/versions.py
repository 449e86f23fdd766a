"""The version of each stage's output for the same input. Dagster shows a stage and everything
downstream as stale when its version changes; the chunk-set generation and the no-change check
of `mtrag build` include them, so a new version rebuilds what it shapes."""
from __future__ import annotations

# Bump a stage's version when its output for the same input changes; Dagster then shows the
# stage and everything downstream as stale, and the generation digest changes.
CODE_VERSIONS = {
    "raw_source": "4",  # 2: git sources (`git:` + `ref:`, ingest/git_source.py): entries carry `blob`,
                        # the inventory `ref`, `repository`, `origin`; a git snapshot's digest has its commit;
                        # 3: a docs source takes PDFs (binary; bytes into the CAS), a scanned, encrypted or
                        # unreadable one skipped with its reason (ingest/pdf.py); metadata `skipped_documents`;
                        # 4: a git tree's paths that leave the repository (`..`, absolute) are skipped,
                        # binary files found by their printable ratio as well as NUL bytes
    "cas_chunks": "11",  # 2: chunk rows carry `script` (cjk or empty); 3: `embed_hash` (code children's
                         # embedding text), `declaration`; overload stubs fold into their implementation;
                         # 4: every byte in some child: long module-level code, class bodies and lines
                         # windowed, complete class outlines, heading-only sections get a passage;
                         # per-file facts files (graph facts only) instead of one facts.json.gz;
                         # 5: rows carry `commit_sha` (was `commit`; kept rows keep theirs) and `ref`;
                         # 6: Python files' facts carry web routes (ingest/routes.py);
                         # 7: PDF documents (ingest/chunking/pdf.py: outline sections or one per page,
                         # passages within one page) and rows carry `page`; HTML drops <nav>, <footer> and
                         # navigation/contentinfo/banner/search roles, a heading-less page is named by <title>;
                         # 8: issue-tracker exports (`kind: issues`, ingest/issues.py): issue / issue_body /
                         # issue_comment chunks; every row carries `issue_key` and `state`;
                         # 9: the chunk table is bucketed by file (stores/bucketed.py), `chunks/`;
                         # 10: a doc's code spans are literals, not references (issues and HTML
                         # excepted); rST interpreted text is one under its conf.py's object default role
                         # 11: a file gives at most `max_file_chunks` chunks, an export `max_issues` issues
                         # (chunking/limits.py); the rest is cut and named in `files_cut`
    "canonical_graph": "5",  # 2: Endpoint nodes (`GET /login`) and ROUTES_TO edges to their handlers;
                             # 3: Issue nodes (GraphNode.properties), Issue CONTAINS its chunks, REFERENCES
                             # between issues; issues' references to code and files (`ref_kind` file);
                             # 4: nodes and relations bucketed by file (stores/bucketed.py);
                             # 5: import rows carry their `kind` (star imports re-export a module's names)
    "embedding_cache": "2",  # 2: code children embed their embedding text (`embed_hash`)
    "qdrant_collection": "7",  # 2: the payload names the kind source_kind (was source_type); 3: vectors
                               # by embed_hash, payload `declaration`; 4: payload `point_digest`, payload
                               # indexes only on filter fields; 5: payload `commit_sha` (was `commit`), `ref`;
                               # 6: payload `page` (a PDF chunk's 1-based page; absent on other points);
                               # 7: payload `issue_key`, `state` (an issue's chunks; absent on other points)
    "fts_db": "4",  # 2: code rows' camelCase identifiers indexed as words too (fts_cjk); 3: web endpoints
                    # (`GET /login`, `/login`) are exact aliases of their handlers' chunks; 4: issue keys
                    # (`#12`, `owner/repo#12`, `PROJ-12`) are aliases (kind `issue`), no short_symbol for issues
    "neo4j_graph": "2",  # 2: Issue nodes with their properties (ISSUE_FIELDS)
    "cross_source_links": "3",  # 2: issues' references, file paths resolved to File nodes; 3: names
                                # re-exported by star imports, members inherited by a class named by suffix
    "index_manifest": "3",  # 2: a git source's entry has `commit_sha`, `ref`, `repository`; 3: a docs
                            # source's entry has its Sphinx `default_role`
}
