"""The official neo4j driver, imported without its optional pandas support where pandas is not
loaded yet.

The driver imports pandas only to offer `Result.to_df` and pandas values as query parameters, which
mtrag never uses; that import was a quarter of a CLI query (docs/performance.md#neo4j), and a
reader imports nothing else of pandas. A process that loaded pandas first (a build's metadata
tables) keeps the driver's support; one that loads it later has pandas, only not in the driver."""
from __future__ import annotations

from mtrag_resources.core.pandas_hidden import pandas_hidden

with pandas_hidden():  # a driver imported before keeps what it found
    import neo4j as _neo4j

GraphDatabase = _neo4j.GraphDatabase
RoutingControl = _neo4j.RoutingControl
ClientError = _neo4j.exceptions.ClientError

__all__ = ["ClientError", "GraphDatabase", "RoutingControl"]
