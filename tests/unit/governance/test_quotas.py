"""Quota files: what parses, and the typed error every malformed entry gets (pure, no ledger)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_gpupool.exceptions import QuotaFileError
from airflow_gpupool.governance.quotas import Flavor, TeamQuota, gpu_milli_of_mig, parse_quota_file


def team(name: str = "vision", *quotas: dict[str, Any], cohort: str | None = "research") -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "quotas": list(quotas) or [{"flavor": {"pool": "a100"}, "nominal": 4}],
    }
    if cohort is not None:
        entry["cohort"] = cohort
    return entry


def test_a_file_parses_into_sorted_quotas_in_milli_gpu() -> None:
    plan = parse_quota_file(
        {
            "teams": [
                team(
                    "vision",
                    {"flavor": {"pool": "a100"}, "nominal": 4, "borrowing_limit": 2, "lending_limit": 1},
                ),
                team(
                    "nlp",
                    {"flavor": {"model": "Tesla-T4"}, "nominal": 0.25},
                    {"flavor": {"pool": "a100"}, "nominal": 2},
                ),
                team("solo", {"flavor": {"pool": "a100"}, "nominal": 1}, cohort=None),
            ]
        }
    )
    assert plan.teams == ("nlp", "solo", "vision")
    assert plan.quotas == (
        TeamQuota("nlp", Flavor("model", "Tesla-T4"), 250, "research"),
        TeamQuota("nlp", Flavor("pool", "a100"), 2000, "research"),
        TeamQuota("solo", Flavor("pool", "a100"), 1000, None),
        TeamQuota("vision", Flavor("pool", "a100"), 4000, "research", 2000, 1000),
    )
    assert plan.flavors == {Flavor("model", "Tesla-T4"), Flavor("pool", "a100")}
    assert plan.quotas[-1].to_dict() == {
        "team": "vision",
        "cohort": "research",
        "flavor": "pool:a100",
        "nominal": 4.0,
        "borrowing_limit": 2.0,
        "lending_limit": 1.0,
    }


@pytest.mark.parametrize(
    ("document", "field"),
    [
        pytest.param([], "quota file", id="not-a-mapping"),
        pytest.param({"teams": [team()], "extra": 1}, "quota file", id="unknown-top-key"),
        pytest.param({"teams": []}, "teams", id="no-teams"),
        pytest.param({"teams": ["vision"]}, "teams[0]", id="team-not-a-mapping"),
        pytest.param(
            {"teams": [{**team(), "colour": "red"}]}, "teams[0]: unknown key", id="unknown-team-key"
        ),
        pytest.param({"teams": [{**team(), "name": ""}]}, "teams[0].name", id="empty-name"),
        pytest.param({"teams": [{**team(), "name": None}]}, "teams[0].name", id="null-name"),
        pytest.param({"teams": [{**team(), "name": " vision"}]}, "teams[0].name", id="spaces-in-name"),
        pytest.param({"teams": [team(), team()]}, "teams[1].name", id="team-twice"),
        pytest.param({"teams": [{**team(), "quotas": []}]}, "teams[0].quotas", id="no-quotas"),
        pytest.param(
            {"teams": [team("v", {"nominal": 1})]}, "teams[0].quotas[0] (team v).flavor", id="no-flavor"
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"zone": "a"}, "nominal": 1})]},
            "teams[0].quotas[0] (team v).flavor",
            id="unknown-flavor-kind",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a", "model": "b"}, "nominal": 1})]},
            "teams[0].quotas[0] (team v).flavor",
            id="two-flavor-kinds",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}})]},
            "teams[0].quotas[0] (team v).nominal",
            id="no-nominal",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": -1})]},
            "teams[0].quotas[0] (team v).nominal",
            id="negative",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": float("nan")})]},
            "teams[0].quotas[0] (team v).nominal",
            id="nan",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": float("inf")})]},
            "teams[0].quotas[0] (team v).nominal",
            id="inf",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": "4"})]},
            "teams[0].quotas[0] (team v).nominal",
            id="string",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": True})]},
            "teams[0].quotas[0] (team v).nominal",
            id="bool",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": 0.0001})]},
            "teams[0].quotas[0] (team v).nominal",
            id="below-a-milli",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": 2, "lending_limit": 3})]},
            "teams[0].quotas[0] (team v).lending_limit",
            id="lending-above-nominal",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": 2, "borrowing_limit": -1})]},
            "teams[0].quotas[0] (team v).borrowing_limit",
            id="negative-borrowing",
        ),
        pytest.param(
            {
                "teams": [
                    team("v", {"flavor": {"pool": "a"}, "nominal": 2, "borrowing_limit": 1}, cohort=None)
                ]
            },
            "teams[0].quotas[0] (team v): borrowing_limit/lending_limit",
            id="borrowing-without-cohort",
        ),
        pytest.param(
            {
                "teams": [
                    team(
                        "v", {"flavor": {"pool": "a"}, "nominal": 1}, {"flavor": {"pool": "a"}, "nominal": 2}
                    )
                ]
            },
            "teams[0].quotas[1].flavor",
            id="flavor-twice",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": 1, "nominl": 2})]},
            "teams[0].quotas[0] (team v): unknown key",
            id="misspelt-key",
        ),
    ],
)
def test_each_malformed_entry_names_its_field(document: Any, field: str) -> None:
    with pytest.raises(QuotaFileError) as refused:
        parse_quota_file(document)
    assert refused.value.field == field
    assert "expected" in str(refused.value)


@pytest.mark.parametrize(
    ("profile", "model", "milli"),
    [
        ("1g.10gb", "NVIDIA-A100-SXM4-80GB", 143),
        ("3g.40gb", "NVIDIA-H100-80GB-HBM3", 429),
        ("7g.80gb", None, 1000),
        ("2g.12gb", "NVIDIA-A30", 500),
        ("4g.24gb", "NVIDIA-A30", 1000),
    ],
)
def test_a_mig_slice_counts_its_compute_share(profile: str, model: str | None, milli: int) -> None:
    assert gpu_milli_of_mig(profile, model) == milli


def test_flavor_text_round_trips_and_bad_text_is_refused() -> None:
    assert Flavor.parse(str(Flavor("model", "Tesla-T4"))) == Flavor("model", "Tesla-T4")
    for bad in ("a100", "zone:a", "pool:"):
        with pytest.raises(QuotaFileError):
            Flavor.parse(bad)


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10), st.floats(allow_nan=True), st.text(max_size=5)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "teams",
                    "name",
                    "cohort",
                    "quotas",
                    "flavor",
                    "pool",
                    "model",
                    "nominal",
                    "borrowing_limit",
                    "lending_limit",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@given(_values)
def test_any_document_parses_or_gets_a_quota_file_error(document: Any) -> None:
    try:
        plan = parse_quota_file(document)
    except QuotaFileError:
        return
    for quota in plan.quotas:  # accepted: every quota is valid
        assert quota.nominal_milli >= 0 and (quota.lending_limit_milli or 0) <= quota.nominal_milli
