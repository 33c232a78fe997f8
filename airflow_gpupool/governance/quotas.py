"""Team quotas: what each team may hold of each resource flavor, and what it may borrow and lend.

A quota file (YAML) declares, per team and per *flavor* (a GPU model or a node pool), a nominal
quota in GPUs, an optional borrowing limit (how far above its nominal quota the team may go
by borrowing what others leave unused) and an optional lending limit (how much of its unused
nominal quota others may borrow). Teams in one cohort lend each other unused quota; a team
without a cohort neither lends nor borrows. The model is Kueue's ClusterQueue and cohort, on
the ledger's own units:

- quantities are GPUs, stored as milli-GPU: a whole GPU counts 1000, a fraction its milli, a MIG
  slice its compute share of the GPU (``3g.40gb`` counts 3/7 of an A100 or H100: 429 milli);
- a flavor is ``{pool: NAME}`` or ``{model: NAME}``; one request draws on the flavors its grant
  matches (the node's pool and the GPU model).

Where ours differ from Kueue: one file holds every team (applying it replaces the quotas of
the ledger as a whole, so a team left out loses its quota); a lending limit defaults to
lending everything unused, and a borrowing limit to no limit within the cohort, as in Kueue.

The same file may declare the pools' **headroom** (:class:`Headroom`): a share of each node
pool's GPUs that only urgent work (priority at or above ``urgent_priority``, or the ``inference``
class) may use, 20 % of every pool unless the file says otherwise (``share: 0`` turns it off);
with ``lend_to_preemptible`` it is lent to preemptible work, which urgent work then preempts;
non-preemptible work that keeps its team within its nominal quota may use it too
(:func:`~airflow_gpupool.governance.capacity.fits_headroom`, whose module says why).

Parsing is pure (no I/O beyond reading the text): :func:`parse_quota_file` either returns a
valid :class:`QuotaPlan` or raises :class:`~airflow_gpupool.exceptions.QuotaFileError` naming the
entry and the field, before anything is written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpupool.exceptions import QuotaFileError

__all__ = [
    "Flavor",
    "Headroom",
    "QuotaPlan",
    "TeamQuota",
    "gpu_milli_of_mig",
    "parse_quota_file",
]

_FLAVOR_KINDS = ("pool", "model")
_TEAM_KEYS = frozenset({"name", "cohort", "quotas"})
_QUOTA_KEYS = frozenset({"flavor", "nominal", "borrowing_limit", "lending_limit"})
_FILE_KEYS = frozenset({"teams", "headroom"})
_HEADROOM_KEYS = frozenset({"share", "pools", "lend_to_preemptible", "urgent_priority"})
#: The share of each pool kept for urgent work when a quota file does not say.
DEFAULT_HEADROOM_SHARE = 0.2
_MAX_NAME = 253
#: Compute slices of a whole GPU under MIG: A30 has 4, the A100 and H100 families 7.
_MIG_COMPUTE_SLICES = (("A30", 4),)
_DEFAULT_MIG_COMPUTE_SLICES = 7


@dataclass(frozen=True, order=True)
class Flavor:
    """A resource flavor: the GPUs of one node pool, or of one GPU model.

    :param kind: ``pool`` or ``model``
    :param name: the node pool's or the GPU model's name
    """

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Flavor:
        """Read ``pool:NAME`` or ``model:NAME`` (the form :meth:`__str__` and the ledger use)."""
        kind, sep, name = text.partition(":")
        if not sep or kind not in _FLAVOR_KINDS or not name:
            raise QuotaFileError("flavor", text, "pool:NAME or model:NAME")
        return cls(kind, name)


@dataclass(frozen=True)
class TeamQuota:
    """One team's quota of one flavor, in milli-GPU.

    :param path: its YAML path in the quota file, for messages (not compared)
    :param borrowing_limit_milli: how far above nominal it may borrow; None: no limit in its cohort
    :param lending_limit_milli: how much of its unused nominal it lends; None: all of it
    """

    team: str
    flavor: Flavor
    nominal_milli: int
    cohort: str | None = None
    borrowing_limit_milli: int | None = None
    lending_limit_milli: int | None = None
    #: Where the quota file declares it (``teams[1].quotas[0]``); empty for a quota read from the ledger.
    path: str = field(default="", compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Return primitives, in GPUs (``quota list --json``)."""
        return {
            "team": self.team,
            "cohort": self.cohort,
            "flavor": str(self.flavor),
            "nominal": self.nominal_milli / 1000,
            "borrowing_limit": _gpus(self.borrowing_limit_milli),
            "lending_limit": _gpus(self.lending_limit_milli),
        }


@dataclass(frozen=True)
class Headroom:
    """The share of each node pool only urgent work may use (no headroom by default).

    :param share_milli: per mille of every pool not in ``pools`` (200: 20 %)
    :param pools: ``(pool, per mille)`` of the pools with their own share, sorted
    :param lend_to_preemptible: preemptible work may use it too, and urgent work preempts it there
    :param urgent_priority: work at or above this priority is urgent (None: ``[gpupool]
        urgent_priority`` when the plan is applied)
    """

    share_milli: int = 0
    pools: tuple[tuple[str, int], ...] = ()
    lend_to_preemptible: bool = False
    urgent_priority: int | None = None

    def share(self, pool: str) -> float:
        """Return the share of ``pool`` kept for urgent work, 0 to 1."""
        return dict(self.pools).get(pool, self.share_milli) / 1000

    @property
    def active(self) -> bool:
        """Whether any pool keeps a headroom."""
        return bool(self.share_milli or any(share for _, share in self.pools))

    def to_dict(self) -> dict[str, Any]:
        """Return primitives (``quota list --json``): shares from 0 to 1."""
        return {
            "share": self.share_milli / 1000,
            "pools": {pool: share / 1000 for pool, share in self.pools},
            "lend_to_preemptible": self.lend_to_preemptible,
            "urgent_priority": self.urgent_priority,
        }


@dataclass(frozen=True)
class QuotaPlan:
    """Every team's quotas, as one quota file declares them (sorted by team, then flavor), and the headroom."""

    quotas: tuple[TeamQuota, ...] = field(default_factory=tuple)
    headroom: Headroom = field(default_factory=Headroom)

    @property
    def flavors(self) -> frozenset[Flavor]:
        """The flavors the plan names."""
        return frozenset(q.flavor for q in self.quotas)

    @property
    def teams(self) -> tuple[str, ...]:
        """The teams, sorted."""
        return tuple(sorted({q.team for q in self.quotas}))


def gpu_milli_of_mig(profile: str, gpu_model: str | None) -> int:
    """Return the milli-GPU a MIG slice counts: its compute slices over the GPU's (``3g.40gb``: 3/7).

    :param profile: a MIG profile such as ``1g.10gb``
    :param gpu_model: the GPU's model (the A30 has 4 compute slices, the A100 and H100 families 7)
    :raises QuotaFileError: the profile does not start with ``<n>g.``
    """
    count, sep, _ = profile.partition("g.")
    if not sep or not count.isdigit() or int(count) < 1:
        raise QuotaFileError("mig_profile", profile, "a MIG profile such as 1g.10gb")
    total = next(
        (n for key, n in _MIG_COMPUTE_SLICES if key in (gpu_model or "")), _DEFAULT_MIG_COMPUTE_SLICES
    )
    return min(1000, round(1000 * int(count) / total))


def parse_quota_file(document: Any) -> QuotaPlan:
    """Validate a loaded quota file (the YAML as Python objects) and return its plan.

    :param document: ``{"teams": [{"name": ..., "cohort": ..., "quotas": [...]}, ...], "headroom": {...}}``
    :raises QuotaFileError: the first problem, naming the team, the entry and the field
    """
    if not isinstance(document, Mapping):
        raise QuotaFileError("quota file", document, "a mapping with teams and an optional headroom")
    _known_keys(document, _FILE_KEYS, "")
    teams = document.get("teams")
    if not isinstance(teams, list) or not teams:
        raise QuotaFileError("teams", teams, "a non-empty list of teams")
    quotas: list[TeamQuota] = []
    seen: set[tuple[str, Flavor]] = set()
    names: set[str] = set()
    for index, entry in enumerate(teams):
        where = f"teams[{index}]"
        team, cohort, entries = _team(entry, where)
        if team in names:
            raise QuotaFileError(f"{where}.name", team, "a team named once in the file")
        names.add(team)
        for number, raw in enumerate(entries):
            quota = _quota(raw, team, cohort, f"{where}.quotas[{number}]")
            if (team, quota.flavor) in seen:
                raise QuotaFileError(
                    f"{where}.quotas[{number}].flavor",
                    str(quota.flavor),
                    "each flavor once per team",
                    team=team,
                )
            seen.add((team, quota.flavor))
            quotas.append(quota)
    headroom = _headroom(document.get("headroom", {}))
    return QuotaPlan(tuple(sorted(quotas, key=lambda q: (q.team, q.flavor))), headroom)


def _headroom(raw: Any) -> Headroom:
    """Read the file's ``headroom`` (absent: 20 % of every pool, not lent)."""
    if not isinstance(raw, Mapping):
        raise QuotaFileError("headroom", raw, f"a mapping with some of {_words(_HEADROOM_KEYS)}")
    _known_keys(raw, _HEADROOM_KEYS, "headroom")
    share = _share(raw.get("share", DEFAULT_HEADROOM_SHARE), "headroom.share")
    pools = raw.get("pools", {})
    if not isinstance(pools, Mapping):
        raise QuotaFileError("headroom.pools", pools, "a mapping of node pool to share, such as {a100: 0.1}")
    shares = tuple(
        sorted(
            (_name(pool, "headroom.pools"), _share(value, f"headroom.pools.{pool}"))
            for pool, value in pools.items()
        )
    )
    lend = raw.get("lend_to_preemptible", False)
    if not isinstance(lend, bool):
        raise QuotaFileError("headroom.lend_to_preemptible", lend, "true or false")
    urgent = raw.get("urgent_priority")
    if urgent is not None and (isinstance(urgent, bool) or not isinstance(urgent, int)):
        raise QuotaFileError("headroom.urgent_priority", urgent, "a whole number (a priority, such as 100)")
    return Headroom(share, shares, lend, urgent)


def _share(value: Any, where: str) -> int:
    """Return a share from 0 to 1 as per mille."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= 1
    ):
        raise QuotaFileError(where, value, "a share from 0 to 1, such as 0.2 (0: no headroom)")
    milli = round(value * 1000)
    if abs(milli - value * 1000) > 1e-6:
        raise QuotaFileError(where, value, "a share to at most three decimals")
    return milli


def _team(entry: Any, where: str) -> tuple[str, str | None, list[Any]]:
    if not isinstance(entry, Mapping):
        raise QuotaFileError(where, entry, "a mapping with name, quotas and an optional cohort")
    _known_keys(entry, _TEAM_KEYS, where)
    name = _name(entry.get("name"), f"{where}.name")
    cohort = None if entry.get("cohort") is None else _name(entry.get("cohort"), f"{where}.cohort", team=name)
    entries = entry.get("quotas")
    if not isinstance(entries, list) or not entries:
        raise QuotaFileError(
            f"{where}.quotas", entries, "a non-empty list of mappings with flavor and nominal", team=name
        )
    return name, cohort, entries


def _quota(raw: Any, team: str, cohort: str | None, where: str) -> TeamQuota:
    if not isinstance(raw, Mapping):
        raise QuotaFileError(where, raw, "a mapping with flavor and nominal", team=team)
    _known_keys(raw, _QUOTA_KEYS, where, team=team)
    nominal = _milli(raw.get("nominal"), f"{where}.nominal", team, required=True)
    assert nominal is not None
    borrowing = _milli(raw.get("borrowing_limit"), f"{where}.borrowing_limit", team)
    lending = _milli(raw.get("lending_limit"), f"{where}.lending_limit", team)
    if lending is not None and lending > nominal:
        raise QuotaFileError(
            f"{where}.lending_limit",
            lending / 1000,
            f"a number of GPUs at most the nominal quota ({nominal / 1000:g} GPUs)",
            team=team,
        )
    if cohort is None and (borrowing or lending):
        field = "borrowing_limit" if borrowing else "lending_limit"
        raise QuotaFileError(
            f"{where}.{field}",
            (borrowing or lending or 0) / 1000,
            "no limit for a team without a cohort (only cohorts lend and borrow: give the team a cohort)",
            team=team,
        )
    flavor = _flavor(raw.get("flavor"), f"{where}.flavor", team)
    return TeamQuota(team, flavor, nominal, cohort, borrowing, lending, path=where)


def _flavor(value: Any, where: str, team: str) -> Flavor:
    if not isinstance(value, Mapping) or len(value) != 1 or next(iter(value)) not in _FLAVOR_KINDS:
        raise QuotaFileError(where, value, "a mapping of one key, {pool: NAME} or {model: NAME}", team=team)
    kind, name = next(iter(value.items()))
    return Flavor(str(kind), _name(name, f"{where}.{kind}", team=team))


def _name(value: Any, where: str, *, team: str | None = None) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_NAME or value != value.strip():
        raise QuotaFileError(
            where, value, f"a name of 1 to {_MAX_NAME} characters, no surrounding spaces", team=team
        )
    return value


def _milli(value: Any, where: str, team: str, *, required: bool = False) -> int | None:
    """Return GPUs as milli-GPU; None when absent (and not required)."""
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise QuotaFileError(
            where, value, "a number of GPUs, 0 or more (fractions allowed, such as 0.25)", team=team
        )
    milli = round(value * 1000)
    if abs(milli - value * 1000) > 1e-6:
        raise QuotaFileError(
            where, value, "a number of GPUs to at most three decimals (milli-GPU)", team=team
        )
    return milli


def _known_keys(
    entry: Mapping[Any, Any], allowed: frozenset[str], where: str, *, team: str | None = None
) -> None:
    """Refuse the first key ``entry`` may not have, named by its YAML path."""
    for key in sorted(set(entry) - allowed, key=str):
        path = f"{where}.{key}" if where else str(key)
        raise QuotaFileError(path, key, f"a key among {_words(allowed)}", team=team)


def _words(keys: frozenset[str]) -> str:
    return ", ".join(sorted(keys))


def _gpus(milli: int | None) -> float | None:
    return None if milli is None else milli / 1000
