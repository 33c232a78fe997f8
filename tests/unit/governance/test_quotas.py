"""Quota files: what parses, and the typed error every malformed entry gets (pure, no ledger)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_gpupool.exceptions import QuotaFileError
from airflow_gpupool.governance.quota_capacity import nominals_above_capacity
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
        pytest.param({"teams": [team()], "extra": 1}, "extra", id="unknown-top-key"),
        pytest.param({"teams": []}, "teams", id="no-teams"),
        pytest.param({"teams": ["vision"]}, "teams[0]", id="team-not-a-mapping"),
        pytest.param({"teams": [{**team(), "colour": "red"}]}, "teams[0].colour", id="unknown-team-key"),
        pytest.param({"teams": [{**team(), "name": ""}]}, "teams[0].name", id="empty-name"),
        pytest.param({"teams": [{**team(), "name": None}]}, "teams[0].name", id="null-name"),
        pytest.param({"teams": [{**team(), "name": " vision"}]}, "teams[0].name", id="spaces-in-name"),
        pytest.param({"teams": [team(), team()]}, "teams[1].name", id="team-twice"),
        pytest.param({"teams": [{**team(), "quotas": []}]}, "teams[0].quotas", id="no-quotas"),
        pytest.param({"teams": [team("v", {"nominal": 1})]}, "teams[0].quotas[0].flavor", id="no-flavor"),
        pytest.param(
            {"teams": [team("v", {"flavor": {"zone": "a"}, "nominal": 1})]},
            "teams[0].quotas[0].flavor",
            id="unknown-flavor-kind",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a", "model": "b"}, "nominal": 1})]},
            "teams[0].quotas[0].flavor",
            id="two-flavor-kinds",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}})]},
            "teams[0].quotas[0].nominal",
            id="no-nominal",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": -1})]},
            "teams[0].quotas[0].nominal",
            id="negative",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": float("nan")})]},
            "teams[0].quotas[0].nominal",
            id="nan",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": float("inf")})]},
            "teams[0].quotas[0].nominal",
            id="inf",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": "4"})]},
            "teams[0].quotas[0].nominal",
            id="string",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": True})]},
            "teams[0].quotas[0].nominal",
            id="bool",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": 0.0001})]},
            "teams[0].quotas[0].nominal",
            id="below-a-milli",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": 2, "lending_limit": 3})]},
            "teams[0].quotas[0].lending_limit",
            id="lending-above-nominal",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a"}, "nominal": 2, "borrowing_limit": -1})]},
            "teams[0].quotas[0].borrowing_limit",
            id="negative-borrowing",
        ),
        pytest.param(
            {
                "teams": [
                    team("v", {"flavor": {"pool": "a"}, "nominal": 2, "borrowing_limit": 1}, cohort=None)
                ]
            },
            "teams[0].quotas[0].borrowing_limit",
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
            "teams[0].quotas[0].nominl",
            id="misspelt-key",
        ),
    ],
)
def test_each_malformed_entry_names_its_field(document: Any, field: str) -> None:
    with pytest.raises(QuotaFileError) as refused:
        parse_quota_file(document)
    assert refused.value.field == field
    message = str(refused.value)
    assert field in message and "expected" in message and "; found " in message
    assert_plain_words(message)


#: What a YAML author should never read: Python's names for types and values (text the file
#: itself holds, quoted, may say anything).
PYTHON_WORDS = re.compile(r"\bNone\b|\bTrue\b|\bFalse\b|\b(list|dict|str|int|float|bool)\b(?! of)")
PYTHON_TYPES = re.compile(r"NoneType|<class|'(list|dict|str|int|float|bool|tuple)'")


def assert_plain_words(message: str) -> None:
    assert not PYTHON_TYPES.search(message), message
    assert not PYTHON_WORDS.search(re.sub(r"'[^']*'", "''", message)), message


@pytest.mark.parametrize(
    ("document", "says"),
    [
        # The cases: an empty file and a list at the top printed `'NoneType'` and `'list'`.
        pytest.param(
            None,
            "quota file: expected a mapping with teams and an optional headroom; found nothing",
            id="empty",
        ),
        pytest.param([{"name": "v"}], "found a list of 1 item(s)", id="list"),
        pytest.param(
            {"teams": {"v": 1}},
            "quota file teams: expected a non-empty list of teams; found a mapping (v)",
            id="teams-mapping",
        ),
        pytest.param(
            {"teams": [team(), team("nlp", {"flavor": {"pool": "a100"}, "nominal": None})]},
            "quota file teams[1].quotas[0].nominal (team nlp): expected a number of GPUs, 0 or more",
            id="null-nominal",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": {"pool": "a100"}, "nominal": True})]},
            "found true (a yes/no value)",
            id="yes-nominal",
        ),
        pytest.param(
            {"teams": [team("v", {"flavor": "a100", "nominal": 1})]},
            "teams[0].quotas[0].flavor (team v): expected a mapping of one key, {pool: NAME} or {model: NAME}; "
            "found the text 'a100'",
            id="flavor-text",
        ),
        pytest.param(
            {"teams": [team()], "headroom": [0.2]},
            "quota file headroom: expected a mapping with some of",
            id="headroom-list",
        ),
    ],
)
def test_errors_say_what_was_expected_and_found_in_words(document: Any, says: str) -> None:
    with pytest.raises(QuotaFileError) as refused:
        parse_quota_file(document)
    assert says in str(refused.value)
    assert_plain_words(str(refused.value))


def test_a_nominal_above_its_flavor_is_named_with_both_numbers() -> None:
    plan = parse_quota_file({"teams": [team("v", {"flavor": {"pool": "a100"}, "nominal": 1000})]})
    a100 = Flavor("pool", "a100")

    (oversized,) = nominals_above_capacity(plan, {a100: 8000})

    assert str(oversized) == (
        "team v's nominal quota of 1000 GPUs on pool:a100 (teams[0].quotas[0].nominal) is above "
        "the 8 GPUs that pool holds in the ledger's inventory"
    )
    assert oversized.error().field == "teams[0].quotas[0].nominal"
    assert "at most the 8 GPUs pool:a100 holds" in str(oversized.error())
    assert nominals_above_capacity(plan, {a100: 1_000_000}) == ()  # exactly the flavor: fine


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
    except QuotaFileError as e:
        assert_plain_words(str(e))
        return
    for quota in plan.quotas:  # accepted: every quota is valid
        assert quota.nominal_milli >= 0 and (quota.lending_limit_milli or 0) <= quota.nominal_milli
