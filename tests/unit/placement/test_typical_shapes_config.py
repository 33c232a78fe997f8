"""``[gpupool] typical_shapes``: parsed once, the same for every worker, never learned from requests."""

from __future__ import annotations

import pytest

from airflow_gpupool import settings
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.placement import Assignment, ClusterSnapshot, GpuState, NodeState, TypicalShape
from airflow_gpupool.placement.frag import DEFAULT_SHAPES
from airflow_gpupool.placement.policy import DEFAULT_POLICY, configured_shapes, get_policy
from airflow_gpupool.resources import GpuRequest

ENV = "AIRFLOW__GPUPOOL__TYPICAL_SHAPES"


@pytest.fixture
def shapes_option(monkeypatch: pytest.MonkeyPatch):
    def set_(value: str) -> None:
        monkeypatch.setenv(ENV, value)

    set_("")
    return set_


def node(name: str, free: tuple[int, ...], cpu: int = 64000, model: str = "A100") -> NodeState:
    gpus = tuple(
        GpuState(i, model, 40960, free_milli=f, free_memory_mib=40960 * f // 1000) for i, f in enumerate(free)
    )
    return NodeState(name, cpu, 262144, gpus, cpu_free=cpu)


def test_parses_the_documented_format(shapes_option) -> None:
    shapes_option(" 4000:500:1=3, 8000:1000:1=2 ,32000:1000:8:A100|H100=1,2000:0:0=0.5 ")
    assert settings.typical_shapes() == (
        (4000, 500, 1, frozenset(), 3.0),
        (8000, 1000, 1, frozenset(), 2.0),
        (32000, 1000, 8, frozenset({"A100", "H100"}), 1.0),
        (2000, 0, 0, frozenset(), 0.5),
    )
    assert configured_shapes() == (
        TypicalShape(4000, 500, 1, frozenset(), 3 / 6.5),
        TypicalShape(8000, 1000, 1, frozenset(), 2 / 6.5),
        TypicalShape(32000, 1000, 8, frozenset({"A100", "H100"}), 1 / 6.5),
        TypicalShape(2000, 0, 0, frozenset(), 0.5 / 6.5),
    )


def test_empty_means_the_built_in_shapes(shapes_option) -> None:
    assert settings.typical_shapes() == ()
    assert configured_shapes() == DEFAULT_SHAPES
    assert settings.DEFAULTS["typical_shapes"] == ""


# (id, value, words the error must contain)
MALFORMED = [
    ("no-weight", "1000:250:1", "cpu_milli:gpu_milli:gpus"),
    ("too-few-parts", "1000:250=1", "expected 'cpu_milli:gpu_milli:gpus[:model|model]=weight'"),
    ("too-many-parts", "1000:250:1:A100:x=1", "expected"),
    ("not-an-integer", "1000:0.5:1=1", "integers"),
    ("weight-not-a-number", "1000:250:1=lots", "the weight a number"),
    ("weight-zero", "1000:250:1=0", "positive"),
    ("weight-infinite", "1000:250:1=inf", "positive"),
    ("negative-cpu", "-1:250:1=1", ">= 0"),
    ("fraction-of-several", "1000:500:2=1", "gpu_milli must be"),
    ("gpu-milli-without-gpus", "1000:500:0=1", "gpu_milli must be"),
    ("gpus-without-milli", "1000:0:1=1", "gpu_milli must be"),
    ("more-than-a-gpu", "1000:1500:1=1", "gpu_milli must be"),
    ("empty-model", "1000:250:1:A100|=1", "model is empty"),
    ("twice", "1000:250:1=1,1000 :250:1=2", "twice"),
]


@pytest.mark.parametrize(("value", "words"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_values_fail_loudly(shapes_option, value: str, words: str) -> None:
    shapes_option(value)
    with pytest.raises(ConfigurationError, match="typical_shapes") as failure:
        settings.typical_shapes()
    assert words in str(failure.value)
    with pytest.raises(ConfigurationError):
        get_policy(DEFAULT_POLICY)


def test_the_ledgers_call_gets_the_configured_shapes(shapes_option) -> None:
    # The ledger builds its policy with get_policy(name) alone.
    shapes_option("4000:500:1=1,8000:1000:2=1")
    for name in ("gpupool", "fgd"):
        policy = get_policy(name)
        assert {(s.cpu_milli, s.gpu_milli, s.gpus) for s in policy.frag.shapes} == {
            (4000, 500, 1),
            (8000, 1000, 2),
        }  # type: ignore[attr-defined]
    explicit = (TypicalShape(1000, 250, 1),)
    assert get_policy("fgd", typical_shapes=explicit).frag.shapes == explicit  # type: ignore[attr-defined]


PROBE = ClusterSnapshot(
    (
        node("a", (1000, 1000, 600, 250)),
        node("b", (1000, 500, 500, 0)),
        node("c", (750, 750, 1000, 1000), cpu=12000),
        node("d", (1000,) * 8),
        node("e", (300, 1000)),
    )
)
PROBES = [GpuRequest(gpu_milli=m, cpu_milli=c) for m, c in ((250, 1000), (500, 4000), (750, 2000))] + [
    GpuRequest(gpus=g, cpu_milli=4000) for g in (1, 2)
]


def worker(name: str, seen: GpuRequest) -> list[tuple[str, tuple[int, ...], float]]:
    """Build a policy as a worker's ledger does, place 200 requests of one shape, then score the probes."""
    policy = get_policy(name)
    busy = ClusterSnapshot(tuple(node(f"w{i}", (1000,) * 8) for i in range(30)))
    for _ in range(200):
        assert isinstance(policy.place(busy, seen), Assignment)
    out = []
    for request in PROBES:
        verdict = policy.place(PROBE, request)
        assert isinstance(verdict, Assignment)
        out.append((verdict.node, verdict.gpu_indices, verdict.score))
    return out


@pytest.mark.parametrize("option", ["", "4000:500:1=3,8000:1000:1=2,32000:1000:8=1"])
@pytest.mark.parametrize("name", ["gpupool", "fgd"])
def test_two_workers_score_a_cluster_alike_whatever_they_placed(
    shapes_option, option: str, name: str
) -> None:
    shapes_option(option)
    fractions = worker(name, GpuRequest(gpu_milli=250, cpu_milli=1000))
    whole = worker(name, GpuRequest(gpus=4, cpu_milli=16000))
    assert fractions == whole
