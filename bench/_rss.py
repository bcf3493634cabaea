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
    return sum(rss.get(pid, 0) for pid in _descendants(root, children))


def _descendants(root: int, children: dict[int, list[int]]) -> list[int]:
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _tree_pids(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                line = stat.read()
        except OSError:
            continue
        children.setdefault(int(line[line.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    return _descendants(root, children)


def _rss_and_shmem_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, RssShmem) of one process, KiB; (0, 0) once it is gone."""
    found = {"VmRSS": 0, "RssShmem": 0}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key = line.split(":", 1)[0]
                if key in found:
                    found[key] = int(line.split()[1])
    except OSError:
        pass
    return found["VmRSS"], found["RssShmem"]


def measure_shared(cmd: list[str], shared_files: str, stdin=None) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MiB of the process tree, peak MiB with each page of the files
    matching the glob `shared_files` counted once) of one fresh run of `cmd`; both sampled
    every 10 ms, the second at one moment: Σ (RSS − RssShmem) + the files' size."""
    start = time.perf_counter()
    process = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = once = 0
    while True:
        rss = shmem = 0
        for pid in _tree_pids(process.pid):
            one, shared = _rss_and_shmem_kib(pid)
            rss, shmem = rss + one, shmem + shared
        files = 0
        for path in glob.glob(shared_files):
            try:
                files += os.path.getsize(path) // 1024
            except OSError:  # removed meanwhile
                pass
        peak, once = max(peak, rss), max(once, rss - shmem + files)
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.01)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[:2]} failed: {process.stderr.read().decode()[-500:]}")
    return seconds, max(peak, usage.ru_maxrss) / 1024, once / 1024


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
