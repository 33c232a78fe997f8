"""``gpupool reserve``: a slice reserved by hand, to debug a pool or try preemption and spot.

The request is built as the operators build theirs: ``--capacity`` is ``GpuPodOperator``'s
``capacity`` (``on-demand``, ``spot``, ``any``; absent, the default rule of
:mod:`airflow_gpupool.governance.capacity`: urgent work on on-demand), and ``--priority-class``
takes the ledger priority from a PriorityClass of the cluster as the gatekeeper takes a pod's
(:mod:`airflow_gpupool.controller.priority_classes`: its value, clamped to the ledger's range).
Everything is checked before anything is sent; a made id is printed (on stderr) once the ledger
has taken the arguments, even when no answer came back, so the reservation can be looked up.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import TYPE_CHECKING, Any

from airflow_gpupool.argtypes import integer, key_value, non_empty, number
from airflow_gpupool.cli.common import kubernetes_api_errors, open_ledger, print_json, url_arg
from airflow_gpupool.exceptions import ConfigurationError, InvalidRequestError

if TYPE_CHECKING:
    from airflow_gpupool.resources import GpuRequest

__all__ = ["cmd_reserve", "register"]

_CAPACITIES = ("on-demand", "spot", "any")


def cmd_reserve(args: argparse.Namespace) -> int:
    """Reserve a slice by hand (debugging a pool; trying preemption with --preemptible, spot with --capacity)."""
    request = _request(args)
    # The id is made here, before anything is sent: a reserve that fails without an answer
    # (the ledger unreachable) can be checked, or run again with the same --id. An id the
    # ledger's own argument check refused (a lease too long) is never printed: nothing has it.
    reservation_id = args.id or uuid.uuid4().hex
    try:
        reservation = open_ledger(args).reserve(
            request, args.holder, ttl=args.ttl, timeout=args.timeout, reservation_id=reservation_id
        )
    except InvalidRequestError:
        raise  # the ledger checks its arguments before it writes: there is no reservation to name
    except BaseException:
        _print_made_id(args, reservation_id)
        raise
    _print_made_id(args, reservation_id)
    if args.json:
        print_json(reservation.to_dict())
    elif reservation.grant:
        g = reservation.grant
        print(
            f"{reservation.id} granted on {g.node} GPUs {list(g.gpu_indices)}"
            + (f" slice {g.mig_slice}" if g.mig_slice else "")
        )
    else:
        print(f"{reservation.id} {reservation.state.value}, position {reservation.position} in the queue")
    return 0


def _print_made_id(args: argparse.Namespace, reservation_id: str) -> None:
    if not args.id:
        print(f"gpupool: reservation id {reservation_id}", file=sys.stderr)


def _request(args: argparse.Namespace) -> GpuRequest:
    """Build the request the options describe, its priority and capacity resolved.

    :raises InvalidRequestError: no GPU asked for, a bad field, or a PriorityClass that gives no priority
    """
    from airflow_gpupool import settings
    from airflow_gpupool.governance.capacity import Capacity, apply_capacity
    from airflow_gpupool.resources import GpuRequest, WorkloadClass

    if not args.gpus and args.gpu_milli is None and args.mig_profile is None:
        raise InvalidRequestError(
            "--gpus",
            args.gpus or 0,
            "at least 1 whole GPU, or --gpu-milli or --mig-profile for a part of one",
        )
    request = GpuRequest(
        cpu_milli=args.cpu_milli,
        memory_mib=args.memory_mib,
        gpus=args.gpus or 0,
        gpu_milli=args.gpu_milli,
        gpu_memory_mib=args.gpu_memory_mib,
        mig_profile=args.mig_profile,
        gpu_models=frozenset(args.gpu_model or ()),
        node_labels=tuple(args.label or ()),
        workload_class=WorkloadClass(args.workload_class),
        priority=_priority(args),
        team=args.team,
        preemptible=args.preemptible,
    )
    return apply_capacity(
        request,
        None if args.capacity is None else Capacity.of(args.capacity),
        checkpointed=False,  # nothing the CLI reserves writes checkpoints
        expected_seconds=None,
        urgent_priority=settings.urgent_priority(),
        price_ratio=settings.spot_price_ratio(),
    )


def _priority(args: argparse.Namespace) -> int:
    """Return ``--priority``, or the ledger priority ``--priority-class`` gives.

    :raises InvalidRequestError: gpupool's own workload class, or a class the cluster lacks
    :raises ConfigurationError: the cluster cannot be reached
    """
    name = args.priority_class
    if name is None:
        return int(args.priority)
    from airflow_gpupool import settings

    own = settings.workload_priority_classes()
    if name in own.values():
        raise InvalidRequestError(
            "--priority-class",
            name,
            f"a PriorityClass other than gpupool's own ({', '.join(sorted(own.values()))}), which order "
            "pods for the kube-scheduler and give no ledger priority; use --priority instead",
        )
    from airflow_gpupool.controller.priority_classes import PodPriorities
    from airflow_gpupool.inventory.sync import core_v1_api

    try:
        api = core_v1_api(args.kubeconfig, args.context)
    except ConfigurationError as e:
        where = f"--kubeconfig {args.kubeconfig}" if args.kubeconfig else "the default kubeconfig"
        raise ConfigurationError(f"--priority-class needs the cluster; {where}: {e}") from e
    try:
        resolved = PodPriorities(api).of_class(name)
    except kubernetes_api_errors() as e:
        where = args.kubeconfig or "the default kubeconfig"
        raise ConfigurationError(
            f"cannot read PriorityClass {name!r} from the cluster of {where}: {type(e).__name__}"
        ) from e
    if resolved.priority is None:
        raise InvalidRequestError(
            "--priority-class", name, f"a PriorityClass of the cluster with a value ({resolved.problem})"
        )
    return resolved.priority


def register(subparsers: Any) -> None:
    """Add ``gpupool reserve``.

    :param subparsers: the top-level subparsers
    """
    p = subparsers.add_parser("reserve", help="reserve a GPU slice by hand", description=cmd_reserve.__doc__)
    url_arg(p)
    part = p.add_mutually_exclusive_group()
    part.add_argument(
        "--gpus", type=integer(0), help="whole GPUs (at least 1, unless a part of one is asked)"
    )
    part.add_argument("--gpu-milli", type=integer(1, 999), help="a fraction of one GPU, 1-999 milli-GPU")
    part.add_argument("--mig-profile", type=non_empty, help="a MIG profile such as 1g.10gb")
    p.add_argument("--gpu-memory-mib", type=integer(1), help="GPU memory for a fraction")
    p.add_argument("--gpu-model", type=non_empty, action="append", help="allowed GPU model (repeatable)")
    p.add_argument(
        "--label", type=key_value, action="append", help="required node label key=value (repeatable)"
    )
    p.add_argument("--cpu-milli", type=integer(0), default=1000)
    p.add_argument("--memory-mib", type=integer(0), default=1024)
    p.add_argument("--workload-class", default="batch", choices=["training", "inference", "batch"])
    rank = p.add_mutually_exclusive_group()
    rank.add_argument("--priority", type=integer(), default=0, help="queue priority, higher first")
    rank.add_argument(
        "--priority-class",
        type=non_empty,
        metavar="NAME",
        help="take the priority from this Kubernetes PriorityClass's value, read from the cluster "
        "(as the gatekeeper does for a pod)",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="F",
        help="for --priority-class: kubeconfig file (default: KUBECONFIG, ~/.kube/config)",
    )
    p.add_argument("--context", metavar="C", help="for --priority-class: kubeconfig context")
    p.add_argument(
        "--preemptible",
        action="store_true",
        help="higher-priority work may take the slice back (it becomes PREEMPTING, then ends)",
    )
    p.add_argument(
        "--capacity",
        choices=_CAPACITIES,
        help="where it may run: on-demand, spot or any (default: the operators' rule, urgent work on on-demand)",
    )
    p.add_argument("--team", type=non_empty, default="default")
    p.add_argument("--holder", type=non_empty, default="gpupool-cli", help="who holds it")
    p.add_argument("--ttl", type=number(0, above=True), help="lease seconds")
    p.add_argument("--timeout", type=number(0, above=True), help="seconds it may wait in the queue")
    p.add_argument(
        "--id", type=non_empty, help="reservation id (idempotent); made and printed on stderr when not given"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_reserve)
