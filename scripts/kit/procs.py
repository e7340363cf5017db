"""ServerProcess: the one way the kit starts and stops a server (serve, probe, eval, bake, tests).

It owns exactly what it starts: the server runs in a new session (its own process group), is
declared ready only when GET /health answers 200 while the process is still alive (so a crash is
told apart from a slow start), and is stopped with SIGTERM to the group, then SIGKILL. Nothing is
ever killed by name and nothing sleeps a fixed time hoping the server is up.

    with ServerProcess(argv, env, host, port, ready_timeout_s=600, log_path=p) as srv:
        requests.get(srv.url + "/v1/models")
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from .errors import KitError

# How often wait_ready asks GET /health. A start's ready time is when a poll first got 200, so it runs late by up to
# one interval: 0.5 s until 2026-11-28 (half a second of noise in start records meant to split seconds), 0.05 s since.
# The server is not listening until it is ready, so the polls before are refused connections, not load on it.
HEALTH_POLL_S = 0.05


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def spare_ports(n: int = 1, span: int = 1, host: str = "127.0.0.1") -> list[int]:
    """n free ports, each with its next span-1 free too (a base: PORT.. of a fleet or a sweep's jobs), for servers
    that bind them later.

    Chosen outside the kernel's ephemeral range. A bind to port 0 gets a port from that range, and so does every
    outgoing connection and every port vLLM's engines open; so a port picked that way can be taken before its server
    binds it, seconds later, after its imports (CI, 2026-11-29: the second fleet of a test found a replica's port in
    use). Outside the range only an explicit bind takes a port. Where there is no room outside it, anywhere."""
    try:
        lo, hi = map(int, EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 65535  # not Linux: Linux's default start to IANA's end covers both
    every = range(20000, 65536 - span + 1)
    outside = [p for p in every if p + span <= lo or p > hi] or list(every)
    out: list[int] = []
    taken: set[int] = set()
    for p in random.SystemRandom().sample(outside, len(outside)):  # not `random`'s seeded state: parallel runs differ
        block = range(p, p + span)
        if not taken.intersection(block) and all(port_free(host, q) for q in block):
            out.append(p)
            taken.update(block)
            if len(out) == n:
                return out
    raise KitError(f"no {n} free run(s) of {span} port(s) on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    """A free port for a server started later (tune's candidates, compare's second side, a replica): spare_ports'."""
    return spare_ports(1, host=host)[0]


def _pin(pid: int, cpus: set[int] | None = None) -> None:
    """Allow a server just started (and every process it starts) `cpus`, else every CPU this process may use (its
    main thread's set), whichever thread started it.

    Why a fleet replica gets its own slice: at `import torch`, MKL counts cores by moving the process onto each
    allowed CPU in turn (strace: sched_setaffinity to [0], then [1], then back; at::init_num_threads). On a 2-core
    host (2026-11-27 and 2026-11-28, CI and here) a replica restarted while the other replica's worker saturated
    the CPU it pins stopped in that move: the new EngineCore sat in the kernel's affine_move_task for minutes, wrote
    nothing, and outlived SIGKILL, and the port stayed taken. Allowed only its own slice, MKL's count never moves a
    replica onto its neighbour's CPU. (Before: the whole set, after a mid-count {1} was taken for the cause.)"""
    try:
        os.sched_setaffinity(pid, cpus or os.sched_getaffinity(os.getpid()))
    except (AttributeError, OSError):  # not Linux, or it has already exited
        pass


def parse_cpus(spec: str | None) -> set[int] | None:
    """CPU ids from a list such as "0,1" or "0-3,6" (VLLM_CPU_OMP_THREADS_BIND's one-slice form); None for anything
    else ("auto", "nobind", "0-1|2-3", empty)."""
    if not spec or not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", spec.strip()):
        return None
    from scripts.patches.engine_cpu import parse_list  # the kernel's list form, parsed in one place
    return parse_list(spec) or None


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is pgid (read from /proc; used to prove nothing was left behind)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


# The host-wide GPU lock (.ci/gpu-session.sh sets it for every job it starts). A probe holds it
# exclusively while it times; a server holds it shared from spawn to ready, so no probe times while a
# neighbour compiles, autotunes or captures graphs (2026-11-25 on the H100: two seeds of a tune were
# timed while DFlash servers started beside them), and no start-up autotunes under a probe's load.
# Start-ups still overlap one another.
GPU_LOCK_ENV = "KIT_PROBE_LOCK"


def gpu_lock_path() -> Path | None:
    """The host-wide GPU lock file, when one is set."""
    lock = os.environ.get(GPU_LOCK_ENV)
    return Path(lock) if lock else None


def flock(path: Path | None, shared: bool = False, waiting: str = ""):
    """A context holding an flock on `path`: exclusive, or shared (a no-op without a path). flock,
    not a pid file: the kernel drops it when the holder dies, so a killed holder never blocks the
    others. `waiting`, when set, is printed once if the lock is busy."""
    import contextlib
    import fcntl
    import sys
    if path is None:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def held():
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        with open(path, "a") as f:  # closing the file releases the lock
            try:
                fcntl.flock(f, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting:
                    print(waiting, file=sys.stderr, flush=True)
                fcntl.flock(f, mode)
            yield
    return held()


# At most N vLLM servers at once on this host, across processes (KIT_SERVER_SLOTS=N; unset: no limit): a start past N
# waits for a stop. For a host whose memory holds only so many: make test-all's two workers on a 24 GB host ran six
# tiny servers at once (2026-12-03, 1.9 GB left) after CI's run that day had lost a server mid-test, as the kernel's
# OOM killer takes the biggest process. An flock on one of N files, held from start to stop (the kernel drops it if
# its holder dies). Servers that start together (a fleet's replicas, compare's two sides) take their slots all at
# once (server_slots): taken one by one, two such groups each held part of what they needed and waited on each
# other until the bound ran out (CI-like run here, 2026-12-03: two 600 s waits). The wait stays bounded, as a
# process may hold slots through servers it keeps up: after SLOT_WAIT_S it starts anyway. Every wait's end is said
# and kept in the slots' folder (waits.log).
SLOTS_ENV = "KIT_SERVER_SLOTS"
SLOT_WAIT_S = 600.0
_pool: list[int] = []  # slots a group took at once (server_slots), each handed to one of its servers' starts
_pool_lock = threading.Lock()


def is_vllm(argv: list[str]) -> bool:
    """A vLLM server's command (the kit's vllm_main, or vllm itself), not a fleet's router or a stand-in."""
    return any(a in ("scripts.kit.vllm_main", "vllm") or a.endswith("/vllm") for a in argv)


def slot_count() -> int | None:
    """KIT_SERVER_SLOTS as a number; None where it is unset."""
    raw = os.environ.get(SLOTS_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
        if n < 1:
            raise ValueError
    except ValueError:
        raise KitError(f"{SLOTS_ENV}={raw!r}: a number of servers, at least 1") from None
    return n


def take_server_slots(k: int, what: str, wait_s: float = SLOT_WAIT_S) -> list[int]:
    """k held slots (their file descriptors), taken together or not at all, under KIT_SERVER_SLOTS; [] where the
    variable is unset, or once wait_s has passed without k free (said)."""
    import fcntl
    import tempfile
    n = slot_count()
    if n is None or k < 1:
        return []
    if k > n:
        raise KitError(f"{what}: {k} servers at once, but {SLOTS_ENV}={n} lets at most {n} run on this host; "
                       f"raise {SLOTS_ENV} or start fewer")
    d = Path(tempfile.gettempdir()) / f"kit-server-slots-{os.getuid()}"
    d.mkdir(exist_ok=True)
    t0, said = time.monotonic(), False
    while True:
        held: list[tuple[int, int]] = []
        for i in range(n):
            fd = os.open(d / f"slot-{i}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append((i, fd))
                if len(held) == k:
                    break
            except BlockingIOError:
                os.close(fd)
        if len(held) == k:
            if said:
                _slot_wait(d, f"{what}: slot {', '.join(str(i) for i, _ in held)} after {time.monotonic() - t0:.0f} s")
            return [fd for _, fd in held]
        for _, fd in held:  # not part of what is needed: a group holding some while it waits is how two deadlock
            os.close(fd)
        waited = time.monotonic() - t0
        if waited > wait_s:
            _slot_wait(d, f"{what}: {k} of {n} server slots ({SLOTS_ENV}) not free after {waited:.0f} s; "
                          f"starting anyway")
            return []
        if not said:
            print(f"{what}: waiting for {k} of {n} server slots ({SLOTS_ENV})", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.5)


def take_server_slot(what: str, wait_s: float = SLOT_WAIT_S) -> int | None:
    """One held slot: one taken earlier for a group this server belongs to (server_slots), else a new one; None
    where KIT_SERVER_SLOTS is unset, or once wait_s has passed with every slot taken (said)."""
    with _pool_lock:
        if _pool:
            return _pool.pop()
    got = take_server_slots(1, what, wait_s)
    return got[0] if got else None


def _slot_wait(d: Path, msg: str) -> None:
    """A wait's end, said and kept in the slots' folder (waits.log), where a host's waits can be counted."""
    print(msg, file=sys.stderr, flush=True)
    with open(d / "waits.log", "a") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} pid {os.getpid()} {msg}\n")


def give_server_slot(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the descriptor drops its lock


@contextlib.contextmanager
def server_slots(k: int, what: str):
    """Slots for k servers about to start together, taken at once; each of this process's next vLLM starts takes one
    of them, and those left unused are given back on exit. Slots still unused from an enclosing group count."""
    with _pool_lock:
        need = max(0, k - len(_pool))
    added = take_server_slots(need, what) if need else []
    with _pool_lock:
        _pool.extend(added)
    try:
        yield
    finally:
        with _pool_lock:
            left = [fd for fd in added if fd in _pool]
            for fd in left:
                _pool.remove(fd)
        for fd in left:
            give_server_slot(fd)


@contextlib.contextmanager
def slots_for_children(k: int, what: str):
    """Slots for k servers that child processes start together (sweep's batch, whose probes wait for each other),
    held here; yields the environment for those children: without KIT_SERVER_SLOTS, as this process counts them
    (None where no slot was taken: the children inherit this environment as it is)."""
    fds = take_server_slots(k, what)
    try:
        yield {key: val for key, val in os.environ.items() if key != SLOTS_ENV} if fds else None
    finally:
        for fd in fds:
            give_server_slot(fd)


@contextlib.contextmanager
def server_slot(what: str):
    """A slot held around a server started some other way (a container's)."""
    fd = take_server_slot(what)
    try:
        yield
    finally:
        give_server_slot(fd)


def stop_on_signals() -> None:
    """Ctrl-C (SIGINT) and SIGTERM both raise KeyboardInterrupt, so an entry point's cleanup (stop the
    servers it started) runs on either. SIGINT is set explicitly: a job started in the background by a
    non-interactive shell (`cmd &` in a script, nohup) inherits SIGINT ignored, and Python then keeps it
    ignored. On the H100 (2026-11-26) every `kill -INT` of a detached `scripts.serve` did nothing, and
    each stop waited 120 s for the TERM that followed."""
    def term(*_):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, term)


def check_serves(url: str, model: str, why: str, where: str | None = None) -> None:
    """Refuse a server that answers no GET /v1/models, or serves another model than the variant's, before anything
    is measured against it (a record would name the wrong variant). The message opens with `where` (the flag the
    user gave; default the URL) and closes with `why` (what to do)."""
    where = where or url
    import requests
    try:
        r = requests.get(url.rstrip("/") + "/v1/models", timeout=30)
        r.raise_for_status()
        models = [m["id"] for m in r.json().get("data", [])]
    except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError) as e:
        raise KitError(f"{where}: no OpenAI server answers GET /v1/models ({type(e).__name__}: {e})") from None
    if model not in models:
        raise KitError(f"{where} serves {models}, not variant {model!r} ({why})")


def busy_port_message(host: str, port: int) -> str:
    """What to do about a port in use, in the forms that work: make reads overrides only from SET
    (a bare PORT=... is a make variable the kit never sees), and keeps only the last of several SET=."""
    alt = next((p for p in range(port + 1, min(port + 100, 65536)) if port_free(host, p)), port + 1)
    return (f"port {port} on {host} is already in use; stop whatever holds it, or choose another: "
            f'make ... SET="PORT={alt}" (several overrides in one quoted SET: SET="PORT={alt} WEIGHTS=dummy"), '
            f"or --set PORT={alt} with python -m scripts.<verb>")


def first_token_at(url: str, model: str, prompt_ids: list[int], timeout: float = 600,
                   whole: bool = False) -> float | None:
    """time.monotonic() when the first streamed token of one short completion of `prompt_ids` arrived, None if
    none did; KitError naming the status when the server refuses it (bake's first request, a standby's wake).
    whole: also read the stream to its end, and raise KitError unless the completion finished (a finish_reason,
    no error): a first token alone does not show the engine can go on (2026-12-03, H200: a woken standby's
    first token came, and its next step killed the engine)."""
    import json
    import requests
    at, finished = None, False
    with requests.post(url + "/v1/completions", stream=True, timeout=timeout, json={
            "model": model, "prompt": prompt_ids, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "stream": True}) as r:
        if r.status_code != 200:
            raise KitError(f"first request answered {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if "error" in obj:  # vLLM streams its error, then [DONE]
                err = obj["error"]
                raise KitError(f"the completion failed{' after its first token' if at else ''}: "
                               f"{err.get('message', err) if isinstance(err, dict) else err}")
            choices = obj.get("choices") or []
            if choices and at is None:
                at = time.monotonic()
                if not whole:
                    return at
            finished = finished or any(c.get("finish_reason") for c in choices)
    if whole and at is not None and not finished:
        raise KitError("the completion's stream ended before it finished (no finish_reason): the engine may have "
                       "died after its first token")
    return at


class ServerProcess:
    def __init__(self, argv: list[str], env: dict, host: str, port: int, ready_timeout_s: float = 600,
                 log_path: Path | None = None, cwd: Path | None = None, on_wait=None, cpus: set[int] | None = None):
        self.argv, self.env, self.host, self.port = argv, env, host, port
        self.cpus = cpus  # the CPUs the server's processes may use (a fleet replica's slice); None: all of ours
        self.ready_timeout_s, self.log_path, self.cwd = ready_timeout_s, log_path, cwd
        self.on_wait = on_wait  # called with elapsed seconds while polling (progress display)
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None
        self._log = None
        self._start_lock = None  # the shared GPU lock, held from spawn to ready
        self._tmp: str | None = None  # the server's own TMPDIR, removed after stop
        self._relays: list = []  # threads echoing a log-less server's output to ours
        self._cpu_claim: int | None = None  # ENGINE_CPU's claim on this host (a locked file), released at stop
        self._quiet = False  # set when we stop the server: its shutdown output is not echoed
        self._slot: int | None = None  # a KIT_SERVER_SLOTS slot, held from start to stop

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> "ServerProcess":
        if not port_free(self.host, self.port):
            raise KitError(busy_port_message(self.host, self.port))
        # A SERVE_* typo is refused here, before anything starts: vLLM itself would take a prefix of
        # a flag silently, or fail ~20 s later behind its usage text (issue #20).
        from .vllm_args import unknown_flags
        bad = unknown_flags(self.argv)
        if bad:
            raise KitError(bad)
        if self._slot is None and is_vllm(self.argv):
            self._slot = take_server_slot(f"server on port {self.port}")
        before = self.proc  # a restart's earlier process, or None
        try:
            return self._start()
        except BaseException:
            if self.proc is before:  # nothing started: nothing holds the slot
                give_server_slot(self._slot)
                self._slot = None
            raise

    def _start(self) -> "ServerProcess":
        env = dict(self.env)
        cpus = self._engine_cpu(env)  # before anything starts: a CPU this server may not use is refused here
        # Its own temp folder, removed once the group is gone: vLLM leaves a vllm_dist_* FileStore file
        # (and IPC sockets) in the temp folder at every stop. Not in self.env: records keep that.
        # Caches torch keeps under the temp folder stay where they were (torch's own default), so a
        # start is not colder than before; vLLM points Inductor at VLLM_CACHE_ROOT for its compiles.
        import getpass
        import tempfile
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
        inductor = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
        self._tmp = tempfile.mkdtemp(prefix=f"kit-server-{self.port}-")
        full_env = {**os.environ, "TMPDIR": self._tmp}
        full_env.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor)
        full_env.update(env)
        # The repo root first on the server's path, however the kit was started (make sets it; a bare
        # `python -m scripts.serve` did not): sitecustomize.py must load in every server process, or the
        # variant's patches (KIT_*) and the start-up trace are silently off.
        from .paths import ROOT
        paths = [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(ROOT) not in paths:
            full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths])
        self._quiet = False
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")
        lock = gpu_lock_path()
        if lock:  # taken before t0: time spent waiting for a probe is not start-up time
            self._start_lock = flock(lock, shared=True,
                                     waiting=f"server on port {self.port}: waiting for a probe to finish "
                                             f"timing ({GPU_LOCK_ENV}={lock})")
            self._start_lock.__enter__()
        self.t0, self.t0_wall = time.monotonic(), time.time()
        # Without a log file the server's output goes to our stdout/stderr, through a relay that stops
        # echoing when we stop it: its shutdown (vLLM's EngineDeadError traceback, leak warnings) is ours.
        out = self._log or subprocess.PIPE
        if not self._log:
            full_env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the terminal as they are written
        try:
            self.proc = subprocess.Popen(self.argv, env=full_env, cwd=self.cwd, start_new_session=True,
                                         stdout=out, stderr=subprocess.STDOUT if self._log else subprocess.PIPE)
        except BaseException:
            self._release_start_lock()  # nothing started: nothing to hold the GPU for
            self._release_cpu_claim()
            self._remove_tmp()
            raise
        _pin(self.proc.pid, cpus or self.cpus)
        if not self._log:
            import threading
            self._relays = [threading.Thread(target=self._relay, args=(pipe, fd), daemon=True)
                            for pipe, fd in ((self.proc.stdout, 1), (self.proc.stderr, 2))]
            for t in self._relays:
                t.start()
        return self

    def _engine_cpu(self, env: dict) -> set[int] | None:
        """ENGINE_CPU (scripts/patches/engine_cpu.py) resolved here, once, against the CPUs this server may use, and its
        CPU claimed on this host until stop(): the server gets `<cpu>:<rest>` and starts on the rest (so this
        process's own pin below cannot undo the patch's).
        None where the key is not set or cannot act (auto with one CPU: said, and left out)."""
        from scripts.patches import engine_cpu
        spec = env.get(engine_cpu.ENV) or os.environ.get(engine_cpu.ENV)
        if not spec:
            return None
        allowed = self.cpus or os.sched_getaffinity(0)
        try:
            loop, rest, self._cpu_claim = engine_cpu.claim(spec, allowed)  # held until stop()
        except ValueError as e:
            if spec == "auto":
                print(f"kit: ENGINE_CPU=auto left out: {e}", file=sys.stderr)
                env[engine_cpu.ENV] = ""  # off (sitecustomize reads an empty switch as unset), whatever ours says
                return None
            raise KitError(f"ENGINE_CPU={spec}: {e}") from None
        env[engine_cpu.ENV] = f"{loop}:{engine_cpu.format_list(rest)}"
        return rest

    def _release_cpu_claim(self) -> None:
        if self._cpu_claim is not None:
            os.close(self._cpu_claim)
            self._cpu_claim = None

    def _relay(self, pipe, fd: int) -> None:
        """Copy the server's output to our fd line by line until it closes; once we are stopping the
        server, keep draining the pipe (so the server never blocks on it) but print nothing."""
        with pipe:
            for line in iter(pipe.readline, b""):
                if not self._quiet:
                    try:
                        os.write(fd, line)
                    except OSError:
                        pass

    def _remove_tmp(self) -> None:
        if self._tmp:
            import shutil
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def wait_ready(self) -> float:
        """Seconds from start to GET /health == 200. Raises KitError on crash or timeout."""
        deadline = self.t0 + self.ready_timeout_s
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise KitError(f"server exited with code {rc} before it was ready{self._log_hint()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        self.ready_s = time.monotonic() - self.t0
                        self._release_start_lock()
                        return self.ready_s
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            now = time.monotonic()
            if now > deadline:
                self.stop()
                raise KitError(f"server not ready after {self.ready_timeout_s:.0f} s "
                               f"(READY_TIMEOUT_S){self._log_hint()}")
            if self.on_wait:
                self.on_wait(now - self.t0)
            # Poll interval, not a guess at readiness: /health decides.
            time.sleep(HEALTH_POLL_S)

    def _release_start_lock(self) -> None:
        if self._start_lock is not None:
            lock, self._start_lock = self._start_lock, None
            lock.__exit__(None, None, None)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM the process group, wait, then SIGKILL; returns when the group is gone."""
        try:
            self._stop(grace_s)
        finally:
            give_server_slot(self._slot)
            self._slot = None

    def _stop(self, grace_s: float) -> None:
        if self.proc is None:
            self._release_start_lock()
            self._release_cpu_claim()
            self._remove_tmp()
            if self._log:  # opened by a start whose process is gone from our hands (fleet: one that outlived SIGKILL)
                self._log.close()
                self._log = None
            return
        # What it prints from here on is the shutdown we asked for; a server that already exited on
        # its own (a crash) still has its last words relayed.
        self._quiet = self.proc.poll() is None
        pgid = self.proc.pid
        t0 = time.monotonic()
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait
            while time.monotonic() < end:
                self.proc.poll()
                if not group_members(pgid):
                    break
                time.sleep(0.2)
            else:
                # Said as it happens: on the H100 (2026-11-25 20:34) two stops outlasted 120 s and their
                # logs ended at "stopping server", so where the time went was never seen.
                left = group_members(pgid)
                print(f"server group {pgid}: {len(left)} process(es) still up {time.monotonic() - t0:.0f} s after "
                      f"{signal.Signals(sig).name}: {', '.join(map(str, left[:8]))}", file=sys.stderr, flush=True)
                continue
            break
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise KitError(f"server pid {pgid} did not exit {time.monotonic() - t0:.0f} s after SIGKILL "
                           "(stuck in the kernel or the GPU driver?); its process group is left to the OS") from None
        if time.monotonic() - t0 > 5:
            print(f"server stopped in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        for t in self._relays:  # the pipes close when the last process of the group is gone
            t.join(timeout=5)
        self._relays = []
        self._remove_tmp()
        self._release_start_lock()  # a server stopped before it was ready
        self._release_cpu_claim()
        if self._log:
            self._log.close()
            self._log = None

    def tail(self, n: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    # vLLM's start-up errors that a config key fixes, and the key: vLLM names its own flag, the user sets the kit's.
    # The Mamba one stopped every Qwen3.5 server of two GPU sessions after minutes of compiling (2026-11-25 at 1024
    # sequences, 2026-11-27 at 256 with 4 GiB of KV).
    KEY_HINTS = ((re.compile(r"max_num_seqs \((\d+)\) exceeds available Mamba cache blocks \((\d+)\)"),
                  "set SERVE_MAX_NUM_SEQS to at most {1} (it is {0}), or give the KV cache more memory "
                  "(SERVE_KV_CACHE_MEMORY_BYTES or SERVE_GPU_MEMORY_UTILIZATION)"),
                 # vLLM sizes the KV cache from a profile run, then warms up: V2's warm-up prefills up to
                 # max_num_seqs requests at once, a peak the profile never saw (H100, session 20261206T0552Z:
                 # 1.71 GiB asked, 1.60 GiB free, on a warm start that applied the bake's startup plan).
                 (re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMG]iB)"),
                  "leave the engine more than the {0} it asked for: fewer sequences (SERVE_MAX_NUM_SEQS: vLLM's "
                  "warm-up runs them all after the KV cache is allocated), a smaller SERVE_KV_CACHE_MEMORY_BYTES, or "
                  "a lower SERVE_GPU_MEMORY_UTILIZATION (where the start applied a startup plan, the plan's KV size "
                  "holds whatever the utilization says until `make bake` measures it again)"),)

    # Where the traceback shows which allocation it was, and a key that sizes for it. The GDN prefill's per-sequence
    # states are missing from vLLM's memory profile (scripts/patches/gdn_profile_states.py): v4's bake on the H100 ran
    # out of memory in that kernel (session 20261206T0747Z), and so did -mega's warm start (session 20261206T0552Z).
    FRAME_HINTS = ((re.compile(r"OutOfMemoryError"), re.compile(r"chunk_gated_delta_rule"),
                    "the allocation is a Gated DeltaNet prefill's per-sequence states, which vLLM's memory profile "
                    "leaves out: GDN_PROFILE_STATES=on (then `make bake`) sizes the KV cache for them"),)

    def _log_hint(self) -> str:
        t = self.tail(25)
        cause = self.root_cause()
        fix = next((hint.format(*m.groups()) for rx, hint in self.KEY_HINTS if cause
                    for m in [rx.search(cause[1])] if m), None)
        if fix and cause:
            log = self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""
            fix += "".join(f"; {hint}" for c, frame, hint in self.FRAME_HINTS if c.search(cause[1]) and frame.search(log))
        return (f"; cause (line {cause[0]} of the log): {cause[1]}" if cause else "") + \
            (f"; fix: {fix}" if fix else "") + (f"; last lines of {self.log_path}:\n{t}" if t else "")

    # vLLM's engine process logs the exception that stopped it; the API server's own traceback, which
    # is what the log ends with, only says "Engine core initialization failed" (2026-11-25: the cause,
    # "max_num_seqs (1024) exceeds available Mamba cache blocks (248)", was 40 lines above the tail).
    CAUSE = re.compile(r"\b((?:[A-Z]\w*(?:Error|Exception))|torch\.OutOfMemoryError): (.+)")

    def root_cause(self) -> tuple[int, str] | None:
        """(line number, 'Error: message') of the last exception message in the log other than the
        API server's generic wrapper, or None. Warnings are skipped: vLLM's fd-limit warning quotes
        "OSError: [Errno 24]" on every start."""
        if not self.log_path or not self.log_path.exists():
            return None
        found = None
        for i, line in enumerate(self.log_path.read_text(errors="replace").splitlines(), 1):
            m = self.CAUSE.search(line)
            if m and "WARNING" not in line and "Engine core initialization failed" not in m.group(2):
                found = i, f"{m.group(1)}: {m.group(2).strip()}"
        return found

    def __enter__(self):
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def wait_ready_shown(self, desc: str) -> float:
        """wait_ready, the wait shown on stderr as a seconds counter (a cold start compiles for minutes, its output
        going to the log); on_wait, if set, still gets every poll. Into a file or a pipe (a CI or job log) the
        counter is redrawn every 30 s, not every second, and the last count is always written."""
        from tqdm import tqdm
        inner = self.on_wait
        every = 0.5 if sys.stderr.isatty() else 30.0
        with tqdm(desc=desc, unit="s", file=sys.stderr, bar_format="{desc}: {n}s", mininterval=every) as bar:
            def tick(elapsed: float) -> None:
                bar.update(max(0, round(elapsed) - bar.n))
                if inner:
                    inner(elapsed)
            self.on_wait = tick
            try:
                return self.wait_ready()
            finally:
                self.on_wait = inner

    @contextlib.contextmanager
    def shown(self, desc: str):
        """`with srv.shown("starting X"):` is `with srv:`, its wait for ready shown (wait_ready_shown)."""
        self.start()
        try:
            self.wait_ready_shown(desc)
        except BaseException:
            self.stop()
            raise
        try:
            yield self
        finally:
            self.stop()

def run_logged(argv: list[str], log: Path, cwd: Path | None = None, env: dict | None = None) -> int:
    """A child kit command (probe, evaluate, serve --then) with its output appended to a log. It shares
    this process group, so Ctrl-C reaches it too and its own handler stops whatever it started."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        return subprocess.run(argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
