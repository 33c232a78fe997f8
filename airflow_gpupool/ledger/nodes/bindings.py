"""What each node pool's slice binding can express, as placement reads it (the ledger's ``binding`` options)."""

from __future__ import annotations

from collections.abc import Mapping

from airflow_gpupool.binding import check_binding_name
from airflow_gpupool.placement.pools import PoolBinding, PoolBindings

__all__ = ["pool_bindings"]


def pool_bindings(binding: str | None, node_pool_bindings: Mapping[str, str] | None) -> PoolBindings:
    """Return what each node pool's binding can express, for placement.

    :param binding: the strategy of pools not listed (None: such pools take any request)
    :param node_pool_bindings: the strategy of each listed pool
    :raises ConfigurationError: an unknown strategy name
    """

    def one(name: str, source: str) -> PoolBinding:
        strategy = check_binding_name(name, source)
        return PoolBinding(strategy.name, strategy.supports)

    pools = {pool: one(name, f"node pool {pool}") for pool, name in (node_pool_bindings or {}).items()}
    return PoolBindings(one(binding, "ledger binding") if binding is not None else None, pools)
