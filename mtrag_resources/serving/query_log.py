"""A log of the questions `mtrag serve` answers, for `mtrag compare --queries LOG.jsonl`: real
traffic run against a shadow and the live generation. Off unless MTRAG_QUERY_LOG names a file.

One JSON line per answered `/v1/query`: the time, the question and its arguments (mode, kind, k,
sources), the generation, how many hits and the confidence, the latency and the team whose key
asked; never a hit's text. The file is bounded: past MTRAG_QUERY_LOG_MAX_MB (10) it becomes
`<file>.1` (one older file kept) and a new one starts."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from mtrag_resources.core.config import env, env_float
from mtrag_resources.core.errors import ConfigError
from mtrag_resources.publish.golden import DEFAULT_MIN_RECALL, GoldenFile, GoldenQuery

DEFAULT_MAX_MB = 10.0


class QueryLog:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = Path(path), max_bytes
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> "QueryLog | None":
        path = env("MTRAG_QUERY_LOG")
        if not path:
            return None
        max_mb = env_float("MTRAG_QUERY_LOG_MAX_MB", DEFAULT_MAX_MB, 100_000, "expected a size in MB above 0")
        log = cls(Path(path), int(max_mb * 1024 * 1024))
        try:
            log.path.parent.mkdir(parents=True, exist_ok=True)
            log.path.touch()
        except OSError as exc:
            raise ConfigError(f"MTRAG_QUERY_LOG={path!r}: cannot write there: {exc.strerror}") from None
        return log

    def record(self, args: dict, answer: dict, ms: float, team: str | None = None) -> None:
        line = json.dumps({
            "ts": round(time.time(), 3), "query": args["text"], "mode": args.get("mode") or "hybrid",
            "kind": args.get("kind"), "k": args.get("k") or 10, "sources": args.get("sources"),
            "generation": answer.get("generation"), "hits": len(answer.get("hits") or []),
            "confidence": answer.get("confidence"), "ms": round(ms, 1), "team": team,
        }, ensure_ascii=False) + "\n"
        data = line.encode("utf-8")
        with self._lock:
            try:
                if self.path.exists() and self.path.stat().st_size + len(data) > self.max_bytes:
                    os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                with open(self.path, "ab") as fh:
                    fh.write(data)
            except OSError:  # a full disk costs the log a line, never the answer
                pass


def logged_queries(path: Path, limit: int = 1000) -> GoldenFile:
    """The log's distinct questions (the latest `limit`, with the arguments they were asked with)
    as a query set without expectations: compare reports their overlap and latency."""
    seen: dict[tuple, dict] = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            try:
                entry = json.loads(line)
                key = (entry["query"], entry.get("mode") or "hybrid", entry.get("kind"), int(entry.get("k") or 10))
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"{path}:{n}: not a query log line (MTRAG_QUERY_LOG's JSON lines)") from None
            seen.pop(key, None)
            seen[key] = entry
    keys = list(seen)[-limit:]
    queries = tuple(GoldenQuery(id=f"log-{i + 1}", query=q, k=k, expect=(), kind=kind, mode=mode)
                    for i, (q, mode, kind, k) in enumerate(keys))
    return GoldenFile(path=Path(path), queries=queries, min_recall=DEFAULT_MIN_RECALL)
