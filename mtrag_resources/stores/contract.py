"""What every marked store promises (Qdrant, FTS, Neo4j): the generation marker it keeps per source,
and the `MarkedStore` protocol the three implement.

A write of a source is bracketed: the store first records `begin` with the source's generation
(the digest of its chunk set), then writes the data, then `committed`; a reader trusts a store for
a source only when its committed generation is the one the manifest publishes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

BEGIN = "begin"
COMMITTED = "committed"
LINKS_SOURCE = "__links__"  # marker key for the cross-source links projection


@dataclass(frozen=True)
class Marker:
    source_id: str
    generation: str
    state: str  # begin | committed

    @property
    def committed(self) -> bool:
        return self.state == COMMITTED


@runtime_checkable
class MarkedStore(Protocol):
    """The contract of a store that holds sources under generation markers. `write_source` takes
    the source id and generation first and the store's own data after; it leaves the marker at
    `begin` if it dies, `committed` when the data is whole. `delete_source` removes the data and
    the marker. The publish gate and the reader use only `marker` / `markers`."""

    def write_source(self, source_id: str, *args: Any, **kwargs: Any) -> Any: ...

    def delete_source(self, source_id: str) -> Any: ...

    def marker(self, source_id: str) -> Marker | None: ...

    def markers(self) -> dict[str, Marker]: ...

    def close(self) -> None: ...


def is_store_failure(exc: BaseException) -> bool:
    """Did a store's own client fail (a database that cannot be opened or read)? For the layers
    above, which import no store client: the HTTP front answers these 503, not 500."""
    import sqlite3
    return isinstance(exc, sqlite3.DatabaseError)
