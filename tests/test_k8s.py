"""Kubernetes manifests (scripts/kit/k8s.py): every variant's render validates against the official
Kubernetes JSON schemas (strict: unknown fields are errors), shipped offline by the
kubernetes-validate package, and carries the scale-out facts (GPUs = TP x DP, /health probes,
queue-length HPA, the served paths under /opt/kit).
"""
from __future__ import annotations

import copy

import pytest
import yaml

from scripts import image
from scripts.kit import errors as k8s_errors
from scripts.kit import k8s
from scripts.kit.paths import ROOT
from scripts.kit.variant import discover, load

try:
    import kubernetes_validate as kv
    import kubernetes_validate.utils
except ImportError:
    pytest.fail("kubernetes-validate is not installed: pin kubernetes-validate==1.37.0 in the test dependencies",
                pytrace=False)
# The oldest release we claim (autoscaling/v2 and startupProbe are GA long before) and the newest the package ships.
K8S_VERSIONS = ("1.29", kv.utils.latest_version())


def validate(doc: dict) -> None:
    for version in K8S_VERSIONS:
        kv.validate(doc, version, strict=True)


def by_kind(docs: list[dict]) -> dict[str, dict]:
    """The first document of each kind: the replicas' Deployment and Service come before the router's."""
    out = {}
    for d in docs:
        out.setdefault(d["kind"], d)
    return out


KINDS = ["PersistentVolumeClaim", "Deployment", "Service", "HorizontalPodAutoscaler",
         "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"]


@pytest.mark.parametrize("name", discover())
def test_every_variant_renders_valid_manifests(name):
    docs = k8s.render(load(name), f"registry.example/kit:{name}", ROOT)
    assert [d["kind"] for d in docs] == KINDS
    for d in docs:
        validate(d)


def test_the_validator_rejects_broken_manifests():
    dep = by_kind(k8s.render(load("qwen3-4b-bf16"), "kit:x", ROOT))["Deployment"]
    typo = copy.deepcopy(dep)
    typo["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    wrong_type = copy.deepcopy(dep)
    wrong_type["spec"]["replicas"] = "one"
    for bad in (typo, wrong_type):
        with pytest.raises(kv.ValidationError):
            validate(bad)


@pytest.mark.parametrize("name,gpus", [("qwen3-4b-bf16", 1), ("qwen3-4b-bf16-tp2", 2), ("qwen3-4b-bf16-dp2", 2)])
def test_gpu_request_is_tp_times_dp(name, gpus):
    v = load(name)
    assert k8s.gpu_count(v) == gpus
    c = by_kind(k8s.render(v, "kit:x", ROOT))["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus == c["resources"]["requests"]["nvidia.com/gpu"]
    assert k8s.gpu_count(load("qwen3-4b-bf16", ["SERVE_TENSOR_PARALLEL_SIZE=2", "SERVE_DATA_PARALLEL_SIZE=2"])) == 4


def test_probes_on_health_and_startup_covers_a_cold_start():
    v = load("qwen3.5-4b-bf16")
    pod = by_kind(k8s.render(v, "kit:x", ROOT))["Deployment"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    s = c["startupProbe"]
    assert s["periodSeconds"] * s["failureThreshold"] >= v["READY_TIMEOUT_S"]
    assert c["ports"][0]["containerPort"] == v["PORT"]
    assert c["securityContext"]["runAsNonRoot"] and c["securityContext"]["runAsUser"] == k8s.IMAGE_UID


def test_hpa_scales_on_the_queue_metric():
    hpa = by_kind(k8s.render(load("qwen3-4b-bf16"), "kit:x", ROOT, max_replicas=6, waiting_per_pod=3))["HorizontalPodAutoscaler"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == k8s.QUEUE_METRIC == "vllm_num_requests_waiting"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "3"}
    assert hpa["spec"]["maxReplicas"] == 6 and hpa["spec"]["scaleTargetRef"]["name"] == "qwen3-4b-bf16"
    assert "metrics adapter" in k8s.header(load("qwen3-4b-bf16"), 1).replace("custom-metrics adapter", "metrics adapter")
    assert "vllm:num_requests_waiting" in k8s.__doc__ and "prometheus-adapter" in k8s.__doc__


def test_pvc_mounts_weights_at_the_served_path_and_cache_optionally():
    v = load("qwen3-4b-bf16-tp2", ["WEIGHTS=dummy"])
    docs = by_kind(k8s.render(v, "kit:x", ROOT, overrides=["WEIGHTS=dummy"]))
    c = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    served = image.in_image(v.weights_dir)
    assert served == "/opt/kit/weights/Qwen--Qwen3-4B/dummy-bf16"
    assert mounts[served]["subPath"] == "Qwen--Qwen3-4B/dummy-bf16" and mounts[served]["readOnly"]
    assert image.in_image(v.cache_root) not in mounts, "default: the cache baked into the image"
    assert "/dev/shm" in mounts
    assert c["args"] == ["--set", "WEIGHTS=dummy"]
    assert docs["PersistentVolumeClaim"]["metadata"]["name"] == \
        docs["Deployment"]["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    with_cache = by_kind(k8s.render(v, "kit:x", ROOT, cache_on_pvc=True))["Deployment"]
    paths = [m["mountPath"] for m in with_cache["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]]
    assert "/opt/kit/weights/cache/qwen3-4b-bf16-tp2" in paths
    validate(with_cache)


@pytest.mark.parametrize("name", ["qwen3.5-4b-awq-seq8-mtp4-fp8kv", "tiny", "x.y_z", "9lives"])
def test_k8s_names_are_dns_labels(name):
    import re
    n = k8s.k8s_name(name)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n) and len(n) <= 63


def test_cli_stdout_and_out_dir(tmp_path, capsys):
    assert image.main(["k8s", "--variant", "qwen3-4b-bf16-dp2", "--image", "reg/kit:dp2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Kubernetes manifests for qwen3-4b-bf16-dp2 (2 GPU(s) per pod)")
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["kind"] for d in docs] == KINDS
    for d in docs:
        validate(d)
    assert image.main(["k8s", "--variant", "qwen3-4b-bf16-dp2", "--out", str(tmp_path / "k")]) == 0
    files = sorted(p.name for p in (tmp_path / "k").iterdir())
    assert files == ["00-persistentvolumeclaim.yaml", "01-deployment.yaml", "02-service.yaml",
                     "03-horizontalpodautoscaler.yaml", "04-serviceaccount.yaml", "05-role.yaml",
                     "06-rolebinding.yaml", "07-deployment.yaml", "08-service.yaml"]
    assert yaml.safe_load((tmp_path / "k" / "01-deployment.yaml").read_text())["spec"]["template"]["spec"][
        "containers"][0]["image"] == "vllm-serving-kit:qwen3-4b-bf16-dp2"


def test_router_in_front_finds_the_replicas_by_label():
    """vllm-router (scripts/kit/fleet.py) is the front door: its arguments parse with vllm-router's own
    parser, its service discovery selects exactly the replica pods, in its namespace, with RBAC to
    read them; the replicas' Service is headless and the variant's Service name is the router's."""
    from vllm_router.launch_router import parse_router_args
    v = load("qwen3-4b-bf16")
    docs = k8s.render(v, "reg/kit:x", ROOT, namespace="serving", policy="round_robin")
    replicas, headless, _hpa, account, role, binding, router, front = docs[1:]
    assert headless["spec"]["clusterIP"] == "None" and headless["metadata"]["name"] == "qwen3-4b-bf16-replicas"
    assert headless["spec"]["selector"] == replicas["spec"]["selector"]["matchLabels"]
    pod = router["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["image"] == "reg/kit:x" and c["command"] == ["vllm-router"]
    assert "nvidia.com/gpu" not in str(c["resources"])
    args = parse_router_args(c["args"])
    assert args.policy == "round_robin" and args.service_discovery and args.port == v["PORT"] == args.service_discovery_port
    replica_labels = replicas["spec"]["template"]["metadata"]["labels"]
    assert args.selector and all(replica_labels.get(k) == val for k, val in args.selector.items())
    assert not all(pod["metadata"]["labels"].get(k) == val for k, val in args.selector.items()), "router selects itself"
    assert args.service_discovery_namespace == "$(POD_NAMESPACE)"
    assert c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert args.health_check_interval_secs <= 5 and args.cb_failure_threshold <= 3
    assert {p["path"] for p in (c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"])} == {"/readiness", "/liveness"}
    assert front["metadata"]["name"] == "qwen3-4b-bf16" and front["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
    assert pod["spec"]["serviceAccountName"] == account["metadata"]["name"] == binding["subjects"][0]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and binding["subjects"][0]["namespace"] == "serving"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    for d in docs:
        assert d["metadata"]["namespace"] == "serving"
        validate(d)
    other = k8s.render(v, "reg/kit:x", ROOT, router_image="reg/router:1")[7]
    assert other["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/router:1"
    with pytest.raises(k8s_errors.KitError, match="unknown router policy"):
        k8s.render(v, "reg/kit:x", ROOT, policy="fastest")


def test_hpa_target_comes_from_the_newest_record_that_kept_the_queue(capsys):
    """Issue 31 item 4: make k8s derives the waiting-requests target from the variant's records and names the
    one it used; the manifests still validate. Checked against the committed records themselves: the level named
    met the record's SLO (and every lower one did), the next one up did not, and the target is the most requests
    that waited there."""
    import json
    from scripts.kit.record import records
    v = load("qwen3-4b-bf16")
    recs = [(str(p.relative_to(ROOT)), r) for kind in ("latency", "comparison") for p, r in records(kind=kind)]
    got = k8s.hpa_target(v, recs)
    assert got is not None
    rec = json.loads((ROOT / got["record"]).read_text())
    levels = k8s._levels(v, rec)
    slo = rec["payload"]["slo"]
    meets = [c for c, ttft, tpot, _ in levels if ttft <= slo["ttft_p99_ms"] and (tpot is None or tpot <= slo["tpot_p99_ms"])]
    assert got["concurrency"] in meets and all(c in meets for c, *_ in levels if c < got["concurrency"])
    assert all(c not in meets for c, *_ in levels if c == min((x for x, *_ in levels if x > got["concurrency"]), default=0))
    queues = next(qs for c, _, _, qs in levels if c == got["concurrency"])
    assert got["waiting_per_pod"] == max(1, max(q["waiting_max"] for q in queues))
    # Only records that kept the queue, of this variant as it is now, measured on one pod, count.
    newer = [(p, r) for p, r in recs if r["provenance"]["utc"] > rec["provenance"]["utc"]]
    assert all(k8s.hpa_target(v, [(p, r)]) is None for p, r in newer)
    fleet_side = copy.deepcopy(rec)
    for sd in fleet_side["payload"]["sides"].values():
        sd["metrics_urls"] = ["http://a:1", "http://a:2"]  # a router's replicas, summed: not one pod's queue
    assert k8s._levels(v, fleet_side) == []
    assert k8s.hpa_target(v, []) is None

    assert image.main(["k8s", "--variant", "qwen3-4b-bf16"]) == 0
    out = capsys.readouterr().out
    assert f"# HPA target: {got['waiting_per_pod']} waiting requests per pod: the most that waited at " \
           f"c={got['concurrency']}, the highest level of {got['record']} that met its SLO" in out
    docs = [d for d in yaml.safe_load_all(out) if d]
    hpa = by_kind(docs)["HorizontalPodAutoscaler"]
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == str(got["waiting_per_pod"])
    for d in docs:
        validate(d)
    assert image.main(["k8s", "--variant", "qwen3-4b-bf16", "--waiting-per-pod", "7"]) == 0
    assert "# HPA target: 7 waiting requests per pod, as given (--waiting-per-pod)." in capsys.readouterr().out


def test_a_warm_pool_of_standbys_is_a_deployment_the_router_does_not_select(capsys):
    """Issue 32: `make k8s STANDBY=N` adds N standby pods (STANDBY=1 appended to the server's --set overrides),
    labelled so that the router's selector misses them until one is promoted by relabelling."""
    from vllm_router.launch_router import parse_router_args
    v = load("qwen3-4b-bf16")
    docs = k8s.render(v, "reg/kit:x", ROOT, overrides=["PORT=8000"], standby=2)
    assert [d["kind"] for d in docs] == KINDS[:4] + ["Deployment"] + KINDS[4:]
    replicas, pool, router = docs[1], docs[4], docs[8]
    assert pool["metadata"]["name"] == "qwen3-4b-bf16-standby" and pool["spec"]["replicas"] == 2
    spod = pool["spec"]["template"]
    assert spod["spec"]["containers"][0]["args"] == ["--set", "PORT=8000", "--set", "STANDBY=1"]
    assert replicas["spec"]["template"]["spec"]["containers"][0]["args"] == ["--set", "PORT=8000"]
    selector = parse_router_args(router["spec"]["template"]["spec"]["containers"][0]["args"]).selector
    assert not all(spod["metadata"]["labels"].get(k) == val for k, val in selector.items()), "router selects standbys"
    promoted = {**spod["metadata"]["labels"], "app.kubernetes.io/name": "qwen3-4b-bf16"}
    assert all(promoted.get(k) == val for k, val in selector.items())  # the header's kubectl label makes it a replica
    for d in docs:
        validate(d)
    assert "Warm pool: 2 standby pod(s)" in k8s.header(v, 1, None, 2) and "Warm pool" not in k8s.header(v, 1)
    # whether a standby pod finds the image's baked cache (STANDBY_CACHE) is said where the pool is set up
    assert "Each standby compiles cold" in k8s.header(v, 1, None, 2)
    shared = k8s.header(load("qwen3-4b-bf16", ["STANDBY_CACHE=variant"]), 1, None, 2)
    assert "share the image's baked cache" in shared and "compiles cold" not in shared
