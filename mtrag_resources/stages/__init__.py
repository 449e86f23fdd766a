"""One module per Dagster asset: the stage's logic, callable without Dagster. Imports `publish`
and below; never `serving`.

Each `build_*` returns a `StageResult`: the data version Dagster records and the metadata a
maintainer sees on the materialization."""
