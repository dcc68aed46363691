"""``titen serve`` as a subprocess on loopback, for the benches and the
liveness test: start it on a data directory, wait for ``/healthz``, read its
resident memory, stop it. (Not a fake: the real CLI, uvicorn and store.)"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TITEN = str(ROOT / ".venv" / "bin" / "titen") if (ROOT / ".venv" / "bin" / "titen").exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":", 1)
                out[key] = round(int(value.split()[0]) / 1024, 1)  # kB -> MiB
    return out


class Served:
    """``with Served(data_dir) as s:`` — ``s.port``, ``s.pid``, ``s.request(...)``."""

    def __init__(self, data_dir: str | os.PathLike, *, env: dict | None = None, log_path=None,
                 extra_args=()):
        self.data_dir = str(data_dir)
        self.port = free_port()
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path or os.path.join(self.data_dir, f".serve-{self.port}.log")
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "Served":
        os.makedirs(self.data_dir, exist_ok=True)
        command = ([TITEN] if TITEN else [sys.executable, "-m", "core.cli"])
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            command + ["serve", "--port", str(self.port), "--data-dir", self.data_dir, *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"titen serve exited with {self.process.returncode}: {self.log()}")
            try:
                status, _, _ = self.request("GET", "/healthz", timeout=2)
                if status == 200:
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("titen serve did not answer /healthz within 120 s")

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()

    def connection(self, timeout: float = 60) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 60) -> tuple[int, dict, bytes]:
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()
