"""A pod group's gang annotations, read and checked (pure): ``gpupool.io/gang`` and its companions.

A pod annotated ``gpupool.io/gang: NAME`` and ``gpupool.io/gang-size: N`` (optionally
``gpupool.io/gang-min: M`` and ``gpupool.io/gang-topology: key1,key2``) is one member of the pod
group ``NAME`` of its namespace: the gatekeeper reserves the group as one gang and admits its pods
together. The executor hook checks the annotations when it gates the pod (a malformed one refuses
the pod); the gatekeeper reads them again to group the pods. Below both, so both read them alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from airflow_gpupool.exceptions import InvalidGangError
from airflow_gpupool.labels import (
    GANG_ANNOTATION,
    GANG_MIN_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GANG_TOPOLOGY_ANNOTATION,
)
from airflow_gpupool.resources import MAX_GANG_MEMBERS, GangSpec

__all__ = ["PodGang", "pod_gang"]

#: A group name: what a label value may be (it names the group in Events and logs), not empty.
_GROUP_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_MAX_NAME = 63


@dataclass(frozen=True)
class PodGang:
    """What one pod says about its group.

    :param name: the group's name (per namespace)
    :param size: its most members (``gpupool.io/gang-size``)
    :param min_members: its elastic minimum (``gpupool.io/gang-min``; the size when absent)
    :param topology_keys: the label keys its members should share; None when the pod names none
        (``[gpupool] gang_topology_keys`` applies)
    """

    name: str
    size: int
    min_members: int
    topology_keys: tuple[str, ...] | None

    def spec(self, default_topology_keys: tuple[str, ...]) -> GangSpec:
        """Return the gang these annotations ask for.

        :param default_topology_keys: the keys when the pod names none
        """
        keys = default_topology_keys if self.topology_keys is None else self.topology_keys
        return GangSpec(members=self.size, min_members=self.min_members, topology_keys=keys)


def _count(annotation: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidGangError(annotation, text, f"an integer from 1 to {MAX_GANG_MEMBERS}") from None
    if not 1 <= value <= MAX_GANG_MEMBERS:
        raise InvalidGangError(annotation, text, f"an integer from 1 to {MAX_GANG_MEMBERS}")
    return value


def pod_gang(annotations: Mapping[str, str]) -> PodGang | None:
    """Return the group a pod's annotations put it in, or None when they name none.

    :param annotations: the pod's annotations
    :raises InvalidGangError: a malformed name, size, minimum (not ``1 <= min <= size <= 512``)
        or topology key, or a companion annotation without ``gpupool.io/gang``
    """
    name = annotations.get(GANG_ANNOTATION)
    if name is None:
        stray = [a for a in (GANG_SIZE_ANNOTATION, GANG_MIN_ANNOTATION) if a in annotations]
        if stray:
            raise InvalidGangError(stray[0], annotations[stray[0]], f"a pod that also sets {GANG_ANNOTATION}")
        return None
    if not _GROUP_NAME.match(name) or len(name) > _MAX_NAME:
        raise InvalidGangError(
            GANG_ANNOTATION, name, f"a group name (a label value of 1 to {_MAX_NAME} characters)"
        )
    if GANG_SIZE_ANNOTATION not in annotations:
        raise InvalidGangError(GANG_SIZE_ANNOTATION, None, f"the group's size, beside {GANG_ANNOTATION}")
    size = _count(GANG_SIZE_ANNOTATION, annotations[GANG_SIZE_ANNOTATION])
    minimum = _count(GANG_MIN_ANNOTATION, annotations.get(GANG_MIN_ANNOTATION, str(size)))
    if minimum > size:
        raise InvalidGangError(
            GANG_MIN_ANNOTATION, annotations[GANG_MIN_ANNOTATION], f"at most {GANG_SIZE_ANNOTATION} ({size})"
        )
    keys = None
    if GANG_TOPOLOGY_ANNOTATION in annotations:
        keys = tuple(k.strip() for k in annotations[GANG_TOPOLOGY_ANNOTATION].split(",") if k.strip())
    found = PodGang(name, size, minimum, keys)
    try:
        found.spec(())  # the keys are checked as the gang will check them
    except InvalidGangError as e:
        raise InvalidGangError(GANG_TOPOLOGY_ANNOTATION, e.value, e.expected) from None
    return found
