"""Provider metadata that Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_gpupool import __version__


def _option(
    description: str, default: str, type_: str = "string", example: str | None = None
) -> dict[str, Any]:
    return {
        "description": description,
        "version_added": "0.1.0",
        "type": type_,
        "example": example,
        "default": default,
    }


def get_provider_info() -> dict[str, Any]:
    """Return the provider's package, connection, config and extension declarations."""
    return {
        "package-name": "airflow-gpupool",
        "name": "GPU pool",
        "description": "Reserve GPU slices (whole GPUs, fractions, MIG) from a shared ledger before "
        "launching Kubernetes pods.",
        "versions": [__version__],
        "connection-types": [
            {"hook-class-name": "airflow_gpupool.hooks.gpupool.GpuPoolHook", "connection-type": "gpupool"}
        ],
        "triggers": [
            {
                "integration-name": "GPU pool",
                "python-modules": [
                    "airflow_gpupool.triggers.reservation",
                    "airflow_gpupool.triggers.pod",
                    "airflow_gpupool.triggers.job",
                    "airflow_gpupool.triggers.checkpoint",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "GPU pool",
                "python-modules": ["airflow_gpupool.operators.gpu_pod", "airflow_gpupool.operators.gpu_job"],
            }
        ],
        "sensors": [
            {"integration-name": "GPU pool", "python-modules": ["airflow_gpupool.sensors.checkpoint"]}
        ],
        "notifications": ["airflow_gpupool.notifiers.escalation.EscalationNotifier"],
        "extra-links": ["airflow_gpupool.operators.links.GpuReservationLink"],
        "task-decorators": [
            {"class-name": "airflow_gpupool.decorators.gpu_pod.gpu_pod_task", "name": "gpu_pod"}
        ],
        "plugins": [{"name": "gpupool", "plugin-class": "airflow_gpupool.plugins.gpupool.GpuPoolPlugin"}],
        "config": {
            "gpupool": {
                "description": "Settings of the airflow-gpupool provider.",
                "options": {
                    "ledger_url": _option(
                        "SQLAlchemy URL of the GPU ledger. Empty: a SQLite file under AIRFLOW_HOME. "
                        "GPUPOOL_LEDGER_URL and the gpupool connection take precedence.",
                        "",
                        example="postgresql+psycopg://gpupool@db:5432/gpupool",
                    ),
                    "placement_policy": _option(
                        "Placement policy of the ledger; empty for the project's default (gpupool). "
                        "See `gpupool simulate --policy all` to compare them on your trace.",
                        "",
                        example="fgd",
                    ),
                    "typical_shapes": _option(
                        "Typical task shapes the fragmentation policies (gpupool, fgd) keep room for, as "
                        "cpu_milli:gpu_milli:gpus[:model|model]=weight items separated by commas: CPU milli, "
                        "GPU milli on each GPU (1000 for whole GPUs; 0 with 0 GPUs for a CPU-only task), "
                        "GPU count, optionally the GPU models allowed, and a relative weight. Every worker "
                        "reads the same shapes, so all score a cluster alike. Empty: the built-in shapes "
                        "(1 CPU with a quarter, half or three-quarter GPU, or 1, 2, 4 or 8 whole GPUs, "
                        "equally weighted). `gpupool simulate` derives them from the trace instead.",
                        "",
                        example="4000:500:1=3,8000:1000:1=2,32000:1000:8:A100=1",
                    ),
                    "lease_ttl_seconds": _option(
                        "Seconds a grant lives unless renewed; a dead holder's slice returns after this.",
                        "600",
                        "integer",
                    ),
                    "reservation_timeout_seconds": _option(
                        "Seconds a request may wait in the queue before it fails, naming what blocked "
                        "it. An hour: on a shared pool a GPU request often waits behind work of minutes "
                        "to hours, and a timeout spends one of the task's tries.",
                        "3600",
                        "integer",
                    ),
                    "orphan_grace_seconds": _option(
                        "Seconds an orphaned grant (its lease expired while its pod still runs) is "
                        "kept before reconcile deletes the pod and frees the slice.",
                        "600",
                        "integer",
                    ),
                    "poll_interval_seconds": _option(
                        "Seconds between checks of a waiting request (trigger and non-deferrable wait).",
                        "5",
                        "integer",
                    ),
                    "max_overtakes": _option(
                        "How many later requests may be granted past a blocked request before it "
                        "blocks the queue (no starvation).",
                        "8",
                        "integer",
                    ),
                    "synchronous_commit": _option(
                        "PostgreSQL ledger: wait for the WAL flush on every commit. false trades the last "
                        "few hundred milliseconds of ledger changes on a server crash for throughput "
                        "(about a fifth more in `gpupool bench ledger`); leases and `gpupool reconcile` "
                        "heal what is lost.",
                        "true",
                        "boolean",
                    ),
                    "lock_timeout_seconds": _option(
                        "Seconds a ledger writer waits for the ledger's lock (PostgreSQL lock_timeout, "
                        "SQLite busy timeout) before it fails with LedgerBusyError. Together with "
                        "idle_in_transaction_timeout_seconds it bounds how long a stopped or hung client "
                        "holds the others up.",
                        "10",
                        "float",
                    ),
                    "statement_timeout_seconds": _option(
                        "PostgreSQL ledger: seconds one statement may run before the server cancels it "
                        "(statement_timeout); above lock_timeout_seconds.",
                        "30",
                        "float",
                    ),
                    "idle_in_transaction_timeout_seconds": _option(
                        "PostgreSQL ledger: seconds a session may sit idle inside a transaction before the "
                        "server ends it (idle_in_transaction_session_timeout), releasing the locks of a "
                        "stopped or hung client.",
                        "10",
                        "float",
                    ),
                    "ledger_retry_seconds": _option(
                        "Seconds a ledger call retries lost connections (server restarting, connection "
                        "refused or reset) with backoff before it fails with LedgerUnavailableError.",
                        "60",
                        "float",
                    ),
                    "binding": _option(
                        "Default slice binding: whole, mig, hami, kai or device.", "whole", example="hami"
                    ),
                    "gang_topology_keys": _option(
                        "Node label keys (comma-separated) whose shared values a gang's members prefer "
                        "(zone, rack, NVLink domain), for pod groups without a gpupool.io/gang-topology "
                        "annotation and GpuJobOperator without topology_keys.",
                        "topology.kubernetes.io/zone",
                        example="topology.kubernetes.io/zone,example.com/rack",
                    ),
                    "node_pool_bindings": _option(
                        "Per node pool binding, as pool=strategy pairs separated by commas.",
                        "",
                        example="a100-mig=mig,t4-shared=hami",
                    ),
                    "workload_priority_classes": _option(
                        "PriorityClass of each workload class's pods, as class=priorityclass pairs; "
                        "empty to set none. deploy/kustomize/base/priority-classes.yaml creates the defaults.",
                        "training=gpupool-training,inference=gpupool-inference",
                    ),
                    "default_checkpoint_root": _option(
                        "Base URL under which tasks get a checkpoint directory when none is given.",
                        "",
                        example="s3://ml-checkpoints/airflow",
                    ),
                    # The waiting path (queue at scale).
                    "max_connections_per_process": _option(
                        "Database connections one process (a triggerer, a worker) keeps to one ledger URL, "
                        "at most: every hook and trigger of the process shares one ledger and its pool. On "
                        "PostgreSQL with 3 or more, one of them listens for grants (NOTIFY).",
                        "4",
                        "integer",
                    ),
                    "waiter_reap_interval_seconds": _option(
                        "A process with waiting requests checks this often (one read) whether a lease or a "
                        "wait is overdue, and only then ends it and serves the queue: what heals a pool when "
                        "no controller runs. Waiters themselves only read.",
                        "30",
                        "float",
                    ),
                    "wait_fallback_poll_seconds": _option(
                        "PostgreSQL: a waiter woken by NOTIFY still reads its request this often, in case a "
                        "notification was lost (a dropped listener connection).",
                        "60",
                        "float",
                    ),
                    "transaction_pooling": _option(
                        "PostgreSQL ledger reached through PgBouncer in transaction pooling mode: no "
                        "server-side prepared statements, no session settings (timeouts are set per "
                        "transaction instead), no LISTEN (waiters poll).",
                        "false",
                        "boolean",
                    ),
                    # The node agent (issue 17).
                    "agent_interval_seconds": _option(
                        "Seconds between two reports (heartbeats) of `gpupool agent run`.", "30"
                    ),
                    "missed_heartbeats": _option(
                        "Heartbeat intervals a node's agent may miss before the controller quarantines the node.",
                        "3",
                    ),
                    "heartbeat_stable_seconds": _option(
                        "Seconds of steady heartbeats before the controller releases a node it quarantined.",
                        "90",
                    ),
                    "leak_grace_seconds": _option(
                        "Seconds GPU memory may stay used by processes no live grant holds before it is a leak.",
                        "60",
                    ),
                    "leak_action": _option(
                        "What a GPU memory leak does: report (status, UI, metric) or quarantine the GPU until clean.",
                        "report",
                    ),
                    # The GPU pool page's history (issue 15).
                    "history_retention_days": _option(
                        "Days ended reservations stay in the ledger's history; the controller prunes older ones.",
                        "30",
                        "float",
                    ),
                    # Start-time forecasts (issue 39).
                    "forecast_prior_seconds": _option(
                        "Mean run time assumed of a GPU task with no successful run of its own, its team's "
                        "or its workload class's in the ledger's history (the forecast's prior).",
                        "3600",
                        "float",
                    ),
                    "forecast_interval_seconds": _option(
                        "The controller recomputes every waiting request's start-time forecast at most this often.",
                        "30",
                        "float",
                    ),
                    "handoff_seconds": _option(
                        "Seconds a GPU step's slice handed on to the next GPU step of its DAG run is held "
                        "for that step to claim; then it is released.",
                        "120",
                        "float",
                    ),
                    "queue_ahead_lead_seconds": _option(
                        "Seconds before its upstream GPU step's forecast end that a downstream GPU step of "
                        "the same DAG run, which cannot be handed the slice, enters the queue (queue ahead).",
                        "300",
                        "float",
                    ),
                    "queue_ahead_idle_seconds": _option(
                        "Seconds a request queued ahead, once granted, waits for its step to claim it; then "
                        "it steps back, keeping its place in the queue.",
                        "120",
                        "float",
                    ),
                    "drift_alert_seconds": _option(
                        "The controller logs a warning for a node whose ledger books disagree with the pods "
                        "the cluster runs there for this long (seconds; the GpuPoolLedgerDrift alert's for).",
                        "300",
                        "float",
                    ),
                    # On-demand and spot capacity (issue 16).
                    "spot_node_pools": _option(
                        "Node pools (comma-separated) whose nodes are spot capacity, besides the nodes "
                        "Karpenter, GKE or EKS label as spot and those labelled gpupool.io/capacity-type=spot.",
                        "",
                        example="a100-spot,t4-spot",
                    ),
                    "spot_price_ratio": _option(
                        "Spot's price over on-demand's (above 0, at most 1); empty: unknown, so no request "
                        "prefers spot by default. Checkpointed, preemptible training prefers spot below 0.6 "
                        "for an expected run under an hour, below 0.4 for longer.",
                        "",
                        "float",
                        example="0.35",
                    ),
                    "urgent_priority": _option(
                        "Priority at and above which work is urgent: by default it never runs on spot.",
                        "100",
                        "integer",
                    ),
                    "evictions_before_on_demand": _option(
                        "After this many evicted tries of one task run (a spot node taken back, a drain), "
                        "its next tries run on on-demand capacity only; 0: never.",
                        "2",
                        "integer",
                    ),
                    "preemption_grace_seconds": _option(
                        "Seconds a preemption victim's pod has to write an emergency checkpoint and exit "
                        "(SIGTERM first) before its slice passes on; a task may ask for another.",
                        "120",
                        "float",
                    ),
                    "min_runtime_seconds": _option(
                        "Seconds a grant runs before it may be preempted (no thrashing); 0: at once.",
                        "60",
                        "float",
                    ),
                    # Waiting demand made visible to the autoscaler (issue 36).
                    "scalable_node_pools": _option(
                        "JSON object of node pools the cluster's autoscaler can grow, each with the shape "
                        "of one empty node: gpu_model, gpus, gpu_memory_mib, and optionally mig, labels, "
                        "cpu, memory. A waiting request that fits no node but an empty node of one gets a "
                        "ProvisioningRequest or placeholder pods from the controller; empty: none.",
                        "",
                        example='{"a100-burst": {"gpu_model": "NVIDIA-A100-SXM4-80GB", "gpus": 8, '
                        '"gpu_memory_mib": 81920, "cpu": "96", "memory": "1024Gi"}}',
                    ),
                    "autoscale_mode": _option(
                        "How the controller asks for nodes: auto (a ProvisioningRequest where the cluster "
                        "serves autoscaling.x-k8s.io/v1, else placeholder pods), provisioning-request, "
                        "placeholder-pods, or off.",
                        "auto",
                    ),
                    "provisioning_class": _option(
                        "The ProvisioningRequest class: best-effort-atomic-scale-up.autoscaling.x-k8s.io "
                        "or check-capacity.autoscaling.x-k8s.io.",
                        "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
                    ),
                    "autoscale_namespace": _option(
                        "Namespace of the ProvisioningRequests, PodTemplates and placeholder pods; empty: "
                        "the controller's own.",
                        "",
                    ),
                    "placeholder_priority_class": _option(
                        "PriorityClass of placeholder pods (value -1, created when missing).",
                        "gpupool-placeholder",
                    ),
                    "discover_node_pools": _option(
                        "Where else scalable pools are found, comma-separated: karpenter (NodePools that "
                        "state a GPU shape in the gpupool.io/node-shape annotation or GFD labels), "
                        "cluster-api (Cluster Autoscaler's node groups: MachineDeployments and MachineSets "
                        "with its size and capacity.cluster-autoscaler.kubernetes.io/* scale-from-zero "
                        "annotations); empty: only scalable_node_pools.",
                        "",
                        example="karpenter,cluster-api",
                    ),
                },
            }
        },
    }
