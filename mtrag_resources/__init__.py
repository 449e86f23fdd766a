"""mtrag's Dagster-independent logic: sources, parsing, CAS, embeddings, stores, manifest, serving."""
