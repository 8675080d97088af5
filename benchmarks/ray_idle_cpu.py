"""CPU that an idle server takes, by process: `fastgemma serve` beside `fastgemma serve --ray
--replicas 1` (Ray's controller, proxy, GCS, raylet, agents and the replica), each started
alone, left idle, then sampled from /proc over a window (Linux).

    python benchmarks/ray_idle_cpu.py [--settle 10] [--window 10] [serve options...]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def session_cpu(session: int) -> dict[int, tuple[int, str]]:
    """pid -> (user + system ticks, command) for the processes of one session."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getsid(int(proc.name)) != session:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            out[int(proc.name)] = (int(fields[11]) + int(fields[12]), _name(argv))
        except (OSError, ValueError):
            continue
    return out


def _name(argv: list[str]) -> str:
    """A process's name without paths: `ray::ProxyActor`, `raylet`, `fastgemma serve ...`."""
    if argv[0].startswith("ray::"):
        return argv[0]
    words = [Path(a).name if "/" in a else a for a in argv if a]
    if words and words[0].startswith("python"):
        words = words[1:]
        if words[:1] == ["-u"]:
            words = words[1:]
    return " ".join(words[:4])[:60]


def measure(label: str, args: list[str], settle: float, window: float) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "fastgemma.cli.main", "serve", *args, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if "fastgemma: serving" in line:
                break
        time.sleep(settle)
        before = session_cpu(proc.pid)
        time.sleep(window)
        after = session_cpu(proc.pid)
        rows = sorted(((after[p][0] - before[p][0]) / TICKS / window * 100, after[p][1]) for p in after if p in before)
        print(f"{label}: {sum(r[0] for r in rows):.1f}% of one core while idle, over {window:.0f} s")
        for share, command in reversed(rows):
            if share >= 0.05:
                print(f"  {share:5.1f}%  {command}")
    finally:
        proc.send_signal(signal.SIGTERM)  # the server only: it stops what it started
        try:
            proc.wait(60)
        finally:
            for pid in session_cpu(proc.pid):  # anything left of the session
                os.kill(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=10.0, help="seconds idle before sampling")
    parser.add_argument("--window", type=float, default=10.0, help="seconds sampled")
    known, serve_args = parser.parse_known_args()
    measure("fastgemma serve", serve_args, known.settle, known.window)
    measure("fastgemma serve --ray --replicas 1", ["--ray", "--replicas", "1", *serve_args], known.settle, known.window)


if __name__ == "__main__":
    main()
