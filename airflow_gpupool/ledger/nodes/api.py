"""The ledger's public methods on nodes: inventory, health, heartbeats and the agent's reports.

:class:`~airflow_gpupool.ledger.Ledger` inherits them; they hand each call to the room that does it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from airflow_gpupool import settings

if TYPE_CHECKING:
    from airflow_gpupool.ledger.db.models import Reservation
    from airflow_gpupool.ledger.nodes.agent_report import NodeReport
    from airflow_gpupool.ledger.nodes.external import ExternalSync, LedgerExternalHolds
    from airflow_gpupool.ledger.nodes.health import HeartbeatCheck, HeartbeatResult, LedgerHealth
    from airflow_gpupool.ledger.nodes.inventory import InventoryChange, LedgerInventory
    from airflow_gpupool.pod_gpus import ExternalPod
    from airflow_gpupool.resources import NodeHealth, NodeInventory

__all__ = ["LedgerNodeApi"]


class LedgerNodeApi:
    """Nodes added, removed, marked healthy or not, and heard from."""

    _inventory: LedgerInventory
    _health: LedgerHealth
    _external: LedgerExternalHolds

    def sync_external(
        self, pods: Iterable[ExternalPod], gone: Iterable[str] = (), *, complete: bool = False
    ) -> ExternalSync:
        """Hold the GPUs of pods this project did not make; release those of pods gone (one transaction).

        A pod bound to a grant (by name, or labelled with a live reservation or gang) is the
        ledger's already and is skipped. See :mod:`~airflow_gpupool.ledger.nodes.external`.

        :param pods: live, scheduled pods that hold GPUs
        :param gone: ``namespace/name`` of pods that ended or were deleted
        :param complete: ``pods`` are every such pod of the cluster (a relist): every other hold ends
        """
        return self._external.sync_external(pods, gone, complete=complete)

    def external_holds(self) -> list[Reservation]:
        """Return the live external holds (state ``external``), by pod then GPU."""
        return self._external.external_holds()

    def upsert_nodes(self, inventory: Iterable[NodeInventory]) -> InventoryChange:
        """Add or update nodes, all in one transaction; unchanged nodes are left alone.

        :raises InvalidInventoryError: a node is malformed, listed twice, or would lose a GPU
            or MIG slice that a live grant holds (drain the node first)
        """
        return self._inventory.upsert_nodes(inventory)

    def remove_node(self, name: str) -> str:
        """Remove a node: ``removed``, ``draining`` (live grants keep it until released) or ``absent``."""
        return self._inventory.remove_node(name)

    def set_health(
        self, name: str, health: NodeHealth | str, *, source: str = "admin", reason: str = ""
    ) -> bool:
        """Set a node's health as ``source``; only ``healthy`` nodes take new grants.

        A source changes only a health set by a source of its rank or lower (admin > agent and
        controller > inventory, see :mod:`~airflow_gpupool.ledger.nodes.health`).

        :returns: whether it changed; False when a higher source set the health
        :raises InvalidInventoryError: unknown node, health value or source
        """
        return self._health.set_node_health(name, health, source=source, reason=reason)

    def set_gpu_health(
        self, node: str, gpu: str, health: NodeHealth | str, *, source: str = "admin", reason: str = ""
    ) -> bool:
        """Set one GPU's health (by UUID or index) as ``source``; a quarantined GPU takes no new grants.

        :returns: whether it changed; False when a higher source set the health
        :raises InvalidInventoryError: unknown node or GPU, a health other than healthy or quarantined
        """
        return self._health.set_gpu_health(node, gpu, health, source=source, reason=reason)

    def heartbeat(self, name: str, at: float | None = None) -> None:
        """Record that a node's agent is alive (no report; see :meth:`record_report`)."""
        self._inventory.heartbeat(name, at)

    def record_report(
        self,
        report: NodeReport,
        *,
        missed_heartbeats: int | None = None,
        leak_grace_seconds: float | None = None,
        leak_action: str | None = None,
    ) -> HeartbeatResult:
        """Store a node agent's heartbeat and report: verify UUIDs, quarantine failing GPUs, find leaks.

        :raises InvalidInventoryError: the node is not in the inventory, or a bad leak action
        """
        return self._health.record_report(
            report,
            missed=missed_heartbeats if missed_heartbeats is not None else settings.missed_heartbeats(),
            leak_grace_s=leak_grace_seconds
            if leak_grace_seconds is not None
            else settings.leak_grace_seconds(),
            leak_action=leak_action or settings.leak_action(),
        )

    def check_heartbeats(
        self, *, missed_heartbeats: int | None = None, stable_seconds: float | None = None
    ) -> HeartbeatCheck:
        """Quarantine nodes whose agent stopped for ``missed_heartbeats`` intervals; release recovered ones."""
        return self._health.check_heartbeats(
            missed=missed_heartbeats if missed_heartbeats is not None else settings.missed_heartbeats(),
            stable_s=stable_seconds if stable_seconds is not None else settings.heartbeat_stable_seconds(),
        )
