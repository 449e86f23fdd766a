"""Answering queries from published generations only: the reader and its channels, fusion, the
doc -> code bridge, bundles, query text handling, request limits, the typed results
(results.py), rendering, HTTP and MCP (mcp.py, on the `mcp` SDK), and the
golden queries run against a candidate generation before it is published (golden.py). Imports
`publish` and below; never `stages`."""
