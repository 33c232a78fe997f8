"""The label, annotation and resource names this project reads and writes on Kubernetes objects.

One place, so the operator that writes a name and the inventory, reconciler or UI that reads it
can never disagree. Plain strings: importing this module imports nothing else.
"""

from __future__ import annotations

# -- ours ---------------------------------------------------------------------------------------
#: The prefix of every label and annotation this project writes.
ANNOTATION_PREFIX = "gpupool.io/"
#: On each pod launched for a grant: the reservation it runs under (reconciliation keys on it).
RESERVATION_LABEL = "gpupool.io/reservation-id"
#: On each pod launched for a grant: the request's workload class (training, inference, batch).
WORKLOAD_CLASS_LABEL = "gpupool.io/workload-class"
#: On each ProvisioningRequest, PodTemplate and placeholder pod made to scale a pool up: the
#: waiting reservation it asks capacity for (the controller finds and ends them by it). The
#: external holds' pod watch skips placeholder pods: they hold no GPU anyone uses (pod_gpus.py).
SCALE_UP_LABEL = "gpupool.io/scale-up-for"
#: On a node: the node pool it belongs to (read before the cloud providers' own pool labels).
POOL_LABEL = "gpupool.io/pool"
#: ``spot`` or ``on-demand``: stamped by the ledger on every node it keeps (from the cloud's own
#: labels, ``[gpupool] spot_node_pools``, or this label set on the node), so a request's
#: ``capacity`` is a node label like any other.
CAPACITY_TYPE_LABEL = "gpupool.io/capacity-type"

# -- the executor hook and the gatekeeper (pods that GpuPodOperator did not build) ------------------
#: The scheduling gate the executor hook puts on a GPU pod; the gatekeeper removes it once granted.
SCHEDULING_GATE = "gpupool.io/reservation"
#: On a gated pod: the request as JSON (``GpuRequest.to_dict``). A pod may set it itself to ask for
#: a fraction (``{"gpu_milli": 500}``); the hook then writes the whole request back.
REQUEST_ANNOTATION = "gpupool.io/request"
#: On a gated pod: the Airflow identity the hook found (the ledger's holder is built from them).
DAG_ID_ANNOTATION = "gpupool.io/dag-id"
TASK_ID_ANNOTATION = "gpupool.io/task-id"
RUN_ID_ANNOTATION = "gpupool.io/run-id"
TRY_NUMBER_ANNOTATION = "gpupool.io/try-number"
MAP_INDEX_ANNOTATION = "gpupool.io/map-index"
#: Team and priority: read from a label or an annotation of the pod, written as annotations.
TEAM_KEY = "gpupool.io/team"
PRIORITY_KEY = "gpupool.io/priority"
#: On a gated pod: the PriorityClass its gpupool priority comes from (the pod's own
#: ``spec.priorityClassName``, when it sets no gpupool priority); the gatekeeper reads its value.
PRIORITY_CLASS_ANNOTATION = "gpupool.io/priority-class"
#: ``true`` or ``false``, a label or an annotation of a gated pod: its container writes a checkpoint
#: on SIGTERM (``GpuPodOperator(checkpoint_on_sigterm=True)`` for pods the operator did not build).
CHECKPOINT_ON_SIGTERM_KEY = "gpupool.io/checkpoint-on-sigterm"
#: On a gated pod: how the grant is bound (``whole``, ``mig`` or ``accounted``), chosen by the hook.
BINDING_ANNOTATION = "gpupool.io/binding"
#: Written by the gatekeeper when it admits a pod: the granted node and GPUs.
NODE_ANNOTATION = "gpupool.io/node"
GPUS_ANNOTATION = "gpupool.io/gpus"
#: On a gang Job's pods (GpuJobOperator): the gang's leader reservation. The gatekeeper leaves them
#: alone: the operator pins each one to its member's slice. (``gpupool.io/gang`` and
#: ``gpupool.io/gang-size`` are the gatekeeper's pod groups, issue 18 item 5: not this.)
GANG_RESERVATION_ANNOTATION = "gpupool.io/gang-reservation"
#: The same, as a label: reconcile finds a member's replacement pod, still gated, by it.
GANG_RESERVATION_LABEL = "gpupool.io/gang-reservation"
#: On gated pods of a pod group (per namespace): the group's name, its size (the gang's most
#: members), its elastic minimum (default: the size) and the node label keys its members should
#: share (comma-separated; default ``[gpupool] gang_topology_keys``). Admitted together.
GANG_ANNOTATION = "gpupool.io/gang"
GANG_SIZE_ANNOTATION = "gpupool.io/gang-size"
GANG_MIN_ANNOTATION = "gpupool.io/gang-min"
GANG_TOPOLOGY_ANNOTATION = "gpupool.io/gang-topology"

#: A container's environment variable naming where the task writes its checkpoints: a pod with it
#: is checkpointed (the spot rule, ``checkpoint-on-sigterm``), and a step reads it to know where.
CHECKPOINT_DIR_ENV = "GPUPOOL_CHECKPOINT_DIR"

# -- Kubernetes ---------------------------------------------------------------------------------
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: On a Job's pods (the Job controller's): the Job's name, and an Indexed Job's completion index.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: Node-pool labels, first match wins: ours, then GKE, EKS, AKS and Karpenter.
POOL_LABELS = (
    POOL_LABEL,
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "karpenter.sh/nodepool",
)

# -- NVIDIA device plugin, GPU Feature Discovery, HAMi -------------------------------------------
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
HAMI_MEMORY_RESOURCE = "nvidia.com/gpumem"
HAMI_CORES_RESOURCE = "nvidia.com/gpucores"
#: NVIDIA's DRA driver (k8s-dra-driver-gpu): its name qualifies the attributes it publishes and the
#: devices it allocates (``gpu-<index>``) in a ResourceClaim's ``status.allocation``.
DRA_DRIVER = "gpu.nvidia.com"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
COUNT_LABEL = "nvidia.com/gpu.count"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GFD_TIMESTAMP_LABEL = "nvidia.com/gfd.timestamp"
