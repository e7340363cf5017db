"""The scheduler's counters of a local server's threads, read just before and after a timed pass (make compare).

Why: on an H200, at one step and acceptance 0, the per-request TPOT of a speculating Qwen3.5 server fell into two
modes about 20% apart. Each mode lasted seconds, on both sides of a comparison and in A/A runs alike, with the GPU at
its maximum clocks throughout (results/gpu-sessions/20261129T2159Z/README.md). The step is host-bound, so the
question is what the server's threads were doing: running, or runnable and waiting for a CPU. Linux keeps that per
thread (/proc/<pid>/task/<tid>/schedstat: time on a CPU, time waiting on a run queue; /proc/.../status: switches
the scheduler forced), and this reads it for every thread of the server's process group, found from the port it
listens on. Only a server on this host is read; a remote URL gets nothing.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

PROC = Path("/proc")
LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]"}


def listening_inodes(port: int, proc: Path = PROC) -> set[str]:
    """Socket inodes listening on `port` (TCP, IPv4 and IPv6) in this network namespace."""
    out = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN; the inode is the 10th field
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                out.add(f[9])
    return out


def pids_listening(port: int, proc: Path = PROC) -> list[int]:
    """The processes holding a socket that listens on `port`."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return []
    want = {f"socket:[{i}]" for i in inodes}
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fds = list((d / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        if any(_link(fd) in want for fd in fds):
            out.append(int(d.name))
    return sorted(out)


def _link(fd: Path) -> str | None:
    """What a descriptor points at; None for one closed since it was listed (a busy server opens and closes
    connections all the time: one such fd used to drop the whole process from pids_listening)."""
    try:
        return os.readlink(fd)
    except OSError:
        return None


def descendants(roots: list[int], proc: Path = PROC) -> list[int]:
    """roots and every process below them (the API server's engine core and workers), from each one's parent pid."""
    parent = {}
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = set(roots), list(roots)
    while todo:
        p = todo.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in out:
                out.add(child)
                todo.append(child)
    return sorted(out)


def server_pids(url: str, proc: Path = PROC) -> list[int]:
    """The processes of the server behind `url` when it runs on this host: those listening on its port and all
    their descendants; [] for another host or a port nothing here listens on."""
    u = urlparse(url)
    if (u.hostname or "") not in LOCAL_HOSTS and f"[{u.hostname}]" not in LOCAL_HOSTS:
        return []
    port = u.port or (443 if u.scheme == "https" else 80)
    roots = pids_listening(port, proc)
    return descendants(roots, proc) if roots else []


def snapshot(pids: list[int], proc: Path = PROC) -> dict[str, dict]:
    """Per thread ("pid/tid"): its name, nanoseconds on a CPU and waiting on a run queue, and forced switches."""
    out = {}
    for pid in pids:
        try:
            tasks = list((proc / str(pid) / "task").iterdir())
        except OSError:
            continue
        for t in tasks:
            try:
                run_ns, wait_ns = (int(x) for x in (t / "schedstat").read_text().split()[:2])
                status = (t / "status").read_text()
                m = re.search(r"^nonvoluntary_ctxt_switches:\s*(\d+)", status, re.M)
                comm = (t / "comm").read_text().strip()
            except (OSError, ValueError):
                continue
            out[f"{pid}/{t.name}"] = {"comm": comm, "run_ns": run_ns, "wait_ns": wait_ns,
                                      "forced": int(m.group(1)) if m else 0}
    return out


def pass_summary(before: dict, after: dict, wall_s: float) -> dict | None:
    """What the server's threads did between two snapshots: all threads' seconds on a CPU and waiting for one, and
    the busiest thread's (most time on a CPU: the engine's step loop when it is busy) with its share of the wall
    time spent waiting (wait_pct) and the switches the scheduler forced on it. None without both snapshots."""
    if not before or not after or wall_s <= 0:
        return None
    deltas = []
    for k, a in after.items():
        b = before.get(k)
        if b is None:
            continue  # a thread that started during the pass: no baseline
        deltas.append((a["comm"], a["run_ns"] - b["run_ns"], a["wait_ns"] - b["wait_ns"], a["forced"] - b["forced"]))
    if not deltas:
        return None
    comm, run, wait, forced = max(deltas, key=lambda d: d[1])
    return {"threads": len(deltas), "run_s": round(sum(d[1] for d in deltas) / 1e9, 4),
            "wait_s": round(sum(d[2] for d in deltas) / 1e9, 4),
            "busiest": {"comm": comm, "run_s": round(run / 1e9, 4), "wait_s": round(wait / 1e9, 4),
                        "run_pct": round(100.0 * run / 1e9 / wall_s, 2), "wait_pct": round(100.0 * wait / 1e9 / wall_s, 2),
                        "forced_switches": forced}}
