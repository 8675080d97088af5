"""The endpoint under test: wait for readiness, and own a `fastgemma serve` child process.

`wait_ready(url)` polls `GET /v1/models` until it answers 200 (as the challenge harness does),
raising `ValueError` with the last error seen when `timeout_s` passes. `ServeProcess` starts
`fastgemma serve` on a loopback port, in its own process group, and always stops it: on
leaving its `with` block (normally, on an exception, on Ctrl-C), on SIGTERM to the verifier
(turned into KeyboardInterrupt while the block runs), and on Linux also when the verifier
dies without cleaning up (the child asks for SIGTERM on its parent's death). It does not
load models itself and knows nothing of the stages.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(port: int, host: str = LOOPBACK) -> None:
    """ValueError when something already listens on host:port (it would answer in our place)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ValueError(
                f"port {port} on {host} is in use ({e.strerror or e}); stop what listens there or "
                f"leave --serve-port unset to pick a free port"
            ) from None


def wait_ready(url: str, timeout_s: float, poll_s: float = 0.5, alive: Callable[[], str | None] | None = None,
               api_key: str | None = None) -> None:
    """Poll GET {url}/v1/models until 200. `alive()` returns a reason when the server died."""
    from fastgemma.verify.client import api_base

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    target = api_base(url) + "/v1/models"
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    with httpx.Client(timeout=max(1.0, min(10.0, timeout_s)), headers=headers) as http:
        while True:
            if alive is not None and (dead := alive()):
                raise ValueError(dead)
            try:
                response = http.get(target)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}: {' '.join(response.text.split())[:200]}"
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() >= deadline:
                raise ValueError(f"the endpoint {target} did not become ready within {timeout_s:g} s; last error: {last}")
            time.sleep(poll_s)


def serve_command(serve_args: list[str], port: int, host: str = LOOPBACK) -> list[str]:
    """`fastgemma serve` run by this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "fastgemma.cli.main", "serve", *serve_args, "--host", host, "--port", str(port)]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


class ServeProcess:
    """A server child on `host:port`, its output appended to `log_path`.

        with ServeProcess(command, port, log_path, ready_timeout_s=600) as proc:
            proc.url, proc.pid
    """

    def __init__(self, command: list[str], port: int, log_path: Path, ready_timeout_s: float = 600.0,
                 host: str = LOOPBACK, stop_timeout_s: float = 15.0,
                 on_start: Callable[[ServeProcess], None] | None = None, env: dict[str, str] | None = None,
                 cwd: Path | None = None):
        self.command, self.port, self.host, self.on_start, self.env = command, port, host, on_start, env
        self.cwd = cwd  # the child's working directory (None: ours)
        self.log_path, self.ready_timeout_s, self.stop_timeout_s = Path(log_path), ready_timeout_s, stop_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._old_sigterm: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:] if line.strip())

    def _exit_reason(self) -> str | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        tail = self.log_tail()
        return f"the server exited with code {self.proc.returncode} before it was ready" + (f"; its log ends: {tail}" if tail else "")

    def start(self) -> ServeProcess:
        check_port_free(self.port, self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent, env=self.env, cwd=self.cwd,
            )
        return self

    def wait_ready(self) -> None:
        wait_ready(self.url, self.ready_timeout_s, alive=self._exit_reason)

    def stop(self) -> None:
        """SIGTERM to the child's process group, SIGKILL after `stop_timeout_s`; reaps it. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 10.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        try:  # stray grandchildren of the group, if any
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def __enter__(self) -> ServeProcess:
        try:
            self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # not the main thread: the with block still stops the child
            self._old_sigterm = None
        try:
            self.start()
            if self.on_start is not None:
                self.on_start(self)
            self.wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.stop()
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None
