"""The executor hook: which pods it gates, with what request, binding and identity (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import models as k8s

from airflow_gpupool.executor_hook import REFUSED, compose, decide, identity_from_pod, pod_mutation_hook
from airflow_gpupool.labels import (
    BINDING_ANNOTATION,
    DAG_ID_ANNOTATION,
    MAP_INDEX_ANNOTATION,
    PRIORITY_KEY,
    REQUEST_ANNOTATION,
    RUN_ID_ANNOTATION,
    SCHEDULING_GATE,
    TASK_ID_ANNOTATION,
    TEAM_KEY,
    TRY_NUMBER_ANNOTATION,
)

KPO_LABELS = {
    "dag_id": "d",
    "task_id": "t",
    "run_id": "manual__x",
    "try_number": "2",
    "kubernetes_pod_operator": "True",
}


def pod(
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    containers: int = 1,
) -> dict[str, Any]:
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    return {
        "metadata": {"name": "p", "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"containers": [{"name": f"c{i}", "resources": resources} for i in range(containers)]},
    }


def request_of(decision_annotations: Any) -> dict[str, Any]:
    return dict(json.loads(decision_annotations[REQUEST_ANNOTATION]))


UNTOUCHED = [
    pytest.param(pod(), id="no resources"),
    pytest.param(pod(limits={"cpu": "2", "memory": "4Gi"}), id="cpu only"),
    pytest.param(pod(limits={"nvidia.com/gpu": 0}), id="zero gpus"),
    pytest.param(
        pod(limits={"nvidia.com/gpu": 1}, labels={"gpupool.io/reservation-id": "gp-1"}),
        id="GpuPodOperator's pod (label)",
    ),
    pytest.param(
        pod(limits={"nvidia.com/gpu": 1}, annotations={"gpupool.io/reservation-id": "gp-1"}),
        id="GpuPodOperator's pod (annotation)",
    ),
]


@pytest.mark.parametrize("p", UNTOUCHED)
def test_untouched(p: dict[str, Any]) -> None:
    assert decide(p).gate is False
    assert decide(p).annotations == {}


GATED = [
    # (pod, binding, the request's expected fields)
    pytest.param(pod(limits={"nvidia.com/gpu": 1}), "whole", {"gpus": 1, "cpu_milli": 0}, id="one gpu"),
    pytest.param(
        pod(limits={"nvidia.com/gpu": "2"}, requests={"cpu": "500m", "memory": "2Gi"}),
        "whole",
        {"gpus": 2, "cpu_milli": 500, "memory_mib": 2048},
        id="two gpus with cpu and memory",
    ),
    pytest.param(
        pod(requests={"nvidia.com/gpu": 1, "cpu": 1}, containers=2),
        "whole",
        {"gpus": 2, "cpu_milli": 2000},
        id="summed over containers",
    ),
    pytest.param(
        pod(limits={"nvidia.com/mig-1g.10gb": 1}), "mig", {"mig_profile": "1g.10gb", "gpus": 0}, id="mig"
    ),
    pytest.param(
        pod(
            limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000},
            annotations={REQUEST_ANNOTATION: '{"gpu_milli": 500, "gpu_memory_mib": 8000}'},
        ),
        "hami",
        {"gpus": 1, "gpu_milli": 500, "gpu_memory_mib": 8000},
        id="fraction shared by HAMi",
    ),
    pytest.param(
        pod(limits={"nvidia.com/gpu": 1}, labels={TEAM_KEY: "vision", PRIORITY_KEY: "5"}),
        "whole",
        {"team": "vision", "priority": 5},
        id="team and priority from labels",
    ),
    pytest.param(
        pod(limits={"nvidia.com/gpu": 1}, annotations={TEAM_KEY: "nlp", PRIORITY_KEY: "-2"}),
        "whole",
        {"team": "nlp", "priority": -2},
        id="team and priority from annotations",
    ),
    pytest.param(
        pod(limits={"nvidia.com/gpu": 1}, annotations={REQUEST_ANNOTATION: '{"gpu_models": ["H100"]}'}),
        "whole",
        {"gpus": 1, "gpu_models": ["H100"]},
        id="annotation narrows the model",
    ),
]


@pytest.mark.parametrize(("p", "binding", "fields"), GATED)
def test_gated(p: dict[str, Any], binding: str, fields: dict[str, Any]) -> None:
    decision = decide(p)
    assert decision.gate is True
    assert decision.annotations[BINDING_ANNOTATION] == binding
    request = request_of(decision.annotations)
    assert {k: request[k] for k in fields} == fields
    assert decision.annotations[TEAM_KEY] == request["team"]


REFUSED_CASES = [
    pytest.param(
        pod(annotations={REQUEST_ANNOTATION: '{"gpu_milli": 250}'}), "gpu_milli", id="fraction, no gpu"
    ),
    pytest.param(
        pod(limits={"nvidia.com/gpu": 1}, annotations={REQUEST_ANNOTATION: '{"gpu_milli": 250}'}),
        "gpu_milli",
        id="fraction of a device-plugin gpu",
    ),
    pytest.param(
        pod(limits={"nvidia.com/gpu": 1}, annotations={REQUEST_ANNOTATION: '{"gpus": 2}'}),
        "gpus",
        id="annotation contradicts the limit",
    ),
    pytest.param(
        pod(
            limits={"nvidia.com/gpu": 1},
            annotations={REQUEST_ANNOTATION: '{"mig_profile": "1g.10gb", "gpus": 0}'},
        ),
        "mig_profile",
        id="mig asked, whole gpu in limits",
    ),
    pytest.param(pod(annotations={REQUEST_ANNOTATION: "half a gpu"}), REQUEST_ANNOTATION, id="not JSON"),
    pytest.param(pod(annotations={REQUEST_ANNOTATION: '{"gpu_mili": 5}'}), "request", id="unknown key"),
    pytest.param(
        pod(limits={"nvidia.com/gpu": 1}, labels={PRIORITY_KEY: "high"}), PRIORITY_KEY, id="bad priority"
    ),
    pytest.param(pod(limits={"nvidia.com/gpu": "lots"}), "quantity", id="bad quantity"),
]


@pytest.mark.parametrize(("p", "named"), REFUSED_CASES)
def test_refused_pods_stay_gated_with_the_reason(p: dict[str, Any], named: str) -> None:
    decision = decide(p)
    assert decision.gate is True  # never let it bypass the ledger
    binding = decision.annotations[BINDING_ANNOTATION]
    assert binding.startswith(f"{REFUSED}: ")
    assert named in binding
    assert REQUEST_ANNOTATION not in decision.annotations


class FakeTi:
    dag_id, task_id, run_id, map_index, try_number = "dag.x", "t", "manual__2026-12-01T12:00:00+00:00", 3, 2


IDENTITIES = [
    pytest.param(pod(labels=KPO_LABELS), None, ("d", "t", "manual__x", -1, 2), id="KPO labels"),
    pytest.param(
        pod(labels={**KPO_LABELS, "map_index": "4"}), None, ("d", "t", "manual__x", 4, 2), id="mapped KPO"
    ),
    pytest.param(
        pod(
            labels={"dag_id": "d", "task_id": "t", "run_id": "safe-label", "try_number": "1"},
            annotations={
                "dag_id": "d",
                "task_id": "t",
                "run_id": "raw:run/1",
                "try_number": "1",
                "map_index": "0",
            },
        ),
        None,
        ("d", "t", "raw:run/1", 0, 1),
        id="KubernetesExecutor annotations beat labels",
    ),
    pytest.param(
        pod(labels={**KPO_LABELS, "task_id": "t", "run_id": "manual__2026-12-01T120000-0000-abc"}),
        {"ti": FakeTi()},
        ("dag.x", "t", "manual__2026-12-01T12:00:00+00:00", 3, 2),
        id="the running task's context beats sanitized labels",
    ),
    pytest.param(
        pod(labels={**KPO_LABELS, "task_id": "other"}),
        {"ti": FakeTi()},
        ("d", "other", "manual__x", -1, 2),
        id="a context of another task is ignored",
    ),
    pytest.param(pod(labels={"dag_id": "d"}), None, None, id="no identity"),
]


@pytest.mark.parametrize(("p", "context", "expected"), IDENTITIES)
def test_identity(p: dict[str, Any], context: Any, expected: tuple[Any, ...] | None) -> None:
    who = identity_from_pod(p, context)
    got = None if who is None else (who.dag_id, who.task_id, who.run_id, who.map_index, who.try_number)
    assert got == expected


def test_identity_annotations_written() -> None:
    annotations = decide(
        pod(limits={"nvidia.com/gpu": 1}, labels={**KPO_LABELS, "map_index": "1"})
    ).annotations
    assert {k: annotations[k] for k in (DAG_ID_ANNOTATION, TASK_ID_ANNOTATION, RUN_ID_ANNOTATION)} == {
        DAG_ID_ANNOTATION: "d",
        TASK_ID_ANNOTATION: "t",
        RUN_ID_ANNOTATION: "manual__x",
    }
    assert (annotations[TRY_NUMBER_ANNOTATION], annotations[MAP_INDEX_ANNOTATION]) == ("2", "1")


def v1pod(limits: dict[str, str] | None, gates: list[str] = ()) -> k8s.V1Pod:  # type: ignore[assignment]
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", labels=dict(KPO_LABELS), annotations={"keep": "me"}),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="base", resources=k8s.V1ResourceRequirements(limits=limits))],
            scheduling_gates=[k8s.V1PodSchedulingGate(name=g) for g in gates] or None,
        ),
    )


def test_hook_gates_a_v1pod_in_place_once() -> None:
    p = v1pod({"nvidia.com/gpu": "1"}, gates=["other.io/gate"])
    pod_mutation_hook(p)
    pod_mutation_hook(p)  # idempotent: Airflow may apply it twice (a pod template then KPO)
    assert [g.name for g in p.spec.scheduling_gates] == ["other.io/gate", SCHEDULING_GATE]
    assert p.metadata.annotations["keep"] == "me"
    assert p.metadata.annotations[BINDING_ANNOTATION] == "whole"


def test_hook_leaves_a_cpu_pod_alone() -> None:
    p = v1pod({"cpu": "1"})
    before = p.to_dict()
    pod_mutation_hook(p)
    assert p.to_dict() == before


def test_compose_runs_in_order() -> None:
    def team_hook(p: k8s.V1Pod) -> None:
        p.spec.containers[0].resources = k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"})

    p = v1pod(None)
    compose(team_hook, pod_mutation_hook)(p)
    assert [g.name for g in p.spec.scheduling_gates] == [SCHEDULING_GATE]
    q = v1pod(None)
    compose(pod_mutation_hook, team_hook)(q)  # ours first cannot see the team's GPUs
    assert q.spec.scheduling_gates is None


# -- where the pod can be scheduled becomes where the ledger may place it -------------------------

A100, H100, T4 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Tesla-T4"
PRODUCT = "nvidia.com/gpu.product"
NODE_POOL = "cloud.google.com/gke-nodepool"


def placed(
    selector: dict[str, str] | None = None,
    required: list[dict[str, Any]] | None = None,
    preferred: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    p = pod(limits={"nvidia.com/gpu": 1}, annotations=annotations)
    if selector:
        p["spec"]["nodeSelector"] = selector
    affinity: dict[str, Any] = {}
    if required is not None:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": required}
    if preferred is not None:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    if affinity:
        p["spec"]["affinity"] = {"nodeAffinity": affinity}
    return p


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


PLACEMENTS = [
    pytest.param(placed({PRODUCT: A100}), {"gpu_models": [A100]}, id="selector on the GPU product"),
    pytest.param(placed({NODE_POOL: "a100"}), {"node_labels": {NODE_POOL: "a100"}}, id="selector on a pool"),
    pytest.param(
        placed(
            required=[{"matchExpressions": [expr(PRODUCT, "In", A100, H100), expr(NODE_POOL, "In", "p")]}]
        ),
        {"gpu_models": sorted([A100, H100]), "node_labels": {NODE_POOL: "p"}},
        id="affinity: models and a pool",
    ),
    pytest.param(
        placed({PRODUCT: A100}, required=[{"matchExpressions": [expr(PRODUCT, "In", A100, H100)]}]),
        {"gpu_models": [A100]},
        id="selector narrows the affinity's models",
    ),
    pytest.param(
        placed(preferred=[{"weight": 5, "preference": {"matchExpressions": [expr("zone", "In", "a")]}}]),
        {"gpu_models": [], "prefer_node_labels": {"zone": "a"}},
        id="preferred term becomes a preference",
    ),
    pytest.param(
        placed(preferred=[{"weight": 5, "preference": {"matchExpressions": [expr("zone", "NotIn", "a")]}}]),
        {"gpu_models": [], "node_labels": {}, "prefer_node_labels": {}},
        id="other preferences are soft: ignored",
    ),
    pytest.param(
        placed({PRODUCT: A100}, annotations={REQUEST_ANNOTATION: json.dumps({"gpu_models": [A100, H100]})}),
        {"gpu_models": [A100]},
        id="annotation's models narrowed by the selector",
    ),
]


@pytest.mark.parametrize(("p", "fields"), PLACEMENTS)
def test_node_selection_becomes_the_request(p: dict[str, Any], fields: dict[str, Any]) -> None:
    decision = decide(p)
    assert decision.annotations[BINDING_ANNOTATION] == "whole"
    request = request_of(decision.annotations)
    for key, value in fields.items():
        assert request[key] == value, key


UNPLACEABLE = [
    pytest.param(
        placed(required=[{"matchExpressions": [expr("zone", "In", "a")]}, {"matchExpressions": []}]),
        "nodeSelectorTerms",
        id="alternative terms",
    ),
    pytest.param(
        placed(required=[{"matchExpressions": [expr("spot", "DoesNotExist")]}]),
        "matchExpressions",
        id="operator",
    ),
    pytest.param(
        placed(required=[{"matchExpressions": [expr("zone", "In", "a", "b")]}]),
        "matchExpressions",
        id="several values off the product label",
    ),
    pytest.param(
        placed(required=[{"matchFields": [expr("metadata.name", "In", "n1")]}]),
        "matchFields",
        id="matchFields",
    ),
    pytest.param(
        placed({PRODUCT: T4}, required=[{"matchExpressions": [expr(PRODUCT, "In", A100)]}]),
        PRODUCT,
        id="selector and affinity share no model",
    ),
    pytest.param(
        placed({"zone": "a"}, required=[{"matchExpressions": [expr("zone", "In", "b")]}]),
        "node_labels['zone']",
        id="selector and affinity disagree on a label",
    ),
]


@pytest.mark.parametrize(("p", "named"), UNPLACEABLE)
def test_node_selection_the_ledger_cannot_express_is_refused(p: dict[str, Any], named: str) -> None:
    decision = decide(p)
    binding = decision.annotations[BINDING_ANNOTATION]
    assert decision.gate is True and binding.startswith(f"{REFUSED}: ")
    assert named in binding


def test_importing_the_hook_while_airflow_starts_from_inside_this_package(tmp_path: Any) -> None:
    # `gpupool controller run` on an Airflow image: our package imports Airflow, which imports
    # airflow_local_settings, which imports the hook while our exceptions module is half-loaded.
    import os
    import subprocess
    import sys

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "airflow_local_settings.py").write_text(
        "from airflow_gpupool.executor_hook import pod_mutation_hook  # noqa: F401\n"
    )
    code = (
        "import airflow_gpupool.ledger, airflow.settings as s;"
        "print(len(s.get_policy_plugin_manager().hook.pod_mutation_hook.get_hookimpls()))"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "1"


def with_claims(p: dict[str, Any]) -> dict[str, Any]:
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "mine"}]
    return p


@pytest.mark.parametrize(
    ("p", "named"),
    [
        pytest.param(
            with_claims(pod(limits={"nvidia.com/gpu": 1})),
            "spec.resourceClaims",
            id="a GPU pod with resource claims",
        ),
        pytest.param(
            pod(limits={"nvidia.com/gpu": 1}, annotations={BINDING_ANNOTATION: "dra"}),
            BINDING_ANNOTATION,
            id="the dra binding asked for",
        ),
    ],
)
def test_dra_is_refused_on_the_gated_path(p: dict[str, Any], named: str) -> None:
    binding = decide(p).annotations[BINDING_ANNOTATION]
    assert binding.startswith(f"{REFUSED}: ") and named in binding
    assert "only on the GpuPodOperator path" in binding and "GpuPodOperator(binding='dra')" in binding


def _grouped(**annotations: str) -> dict[str, Any]:
    return pod(limits={"nvidia.com/gpu": 1}, annotations=annotations)


GANG_REFUSED_CASES = [
    pytest.param(
        _grouped(**{"gpupool.io/gang": "g", "gpupool.io/gang-size": "x"}), "gang-size", id="size not int"
    ),
    pytest.param(_grouped(**{"gpupool.io/gang": "g"}), "gang-size", id="no size"),
    pytest.param(_grouped(**{"gpupool.io/gang": "g", "gpupool.io/gang-size": "0"}), "gang-size", id="size 0"),
    pytest.param(
        _grouped(**{"gpupool.io/gang": "g", "gpupool.io/gang-size": "513"}), "gang-size", id="too big"
    ),
    pytest.param(
        _grouped(**{"gpupool.io/gang": "g", "gpupool.io/gang-size": "2", "gpupool.io/gang-min": "3"}),
        "gang-min",
        id="min above size",
    ),
    pytest.param(
        _grouped(
            **{"gpupool.io/gang": "g", "gpupool.io/gang-size": "2", "gpupool.io/gang-topology": "bad key!"}
        ),
        "gang-topology",
        id="bad topology key",
    ),
    pytest.param(
        _grouped(**{"gpupool.io/gang": "no spaces", "gpupool.io/gang-size": "2"}),
        "gpupool.io/gang",
        id="bad name",
    ),
    pytest.param(_grouped(**{"gpupool.io/gang-size": "2"}), "gang-size", id="size without a group"),
]


@pytest.mark.parametrize(("p", "named"), GANG_REFUSED_CASES)
def test_malformed_pod_groups_are_refused_with_the_reason(p: dict[str, Any], named: str) -> None:
    decision = decide(p)
    assert decision.gate is True
    binding = decision.annotations[BINDING_ANNOTATION]
    assert binding.startswith(f"{REFUSED}: ") and named in binding


def test_a_well_formed_pod_group_is_gated_with_its_request() -> None:
    annotations = {"gpupool.io/gang": "g", "gpupool.io/gang-size": "4", "gpupool.io/gang-min": "2"}
    decision = decide(_grouped(**annotations))
    assert decision.gate is True and decision.annotations[BINDING_ANNOTATION] == "whole"
    assert json.loads(decision.annotations[REQUEST_ANNOTATION])["gpus"] == 1
