"""The fast lane's latency (`mtrag watch`, issue #15), measured from outside as a user sees it: a
`mtrag serve` process and a `mtrag watch` process on a built home; each edit is saved, then the
server is queried (exact mode, every 20 ms) until the new function is the first hit; each file
removal is saved, then the server is queried until the file has no hit left, and afterwards the
three stores are checked directly. Both count only answers from a newer generation than the one
served at the save (a store written before the publish is served as `stale` meanwhile).

  watch_append_s   edit saved -> the new function is the exact hit of a query from another process
  watch_delete_s   file removed -> gone from the published generation (and from Qdrant, FTS, Neo4j)
  watch_append_stage_s, watch_delete_stage_s
                   the watch's own seconds per asset (its journal's `stage_seconds`), medians
  watch_serve_hybrid_p50_ms, watch_serve_hybrid_p95_ms
                   hybrid queries from another client, SERVE_QPS a second, while the watch
                   publishes SERVE_EDITS more appends (a phase of its own after the rounds above,
                   so that their figures stay comparable with earlier runs)

Used by bench/build.py (click + flask) and bench/scale.py (django); alone:
  python bench/watch_latency.py --work bench/out/build-work --file flask/src/flask/helpers.py \\
      --delete flask-docs:flask/docs/views.rst:docs/views.rst
"""
from __future__ import annotations

import argparse
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.build import gone_everywhere  # noqa: E402
from bench.common import REPO, mtrag_env, percentile, stop_group, write_json  # noqa: E402
from bench.http_load import free_port, peak_rss_mb, request, start_server, stop_server, wait_healthy  # noqa: E402
from mtrag_resources.core.config import Settings  # noqa: E402
from mtrag_resources.publish.journal import journal_path  # noqa: E402

POLL_S = 0.02
VISIBLE_TIMEOUT_S = 60.0
APPENDED = '''

def watch_bench_{n}_{stamp}(value):
    """Return the value; appended by the watch benchmark."""
    return value
'''


class WatchProcess:
    """`mtrag watch` with its output lines on a queue."""

    def __init__(self, env: dict) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "mtrag_assets.app.cli", "watch"], env=env, cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self.published_at: list[float] = []  # when each "published generation" line arrived
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("published generation"):
                self.published_at.append(time.perf_counter())
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def published_after(self, t: float) -> float | None:
        """Seconds from `t` to the first publish line after it (None: none yet)."""
        later = [p for p in self.published_at if p > t]
        return later[0] - t if later else None

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"mtrag watch exited before {text!r}:\n" + "\n".join(self.seen[-20:]))
            self.seen.append(line)
            if text in line:
                return line
        raise RuntimeError(f"no {text!r} from mtrag watch within {timeout:.0f} s:\n" + "\n".join(self.seen[-20:]))

    def drain(self) -> None:
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                self.seen.append(line)

    def stop(self) -> None:
        stop_group(self.proc, grace_s=120)  # SIGTERM: the watch ends between batches


QUERY_TIMEOUT_S = 10.0
SERVE_EDITS = 5
SERVE_QPS = 10
# What a service asks while the watch publishes: prose, an identifier, a question (hybrid: both
# channels and the graph's bundles, the default mode of `POST /v1/query`)
SERVE_QUERIES = ["how do I register an error handler", "url_for", "send a file to the client",
                 "what does the test client return", "escape html in a template", "json response"]
STALLS: list[float] = []  # queries the server did not answer within QUERY_TIMEOUT_S (reported)


def _answer(port: int, text: str) -> dict:
    t0 = time.perf_counter()
    try:
        status, body = request(port, "/v1/query", {"query": text, "mode": "exact", "k": 5}, QUERY_TIMEOUT_S)
    except TimeoutError:
        STALLS.append(round(time.perf_counter() - t0, 3))
        return {}
    return json.loads(body) if status == 200 else {}


def _hits(port: int, text: str) -> list[dict]:
    return _answer(port, text).get("hits", [])


def _newer(port: int, text: str, generation: int, hit) -> bool:
    """Does a generation after `generation` answer `text`, and `hit(hits)` hold? (A store's
    source written but not yet published is served as `stale`, not as the new generation.)"""
    answer = _answer(port, text)
    return (answer.get("generation") or 0) > generation and hit(answer.get("hits", []))


def _until(check, what: str) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < VISIBLE_TIMEOUT_S:
        if check():
            return time.perf_counter() - t0
        time.sleep(POLL_S)
    raise RuntimeError(f"{what}: not visible within {VISIBLE_TIMEOUT_S:.0f} s")


def measure(env: dict, home: Path, corpus: Path, edit_file: str, deletions: list[tuple[str, str]],
            edits: int = 10) -> dict:
    """`deletions`: (source id, path under `corpus`, the file's path in its source) of the files
    to remove, one at a time."""
    port = free_port()
    journal = journal_path(Settings(home=Path(home)))
    journal_start = _lines(journal)
    server = start_server(home, port)
    watch = WatchProcess(env)
    out: dict = {}
    try:
        wait_healthy(server, port, 300)
        watch.wait_for("watching", 600)
        target = corpus / edit_file
        append_s, append_published_s = [], []
        for n in range(edits):
            name = f"watch_bench_{n}_{int(time.time())}"
            generation = _answer(port, name).get("generation") or 0
            saved = time.perf_counter()
            target.write_text(target.read_text() + APPENDED.format(n=n, stamp=name.rsplit("_", 1)[1]))
            append_s.append(_until(lambda: _newer(port, name, generation,
                                                  lambda hits: any(h.get("symbol", "").endswith(name) for h in hits[:1])),
                                   f"appended {name}"))
            watch.wait_for("recorded", 60)  # the batch's lineage is written before the next edit
            append_published_s.append(watch.published_after(saved))
        delete_s, gone = [], []
        for source_id, rel, file_path in deletions:
            path = corpus / rel
            if not path.exists():
                continue
            if not [h for h in _hits(port, file_path) if h.get("file_path") == file_path]:
                raise RuntimeError(f"{rel}: no exact hit for {file_path!r} before the removal; nothing to measure")
            generation = _answer(port, file_path).get("generation") or 0
            path.unlink()
            delete_s.append(_until(lambda: _newer(port, file_path, generation,
                                                  lambda hits: not [h for h in hits if h.get("file_path") == file_path]),
                                   f"deleted {rel}"))
            watch.wait_for("recorded", 60)
            gone.append(gone_everywhere(env, source_id, file_path))
        watch.drain()
        published = [line for line in watch.seen if line.startswith("published generation") and "(change)" in line]
        out.update(_serve_while_publishing(port, target, watch))
        # the watch's own seconds per batch (from its event to the published generation): the rest
        # of each round is the file event's delivery and the server's switch to the generation
        batch_s = [float(line.rsplit(", ", 1)[1].split()[0]) for line in published]
        out |= {
            "watch_append_s": round(statistics.median(append_s), 3),
            "watch_append_p95_s": round(percentile(append_s, 95), 3),
            "watch_append_rounds_s": [round(s, 3) for s in append_s],
            # save -> the watch's "published generation" line: the rest of a round is the server's
            # switch to the new generation and the 20 ms polling
            "watch_append_published_rounds_s": [round(s, 3) if s is not None else None for s in append_published_s],
            "watch_delete_s": round(statistics.median(delete_s), 3) if delete_s else None,
            "watch_delete_rounds_s": [round(s, 3) for s in delete_s],
            "watch_deleted_everywhere": all(gone) if gone else None,
            "watch_batch_s": round(statistics.median(batch_s), 3) if batch_s else None,
            "watch_batch_rounds_s": batch_s,
            "watch_publish_lines": published[-3:],
            "watch_serve_rss_mb": peak_rss_mb(server.pid),
            "watch_query_stalls": len(STALLS),  # queries unanswered within QUERY_TIMEOUT_S during the rounds
        }
        # where the batches' time went: the journal's seconds per asset, medians over the appends
        # and over the removals (each asset summed over a batch's sources)
        batches = [e["stage_seconds"] for e in _entries(journal, journal_start) if e.get("stage_seconds")]
        out["watch_append_stage_s"] = _stage_medians(batches[:edits])
        out["watch_delete_stage_s"] = _stage_medians(batches[edits:edits + len(delete_s)])
    except Exception as exc:
        watch.drain()
        raise RuntimeError(f"{exc}; mtrag watch said:\n" + "\n".join(watch.seen[-15:])) from exc
    finally:
        watch.stop()
        stop_server(server)
    return out


def _serve_while_publishing(port: int, target: Path, watch: WatchProcess, edits: int = SERVE_EDITS) -> dict:
    """Hybrid latency seen by a steady client (SERVE_QPS, the queries in turn) while the watch
    applies and publishes `edits` appends, each waited for up to its recorded lineage."""
    latencies_ms: list[float] = []
    timings: list[dict] = []  # each answer's timings_ms, with its wall time: where a slow one waited
    errors: list[str] = []
    stop = threading.Event()

    def client() -> None:
        n = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            body = None
            try:
                status, body = request(port, "/v1/query", {"query": SERVE_QUERIES[n % len(SERVE_QUERIES)],
                                                          "mode": "hybrid", "k": 10}, QUERY_TIMEOUT_S)
                if status != 200:
                    errors.append(f"HTTP {status}")
            except TimeoutError:
                errors.append("timeout")
            latencies_ms.append((time.perf_counter() - t0) * 1000)
            try:
                answer_timings = json.loads(body).get("timings_ms") or {} if body else {}
            except ValueError:
                answer_timings = {}
            timings.append({"wall_ms": round(latencies_ms[-1], 1), "at_s": round(t0 - started, 2), **answer_timings})
            n += 1
            stop.wait(max(0.0, 1 / SERVE_QPS - (time.perf_counter() - t0)))

    for text in SERVE_QUERIES:  # the query embedder's first use is not what this measures
        request(port, "/v1/query", {"query": text, "mode": "hybrid", "k": 10}, 60)
    started = time.perf_counter()
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        for n in range(edits):
            name = f"watch_serve_{n}_{int(time.time())}"
            target.write_text(target.read_text() + APPENDED.format(n=n, stamp=name.rsplit("_", 1)[1])
                              .replace("watch_bench_", "watch_serve_"))
            watch.wait_for("published generation", 60)
            watch.wait_for("recorded", 60)
    finally:
        stop.set()
        thread.join(QUERY_TIMEOUT_S + 1)
    return {"watch_serve_hybrid_p50_ms": round(statistics.median(latencies_ms), 1) if latencies_ms else None,
            "watch_serve_hybrid_p95_ms": round(percentile(latencies_ms, 95), 1) if latencies_ms else None,
            "watch_serve_hybrid_max_ms": round(max(latencies_ms), 1) if latencies_ms else None,
            "watch_serve_hybrid_queries": len(latencies_ms), "watch_serve_hybrid_errors": errors[:5],
            "watch_serve_slowest": sorted(timings, key=lambda x: -x["wall_ms"])[:6],
            "watch_serve_edits": edits}


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def _entries(path: Path, start: int) -> list[dict]:
    """The journal's entries after its first `start` lines."""
    try:
        lines = path.read_text().splitlines()[start:]
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def _stage_medians(batches: list[dict]) -> dict:
    per_batch = []
    for stages in batches:
        summed: dict = {}
        for key, seconds in stages.items():
            name = key.rsplit("/", 1)[-1]
            summed[name] = summed.get(name, 0.0) + seconds
        per_batch.append(summed)
    names = sorted({n for b in per_batch for n in b})
    return {n: round(statistics.median(b.get(n, 0.0) for b in per_batch), 3) for n in names}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=str(REPO / "bench/out/build-work"), help="a built bench work folder")
    ap.add_argument("--file", default="flask/src/flask/helpers.py", help="file (under corpus/) to append to")
    ap.add_argument("--delete", action="append", default=[],
                    help="SOURCE:PATH:FILE_PATH: remove PATH (under corpus/), FILE_PATH in SOURCE")
    ap.add_argument("--edits", type=int, default=10)
    ap.add_argument("--out", default=str(REPO / "bench/out/watch.json"))
    args = ap.parse_args()
    work = Path(args.work).resolve()  # relative: the sources file and DAGSTER_HOME need absolute paths
    env = mtrag_env(work / "home", work / "sources.yaml")
    deletions = [tuple(d.split(":", 2)) for d in args.delete]
    result = measure(env, work / "home", work / "corpus", args.file, deletions, args.edits)
    print(json.dumps(result, indent=1))
    write_json(args.out, result)


if __name__ == "__main__":
    main()
