"""From a source to parsed facts: source specs (folders, sdists), file inventories and snapshots,
globs and file types, chunking of code and docs, the embedding text of code chunks and identifier
splitting (embed_text.py), the code graph resolver and the doc -> code link resolver. Pure
computation over files; imports only `core`."""
