"""Which HTTP server settings ``titen serve`` uses, by measurement: uvicorn
with the h11 parser vs uvicorn with httptools (llhttp, wrapped by
``core.api.edge.EnvelopeHttpToolsProtocol``), on one service over loopback.

    .venv/bin/python -m bench.server_choice [--requests 3000]

For each: the edge probes (bad Content-Length, Content-Length with
Transfer-Encoding) and their answers, then ``GET /healthz`` and ``POST
/v1/context/compile`` (a 200-claim organization) latency over one keep-alive
connection, concurrency 1, after 200 warm-up requests: p50/p95/p99. Shared
CPU: run it twice and compare the orders, not the digits.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import tempfile
import threading
import time

import uvicorn

from bench import common


def probe(port: int, raw: bytes) -> str:
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(3)
    s.sendall(raw)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except socket.timeout:
        pass
    s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    ctype = next((line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-type")), b"")
    return f"{head.split(b' ', 2)[1].decode() if head else '-'} {ctype.decode()}"


def run(protocol, label: str, service, key: str, requests: int) -> dict:
    from core.api.app import create_app

    port = common.free_port()
    config = uvicorn.Config(create_app(service), host="127.0.0.1", port=port, http=protocol, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    body = json.dumps({"subject_id": "user_bench", "task": "deploy smoke release", "max_tokens": 1200})
    obs = json.dumps({"subject_id": "user_bench", "kind": "tool_result", "content": "x",
                      "source": {"type": "tool", "ref": "r"}}).encode()
    probes = {
        "bad Content-Length": probe(port, b"POST /v1/observations HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n{}"),
        "CL + TE": probe(port, b"POST /v1/observations HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + key.encode()
                         + b"\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % (len(obs), len(obs))
                         + obs + b"\r\n0\r\n\r\n"),
    }
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}

    def timed(method, path, payload=None):
        t0 = time.perf_counter()
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        return time.perf_counter() - t0

    for _ in range(200):
        timed("GET", "/healthz")
        timed("POST", "/v1/context/compile", body)
    health = [timed("GET", "/healthz") for _ in range(requests)]
    compiles = [timed("POST", "/v1/context/compile", body) for _ in range(requests // 3)]
    conn.close()
    server.should_exit = True
    thread.join()
    return {"label": label, "probes": probes, "healthz": common.summary_ms(health),
            "compile": common.summary_ms(compiles)}


def main(argv=None) -> int:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from core.config import Settings
    from core.api.edge import EnvelopeHttpToolsProtocol
    from core.keys import Principal
    from core.service import Service
    from core.writes import Writes

    parser = argparse.ArgumentParser(prog="python -m bench.server_choice", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="titen-server-choice-") as data_dir:
        service = Service(Settings.from_env(data_dir=data_dir))
        writer = Principal("bench", "importer", "cli", frozenset({"memory:write"}), ())
        writes = Writes(service.store, service.reader)
        for claim in common.generate(200):
            writes.record_observation(writer, common.to_observation(claim, "user_bench"))
        service.rebuild("bench")
        key = service.keys.create("bench", "bench", ["context:compile", "memory:write"], [])["api_key"]
        for protocol, label in ((H11Protocol, "uvicorn h11"), (EnvelopeHttpToolsProtocol, "uvicorn httptools")):
            r = run(protocol, label, service, key, args.requests)
            print(f"{r['label']:18} probes: " + "; ".join(f"{k} -> {v}" for k, v in r["probes"].items()))
            for what in ("healthz", "compile"):
                s = r[what]
                print(f"{'':18} {what:8} n={s['n']} p50 {s['p50_ms']} ms  p95 {s['p95_ms']} ms  p99 {s['p99_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
