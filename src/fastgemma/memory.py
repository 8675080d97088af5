"""Process memory: what is resident now and at most, and handing freed heap back to the OS.

Loading allocates and frees many intermediate slices (dequantisation, quantisation, the
lm_head screen's bounds). glibc keeps freed chunks below its mmap threshold in its heaps;
`release_free_memory()` (malloc_trim) returns them once loading is done, so the resident
figure after loading is the weights, caches and buffers that stay, not the allocator's
high-water mark. Elsewhere (not glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def _status_kib(field: str, pid: int | str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def resident_bytes(pid: int | str = "self") -> int | None:
    """Resident set size of a process (Linux), or None where unknown."""
    kib = _status_kib("VmRSS", pid)
    return None if kib is None else kib * 1024


def peak_resident_bytes(pid: int | str = "self") -> int | None:
    """The process's peak resident set size so far (VmHWM; ru_maxrss off Linux for self)."""
    kib = _status_kib("VmHWM", pid)
    if kib is None and pid == "self" and sys.platform != "win32":
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    return None if kib is None else kib * 1024


def reset_peak() -> bool:
    """Start the process's peak resident figure (VmHWM) anew from now (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryMeter:
    """What a piece of work adds: `MemoryMeter(device)`, the work, then `read()` ->
    {"resident_mib": resident growth, "peak_mib": peak growth during it} and on CUDA
    "gpu_peak_mib" (torch's peak allocation on the device)."""

    def __init__(self, device=None):
        self.device = device
        self.cuda = device is not None and getattr(device, "type", str(device)).startswith("cuda")
        self.peak_reset = reset_peak()
        self.start = resident_bytes() or 0
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(device)

    def read(self) -> dict[str, float]:
        now = resident_bytes() or 0
        peak = (peak_resident_bytes() or now) if self.peak_reset else now
        out = {"resident_mib": (now - self.start) / 2**20, "peak_mib": (max(peak, now) - self.start) / 2**20}
        if self.cuda:
            import torch

            out["gpu_peak_mib"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return out


def release_free_memory() -> None:
    """Return the C heap's free pages to the OS (glibc's malloc_trim)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def gib(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"
