"""Kubernetes manifests for one variant's image: pure rendering, no cluster access, no I/O.

`render(variant, image)` returns plain dicts (validated in tests/test_k8s.py against the official
schemas shipped by the kubernetes-validate package):

  PersistentVolumeClaim  <name>-weights: laid out like the repo's weights/ folder
                         (<org>--<name>/<tag>/ and cache/<variant>/), filled once, mounted read-only
                         over the image's weights path (build the image with --weights mount)
  Deployment             <name>: the image's entrypoint (scripts.serve for KIT_VARIANT), one pod =
                         one vLLM server holding TP x DP GPUs; startup/readiness/liveness on /health
  Service                <name>-replicas: headless (no virtual IP): the replicas are reached one by
                         one, through the router, never balanced behind its back
  HorizontalPodAutoscaler <name>: scales on vLLM's queue length, a Pods metric; its target comes from the
                         variant's records (hpa_target), which the caller reads and passes in
  ServiceAccount, Role, RoleBinding <name>-router: the router may read pods in its namespace
  Deployment             <name>-router: vllm-router (scripts/kit/fleet.py), cache-aware by default,
                         finding the Ready replica pods by label (Kubernetes service discovery)
  Service                <name>: the front door, on the router (clients keep the one-server name)

The autoscaler needs a custom-metrics adapter: HPA reads `vllm_num_requests_waiting` from
custom.metrics.k8s.io, which nothing serves by default. With Prometheus scraping the pods
(annotations below) a prometheus-adapter rule maps the server's gauge to that name:

    - seriesQuery: 'vllm:num_requests_waiting{namespace!="",pod!=""}'
      resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
      name: {matches: "^vllm:num_requests_waiting$", as: "vllm_num_requests_waiting"}
      metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'

    python -m scripts.image k8s --variant qwen3-4b-bf16-tp2 --image kit:qwen3-4b-bf16-tp2
"""
from __future__ import annotations

import json
import re

# Where the kit lives inside the image: vLLM's compile-cache key contains the model path string,
# so the image keeps the absolute root the cache was baked under (see Dockerfile).
IMAGE_ROOT = "/opt/kit"
# The image's non-root user (Dockerfile `useradd --uid`); fsGroup makes the PVC readable to it.
IMAGE_UID = 10001
QUEUE_METRIC = "vllm_num_requests_waiting"
# The HPA's target without a record to derive it from (hpa_target): queued requests per pod.
WAITING_PER_POD = 4


def _levels(v, rec: dict) -> list[tuple[int, float | None, float | None, list]]:
    """(concurrency, TTFT p99 ms, TPOT p99 ms, the server's queue summaries) per level of `rec` where it
    measured `v` as it is now: a valid latency record's levels, or the side of a valid comparison that ran it."""
    p = rec["payload"]
    if not p.get("validity", {}).get("valid"):
        return []
    # Behind a router the gauges were summed over its replicas: the fleet's queue, not one pod's.
    one_pod = lambda side: len(side.get("metrics_urls") or [None]) == 1
    if rec["kind"] == "latency":
        return [(lv["concurrency"], lv["ttft_ms"]["p99"], lv["tpot_ms"]["p99"], lv.get("server_queue") or [])
                for lv in p["levels"]] if v.describes(rec) and one_pod(p["server"]) else []
    side = next((k for k, sd in p["sides"].items() if sd["variant"] == v.name and v.describes(sd) and one_pod(sd)), None)
    if side is None:
        return []
    rows = {(m["metric"], m["concurrency"]): m[side] for m in p["metrics"]}
    return [(c, rows.get(("ttft_p99_ms", c)), rows.get(("tpot_p99_ms", c)),
             [q["server_queue"] for q in p["passes"] if q["side"] == side and q["concurrency"] == c and q.get("server_queue")])
            for c in sorted({m["concurrency"] for m in p["metrics"]})]


def hpa_target(v, recs: list[tuple[str, dict]]) -> dict | None:
    """The HPA's waiting-requests target per pod, from the newest record of `v` whose levels kept the server's
    queue (vLLM's request gauges, polled while timing): the most requests that waited at the highest level that
    still met the record's SLO (every lower level meeting it too), at least 1. A pod queueing more than that on
    average is past the load it was measured to hold within the SLO, so the HPA adds one. recs: (path, record),
    any order. None when no record qualifies."""
    for path, rec in sorted(recs, key=lambda pr: pr[1]["provenance"]["utc"], reverse=True):
        levels = _levels(v, rec)
        if not levels or not all(qs for *_, qs in levels):
            continue
        slo = rec["payload"]["slo"]
        held = None
        for c, ttft, tpot, qs in sorted(levels):
            if ttft is None or ttft > slo["ttft_p99_ms"] or (tpot is not None and tpot > slo["tpot_p99_ms"]):
                break
            held = (c, qs)
        if held is None:
            continue
        c, qs = held
        kv = [q["kv_usage_max"] for q in qs if q.get("kv_usage_max") is not None]
        return {"waiting_per_pod": max(1, max(q["waiting_max"] for q in qs)), "record": str(path), "concurrency": c,
                "slo": slo, "kv_usage_max": max(kv) if kv else None}
    return None


def k8s_name(variant_name: str) -> str:
    """A DNS-1035 label from a variant name: dots become dashes, 63 characters at most."""
    name = re.sub(r"[^a-z0-9-]", "-", variant_name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = "v-" + name
    return name[:63].rstrip("-")


def gpu_count(variant) -> int:
    """GPUs one server needs: tensor parallel x data parallel (x pipeline parallel)."""
    n = 1
    for key in ("SERVE_TENSOR_PARALLEL_SIZE", "SERVE_DATA_PARALLEL_SIZE", "SERVE_PIPELINE_PARALLEL_SIZE"):
        if key in variant.config:
            n *= int(variant.config[key])
    return n


def in_image(path, root) -> str:
    """A host path under the repo root, as the image sees it (/opt/kit/...)."""
    return IMAGE_ROOT + "/" + str(path.relative_to(root))


def server_args(overrides: list[str] | tuple = ()) -> list[str]:
    """Arguments appended to the image's ENTRYPOINT: the same --set overrides the image was built with."""
    out = []
    for item in overrides:
        out += ["--set", item]
    return out


def render(variant, image: str, root, *, overrides=(), namespace: str | None = None, max_replicas: int = 4,
           waiting_per_pod: int = WAITING_PER_POD, pvc_size: str = "64Gi", storage_class: str | None = None,
           cache_on_pvc: bool = False, policy: str | None = None, router_image: str | None = None,
           standby: int = 0) -> list[dict]:
    """PVC, Deployment, Service and HPA for `variant` served from `image`, then the router in front.

    standby: a warm pool of that many standby pods (STANDBY=1: started, then asleep; scripts/kit/standby.py),
    a Deployment `<name>-standby` whose pods the router does not select (another app.kubernetes.io/name).
    To promote one: POST /wake_up to it, then label it app.kubernetes.io/name=<name>. The router finds it by
    that label, and the standby Deployment, having lost the pod, starts a new standby in its place.

    waiting_per_pod: target average of queued requests per pod before the HPA adds one.
    cache_on_pvc: also mount weights/cache/<variant> from the PVC (default: the cache baked into the image).
    policy, router_image: vllm-router's policy (default: the variant's FLEET_POLICY) and image (default: the
    kit's image, which carries it).
    """
    policy = variant["FLEET_POLICY"] if policy is None else policy
    name = k8s_name(variant.name)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "vllm-serving-kit",
              "kit/variant": k8s_name(variant.name)}
    meta = {"name": name, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    port = int(variant["PORT"])
    gpus = gpu_count(variant)
    weights_sub = str(variant.weights_dir.relative_to(root / "weights"))
    mounts = [{"name": "weights", "mountPath": in_image(variant.weights_dir, root), "subPath": weights_sub,
               "readOnly": True},
              {"name": "dshm", "mountPath": "/dev/shm"}]
    if cache_on_pvc:
        cache_sub = str(variant.cache_root.relative_to(root / "weights"))
        mounts.insert(1, {"name": "weights", "mountPath": in_image(variant.cache_root, root), "subPath": cache_sub})
    health = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5}
    # A cold start (no cache hit) may take up to READY_TIMEOUT_S; the startup probe holds off
    # liveness until then, so a slow compile is not killed and restarted forever.
    startup_period_s = 10
    container = {
        "name": "vllm",
        "image": image,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
        "startupProbe": {**health, "periodSeconds": startup_period_s,
                         "failureThreshold": -(-int(variant["READY_TIMEOUT_S"]) // startup_period_s)},
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**health, "periodSeconds": 15, "failureThreshold": 4},
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": IMAGE_UID},
    }
    if overrides:
        container["args"] = server_args(overrides)
    pod = {
        "metadata": {"labels": labels,
                     "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                                     "prometheus.io/path": "/metrics"}},
        "spec": {
            "containers": [container],
            # scripts.serve stops the vLLM process group with a 30 s SIGTERM grace.
            "terminationGracePeriodSeconds": 60,
            "securityContext": {"fsGroup": IMAGE_UID},
            "volumes": [
                {"name": "weights", "persistentVolumeClaim": {"claimName": f"{name}-weights", "readOnly": not cache_on_pvc}},
                # NCCL (TP/DP > 1) exchanges through /dev/shm; the container default is 64 MiB.
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
            ],
        },
    }
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                           "template": pod}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {**meta, "name": f"{name[:54].rstrip('-')}-replicas"},
               "spec": {"type": "ClusterIP", "clusterIP": "None", "selector": {"app.kubernetes.io/name": name},
                        "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}}
    pvc_spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": pvc_size}}}
    if storage_class:
        pvc_spec["storageClassName"] = storage_class
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {**meta, "name": f"{name}-weights"}, "spec": pvc_spec}
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta,
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                    "minReplicas": 1, "maxReplicas": max_replicas,
                    "metrics": [{"type": "Pods", "pods": {"metric": {"name": QUEUE_METRIC},
                                                          "target": {"type": "AverageValue",
                                                                     "averageValue": str(waiting_per_pod)}}}],
                    # A new pod costs a server start (about a minute warm); scale down slowly.
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}}}
    pool = []
    if standby:
        sname = f"{name[:63 - len('-standby')].rstrip('-')}-standby"
        slabels = {**labels, "app.kubernetes.io/name": sname, "kit/role": "standby"}
        spod = json.loads(json.dumps(pod))
        spod["metadata"]["labels"] = slabels
        spod["spec"]["containers"][0]["args"] = server_args([*overrides, "STANDBY=1"])
        pool.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "name": sname, "labels": slabels},
                     "spec": {"replicas": standby, "selector": {"matchLabels": {"app.kubernetes.io/name": sname}},
                              "template": spod}})
    # A JSON round trip: plain, unshared dicts (YAML would otherwise emit anchors for shared ones).
    from .fleet import policy_args, router_manifests
    router = router_manifests(name, labels, {k: v for k, v in labels.items() if k != "app.kubernetes.io/name"}, port,
                              router_image or image, policy, namespace, IMAGE_UID, policy_args(variant, policy))
    return json.loads(json.dumps([pvc, deployment, service, hpa, *pool, *router]))


def target_text(waiting_per_pod: int, derived: dict | None, given: bool) -> str:
    """Where the HPA's target came from, for the manifests' comment."""
    if given:
        return f"{waiting_per_pod} waiting requests per pod, as given (--waiting-per-pod)"
    if derived is None:
        return (f"{waiting_per_pod} waiting requests per pod, the default: no record of this variant kept the "
                "server's queue at a level that met its SLO (make eval-latency or make compare writes one)")
    kv = f", KV cache up to {derived['kv_usage_max']:.0%} full" if derived["kv_usage_max"] is not None else ""
    return (f"{waiting_per_pod} waiting requests per pod: the most that waited at c={derived['concurrency']}, the "
            f"highest level of {derived['record']} that met its SLO (TTFT p99 <= {derived['slo']['ttft_p99_ms']:g} ms, "
            f"TPOT p99 <= {derived['slo']['tpot_p99_ms']:g} ms){kv}")


def header(variant, gpus: int, target: str | None = None, standby: int = 0) -> str:
    """YAML comment block on top of the rendered manifests (the autoscaler's prerequisite and target)."""
    name = k8s_name(variant.name)
    pool = (f"# Warm pool: {standby} standby pod(s) ({name}-standby, asleep after one request; the router does not\n"
            f"# select them). Promote one: POST /wake_up to it (under a second on an H100), then\n"
            f"#   kubectl label pod POD app.kubernetes.io/name={name} --overwrite\n"
            f"# The router adds it; the standby Deployment starts a new standby in its place. Unwoken, a promoted\n"
            f"# pod wakes on its first request (make serve's wake-on-request door), at that request's cost.\n"
            + ("# The standbys share the image's baked cache (STANDBY_CACHE=variant: sleep mode left out of vLLM's\n"
               "# compile key by the kit), so each starts as a warm start does before it sleeps.\n"
               if variant["STANDBY_CACHE"] == "variant" else
               "# Each standby compiles cold (minutes) before it sleeps: sleep mode is in vLLM's compile key and the\n"
               "# image holds the variant's bake. --set STANDBY_CACHE=variant shares it (docs/compile-cache.md).\n")
            ) if standby else ""
    return (f"# Kubernetes manifests for {variant.name} ({gpus} GPU(s) per pod), rendered by `make k8s`.\n"
            f"# The HPA scales on the Pods metric {QUEUE_METRIC}: it needs a custom-metrics adapter\n"
            "# (e.g. prometheus-adapter mapping vllm:num_requests_waiting; see scripts/kit/k8s.py).\n"
            + (f"# HPA target: {target}.\n" if target else "") +
            "# Fill the PVC like the repo's weights/ folder (weights/<org>--<name>/<tag>/) before applying.\n"
            f"# Clients: http://{k8s_name(variant.name)}:{variant['PORT']} is vllm-router, in front of the replicas.\n"
            + pool)
