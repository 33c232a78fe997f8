"""The ``gpupool`` command against a real SQLite ledger, run in-process through ``main``."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_gpupool.cli import main
from tests.ledger_fixtures import POSTGRES_URL, require_postgres

INVENTORY = """
nodes:
  - name: gpu-a
    cpu: 32
    memory: 128Gi
    gpus:
      - {model: A100, memory: 80Gi, count: 2}
      - {model: A100, memory: 80Gi, mig: [3g.40gb, 3g.40gb]}
  - name: gpu-b
    cpu: 8
    memory: 64Gi
    gpus:
      - {model: T4, memory: 16Gi}
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def json_out(text: str) -> dict:
    """Parse the JSON object a ``--json`` command printed."""
    return json.loads(text)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


@pytest.fixture
def inventory_file(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return path


@pytest.fixture
def loaded(url: str, inventory_file: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert run(capsys, "inventory", "load", str(inventory_file), "--url", url)[0] == 0
    return url


def test_ledger_init_creates_then_reports_up_to_date(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "ledger", "init", "--url", url)
    assert code == 0
    assert out.startswith(f"ledger at {url}: applied schema v")

    code, out, _ = run(capsys, "ledger", "init", "--url", url)
    assert (code, out) == (0, f"ledger at {url}: already up to date\n")


def test_inventory_load_is_idempotent(
    url: str, inventory_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "inventory", "load", str(inventory_file), "--url", url)
    assert (code, out) == (0, f"inventory {inventory_file}: 2 added, 0 updated, 0 unchanged\n")

    code, out, _ = run(capsys, "inventory", "load", str(inventory_file), "--url", url)
    assert (code, out) == (0, f"inventory {inventory_file}: 0 added, 0 updated, 2 unchanged\n")


def test_inventory_load_prunes_nodes_absent_from_the_file(
    loaded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text("nodes: [{name: gpu-b, cpu: 8, memory: 64Gi, gpus: [{model: T4, memory: 16Gi}]}]")
    code, out, _ = run(capsys, "inventory", "load", str(smaller), "--prune", "--url", loaded)
    assert (code, out) == (
        0,
        f"inventory {smaller}: 0 added, 0 updated, 1 unchanged, pruned gpu-a (removed)\n",
    )


def test_status_table_shows_nodes_grants_and_queue(loaded: str, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "reserve", "--gpus", "2", "--holder", "trainer", "--id", "big-one", "--url", loaded)
    run(
        capsys,
        "reserve",
        "--gpus",
        "2",
        "--holder",
        "waiter",
        "--id",
        "queued-one",
        "--priority",
        "3",
        "--url",
        loaded,
    )

    code, out, _ = run(capsys, "status", "--url", loaded)

    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Nodes (2), GPU allocation 50.0%"
    assert lines[2].split()[:5] == ["gpu-a", "default", "healthy", "3", "0:0.00"]
    assert lines[2].split()[5:8] == ["1:0.00", "2:MIG", "2"]
    assert lines[3].split()[:5] == ["gpu-b", "default", "healthy", "1", "0:1.00"]
    grants = lines[lines.index("Grants (1)") + 2].split()
    assert grants[:6] == ["big-one", "trainer", "default", "2", "GPU", "gpu-a/0,1"]
    queue = lines[lines.index("Queue (1)") + 2].split()
    assert queue[:6] == ["1", "queued-one", "waiter", "3", "2", "GPU"]


def test_status_json_reports_allocation_and_grants(loaded: str, capsys: pytest.CaptureFixture[str]) -> None:
    run(
        capsys, "reserve", "--mig-profile", "3g.40gb", "--holder", "infer", "--id", "mig-one", "--url", loaded
    )
    run(capsys, "reserve", "--gpu-milli", "250", "--holder", "small", "--id", "frac-one", "--url", loaded)

    code, out, _ = run(capsys, "status", "--json", "--url", loaded)

    assert code == 0
    data = json_out(out)
    assert data["gpu_capacity_milli"] == 4000
    assert data["gpu_allocated_milli"] == 429 + 250
    assert data["allocation"] == pytest.approx(679 / 4000)
    assert [n["name"] for n in data["nodes"]] == ["gpu-a", "gpu-b"]
    grants = {g["id"]: g for g in data["grants"]}
    assert set(grants) == {"mig-one", "frac-one"}
    assert grants["mig-one"]["grant"]["mig_profile"] == "3g.40gb"
    assert grants["mig-one"]["grant"]["gpu_indices"] == [2]
    assert grants["frac-one"]["grant"]["milli_per_gpu"] == 250
    assert data["queue"] == []


def test_reserve_json_then_release_twice(loaded: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "reserve", "--gpus", "1", "--gpu-model", "T4", "--json", "--url", loaded)
    assert code == 0
    reservation = json_out(out)
    assert reservation["state"] == "granted"
    assert reservation["holder"] == "gpupool-cli"
    assert reservation["grant"]["node"] == "gpu-b"
    assert reservation["grant"]["gpu_uuids"] == ["GPU-gpu-b-0"]
    assert reservation["request"]["gpu_models"] == ["T4"]

    code, out, _ = run(capsys, "release", reservation["id"], "--url", loaded)
    assert (code, out) == (0, "granted reservation released: released from the gpupool CLI\n")
    code, out, _ = run(capsys, "release", reservation["id"], "--url", loaded)
    assert code == 0
    assert out.startswith("nothing to release: reservation released at ")


def test_reserve_without_id_makes_one_first_and_prints_it(
    loaded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "reserve", "--gpus", "1", "--json", "--url", loaded)
    assert code == 0
    made = json_out(out)["id"]
    assert err == f"gpupool: reservation id {made}\n"
    # Run again with the id it printed (a retry after a lost answer): the same grant, no second one.
    code, out, err = run(capsys, "reserve", "--gpus", "1", "--json", "--id", made, "--url", loaded)
    assert (code, err, json_out(out)["id"], json_out(out)["state"]) == (0, "", made, "granted")


def test_a_busy_ledger_is_a_clear_cli_error(
    loaded: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LOCK_TIMEOUT_SECONDS", "0.2")
    holder = sqlite3.connect(loaded.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock and does not let go
    try:
        code, _, err = run(capsys, "reap", "--url", loaded)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == 2
    assert err.startswith("gpupool: error: the GPU ledger is busy: its write lock was not free within 0.2 s")


def test_reserve_that_must_wait_prints_its_queue_position(
    loaded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, "reserve", "--gpus", "2", "--url", loaded)
    code, out, _ = run(capsys, "reserve", "--gpus", "2", "--id", "second", "--url", loaded)
    assert (code, out) == (0, "second waiting, position 1 in the queue\n")


def test_reap_reports_counts(loaded: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "reap", "--url", loaded)
    assert (code, out) == (0, "expired 0, timed out 0, granted 0\n")


def test_release_of_unknown_id_is_an_error(loaded: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "release", "no-such-id", "--url", loaded)
    assert (code, out) == (2, "")
    assert err == "gpupool: error: no reservation 'no-such-id' in the ledger\n"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        pytest.param("nodes: [name: n1", "expected valid YAML", id="malformed-yaml"),
        pytest.param(
            "nodes: [{name: n1, gpus: [{model: A100, mig: [9g.90gb]}]}]",
            # The MIG layout check names the list the profile is in (issue 12).
            "invalid nodes[0].gpus[0].mig='9g.90gb'",
            id="unknown-mig",
        ),
        pytest.param("nodes: []", "expected at least one node", id="empty-node-list"),
    ],
)
def test_bad_inventory_file_exits_2(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_text)
    code, out, err = run(capsys, "inventory", "load", str(bad), "--url", url)
    assert (code, out) == (2, "")
    assert err.startswith("gpupool: error: invalid ")
    assert message in err
    assert not Path(url.removeprefix("sqlite:///")).exists(), (
        "nothing is created for a file that does not parse"
    )


def test_unknown_mig_profile_in_reserve_exits_2(loaded: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "reserve", "--mig-profile", "9g.1gb", "--url", loaded)
    assert (code, out) == (2, "")
    assert err.startswith("gpupool: error: invalid mig_profile='9g.1gb': expected one of [")


def test_missing_ledger_says_how_to_create_it(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "status", "--url", url)
    assert code == 2
    assert (
        err == f"gpupool: error: no GPU ledger at {url}: create it with `gpupool ledger init --url {url}`\n"
    )


def test_url_precedence_flag_then_env_then_airflow_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    monkeypatch.delenv("AIRFLOW__GPUPOOL__LEDGER_URL", raising=False)
    env_url = f"sqlite:///{tmp_path}/from-env.db"
    flag_url = f"sqlite:///{tmp_path}/from-flag.db"
    monkeypatch.setenv("GPUPOOL_LEDGER_URL", env_url)

    assert run(capsys, "ledger", "init", "--url", flag_url)[1].startswith(f"ledger at {flag_url}: ")
    assert run(capsys, "ledger", "init")[1].startswith(f"ledger at {env_url}: ")
    monkeypatch.delenv("GPUPOOL_LEDGER_URL")
    default_url = f"sqlite:///{home / 'gpupool-ledger.db'}"
    assert run(capsys, "ledger", "init")[1].startswith(f"ledger at {default_url}: ")
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["from-env.db", "from-flag.db"]
    assert (home / "gpupool-ledger.db").exists()


def test_bench_ledger_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/b.db"
    code, out, _ = run(
        capsys, "bench", "ledger", "--url", url, "--clients", "2", "--seconds", "1", "--nodes", "20", "--json"
    )
    assert code == 0
    result = json_out(out)
    assert {"cycles_per_s", "reserve_p50_ms", "reserve_p99_ms", "violations"} <= set(result)
    assert result["violations"] == 0 and result["violation_examples"] == []
    assert result["grants_left"] == 0
    assert (result["backend"], result["clients"], result["nodes"]) == ("sqlite", 2, 20)
    # The clock starts once every client is warm, and each client runs for at least the second asked.
    assert result["seconds"] >= 1.0
    assert result["cycles"] > 0
    assert result["cycles_per_s"] == pytest.approx(result["cycles"] / result["seconds"], rel=0.01, abs=0.1)
    assert 0 < result["reserve_p50_ms"] <= result["reserve_p99_ms"]


@pytest.mark.postgres
@pytest.mark.parametrize("flags", [[], ["--serialized"]], ids=["concurrent", "serialized"])
def test_bench_ledger_on_postgresql(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    require_postgres()
    code, out, _ = run(
        capsys, "bench", "ledger", "--url", POSTGRES_URL, "--clients", "3", "--seconds", "1", "--nodes", "30",
        "--json", *flags,
    )  # fmt: skip
    result = json_out(out)
    assert code == 0 and result["violations"] == 0 and result["grants_left"] == 0
    assert (result["backend"], result["path"]) == ("postgresql", "serialized" if flags else "concurrent")
    assert result["cycles"] > 0


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([], id="gpupool"),
        pytest.param(["ledger"], id="ledger"),
        pytest.param(["ledger", "init"], id="ledger-init"),
        pytest.param(["inventory"], id="inventory"),
        pytest.param(["inventory", "load"], id="inventory-load"),
        pytest.param(["status"], id="status"),
        pytest.param(["reserve"], id="reserve"),
        pytest.param(["release"], id="release"),
        pytest.param(["reap"], id="reap"),
        pytest.param(["bench"], id="bench"),
        pytest.param(["bench", "ledger"], id="bench-ledger"),
    ],
)
def test_help_of_every_command_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: gpupool{' ' if argv else ''}{' '.join(argv)}")


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "gpupool"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gpupool ")
    for command in ("ledger", "inventory", "status", "reserve", "release", "reap", "bench"):
        assert command in done.stdout


def test_status_shows_each_quota_beside_its_teams_use(
    loaded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "status", "--json", "--url", loaded)
    assert (code, json_out(out)["quotas"]) == (0, [])  # none stored: no table, an empty list
    assert "Quotas" not in run(capsys, "status", "--url", loaded)[1]
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        "teams:\n"
        "  - {name: vision, cohort: lab, quotas: [{flavor: {pool: default}, nominal: 1}]}\n"
        "  - {name: nlp, cohort: lab, quotas: [{flavor: {pool: default}, nominal: 2}]}\n"
    )
    assert run(capsys, "quota", "apply", str(quotas), "--url", loaded)[0] == 0
    run(capsys, "reserve", "--gpus", "2", "--team", "vision", "--holder", "v", "--id", "v1", "--url", loaded)

    code, out, _ = run(capsys, "status", "--url", loaded)

    assert code == 0
    lines = out.splitlines()
    assert lines[lines.index("Quotas (2), in GPUs") + 1].split() == [
        "TEAM",
        "FLAVOR",
        "NOMINAL",
        "HELD",
        "BORROWED",
        "LENT",
        "UNUSED",
    ]
    rows = [line.split() for line in lines[lines.index("Quotas (2), in GPUs") + 2 :]]
    assert ["nlp", "pool:default", "2", "0", "0", "1", "2"] in rows
    assert ["vision", "pool:default", "1", "2", "1", "0", "0"] in rows
    data = json_out(run(capsys, "status", "--json", "--url", loaded)[1])
    vision = next(q for q in data["quotas"] if q["team"] == "vision")
    assert vision == {
        "team": "vision",
        "flavor": "pool:default",
        "nominal": 1.0,
        "held": 2.0,
        "borrowed": 1.0,
        "unused": 0.0,
        "lent": 0.0,
    }
