"""The official neo4j driver, imported without its optional pandas support where pandas is not
loaded yet.

The driver imports pandas only to offer `Result.to_df` and pandas values as query parameters, which
mtrag never uses; that import was 0.32 s of a 1.3 s `mtrag query` on the django bench home, and a
reader imports nothing else of pandas. A process that loaded pandas first (a build's metadata
tables) keeps the driver's support; one that loads it later has pandas, only not in the driver."""
from __future__ import annotations

import sys


def _import_driver():
    if "pandas" in sys.modules or "neo4j" in sys.modules:
        import neo4j
        return neo4j
    sys.modules["pandas"] = None  # type: ignore[assignment] - `import pandas` raises ImportError
    try:
        import neo4j
    finally:
        del sys.modules["pandas"]
    return neo4j


_neo4j = _import_driver()
GraphDatabase = _neo4j.GraphDatabase
RoutingControl = _neo4j.RoutingControl
ClientError = _neo4j.exceptions.ClientError

__all__ = ["ClientError", "GraphDatabase", "RoutingControl"]
