"""Every store and the only place that imports a store client (qdrant_client, qdrant_edge, neo4j,
sqlite3): Qdrant, SQLite FTS, Neo4j and its local server launcher, the CAS, Parquet tables and the
embedding cache; `contract.py` is what a marked store promises, `connect.py` opens each one.
Imports `core`, `ingest` and `embedding`."""
