"""A fleet: N replicas of one variant behind vllm-router, the front door (issue #21).

The kit does not balance requests itself: vllm-router (PyPI `vllm-router`, a Rust load balancer from
the vLLM project, pinned in pyproject.toml's `router` group) routes them, cache-aware by default: a
request goes to the replica that served the longest prefix of its prompt (over 30% of it), else to
the least loaded one (in-flight requests; the first on a tie).

Every process is a ServerProcess (own process group, /health polling, SIGTERM then SIGKILL):

    replicas   the variant's own server command (Variant.to_argv/to_env), one port each, one GPU
               slice each on a GPU host (CUDA_VISIBLE_DEVICES), a share of the CPUs on a CPU host
    router     `vllm-router --worker-urls ...`, started once every replica answers /health; its own
               /health is its readiness (200 only while every replica is healthy: 503 naming the dead
               ones after; /readiness is 200 while at least one is)

A replica that dies is restarted (Fleet.supervise, called by watch): a supervisor is what users of
`make serve-fleet` expect, and the router takes the replica back at its next health check once it
answers again. Restarts are bounded (FLEET_MAX_RESTARTS per replica), so a replica that cannot start
(a bad GPU, a config that crashes) is not restarted forever; each death and start is one stderr line
and one entry of Fleet.events.

    with Fleet(load("tiny"), replicas=2) as fleet:
        requests.post(fleet.url + "/v1/completions", json={...})

Ports: the router takes the variant's PORT (where clients of `make serve` already point), the replicas
PORT+1 ... PORT+N, the router's Prometheus metrics PORT+N+1; or pass them. All are checked before
anything starts.
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

from .errors import KitError
from .procs import ServerProcess, parse_cpus, port_free, server_slots

ROUTER_PACKAGE = "vllm-router"


def _policies() -> tuple:
    from .schema import load_schema
    return tuple(load_schema("variant.schema.json")["properties"]["FLEET_POLICY"]["enum"])


# The policies vllm-router 0.1.17 names (`vllm-router --help`) that need nothing beyond the worker
# URLs (kv_aware needs KV-event sources; sticky_least_loaded is for program scheduling): the schema's
# FLEET_POLICY enum, which also holds the default.
POLICIES = _policies()
# Routing around a dead replica. The router's defaults notice one only after 3 failed health checks
# 60 s apart, and its circuit breaker opens after 10 failures, while cache affinity keeps choosing the
# dead replica for its prompts through all 5 retries: in a trial with the defaults (vllm-router 0.1.17,
# 2026-11-25, not kept as a record), requests sent after one of two `tiny` replicas was SIGKILLed failed
# ("500 Request failed: error sending request"); with these, tests/test_fleet_e2e.py loses none. A check every 2 s drops a
# replica at its first failure; the breaker opens after 2 failed requests, within one request's
# retries, so the retry goes to another replica. Retries stay on (their default).
ROUTER_HEALTH = ["--health-check-interval-secs", "2", "--health-failure-threshold", "1",
                 "--health-success-threshold", "1", "--health-check-timeout-secs", "5",
                 "--cb-failure-threshold", "2", "--cb-timeout-duration-secs", "30"]
ROUTER_READY_TIMEOUT_S = 60
PLACEMENT_KEYS = ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_OMP_THREADS_BIND")


def router_binary() -> str:
    """The vllm-router executable: beside this Python (the .venv), else on PATH."""
    here = Path(sys.executable).parent / "vllm-router"
    found = str(here) if here.is_file() else shutil.which("vllm-router")
    if not found:
        raise KitError(f"vllm-router is not installed: run `make install` (it installs the {ROUTER_PACKAGE} pin "
                       f"from pyproject.toml's `router` group), or `.venv/bin/pip install {ROUTER_PACKAGE}`")
    return found


# vllm-router's cache_aware knobs, variant keys (FLEET_*; defaults in the variant schema): the router is always given
# them, so a record's FLEET_* keys say what it ran with even if a later router changes its own defaults.
CACHE_AWARE_FLAGS = (("FLEET_CACHE_THRESHOLD", "--cache-threshold"),
                     ("FLEET_BALANCE_ABS_THRESHOLD", "--balance-abs-threshold"),
                     ("FLEET_BALANCE_REL_THRESHOLD", "--balance-rel-threshold"))


def policy_args(variant, policy: str) -> list[str]:
    """The router flags of `policy` that come from the variant: cache_aware's thresholds, nothing for the rest."""
    if policy != "cache_aware":
        return []
    return [a for key, flag in CACHE_AWARE_FLAGS for a in (flag, str(variant[key]))]


def router_argv(binary: str, host: str, port: int, worker_urls: list[str], policy: str, metrics_port: int,
                extra: list[str] = ()) -> list[str]:
    if policy not in POLICIES:
        raise KitError(f"unknown router policy {policy!r}; vllm-router's: {', '.join(POLICIES)}")
    return [binary, "--host", host, "--port", str(port), "--worker-urls", *worker_urls, "--policy", policy, *extra,
            "--prometheus-host", host, "--prometheus-port", str(metrics_port),
            # The replicas are healthy before the router starts: its first check passes at once.
            "--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1",
            *ROUTER_HEALTH]


def gpus_per_replica(variant) -> int:
    from .k8s import gpu_count
    return gpu_count(variant)


def placements(variant, n: int, platform: str) -> list[dict]:
    """The environment that pins replica i to its devices: a GPU slice (CUDA_VISIBLE_DEVICES) on a GPU
    host, a slice of this process's CPUs (VLLM_CPU_OMP_THREADS_BIND) on a CPU host; {} where no slice
    fits or the variant pins it itself."""
    if platform == "gpu":
        from .device import gpu_facts
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [x for x in visible.split(",") if x.strip()] if visible else [str(i) for i in range(len(gpu_facts()))]
        k = gpus_per_replica(variant)
        if len(ids) >= n * k:
            return [{"CUDA_VISIBLE_DEVICES": ",".join(ids[i * k:(i + 1) * k])} for i in range(n)]
        # Sharing GPUs: each vLLM would claim 90% of one by default, so the budget must be explicit.
        if not variant.config.get("SERVE_KV_CACHE_MEMORY_BYTES"):
            raise KitError(f"{n} replicas x {k} GPU(s) need {n * k} GPUs, {len(ids)} visible; to share GPUs, "
                           f"set SERVE_KV_CACHE_MEMORY_BYTES and SERVE_GPU_MEMORY_UTILIZATION (SET=...)")
        return [{} for _ in range(n)]
    if "VLLM_CPU_OMP_THREADS_BIND" in variant.config:
        return [{} for _ in range(n)]
    cpus = sorted(os.sched_getaffinity(0))
    per = len(cpus) // n
    if per < 1:
        return [{} for _ in range(n)]
    return [{"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cpus[i * per:(i + 1) * per])} for i in range(n)]


class Fleet:
    def __init__(self, variant, replicas: int | None = None, policy: str | None = None, *, platform: str | None = None,
                 router_port: int | None = None, replica_ports: list[int] | None = None,
                 metrics_port: int | None = None, log_dir: Path | None = None, say=None):
        import dataclasses
        from .device import host_platform
        replicas = int(variant["FLEET_REPLICAS"]) if replicas is None else replicas
        policy = variant["FLEET_POLICY"] if policy is None else policy
        if replicas < 1:
            raise KitError(f"REPLICAS={replicas}: at least 1")
        self.variant, self.n, self.policy = variant, replicas, policy
        self.platform = platform or host_platform()
        base = int(variant["PORT"])
        self.router_port = router_port if router_port is not None else base
        self.replica_ports = replica_ports or [self.router_port + 1 + i for i in range(replicas)]
        if len(self.replica_ports) != replicas:
            raise KitError(f"{len(self.replica_ports)} replica ports for {replicas} replicas")
        self.metrics_port = metrics_port if metrics_port is not None else max(self.replica_ports) + 1
        self.host = variant["HOST"]
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        stamp = time.strftime("%Y%m%dT%H%M%S")
        if log_dir is None:
            from . import record
            log_dir = record.RESULTS / variant.name / "logs"
        self.log_dir = log_dir
        where = placements(variant, replicas, self.platform)
        self.replicas: list[ServerProcess] = []
        for i, port in enumerate(self.replica_ports):
            v = dataclasses.replace(variant, config={**variant.config, "PORT": port})
            env = {**v.to_env(self.platform), **where[i]}
            # On a CPU host the replica's processes are held to its slice, not only its worker (procs._pin says why).
            srv = ServerProcess(v.to_argv(self.platform), env, v["HOST"], port, v["READY_TIMEOUT_S"],
                                log_path=log_dir / f"fleet-{stamp}-replica{i}-{port}.log",
                                cpus=parse_cpus(where[i].get("VLLM_CPU_OMP_THREADS_BIND")))
            srv.index = i
            self.replicas.append(srv)
        self.router_log = log_dir / f"fleet-{stamp}-router-{self.router_port}.log"
        self.router: ServerProcess | None = None
        self.max_restarts = int(variant["FLEET_MAX_RESTARTS"])
        self.restarts = [0] * replicas
        # What supervise saw and did, in order: {"t_unix", "replica", "event": exited|restarting|ready|
        # failed|given_up, ...}; scripts/failover.py records them.
        self.events: list[dict] = []
        self._restarting: dict[int, threading.Thread] = {}
        self.given_up: set[int] = set()
        # Replicas whose restarted process outlived SIGKILL (2026-11-27/28, a tiny replica's restart on a loaded 2-core
        # host stopped in the kernel while MKL's core count moved it onto the other replica's saturated CPU: replicas
        # are now held to their own CPU slice, procs._pin): the next supervise starts another process instead of
        # waiting on that one; `left` keeps those processes' pids.
        self._stuck: set[int] = set()
        self.left: list[int] = []
        self._lock = threading.Lock()
        self._stopping = False

    @property
    def url(self) -> str:
        return ServerProcess([], {}, self.host, self.router_port).url

    def router_command(self) -> list[str]:
        return router_argv(router_binary(), self.host, self.router_port, [r.url for r in self.replicas],
                           self.policy, self.metrics_port, policy_args(self.variant, self.policy))

    def check_ports(self) -> None:
        named = [("router", self.router_port), ("router metrics", self.metrics_port)] + \
            [(f"replica {r.index}", r.port) for r in self.replicas]
        seen = {}
        for what, port in named:
            if port in seen:
                raise KitError(f"port {port} given to both {seen[port]} and {what}")
            seen[port] = what
            if not port_free(self.host, port):
                raise KitError(f"port {port} on {self.host} ({what}) is already in use; stop whatever holds it "
                               f"or choose another base (SET=PORT=...)")

    def start(self) -> "Fleet":
        """Replicas (all at once), each /health, then the router and its /health. On any failure
        everything started so far is stopped before the error is raised."""
        argv = self.router_command()  # a missing router fails before any replica costs a start
        self.check_ports()
        try:
            with server_slots(len(self.replicas), f"fleet of {len(self.replicas)} on {self.host}:{self.router_port}"):
                for r in self.replicas:
                    r.start()
                    pin = "".join(f" {k}={r.env[k]}" for k in PLACEMENT_KEYS if k in r.env)
                    self.say(f"replica {r.index}: starting on {r.url}{pin} (log {r.log_path})")
            for r in self.replicas:
                try:
                    ready = r.wait_ready()
                except KitError as e:
                    raise KitError(f"replica {r.index} (port {r.port}) failed to start; its log: {r.log_path}\n{e}") from None
                self.say(f"replica {r.index}: ready on {r.url} after {ready:.1f} s")
            self.router = ServerProcess(argv, {}, self.host, self.router_port, ROUTER_READY_TIMEOUT_S,
                                        log_path=self.router_log)
            self.router.start()
            try:
                ready = self.router.wait_ready()
            except KitError as e:
                raise KitError(f"vllm-router failed to start; its log: {self.router_log}\n{e}") from None
            self.say(f"router: ready on {self.url} ({self.policy}) after {ready:.1f} s (log {self.router_log})")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """The router first (no new requests reach a stopping replica), then every replica; a restart
        under way ends with its server."""
        self._stopping = True
        if self.router is not None:
            self.router.stop()
        for r in self.replicas:
            self._stop_replica(r)
        for t in list(self._restarting.values()):
            t.join(60)  # its server is stopped: its wait for /health ends at once
        for r in self.replicas:
            self._stop_replica(r)  # one that a restart had started between the two

    def _stop_replica(self, r: ServerProcess) -> None:
        """Every replica is stopped even when one outlives SIGKILL (said, left to the OS), so the caller's record
        is still written."""
        try:
            r.stop()
        except KitError as e:
            self.say(f"replica {r.index}: {str(e).splitlines()[0]}")
            self._leave(r)

    def _leave(self, r: ServerProcess) -> None:
        """Let go of a replica's process that outlived SIGKILL (its pid kept in `left`), then close what its start
        opened; stopping it again would only wait again."""
        self.left.append(r.proc.pid)
        r.proc = None
        r.stop()

    def pgids(self) -> list[int]:
        """The process groups this fleet started (one per process it spawned)."""
        return [s.proc.pid for s in [*self.replicas, self.router] if s is not None and s.proc is not None]

    def _event(self, replica: int, event: str, **facts) -> dict:
        e = {"t_unix": round(time.time(), 3), "replica": replica, "event": event, **facts}
        with self._lock:
            self.events.append(e)
        return e

    def supervise(self) -> None:
        """One look at every replica: one that exited is restarted in a thread of its own (a cold start
        takes minutes; the router routes around it meanwhile), at most max_restarts times."""
        for r in self.replicas:
            i = r.index
            if r.proc is None or (r.alive() and i not in self._stuck) or i in self.given_up:
                continue
            t = self._restarting.get(i)
            if t is not None and t.is_alive():
                continue  # its restart thread owns it until it is ready or failed
            self._restarting.pop(i, None)
            code = r.proc.poll()  # None for a stuck one: it has not exited, but it will never serve
            up = sum(x.alive() for x in self.replicas)
            self._event(i, "exited", exit_code=code)
            if self.restarts[i] >= self.max_restarts:
                self.given_up.add(i)
                self._event(i, "given_up", restarts=self.restarts[i])
                self.say(f"replica {i} on {r.url} exited with code {code}; not restarted: {self.restarts[i]} restart(s) "
                         f"done (FLEET_MAX_RESTARTS={self.max_restarts}); the router routes around it ({up} left); "
                         f"log {r.log_path}")
                continue
            self.restarts[i] += 1
            self.say(f"replica {i} on {r.url} exited with code {code}; restarting it (restart {self.restarts[i]} of "
                     f"at most {self.max_restarts}); the router routes around it meanwhile ({up} left); log {r.log_path}")
            t = threading.Thread(target=self._restart, args=(r, i in self._stuck), daemon=True, name=f"restart-replica{i}")
            self._stuck.discard(i)
            self._restarting[i] = t
            t.start()

    def _restart(self, r: ServerProcess, stuck: bool = False) -> None:
        if stuck:
            self._leave(r)
        else:
            r.stop()  # the dead group's leftovers (its temp folder, any child still up), and its log closed
        try:
            if self._stopping:
                return
            # Not under the lock: a start may wait for the GPU lock while a probe times (procs.flock).
            r.start()
            if self._stopping:  # stop() came during the start: its last pass over the replicas stops it too
                r.stop()
                return
            self._event(r.index, "restarting", restart=self.restarts[r.index])
            ready = r.wait_ready()
        except KitError as e:
            if self._stopping:
                return  # stop() ended it
            self._event(r.index, "failed", error=str(e).splitlines()[0][:300])
            self.say(f"replica {r.index}: restart {self.restarts[r.index]} failed: {str(e).splitlines()[0]}; log {r.log_path}")
            if r.alive():  # it outlived SIGKILL (procs.ServerProcess.stop): the next supervise starts another
                self._stuck.add(r.index)
                self.say(f"replica {r.index}: process {r.proc.pid} outlived SIGKILL; left to the OS, another is started")
            return
        self._event(r.index, "ready", ready_s=round(ready, 2))
        self.say(f"replica {r.index}: ready again on {r.url} after {ready:.1f} s (restart {self.restarts[r.index]}); "
                 f"the router takes it back at its next health check")

    def restarting(self) -> bool:
        return any(t.is_alive() for t in self._restarting.values())

    def watch(self, poll_s: float = 1.0) -> int:
        """Until the router exits: restarts each replica that dies (supervise). Returns the router's exit code."""
        while self.router.alive():
            self.supervise()
            time.sleep(poll_s)  # a poll interval, not a wait for readiness
        return self.router.proc.poll()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# -- Kubernetes: the router in front of the replicas (rendered by k8s.render) ---------------------
ROUTER_METRICS_PORT = 29000  # vllm-router's default Prometheus port


def router_k8s_args(selector: dict, port: int, policy: str, extra: list[str] = ()) -> list[str]:
    """The router's arguments in a pod: it finds the replicas itself (Kubernetes service discovery:
    pods matching `selector`, added when Ready, dropped when not), so HPA-added replicas join."""
    if policy not in POLICIES:
        raise KitError(f"unknown router policy {policy!r}; vllm-router's: {', '.join(POLICIES)}")
    return ["--host", "0.0.0.0", "--port", str(port), "--policy", policy, *extra,
            "--service-discovery", "--selector", *[f"{k}={v}" for k, v in selector.items()],
            "--service-discovery-port", str(port),
            # Only this namespace: a Role, not a ClusterRole, is enough ($(VAR) is expanded by Kubernetes).
            "--service-discovery-namespace", "$(POD_NAMESPACE)",
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(ROUTER_METRICS_PORT),
            *ROUTER_HEALTH]


def router_manifests(name: str, replica_labels: dict, base_labels: dict, port: int, image: str, policy: str,
                     namespace: str | None, uid: int, extra: list[str] = ()) -> list[dict]:
    """ServiceAccount + Role + RoleBinding (read pods: service discovery), the router's Deployment,
    and the front-door Service `name` (clients keep the name they used for one server)."""
    rname = f"{name[:63 - len('-router')].rstrip('-')}-router"
    labels = {**base_labels, "app.kubernetes.io/name": rname, "app.kubernetes.io/component": "router"}
    meta = {"name": rname, "labels": labels, **({"namespace": namespace} if namespace else {})}
    selector = {"app.kubernetes.io/name": replica_labels["app.kubernetes.io/name"]}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}
    subject = {"kind": "ServiceAccount", "name": rname, **({"namespace": namespace} if namespace else {})}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": rname},
               "subjects": [subject]}
    container = {
        "name": "router",
        "image": image,
        # The kit's image carries the pinned vllm-router beside vLLM; another image needs it on PATH.
        "command": ["vllm-router"],
        "args": router_k8s_args(selector, port, policy, extra),
        "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"}],
        # /readiness: 200 once at least one replica is healthy; /liveness: the process answers.
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 5,
                           "timeoutSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": 15,
                          "timeoutSeconds": 5, "failureThreshold": 4},
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": uid},
    }
    pod = {"metadata": {"labels": labels,
                        "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(ROUTER_METRICS_PORT),
                                        "prometheus.io/path": "/metrics"}},
           "spec": {"serviceAccountName": rname, "containers": [container]}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": rname}},
                           "template": pod}}
    front = {"apiVersion": "v1", "kind": "Service",
             "metadata": {**meta, "name": name},
             "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/name": rname},
                      "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}}
    return [account, role, binding, deployment, front]
