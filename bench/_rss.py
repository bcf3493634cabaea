"""Wall time and peak memory of a fresh process and everything it starts, for the benchmarks.

Peak memory is the largest sum of RSS over the process and its descendants (worker processes
count in full), sampled every 10 ms from /proc, or the kernel's own peak of the process if
that is higher (for what sampling missed). Linux only.
"""

from __future__ import annotations

import os
import subprocess
import time

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def _tree_rss_kib(root: int) -> int:
    """RSS of `root` and all its descendants, KiB (Linux /proc).

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
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def measure(cmd: list[str], stdin=None, env=None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB of the process tree) of one fresh run of `cmd`."""
    start = time.perf_counter()
    process = subprocess.Popen(
        cmd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    peak = 0
    while True:
        peak = max(peak, _tree_rss_kib(process.pid))
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.01)
    seconds = time.perf_counter() - start
    peak = max(peak, usage.ru_maxrss)  # the kernel's own peak, for what sampling missed
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{cmd[:2]} failed: {process.stderr.read().decode()[-500:]}")
    return seconds, peak / 1024


def measure_parts(cmd: list[str], stdin=None, env=None) -> tuple[float, float, float, float]:
    """(wall seconds, peak RSS, peak anonymous RSS, peak file-backed RSS, in MiB) of one fresh
    run of `cmd`, one process (nothing it starts counts): a model's safetensors are mapped
    from the file, so its weights are file-backed pages (which the kernel can drop and read
    again), and what the run computes is anonymous memory. Sampled every 10 ms from
    /proc/PID/status; each peak is its own (they need not be at the same moment)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        cmd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    peaks = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    while True:
        try:
            with open(f"/proc/{process.pid}/status") as status:
                for line in status:
                    key = line.split(":", 1)[0]
                    if key in peaks:
                        peaks[key] = max(peaks[key], int(line.split()[1]))
        except OSError:
            pass
        pid, status_code, _ = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.01)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status_code) != 0:
        raise SystemExit(f"{cmd[:2]} failed: {process.stderr.read().decode()[-500:]}")
    return seconds, peaks["VmRSS"] / 1024, peaks["RssAnon"] / 1024, peaks["RssFile"] / 1024
