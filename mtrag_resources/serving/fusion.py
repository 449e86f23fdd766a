"""Rank fusion across retrieval channels (pure Python, no store clients).

Two pieces of the serving pipeline (DESIGN.md, "Serving"):

* `merge_exact_into_dense`: exact-alias candidates that the dense top-k missed get their *real*
  cosine (the reader fetches it by point id) and join the dense ranking at the position that
  cosine gives. No rank is invented: a candidate whose cosine is below every dense hit ends up
  last, one whose cosine beats the top hit ends up first.
* `weighted_rrf`: weighted reciprocal rank fusion over any number of channels.

Scores here are similarities/fusion scores: higher is better. (The bundle scorer in
`bundles.py` works with distances instead, lower is better.)
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

#: Default channel weights for `weighted_rrf`.
#:
#: * ``dense`` (embedding cosine) and ``fts`` (SQLite FTS5 bm25) are peers: each is good at what
#:   the other misses (paraphrase; rare literal terms), so neither is preferred.
#: * ``exact`` is the alias-table channel: a hit there means the query named a symbol or title
#:   *exactly* (``click.echo``, ``Context.invoke``). Identity matches are precise - when they
#:   exist they are almost always what the user meant - so they count double. With k=60 an
#:   exact rank-1 hit contributes 2/61, as much as rank 1 in both dense and fts together.
#:
#: Channels absent from the mapping get weight 1.0.
DEFAULT_WEIGHTS: dict[str, float] = {"dense": 1.0, "fts": 1.0, "exact": 2.0}

#: Weight of a channel not named in the weights mapping.
DEFAULT_CHANNEL_WEIGHT = 1.0

Id = TypeVar("Id", bound=Hashable)


def _sort_key_id(x: object) -> tuple[str, str]:
    # ids are normally str; fall back to repr so mixed types still sort deterministically
    return (type(x).__name__, x if isinstance(x, str) else repr(x))


def weighted_rrf(
    rankings: Mapping[str, Sequence[str]],
    weights: Mapping[str, float] | None = None,
    k: int = 60,
) -> list[tuple[str, float, dict[str, dict]]]:
    """Weighted reciprocal rank fusion.

    ``rankings`` maps a channel name to its ids, best first. Each id's fused score is
    ``sum over channels c containing it of w_c / (k + rank_c)`` with 1-based ranks. An id listed
    twice in one channel counts once, at its best (first) rank.

    ``weights=None`` uses `DEFAULT_WEIGHTS`; a channel missing from the weights gets
    `DEFAULT_CHANNEL_WEIGHT` (1.0). Weights must be finite and >= 0; a zero weight keeps the
    channel's ids in the output (with a 0 contribution) but lets them not move the order.

    Returns ``[(id, fused_score, {channel: {"rank": r, "score": w/(k+r)}})]`` sorted by fused
    score descending; ties are broken by the best single-channel rank (ascending), then by id, so
    the output is deterministic and independent of the channel mapping's order.
    """
    if k < 0 or not math.isfinite(k):
        raise ValueError(f"k must be a finite number >= 0, got {k!r}")
    w_map = DEFAULT_WEIGHTS if weights is None else weights
    fused: dict[str, float] = {}
    detail: dict[str, dict[str, dict]] = {}
    best_rank: dict[str, int] = {}
    for channel in sorted(rankings):
        w = float(w_map.get(channel, DEFAULT_CHANNEL_WEIGHT))
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"weight for channel {channel!r} must be finite and >= 0, got {w!r}")
        seen: set[str] = set()
        rank = 0
        for doc_id in rankings[channel]:
            if doc_id in seen:
                continue
            seen.add(doc_id)
            rank += 1
            contribution = w / (k + rank)
            fused[doc_id] = fused.get(doc_id, 0.0) + contribution
            detail.setdefault(doc_id, {})[channel] = {"rank": rank, "score": contribution}
            if rank < best_rank.get(doc_id, rank + 1):
                best_rank[doc_id] = rank
    ordered = sorted(fused, key=lambda d: (-fused[d], best_rank[d], _sort_key_id(d)))
    return [(d, fused[d], detail[d]) for d in ordered]


def merge_exact_into_dense(
    dense: Sequence[tuple[Id, float]],
    exact_cosines: Mapping[Id, float],
) -> list[tuple[Id, float]]:
    """Insert exact-alias candidates missing from the dense top-k into the dense ranking.

    ``dense`` is the dense channel's ``[(id, cosine)]``, best first, as the vector store returned
    it. ``exact_cosines`` maps each exact-alias candidate id to its true cosine with the query
    vector (fetched by point id). Ids already in ``dense`` keep their place and score. Each
    missing candidate is inserted just before the first dense entry whose cosine is strictly
    lower than its own (so on equal cosine the original dense hit stays ahead); several missing
    candidates are inserted in descending cosine order (ties by id). Candidates whose cosine is
    NaN are dropped: they have no position to take. The dense list's own order is never changed.
    """
    present = {doc_id for doc_id, _ in dense}
    missing = [
        (doc_id, float(cos))
        for doc_id, cos in exact_cosines.items()
        if doc_id not in present and not math.isnan(float(cos))
    ]
    missing.sort(key=lambda item: (-item[1], _sort_key_id(item[0])))
    out: list[tuple[Id, float]] = []
    i = 0
    for doc_id, cos in dense:
        while i < len(missing) and missing[i][1] > cos:
            out.append(missing[i])
            i += 1
        out.append((doc_id, cos))
    out.extend(missing[i:])
    return out


_NAME_SPLIT_RE = re.compile(r"::|[.#]")


def _short_name(row: Mapping) -> str:
    """A function or method chunk's last name part ("" for other chunks and for dunders)."""
    if row.get("chunk_type") not in ("function", "method"):
        return ""
    name = _NAME_SPLIT_RE.split(str(row.get("symbol") or ""))[-1]
    return "" if name.startswith("__") and name.endswith("__") else name  # dunders implement no one declaration


def demote_declarations(
    fused: list[tuple[str, float, dict[str, dict]]],
    row_of: Callable[[str], Mapping | None],
    window: int,
) -> list[tuple[str, float, dict[str, dict]]]:
    """Declarations rank below the implementations they declare.

    A declaration-only code chunk (``row["declaration"]``: an abstract method, a Protocol member,
    a default hook with an empty body, an ``@overload`` stub without its implementation right
    after it, a ``.pyi`` stub) that the fusion ranked above a non-declaration function or method
    of the same short name (``Base.send`` above ``HTTPAdapter.send``) gets that implementation
    right above it: the implementation moves up to the declaration's place, the declaration and
    what lay between them one place down. Only the first ``window`` entries take part (what the
    answer shows; nothing leaves or enters them), and each entry keeps its fused score (so scores
    need not be descending around a moved one). A declaration the exact channel ranked first is
    left where it is: the query named it. Overload stubs followed by their implementation never
    get here: cas_chunks folds them into the implementation's chunk."""
    head = list(fused[:window])
    rows = [row_of(entry[0]) or {} for entry in head]
    done: set[str] = set()  # one implementation above a declaration is enough
    for i in range(len(head)):
        row = rows[i]
        name = _short_name(row) if row.get("declaration") else ""
        if not name or head[i][0] in done or head[i][2].get("exact", {}).get("rank") == 1:
            continue
        done.add(head[i][0])
        impl = next((j for j in range(i + 1, len(head))
                     if not rows[j].get("declaration") and _short_name(rows[j]) == name), None)
        if impl is not None:
            head.insert(i, head.pop(impl))
            rows.insert(i, rows.pop(impl))
    return head + list(fused[window:])


def named_first(fused: Sequence[tuple[Id, float, dict]], named: set[Id]) -> list[tuple[Id, float, dict]]:
    """The fused list with the chunks the whole query names (an identifier or an issue key that
    is their alias) ahead of the rest, each part in its own order: a query that is a name asks
    for what it names, however many other chunks share its words."""
    if not named:
        return list(fused)
    return [e for e in fused if e[0] in named] + [e for e in fused if e[0] not in named]
