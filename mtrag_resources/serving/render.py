"""Plain-text views of reader results for the terminal (the typed results of serving/results.py,
read in their `to_dict()` form, or plain dicts of that shape).

Every value shown comes from indexed files (names, titles, text), so it may carry what a terminal
obeys: escape sequences, other control characters, bidi overrides that reorder what is shown.
Each is shown escaped (`\x1b`, `\u202e`), as the JSON output escapes control characters; a
snippet keeps its lines."""
from __future__ import annotations

import re

# C0 controls but tab, DEL, C1 controls, line and paragraph separators, the bidi embeddings,
# overrides and isolates, and lone surrogates (which a UTF-8 terminal cannot be sent)
_TERMINAL_UNSAFE_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                                 "\ud800-\udfff]")
# What the views show with repr(), which escapes them already: the caller's own query and names.
_SHOWN_BY_REPR = ("query", "from", "to")
# Values whose lines the views cut themselves: a hit's snippet, a stale store's reason (its first line)
_MULTI_LINE = ("text", "reason")


def _escape(match: re.Match) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, keep_newlines: bool = False) -> str:
    """`text` as a terminal shows it as it is: every control, bidi or separator character escaped
    (`keep_newlines`: but line feeds, a CR LF as one)."""
    if not _TERMINAL_UNSAFE_RE.search(text):
        return text
    if not keep_newlines:
        return _TERMINAL_UNSAFE_RE.sub(_escape, text)
    return "\n".join(_TERMINAL_UNSAFE_RE.sub(_escape, line) for line in text.replace("\r\n", "\n").split("\n"))


def _terminal_values(value, key: str = ""):
    """A result with every string in it through terminal_safe (multi-line values keep their lines)."""
    if isinstance(value, str):
        return terminal_safe(value, keep_newlines=key in _MULTI_LINE)
    if isinstance(value, list):
        return [_terminal_values(v, key) for v in value]
    if isinstance(value, dict):
        return {k: _terminal_values(v, k) for k, v in value.items()}
    return value


def _as_dict(result) -> dict:
    result = result.to_dict() if hasattr(result, "to_dict") else result
    return {k: v if k in _SHOWN_BY_REPR else _terminal_values(v, k) for k, v in result.items()}


def _first_lines(text: str, n: int = 3, width: int = 110) -> str:
    lines = [l.rstrip() for l in (text or "").splitlines() if l.strip()][:n]
    return "\n".join("      " + (l if len(l) <= width else l[: width - 3] + "...") for l in lines)


def render_query(result: dict) -> str:
    result = _as_dict(result)
    out = [f"generation {result['generation']}  query: {result['query'][:200]!r}  mode: {result.get('mode')}"]
    exact = result.get("exact") or {}
    if exact.get("identifier") and not exact.get("matched"):
        out.append(f"  not found: no symbol is named {result['query']!r}; the hits below are only similar")
    elif result.get("confidence") == "low" and result["hits"]:
        out.append("  low confidence: no hit is close to the query")
    for h in result["hits"]:
        chans = ", ".join(f"{c}#{v['rank']}" for c, v in h["channels"].items())
        where = _locator(h)
        label = f"{h['title']} [{h['state']}]" if h.get("issue_key") else h["symbol"] or h["title"]  # an issue
        out.append(f"  {h['rank']:>2}. {label}  [{where}]  ({chans})")
        out.append(_first_lines(h["text"]))
    for b in result.get("bridge", []):
        origin = b.get("from_title") or b["from_chunk_id"][:8]
        out.append(f"  bridge: {origin} -{b['relation']}/{b['confidence']}-> {b['symbol']} "
                   f"({b['file_path']}:{b['start_line']})")
    for p in result.get("paths", []):
        out.append("  path: " + " -> ".join(n["qualified_name"] or n["name"] for n in p["nodes"]))
    for b in result.get("bundles", []):
        out.append(f"  bundle: {b['source_id']}:{b['unit']} score {b['score']:.3f} via {b['best_path']}")
    if not result["hits"] and result.get("empty_reason"):
        out.append(f"  no hits: {result['empty_reason']}")
    out += _stale_lines(result.get("stale", []))
    return "\n".join(out)


def _locator(hit: dict) -> str:
    """Where a hit is: an issue by its key (its export's lines say nothing), a PDF's page, else lines."""
    if hit.get("issue_key"):
        return f"{hit['source_id']}:{hit['issue_key']}"
    if hit.get("page"):
        return f"{hit['source_id']}:{hit['file_path']}:p. {hit['page']}"
    return f"{hit['source_id']}:{hit['file_path']}:{hit['start_line']}-{hit['end_line']}"


def _stale_lines(stale: list[dict]) -> list[str]:
    """One line per store and cause, naming its sources: a Neo4j that is down makes every source's
    graph stale for the same reason, which is one fact, not one per source."""
    by_cause: dict[tuple[str, str], list[str]] = {}
    for s in stale:
        by_cause.setdefault((s["store"], s["reason"].splitlines()[0] if s["reason"] else ""), []).append(s["source"])
    return [f"  STALE {sources[0]}/{store}: {reason}" if len(sources) == 1 else
            f"  STALE {store} of {len(sources)} sources ({', '.join(sources)}): {reason}"
            for (store, reason), sources in by_cause.items()]


def render_paths(result: dict) -> str:
    result = _as_dict(result)
    out = [f"generation {result['generation']}  paths from {result['from']!r}" + (f" to {result['to']!r}" if result.get("to") else "")]
    for p in result["paths"]:
        steps = [p["nodes"][0]["qualified_name"] or p["nodes"][0]["name"]]
        for e, n in zip(p["edges"], p["nodes"][1:]):
            ev = e.get("evidence") or {}
            # a chunk node (an issue's comment, say) has a name, no qualified name
            steps.append(f"-[{e['type']} {ev.get('file', '')}:{ev.get('start_line', '')}]-> {n['qualified_name'] or n['name']}")
        out.append("  " + " ".join(steps))
    if not result["paths"]:
        graph_down = [s for s in result.get("stale", []) if s["store"] == "neo4j"]
        out.append("  (no path: the graph is not available, see STALE)" if graph_down else "  (no verified path)")
    out += _stale_lines(result.get("stale", []))
    return "\n".join(out)


def _quality_lines(result: dict) -> list[str]:
    """The published generation's golden recall, and the last candidate the golden gate refused."""
    out = []
    q = result.get("quality")
    if q:
        out.append(f"  golden recall {q['recall']:.3f} ({q['recalled']}/{q['queries']} queries)")
        if q.get("accepted_drop"):
            out.append("  published with an accepted golden-quality drop (--accept-quality-drop): "
                       + "; ".join(q["accepted_drop"].get("reasons", [])))
    r = result.get("quality_refused")
    if r:
        stays = r.get("published_generation")
        out.append(f"  REFUSED generation {r['candidate_generation']} by the golden-query gate ({r.get('refused_at', '')}); "
                   + (f"CURRENT stays at generation {stays}" if stays is not None else "nothing published"))
        out.extend(f"    {reason}" for reason in r.get("reasons", []))
        for g in r.get("regressed", []):
            old = f"rank {g['old_rank']}" if g.get("old_rank") is not None else f"not in top {g['k']}"
            new = f"rank {g['new_rank']}" if g.get("new_rank") is not None else f"not in top {g['k']}"
            out.append(f"    {g['id']}: {old} -> {new} (query {g['query']!r})")
    return out


def render_status(result: dict) -> str:
    result = _as_dict(result)
    if result.get("generation") is None:
        return "\n".join(["no published generation; run `mtrag build`"] + _quality_lines(result))
    out = [f"published generation {result['generation']}"]
    for sid, stores in result["sources"].items():
        cells = "  ".join(f"{st}={v['state']}@{(v['generation'] or '-')[:8]}" for st, v in stores.items())
        out.append(f"  {sid:<20} {cells}")
    out += _stale_lines(result["stale"])
    if not result["stale"]:
        out.append("  every store matches the manifest")
    served = result.get("serving")
    if served:
        out.append(f"  serving profile {served['profile']!r}" + (f" (cut over; `mtrag rollback` restores generation "
                                                                 f"{served['cutover']})" if served.get("cutover") else ""))
    fast = result.get("fast_lane")
    if fast:
        out.append(f"  last watch batch: generation {fast.get('generation')}, sources {', '.join(fast.get('sources') or []) or '-'}, "
                   f"files {fast.get('files')} ({fast.get('deleted')} deleted), {fast.get('seconds')} s")
    out.extend(_quality_lines(result))
    return "\n".join(out)
