"""`fastgemma serve` as a child process, for the tests that need a real one (start-up lines,
signals, Ray): started on a free loopback port and returned once it says it is serving."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


@contextmanager
def serve_process(*args: str, ready: str = "fastgemma: serving", timeout: float = 300,
                  new_session: bool = False) -> Iterator[tuple[subprocess.Popen, str, list[str]]]:
    """(process, url, lines printed up to `ready`). `args` follow `fastgemma serve`; its
    output is read on after `ready`, so the pipe never fills. On exit a process still running
    is killed (its whole session with `new_session`, for servers with children, as Ray's)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fastgemma.cli.main", "serve", *args, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=new_session)
    try:
        printed: list[str] = []
        deadline = time.monotonic() + timeout
        while not any(ready in line for line in printed):
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(printed[-40:])
            printed.append(line)
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        yield proc, f"http://127.0.0.1:{port}", printed
    finally:
        if proc.poll() is None:
            if new_session:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait(30)
