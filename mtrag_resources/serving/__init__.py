"""Answering queries from published generations only: the reader and its channels, fusion, the
doc -> code bridge, bundles, query text handling, request limits, rendering and HTTP. Imports
`publish` and below; never `stages`."""
