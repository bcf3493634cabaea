"""Wall time and peak memory of a fresh process and everything it starts, for the benchmarks.

Peak memory is the largest sum of RSS over the process and its descendants (worker processes
count in full), sampled every 10 ms from /proc, or the kernel's own peak of the process if
that is higher (for what sampling missed). Linux only.

Files in shared memory (/dev/shm) count in that sum only where a process maps them, as often
as it is mapped; `measure_shared` also gives the peak with each page of such files counted
once, mapped or not: the sum's RSS less its shared-memory pages, plus the files' size.
"""

from __future__ import annotations

import glob
import os
import subprocess
import time
from collections.abc import Callable

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def _tree_rss_kib(root: int) -> int:
    """RSS of `root` and all its descendants, KiB (Linux /proc)."""
    children, rss = _processes()
    return sum(rss.get(pid, 0) for pid in _descendants(root, children))


def _tree_pids(root: int) -> list[int]:
    """`root` and all its descendants."""
    return _descendants(root, _processes()[0])


def _processes() -> tuple[dict[int, list[int]], dict[int, int]]:
    """Every process's children, and its RSS in KiB.

    Reads each process's one-line /proc/PID/stat (parent and RSS in pages), which is several
    times cheaper than its status file: the sampler shares the cores with what it measures.
    """
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                line = stat.read()
        except OSError:
            continue
        fields = line[line.rindex(")") + 2 :].split()  # the name, in brackets, may hold spaces
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)  # field 4: the parent
        rss[pid] = int(fields[21]) * PAGE_KIB  # field 24: resident pages
    return children, rss


def _descendants(root: int, children: dict[int, list[int]]) -> list[int]:
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _status_kib(pid: int, keys: tuple[str, ...]) -> dict[str, int]:
    """The `keys` of /proc/PID/status (VmRSS, RssAnon, …), KiB; 0 once the process is gone."""
    found = dict.fromkeys(keys, 0)
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key = line.split(":", 1)[0]
                if key in found:
                    found[key] = int(line.split()[1])
    except OSError:
        pass
    return found


def _run_sampled(cmd: list[str], sample: Callable[[int], None], stdin=None, env=None):
    """Run `cmd` fresh, calling `sample(pid)` every 10 ms until it exits; return the wall
    seconds and its resource usage (the kernel's peak RSS of the process in `ru_maxrss`)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        cmd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    while True:
        sample(process.pid)
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.01)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[:2]} failed: {process.stderr.read().decode()[-500:]}")
    return seconds, usage


def measure(cmd: list[str], stdin=None, env=None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB of the process tree) of one fresh run of `cmd`."""
    peak = 0

    def sample(pid: int) -> None:
        nonlocal peak
        peak = max(peak, _tree_rss_kib(pid))

    seconds, usage = _run_sampled(cmd, sample, stdin, env)
    peak = max(peak, usage.ru_maxrss)  # the kernel's own peak, for what sampling missed
    return seconds, peak / 1024


def measure_shared(cmd: list[str], shared_files: str, stdin=None) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MiB of the process tree, peak MiB with each page of the files
    matching the glob `shared_files` counted once) of one fresh run of `cmd`; both sampled
    every 10 ms, the second at one moment: Σ (RSS − RssShmem) + the files' size."""
    peak = once = 0

    def sample(root: int) -> None:
        nonlocal peak, once
        rss = shmem = 0
        for pid in _tree_pids(root):
            found = _status_kib(pid, ("VmRSS", "RssShmem"))
            rss, shmem = rss + found["VmRSS"], shmem + found["RssShmem"]
        files = 0
        for path in glob.glob(shared_files):
            try:
                files += os.path.getsize(path) // 1024
            except OSError:  # removed meanwhile
                pass
        peak, once = max(peak, rss), max(once, rss - shmem + files)

    seconds, usage = _run_sampled(cmd, sample, stdin)
    return seconds, max(peak, usage.ru_maxrss) / 1024, once / 1024


def measure_parts(cmd: list[str], stdin=None, env=None) -> tuple[float, float, float, float]:
    """(wall seconds, peak RSS, peak anonymous RSS, peak file-backed RSS, in MiB) of one fresh
    run of `cmd`, one process (nothing it starts counts): a model's safetensors are mapped
    from the file, so its weights are file-backed pages (which the kernel can drop and read
    again), and what the run computes is anonymous memory. Sampled every 10 ms from
    /proc/PID/status; each peak is its own (they need not be at the same moment)."""
    peaks = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}

    def sample(pid: int) -> None:
        for key, value in _status_kib(pid, tuple(peaks)).items():
            peaks[key] = max(peaks[key], value)

    seconds, _ = _run_sampled(cmd, sample, stdin, env)
    return seconds, peaks["VmRSS"] / 1024, peaks["RssAnon"] / 1024, peaks["RssFile"] / 1024
