"""A node's GPUs: UUIDs no node agent has verified, a node agent that finds no GPU."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_gpupool.exceptions.base import GpuPoolError

__all__ = ["NoGpuError", "UnverifiedGpuUuidError"]


class UnverifiedGpuUuidError(GpuPoolError):
    """The ``device`` or ``dra`` binding was given GPU UUIDs that no node agent has reported.

    Until ``gpupool agent run`` on the node has reported its GPUs, the ledger only has the
    inventory's UUIDs, which no NVIDIA runtime can select.

    :param uuids: the unverified UUIDs
    :param selector: what would have selected them
    """

    def __init__(self, uuids: Sequence[str], selector: str = "NVIDIA_VISIBLE_DEVICES") -> None:
        self.uuids = tuple(uuids)
        super().__init__(
            f"GPU UUIDs {list(self.uuids)} are not verified: no node agent has reported them, so "
            f"{selector} cannot select them; run `gpupool agent run` on the node (the "
            "nvml-agent DaemonSet) or use another binding (whole, hami, kai) for this node pool"
        )


class NoGpuError(GpuPoolError):
    """The node agent found no GPU to watch: no driver, no NVML library, no GPU or no permission.

    :param node: the node the agent runs for
    :param reason: what NVML said, in words
    """

    def __init__(self, node: str, reason: str) -> None:
        self.node = node
        self.reason = reason
        super().__init__(
            f"no GPU to watch on node {node}: {reason}; run the agent on GPU nodes only, with the "
            "NVIDIA container runtime (or --backend fake --fake-spec FILE to try it without a GPU)"
        )
