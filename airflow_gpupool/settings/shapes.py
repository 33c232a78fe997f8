"""The ``[gpupool] typical_shapes`` items, checked: ``cpu_milli:gpu_milli:gpus[:model|model]=weight``.

Pure: :func:`airflow_gpupool.settings.typical_shapes` reads the option and splits it into items;
each is checked here, and a shape listed twice is refused.
"""

from __future__ import annotations

import math

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.resources import MILLI_PER_GPU

__all__ = ["SHAPE_EXAMPLE", "SHAPE_FORM", "ShapeSetting", "shape_settings"]

#: One typical shape as configured: ``(cpu_milli, gpu_milli per GPU, gpus, models, weight)``,
#: the fields of :class:`~airflow_gpupool.placement.frag.TypicalShape` in order.
ShapeSetting = tuple[int, int, int, frozenset[str], float]

SHAPE_FORM = "cpu_milli:gpu_milli:gpus[:model|model]=weight"
SHAPE_EXAMPLE = "4000:500:1=3,8000:1000:1=2,32000:1000:8:A100=1"


def shape_settings(items: dict[str, str], where: str) -> tuple[ShapeSetting, ...]:
    """Return the shapes of ``typical_shapes`` items (``key=weight``), in order.

    :param items: the items, each key ``cpu_milli:gpu_milli:gpus[:model|model]`` and its weight
    :param where: the option, as the errors name it
    :raises ConfigurationError: an item is malformed, or a shape is listed twice
    """
    out: dict[tuple[int, int, int, frozenset[str]], ShapeSetting] = {}
    for key, weight in items.items():
        shape = _shape_setting(key, weight, where)
        if shape[:4] in out:
            raise ConfigurationError(f"{where} lists the shape {key!r} twice")
        out[shape[:4]] = shape
    return tuple(out.values())


def _shape_setting(key: str, weight: str, where: str) -> ShapeSetting:
    item = f"{key}={weight}"
    parts = [p.strip() for p in key.split(":")]
    try:
        if len(parts) not in (3, 4):
            raise ValueError(f"expected '{SHAPE_FORM}'")
        try:
            cpu, milli, gpus = (int(p) for p in parts[:3])
            share = float(weight)
        except ValueError:
            raise ValueError("cpu_milli, gpu_milli and gpus must be integers, the weight a number") from None
        models = frozenset(m.strip() for m in parts[3].split("|")) if len(parts) == 4 else frozenset()
        _check_shape(cpu, milli, gpus, models, share)
    except ValueError as e:
        raise ConfigurationError(f"{where} item {item!r}: {e} (example: {SHAPE_EXAMPLE!r})") from None
    return (cpu, milli, gpus, models, share)


def _check_shape(cpu: int, milli: int, gpus: int, models: frozenset[str], weight: float) -> None:
    if cpu < 0 or gpus < 0:
        raise ValueError("cpu_milli and gpus must be >= 0")
    if (
        (gpus == 0) != (milli == 0)
        or not 0 <= milli <= MILLI_PER_GPU
        or (gpus > 1 and milli != MILLI_PER_GPU)
    ):
        raise ValueError("gpu_milli must be 1-1000 with 1 GPU, 1000 with more, 0 with none")
    if "" in models:
        raise ValueError("a GPU model is empty")
    if not (weight > 0 and math.isfinite(weight)):
        raise ValueError("the weight must be a positive number")
