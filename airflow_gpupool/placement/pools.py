"""What each node pool's slice binding can express, as placement sees it (pure).

A grant becomes a pod through the binding strategy of its node pool
(:mod:`airflow_gpupool.binding`): ``whole`` cannot express a fraction of a GPU, ``hami``
cannot express a MIG slice. Placement must therefore only choose nodes whose pool's
binding can express the request, or the grant fails when its pod is built. This module
holds that rule as plain data (a binding name and the request kinds it expresses, per
pool) so that placement stays below the bindings: the ledger builds a
:class:`PoolBindings` from the strategies and hands it down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from airflow_gpupool.resources import GpuKind, GpuRequest

__all__ = ["KIND_WORDS", "PoolBinding", "PoolBindings"]

#: How a reason names each request kind: "cannot express a fraction".
KIND_WORDS = {
    GpuKind.NONE: "a CPU-only request",
    GpuKind.WHOLE: "whole GPUs",
    GpuKind.FRACTION: "a fraction",
    GpuKind.MIG: "a MIG slice",
}


@dataclass(frozen=True, slots=True)
class PoolBinding:
    """One binding strategy: its name and the request kinds it can express."""

    name: str
    kinds: frozenset[GpuKind]


@dataclass(frozen=True)
class PoolBindings:
    """The binding of each node pool; pools not listed use ``default``.

    :param default: the binding of every pool not in ``pools``; None: such pools take any request
    :param pools: the binding of each named pool
    """

    default: PoolBinding | None = None
    pools: Mapping[str, PoolBinding] = field(default_factory=dict)

    @property
    def unconstrained(self) -> bool:
        """Whether every pool takes every request kind (no binding known)."""
        return self.default is None and not self.pools

    def of(self, pool: str) -> PoolBinding | None:
        """Return the binding of ``pool``, or None when it is unconstrained."""
        return self.pools.get(pool, self.default)

    def allows(self, pool: str, request: GpuRequest) -> bool:
        """Whether the binding of ``pool`` can express ``request``."""
        binding = self.of(pool)
        return binding is None or request.kind in binding.kinds

    def reason(self, pool: str, request: GpuRequest) -> str | None:
        """Say why ``pool`` cannot take ``request`` (None: it can)."""
        binding = self.of(pool)
        if binding is None or request.kind in binding.kinds:
            return None
        return f"binding {binding.name!r} on pool {pool} cannot express {KIND_WORDS[request.kind]}"

    def able_pools(self, pools: Iterable[str], request: GpuRequest) -> list[str]:
        """Return, sorted, those of ``pools`` whose binding can express ``request``."""
        return sorted({p for p in pools if self.allows(p, request)})


#: No binding known: every pool takes every request (a ledger opened without bindings).
UNCONSTRAINED = PoolBindings()
