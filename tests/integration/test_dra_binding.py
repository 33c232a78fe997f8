"""The ``dra`` binding end to end: GpuPodOperator's ResourceClaim, as the emulator stores it.

NVIDIA's DRA driver publishes each GPU and MIG device with a ``uuid`` attribute; the claim selects
the granted ones with a CEL selector, the pod names it in ``spec.resourceClaims``, and the pod owns
it, so Kubernetes (here the emulator's garbage collector) deletes it with the pod.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client import CustomObjectsApi

from airflow_gpupool.agent.collect import NvmlCollector
from airflow_gpupool.inventory.sync import core_v1_api
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.operators.pod.pod_spec import RESOURCE_CLAIM_ANNOTATION
from airflow_gpupool.testing import KubernetesEmulatorServer
from airflow_gpupool.testing.fake_nvml import FakeNvml, node_spec

DRA = ("resource.k8s.io", "v1", "default", "resourceclaims")


def report(ledger: Ledger, node: str, gpus: int) -> dict[str, Any]:
    """Have the node agent (on the fake NVML) report the node's real UUIDs; return its spec."""
    spec = node_spec(node, gpus)
    collector = NvmlCollector(FakeNvml(spec), node)
    collector.open()
    ledger.record_report(collector.sample(30.0))
    return spec


def claims(k8s: KubernetesEmulatorServer) -> list[dict[str, Any]]:
    api = CustomObjectsApi(core_v1_api(k8s.kubeconfig_path).api_client)
    return list(api.list_namespaced_custom_object(*DRA)["items"])


def test_dra_claims_the_granted_gpus_by_uuid_and_goes_with_the_pod(
    run_dag: Any, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    spec = report(gpu_ledger, "gpu-a100", 4)
    dag_run = run_dag("gpu_bind_dra")

    assert str(dag_run.state) == "success"
    (pod,) = k8s.created_pods()
    (reservation,) = gpu_ledger.history()
    grant = reservation.grant
    assert grant is not None and grant.gpu_uuids_verified
    assert set(grant.gpu_uuids) <= {g["uuid"] for g in spec["gpus"]}
    name = f"{reservation.id}-gpu"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": name}]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["claims"] == [{"name": "gpu"}]
    assert "nvidia.com/gpu" not in (container["resources"].get("limits") or {})  # the claim, not the plugin
    created = [r for r in k8s.requests if r.method == "POST" and r.path.endswith("/resourceclaims")]
    (body,) = [r.body for r in created]
    assert body["metadata"]["name"] == name
    (request,) = body["spec"]["devices"]["requests"]
    uuids = json.dumps(list(grant.gpu_uuids))
    assert request["exactly"] == {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 2,
        "selectors": [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid in {uuids}'}}],
    }
    assert json.loads(pod["metadata"]["annotations"][RESOURCE_CLAIM_ANNOTATION]) == body["spec"]
    assert claims(k8s) == []  # KubernetesPodOperator deleted the pod: its claim went with it
    assert gpu_ledger.snapshot().grants == ()


def test_dra_mig_claim_is_stored_owned_by_the_pod_until_the_pod_is_deleted(
    run_dag: Any, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    report(gpu_ledger, "gpu-mig", 1)
    dag_run = run_dag("gpu_bind_dra_mig_kept")

    assert str(dag_run.state) == "success"
    (reservation,) = gpu_ledger.history()
    grant = reservation.grant
    assert grant is not None and grant.mig_profile == "1g.10gb"
    (claim,) = claims(k8s)
    pod = k8s.pod_history(k8s.created_pods()[0]["metadata"]["name"])[-1]
    assert claim["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    ]
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "mig.nvidia.com"
    assert request["exactly"]["selectors"] == [
        {
            "cel": {
                "expression": f'device.attributes["gpu.nvidia.com"].parentUUID == "{grant.gpu_uuids[0]}" && '
                'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
            }
        }
    ]
    core_v1_api(k8s.kubeconfig_path).delete_namespaced_pod(pod["metadata"]["name"], "default")
    k8s.wait_for_pod_gone(pod["metadata"]["name"])  # the DELETE answers while the pod terminates
    assert claims(k8s) == []  # deleted with its owner
