"""The query gate: which (source, store) channels may serve for the published generation.

A store whose committed marker for a source differs from the manifest, or that has an open
`begin`, is `stale` for that source: its hits are left out and reported, never mixed in."""
from __future__ import annotations

from dataclasses import dataclass, field

from mtrag_resources.stores.contract import LINKS_SOURCE, Marker

STORES = ("qdrant", "fts", "neo4j")


@dataclass
class GateState:
    generation: int | None
    stores: dict = field(default_factory=dict)   # source -> store -> {"generation", "state"}
    stale: list = field(default_factory=list)    # [{"source", "store", "reason"}]
    graph_markers: dict | None = None            # the graph's markers the gate saw (None: unreachable)

    def is_stale(self, source_id: str, store: str) -> bool:
        return any(s["source"] == source_id and s["store"] == store for s in self.stale)

    def stale_for(self, store: str) -> set[str]:
        return {s["source"] for s in self.stale if s["store"] == store}


def evaluate(manifest: dict | None, live: dict[str, dict[str, Marker | None]],
             links_marker: Marker | None = None, unreachable: dict[str, str] | None = None) -> GateState:
    """`live[store][source]` is the marker each store holds now; `unreachable[store]` explains a
    store that could not be asked (its channel is stale for every source)."""
    if not manifest:
        return GateState(generation=None, stale=[{"source": "*", "store": "*",
                                                   "reason": "no published generation (run `mtrag build`)"}])
    unreachable = unreachable or {}
    state = GateState(generation=int(manifest["generation"]))
    for sid, entry in sorted(manifest.get("sources", {}).items()):
        expected = entry["chunk_generation"]
        state.stores[sid] = {}
        for store in STORES:
            if store in unreachable:
                state.stores[sid][store] = {"generation": None, "state": "unreachable"}
                state.stale.append({"source": sid, "store": store, "reason": unreachable[store]})
                continue
            marker = live.get(store, {}).get(sid)
            state.stores[sid][store] = {"generation": marker.generation if marker else None,
                                        "state": marker.state if marker else "missing"}
            reason = _reason(marker, expected)
            if reason:
                state.stale.append({"source": sid, "store": store, "reason": reason})
    expected_links = manifest.get("links", {}).get("generation")
    if expected_links and "neo4j" not in unreachable:
        reason = _reason(links_marker, expected_links)
        if reason:
            state.stale.append({"source": LINKS_SOURCE, "store": "neo4j", "reason": reason})
    return state


def _reason(marker: Marker | None, expected: str) -> str | None:
    if marker is None:
        return f"no marker; the manifest expects generation {expected}"
    if marker.state != "committed":
        return f"write in progress ({marker.state} {marker.generation}); published generation is {expected}"
    if marker.generation != expected:
        return f"store holds generation {marker.generation}, the manifest publishes {expected}"
    return None
