"""The generation marker every store keeps per source: begin(source, generation) ... commit."""
from __future__ import annotations

from dataclasses import dataclass

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
