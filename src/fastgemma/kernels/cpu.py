"""What this CPU offers: its physical cores and feature flags (from /proc/cpuinfo), and
the process's thread count.

The lowest layer: the native kernels' build (native.py) and the engine's defaults
(config.py) both read it; it imports nothing of fastgemma.
"""

from __future__ import annotations

import os


def physical_cores() -> int:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo; os.cpu_count() elsewhere."""
    cores, phys = set(), "0"
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "physical id":
                phys = value.strip()
            elif key.strip() == "core id":
                cores.add((phys, value.strip()))
    except OSError:
        pass
    return len(cores) or os.cpu_count() or 1


def cpu_flags() -> set[str]:
    """The CPU feature flags /proc/cpuinfo lists (empty where there is none)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_fast_bf16() -> bool:
    """AVX-512 BF16 or AMX: the CPU multiplies bf16 natively."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def set_cpu_threads(n: int) -> None:
    """torch's intra-op threads for this process. Called once where a process starts
    (`fastgemma serve`, `bench decode`, `generate`), or by `LLM(threads=N)`."""
    import torch  # here: reading the CPU's facts needs no torch (a CLI's --help imports this)

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
