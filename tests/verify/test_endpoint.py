"""verify/endpoint.py: readiness timeouts with the last error, port in use, no orphans."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from fastgemma.verify.endpoint import ServeProcess, free_port, wait_ready
from tests.verify.conftest import pid_alive

# A stand-in server: answers GET /v1/models with the status given as argv[2].
FAKE_SERVER = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            self.send_response(int(sys.argv[2])); self.send_header("content-length", "2"); self.end_headers()
            self.wfile.write(b"{}")

    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _fake(port: int, status: int) -> list[str]:
    return [sys.executable, "-c", FAKE_SERVER, str(port), str(status)]


def test_ready_and_stopped(tmp_path):
    port = free_port()
    with ServeProcess(_fake(port, 200), port, tmp_path / "log") as proc:
        pid = proc.pid
        assert pid_alive(pid)
    assert not pid_alive(pid)


def test_never_ready_reports_last_error(tmp_path):
    port = free_port()
    proc = ServeProcess(_fake(port, 503), port, tmp_path / "log", ready_timeout_s=1.5)
    with pytest.raises(ValueError, match=r"did not become ready within 1.5 s; last error: HTTP 503"):
        with proc:
            pass
    assert proc.proc is None


def test_nothing_listening_reports_connect_error():
    start = time.monotonic()
    with pytest.raises(ValueError, match="last error: ConnectError"):
        wait_ready(f"http://127.0.0.1:{free_port()}", timeout_s=1.0, poll_s=0.2)
    assert time.monotonic() - start < 5


def test_child_that_exits_early(tmp_path):
    port = free_port()
    command = [sys.executable, "-c", "import sys; print('cannot load the model'); sys.exit(3)"]
    with pytest.raises(ValueError, match=r"exited with code 3 before it was ready; its log ends: cannot load the model"):
        with ServeProcess(command, port, tmp_path / "log", ready_timeout_s=30):
            pass


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = ServeProcess(_fake(port, 200), port, tmp_path / "log")
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is in use"):
            with proc:
                pass
        assert proc.proc is None  # nothing was started


def test_stopped_when_the_block_raises(tmp_path):
    port = free_port()
    with pytest.raises(RuntimeError, match="stage failed"):
        with ServeProcess(_fake(port, 200), port, tmp_path / "log") as proc:
            pid = proc.pid
            raise RuntimeError("stage failed")
    assert not pid_alive(pid)


# The verifier's side in a separate process: start the child, print its pid, wait. It restores
# Python's Ctrl-C handler, as a verifier started from a shell has it: a process started with
# SIGINT ignored (inherited from the test runner) would not see the SIGINT case at all.
HOLDER = textwrap.dedent("""
    import signal, sys, time
    from pathlib import Path
    from fastgemma.verify.endpoint import ServeProcess
    signal.signal(signal.SIGINT, signal.default_int_handler)
    port = int(sys.argv[1])
    command = [sys.executable, "-c", sys.argv[2], str(port), "200"]
    with ServeProcess(command, port, Path(sys.argv[3])) as proc:
        print(proc.pid, flush=True)
        time.sleep(120)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_no_orphan_when_the_verifier_is_signalled(tmp_path, sig):
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(port), FAKE_SERVER, str(tmp_path / "log")],
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(holder.stdout.readline())
        assert pid_alive(child)
        holder.send_signal(sig)
        holder.wait(30)
        deadline = time.monotonic() + 10
        while pid_alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(child), f"the server child outlived a verifier killed by {sig.name}"
    finally:
        holder.kill()
        holder.wait()
