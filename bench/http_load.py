"""Bounded load test of `mtrag serve` on loopback: C concurrent clients for D seconds (default 50 x
30 s) against an already built MTRAG_HOME; requests, errors and p50 / p95 / p99 latency per mode.

Loopback only: the server is started here on 127.0.0.1 (a free port) and nothing else is
contacted. Bounded: no new request starts after the deadline, at most --max-requests in all, each
request has a timeout, and the server is stopped at the end whatever happens.

Each client sends one request at a time (a new connection per request: the server speaks
HTTP/1.0), cycling through the modes from its own offset so every mode sees the same load. The
server answers one query at a time (the reader holds a lock), so latency under load is mostly
queueing: expect p50 ~ clients x service time.

Usage: python bench/http_load.py --home data [--clients 50] [--duration 30] [--out bench/out/http_load.json]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, percentile, write_json  # noqa: E402

HOST = "127.0.0.1"
MODES = ("hybrid", "dense", "lexical", "exact", "bundles")
FALLBACK_TEXTS = ["how is the total computed", "parse command line options", "tax rate for a region",
                  "read a configuration file", "print a message to the terminal"]


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def request(port: int, path: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request("POST" if data is not None else "GET", path, body=data,
                     headers={"Content-Type": "application/json"} if data is not None else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def texts_for(home: Path, n: int, seed: int) -> tuple[list[str], list[str]]:
    """(symbols for exact, sentences for the other modes), drawn from the published chunks."""
    try:
        from bench.query import query_set
        symbols, sentences = query_set(home, n, seed)
    except Exception:  # noqa: BLE001 - a home without code functions or summaries still gets a load
        symbols, sentences = [], []
    return symbols or FALLBACK_TEXTS, sentences or FALLBACK_TEXTS


def start_server(home: Path, port: int) -> subprocess.Popen:
    env = dict(os.environ, MTRAG_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.pop("MTRAG_API_KEY", None)  # loopback needs none
    server = subprocess.Popen([sys.executable, "-m", "mtrag_assets.app.cli", "serve", "--host", HOST,
                               "--port", str(port)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    # The server logs a line per request: a pipe nobody reads fills (64 KiB) and then every request
    # thread blocks writing its log line. A thread keeps reading; the last lines are kept.
    server.log_tail = deque(maxlen=200)
    threading.Thread(target=lambda: server.log_tail.extend(server.stdout), daemon=True).start()
    return server


def server_output(server: subprocess.Popen) -> str:
    return "".join(server.log_tail)


def wait_healthy(server: subprocess.Popen, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            time.sleep(0.2)  # the reader thread takes the last lines
            raise RuntimeError(f"mtrag serve exited ({server.returncode}):\n{server_output(server)[-3000:]}")
        try:
            if request(port, "/healthz", None, 2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"mtrag serve did not answer /healthz within {timeout:.0f} s")


def stop_server(server: subprocess.Popen) -> str:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=20)
    return server_output(server)[-2000:]


def peak_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return float("nan")


def run_load(port: int, clients: int, duration: float, max_requests: int, timeout: float, modes: list[str],
             symbols: list[str], sentences: list[str]) -> tuple[dict, float]:
    lat: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, Counter] = defaultdict(Counter)
    lock = threading.Lock()
    budget = [max_requests]
    deadline = time.monotonic() + duration

    def client(i: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            with lock:
                if budget[0] <= 0:
                    return
                budget[0] -= 1
            mode = modes[(i + n) % len(modes)]
            texts = symbols if mode == "exact" else sentences
            text = texts[(i * 7 + n) % len(texts)]
            n += 1
            t0 = time.perf_counter()
            try:
                status, body = request(port, "/v1/query", {"text": text, "mode": mode, "k": 10}, timeout)
                err = None if status == 200 else f"HTTP {status}"
            except (OSError, http.client.HTTPException) as exc:
                err = exc.__class__.__name__
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                lat[mode].append(ms)
                if err:
                    errors[mode][err] += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=duration + timeout + 30)
    wall = time.monotonic() - t0

    def summary(values: list[float], errs: Counter) -> dict:
        return {"requests": len(values), "errors": sum(errs.values()), "error_kinds": dict(errs),
                "p50_ms": round(percentile(values, 50), 1), "p95_ms": round(percentile(values, 95), 1),
                "p99_ms": round(percentile(values, 99), 1), "max_ms": round(max(values), 1) if values else None,
                "rps": round(len(values) / wall, 2) if wall else None}

    per_mode = {m: summary(lat[m], errors[m]) for m in modes}
    everything = [v for m in modes for v in lat[m]]
    total_errors = Counter()
    for m in modes:
        total_errors.update(errors[m])
    per_mode["all"] = summary(everything, total_errors)
    return per_mode, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", required=True, help="an MTRAG_HOME with a published generation")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds during which requests start")
    ap.add_argument("--max-requests", type=int, default=100_000, help="hard cap on requests in all")
    ap.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", default=str(REPO / "bench/out/http_load.json"))
    args = ap.parse_args()
    if not 1 <= args.clients <= 500:
        ap.error("--clients must be from 1 to 500")
    if not 0 < args.duration <= 600:
        ap.error("--duration must be more than 0 and at most 600 seconds")
    if args.max_requests < 1:
        ap.error("--max-requests must be positive")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        ap.error(f"--modes: choose from {','.join(MODES)}")
    home = Path(args.home).resolve()
    if not (home / "08-manifest" / "CURRENT").exists():
        ap.error(f"{home} has no published generation (run `mtrag build` first)")

    symbols, sentences = texts_for(home, 200, args.seed)
    port = free_port()
    server = start_server(home, port)
    log_tail = ""
    try:
        wait_healthy(server, port, 180)
        for mode in modes:  # warm every path once (the model loads on the first dense query); not counted
            status, body = request(port, "/v1/query", {"text": sentences[0], "mode": mode}, args.timeout)
            if status != 200:
                raise RuntimeError(f"warm-up {mode}: HTTP {status}: {body[:300]!r}")
        generation = json.loads(request(port, "/v1/status", None, 30)[1]).get("generation")
        print(f"load: {args.clients} clients x {args.duration:g} s on http://{HOST}:{port}, modes {modes}", flush=True)
        per_mode, wall = run_load(port, args.clients, args.duration, args.max_requests, args.timeout, modes,
                                  symbols, sentences)
        healthy_after = request(port, "/healthz", None, 30)[0] == 200
        peak = peak_rss_mb(server.pid)
    finally:
        log_tail = stop_server(server)
    for mode, s in per_mode.items():
        print(f"{mode:8s} requests={s['requests']:6d} errors={s['errors']:4d} p50={s['p50_ms']:8.1f} ms "
              f"p95={s['p95_ms']:8.1f} ms p99={s['p99_ms']:8.1f} ms rps={s['rps']}", flush=True)
    write_json(args.out, {
        "home": str(home), "generation": generation, "clients": args.clients, "duration_s": args.duration,
        "wall_s": round(wall, 1), "max_requests": args.max_requests, "timeout_s": args.timeout,
        "modes": per_mode, "server_healthy_after": healthy_after, "server_peak_rss_mb": peak,
        "cpu_count": os.cpu_count(), "server_log_tail": log_tail[-500:],
    })


if __name__ == "__main__":
    main()
