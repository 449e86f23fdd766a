"""Plain-text views of reader results for the terminal (the typed results of serving/results.py,
read in their `to_dict()` form, or plain dicts of that shape)."""
from __future__ import annotations


def _as_dict(result) -> dict:
    return result.to_dict() if hasattr(result, "to_dict") else result


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
        where = f"{h['source_id']}:{h['file_path']}:" + (f"p. {h['page']}" if h.get("page")  # a PDF's page
                                                         else f"{h['start_line']}-{h['end_line']}")
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
    for s in result.get("stale", []):
        out.append(f"  STALE {s['source']}/{s['store']}: {s['reason']}")
    return "\n".join(out)


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
        out.append("  (no verified path)")
    for s in result.get("stale", []):
        out.append(f"  STALE {s['source']}/{s['store']}: {s['reason']}")
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
    for s in result["stale"]:
        out.append(f"  STALE {s['source']}/{s['store']}: {s['reason']}")
    if not result["stale"]:
        out.append("  every store matches the manifest")
    fast = result.get("fast_lane")
    if fast:
        out.append(f"  last watch batch: generation {fast.get('generation')}, sources {', '.join(fast.get('sources') or []) or '-'}, "
                   f"files {fast.get('files')} ({fast.get('deleted')} deleted), {fast.get('seconds')} s")
    out.extend(_quality_lines(result))
    return "\n".join(out)
