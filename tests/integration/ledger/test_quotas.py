"""Team quotas in the ledger, on SQLite and PostgreSQL: apply (idempotent, all or nothing), list, usage;
and ``gpupool quota`` end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_gpupool import settings
from airflow_gpupool.cli import main
from airflow_gpupool.exceptions import QuotaFileError
from airflow_gpupool.governance.quotas import Flavor, Headroom, QuotaPlan, parse_quota_file
from airflow_gpupool.ledger import Ledger, LedgerQuotas
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

A100 = "NVIDIA-A100-SXM4-80GB"
FILE = """
teams:
  - name: vision
    cohort: research
    quotas:
      - flavor: {pool: a100}
        nominal: 4
        borrowing_limit: 2
        lending_limit: 1
  - name: nlp
    cohort: research
    quotas:
      - flavor: {model: NVIDIA-A100-SXM4-80GB}
        nominal: 2.5
"""


@pytest.fixture
def pool(ledger: Ledger) -> Ledger:
    ledger.upsert_nodes(
        [
            node("a1", gpus=8, model=A100, pool="a100"),
            node("m1", gpus=1, model=A100, mig={0: ["3g.40gb", "3g.40gb", "1g.10gb"]}, pool="a100-mig"),
        ]
    )
    return ledger


def plan(text: str = FILE) -> object:
    import yaml

    return parse_quota_file(yaml.safe_load(text))


def stored(text: str = FILE) -> QuotaPlan:
    """The plan as the ledger keeps it: the headroom's urgent priority fixed when applied."""
    applied = plan(text)
    assert isinstance(applied, QuotaPlan)
    return replace(applied, headroom=replace(applied.headroom, urgent_priority=settings.urgent_priority()))


def test_apply_is_idempotent_and_replaces_the_quotas_as_a_whole(pool: Ledger) -> None:
    quotas = LedgerQuotas(pool)
    first = quotas.apply(plan())  # type: ignore[arg-type]
    assert (first.added, first.changed, first.removed) == (
        (f"nlp model:{A100}", "vision pool:a100"),
        (),
        (),
    )
    assert first.headroom_changed  # the default: 20 % of every pool
    again = quotas.apply(plan())  # type: ignore[arg-type]
    assert again.summary() == "0 added, 0 changed, 0 removed" and not again.headroom_changed
    assert quotas.list() == stored()

    smaller = FILE.replace("nominal: 4", "nominal: 3").split("  - name: nlp")[0]
    preview = quotas.apply(plan(smaller), dry_run=True)  # type: ignore[arg-type]
    assert (preview.changed, preview.removed) == (("vision pool:a100",), (f"nlp model:{A100}",))
    assert quotas.list() == stored()  # a dry run writes nothing
    quotas.apply(plan(smaller))  # type: ignore[arg-type]
    (vision,) = quotas.list().quotas
    assert (vision.team, vision.nominal_milli) == ("vision", 3000)


def test_a_flavor_the_ledger_lacks_is_refused_and_nothing_changes(pool: Ledger) -> None:
    quotas = LedgerQuotas(pool)
    quotas.apply(plan())  # type: ignore[arg-type]
    refused = (
        r"quota file teams\[0\]\.quotas\[0\]\.flavor\.pool \(team vision\): expected a pool of the "
        r"ledger's inventory \(a100, a100-mig\); found the text 'h100'"
    )
    with pytest.raises(QuotaFileError, match=refused):
        quotas.apply(plan(FILE.replace("{pool: a100}", "{pool: h100}")))  # type: ignore[arg-type]
    with pytest.raises(QuotaFileError, match=r"headroom.pools.h100.*a100, a100-mig"):
        quotas.apply(plan("headroom: {pools: {h100: 0.5}}\n" + FILE))  # type: ignore[arg-type]
    assert quotas.list() == stored()


def test_usage_counts_whole_fractional_and_mig_grants_per_team_and_flavor(pool: Ledger) -> None:
    pool.reserve(GpuRequest(gpus=2, team="vision"), "h", reservation_id="gp-1")
    pool.reserve(
        GpuRequest(gpus=0, gpu_milli=250, gpu_memory_mib=1024, team="vision"), "h", reservation_id="gp-2"
    )
    pool.reserve(GpuRequest(mig_profile="3g.40gb", team="nlp"), "h", reservation_id="gp-3")
    used = LedgerQuotas(pool).usage()
    assert used[("vision", Flavor("pool", "a100"))] == 2250
    assert used[("vision", Flavor("model", A100))] == 2250
    assert used[("nlp", Flavor("pool", "a100-mig"))] == 429  # 3 of the A100's 7 compute slices
    pool.release("gp-1")
    assert LedgerQuotas(pool).usage()[("vision", Flavor("pool", "a100"))] == 250


def test_quota_cli_applies_lists_and_refuses_bad_files(
    pool: Ledger, ledger_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "quotas.yaml"
    good.write_text(FILE)
    assert main(["quota", "apply", str(good), "--url", ledger_url]) == 0
    assert "quotas applied: 2 added, 0 changed, 0 removed" in capsys.readouterr().out
    pool.reserve(GpuRequest(gpus=1, team="vision"), "h", reservation_id="gp-1")

    assert main(["quota", "list", "--url", ledger_url, "--json"]) == 0
    rows = {r["team"]: r for r in json.loads(capsys.readouterr().out)["quotas"]}
    assert rows["vision"] == {
        "team": "vision",
        "cohort": "research",
        "flavor": "pool:a100",
        "nominal": 4.0,
        "borrowing_limit": 2.0,
        "lending_limit": 1.0,
        "used": 1.0,
    }
    assert main(["quota", "list", "--url", ledger_url]) == 0
    assert "vision  research  pool:a100" in capsys.readouterr().out

    bad = tmp_path / "bad.yaml"
    for text, message in (
        ("teams: [", "valid YAML"),
        (FILE.replace("lending_limit: 1", "lending_limit: 9"), "lending_limit"),
        (FILE.replace("{pool: a100}", "{pool: nowhere}"), "teams[0].quotas[0].flavor.pool (team vision)"),
    ):
        bad.write_text(text)
        assert main(["quota", "apply", str(bad), "--url", ledger_url]) == 2
        assert message in capsys.readouterr().err
    assert main(["quota", "apply", str(tmp_path / "missing.yaml"), "--url", ledger_url]) == 2
    assert "a readable file" in capsys.readouterr().err
    assert LedgerQuotas(pool).list() == stored()  # nothing refused was written


def test_the_headroom_is_applied_changed_and_turned_off_with_the_quotas(
    pool: Ledger, ledger_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text(
        "headroom: {share: 0.25, pools: {a100-mig: 0}, lend_to_preemptible: true, urgent_priority: 50}\n"
        + FILE
    )
    assert main(["quota", "apply", str(path), "--url", ledger_url]) == 0
    out = capsys.readouterr().out
    assert (
        "headroom 25 % of every pool (a100-mig: 0 %) for urgent work (priority >= 50 or inference), lent to preemptible work"
        in out
    )
    assert LedgerQuotas(pool).list().headroom == Headroom(250, (("a100-mig", 0),), True, 50)
    assert main(["quota", "list", "--url", ledger_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["headroom"] == {
        "share": 0.25,
        "pools": {"a100-mig": 0.0},
        "lend_to_preemptible": True,
        "urgent_priority": 50,
    }
    path.write_text("headroom: {share: 0}\n" + FILE)
    assert main(["quota", "apply", str(path), "--url", ledger_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["headroom_changed"] is True
    assert LedgerQuotas(pool).list().headroom == Headroom()  # share 0: none stored
    assert main(["quota", "list", "--url", ledger_url]) == 0
    assert "headroom: none" in capsys.readouterr().out


def test_a_nominal_above_the_pool_is_applied_with_a_warning_and_refused_with_strict(
    pool: Ledger, ledger_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text(FILE)
    assert main(["quota", "apply", str(path), "--url", ledger_url]) == 0
    assert "warning" not in capsys.readouterr().err  # 4 and 2.5 GPUs fit the 8 the flavors hold
    before = LedgerQuotas(pool).list()

    path.write_text(FILE.replace("nominal: 4", "nominal: 1000"))
    assert main(["quota", "apply", str(path), "--url", ledger_url, "--strict"]) == 2
    err = capsys.readouterr().err
    assert "quota file teams[0].quotas[0].nominal (team vision)" in err
    assert "at most the 8 GPUs pool:a100 holds" in err and "found the number 1000" in err
    assert LedgerQuotas(pool).list() == before  # refused before anything is written

    assert main(["quota", "apply", str(path), "--url", ledger_url, "--json"]) == 0
    captured = capsys.readouterr()
    warning = (
        "team vision's nominal quota of 1000 GPUs on pool:a100 (teams[0].quotas[0].nominal) is above "
        "the 8 GPUs that pool holds in the ledger's inventory"
    )
    assert f"gpupool: warning: {warning}" in captured.err
    # The headroom's own warning follows: 1000 GPUs of nominal leave no room for urgent work.
    nominal, headroom = json.loads(captured.out)["warnings"]
    assert nominal == warning and headroom.startswith("pool a100: nominal quotas add up to 1000 GPUs")
    assert {q.team: q.nominal_milli for q in LedgerQuotas(pool).list().quotas}["vision"] == 1_000_000


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param(
            "",
            "quota file: expected a mapping with teams and an optional headroom; found nothing",
            id="empty",
        ),
        pytest.param("- vision\n", "found a list of 1 item(s)", id="list"),
        pytest.param(
            FILE.replace("nominal: 2.5", "nominal: lots"),
            "quota file teams[1].quotas[0].nominal (team nlp): expected a number of GPUs",
            id="text-nominal",
        ),
        pytest.param(
            FILE.replace("nominal: 2.5", "nominal:"),
            "teams[1].quotas[0].nominal (team nlp): expected a number of GPUs, 0 or more (fractions allowed, "
            "such as 0.25); found nothing (null or empty)",
            id="null-nominal",
        ),
    ],
)
def test_a_refused_file_names_the_yaml_path_in_words_and_changes_nothing(
    pool: Ledger, ledger_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text(FILE)
    assert main(["quota", "apply", str(path), "--url", ledger_url]) == 0
    before = LedgerQuotas(pool).list()
    capsys.readouterr()

    path.write_text(text)
    assert main(["quota", "apply", str(path), "--url", ledger_url]) == 2

    err = capsys.readouterr().err
    assert says in err
    assert "NoneType" not in err and "'list'" not in err
    assert LedgerQuotas(pool).list() == before


def test_the_first_apply_prints_the_urgent_priority_as_a_number(
    pool: Ledger, ledger_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text("headroom: {share: 0.2}\n" + FILE)  # no urgent_priority: [gpupool] urgent_priority

    assert main(["quota", "apply", str(path), "--url", ledger_url]) == 0

    out = capsys.readouterr().out
    priority = settings.urgent_priority()
    assert f"headroom 20 % of every pool for urgent work (priority >= {priority} or inference)" in out
    assert "[gpupool]" not in out
    assert main(["quota", "list", "--url", ledger_url]) == 0
    assert f"(priority >= {priority} or inference)" in capsys.readouterr().out


def test_apply_warns_when_nominal_quotas_exceed_the_pool_less_its_headroom(
    pool: Ledger, ledger_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Pool a100 has 8 GPUs; with 25 % kept for urgent work, 6 are outside the headroom.
    path = tmp_path / "quotas.yaml"
    fits = "headroom: {share: 0.25}\nteams:\n  - {name: ml, quotas: [{flavor: {pool: a100}, nominal: 6}]}\n"
    path.write_text(fits)
    assert main(["quota", "apply", str(path), "--url", ledger_url]) == 0
    assert "warning" not in capsys.readouterr().out
    path.write_text(fits + "  - {name: ads, quotas: [{flavor: {pool: a100}, nominal: 2}]}\n")
    assert main(["quota", "apply", str(path), "--url", ledger_url]) == 0
    warning = (
        "pool a100: nominal quotas add up to 8 GPUs, above the 6 GPUs outside its 25% headroom:"
        " work that is not urgent may wait within its nominal"
    )
    assert f"  warning: {warning}\n" in capsys.readouterr().out
    assert [q.team for q in LedgerQuotas(pool).list().quotas] == ["ads", "ml"]  # applied all the same
    assert main(["quota", "apply", str(path), "--url", ledger_url, "--json", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == [warning]
