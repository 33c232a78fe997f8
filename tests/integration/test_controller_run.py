"""``gpupool controller run`` against the Kubernetes emulator: one pass, two replicas, signals, faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from kubernetes import client, config, watch

from airflow_gpupool.cli import main
from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
from airflow_gpupool.controller.run import ControllerIntervals, GpuPoolController
from airflow_gpupool.inventory.sync import core_v1_api
from airflow_gpupool.labels import RESERVATION_LABEL
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.ledger_fixtures import FakeClock

ROOT = Path(__file__).resolve().parents[2]
NODES = ["gpu-a-0", "gpu-b-0"]
LEASE_SECONDS = 2.0


@pytest.fixture
def k8s() -> Iterator[KubernetesEmulatorServer]:
    nodes = [gpu_node("gpu-a-0", gpus=8), gpu_node("gpu-b-0", gpus=4)]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.1) as server:
        yield server


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger.create(url).close()  # an empty ledger: no nodes
    return url


@pytest.fixture
def leases(k8s: KubernetesEmulatorServer) -> Any:
    return client.CoordinationV1Api(config.new_client_from_config(config_file=k8s.kubeconfig_path))


def controller_args(url: str, k8s: KubernetesEmulatorServer, identity: str, *extra: str) -> list[str]:
    return [
        "controller",
        "run",
        "--url",
        url,
        "--kubeconfig",
        k8s.kubeconfig_path,
        "--identity",
        identity,
        "--lease-duration",
        str(LEASE_SECONDS),
        "--sync-interval",
        "0.5",
        "--reconcile-interval",
        "0.5",
        *extra,
    ]


def start(args: list[str], log: IO[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_gpupool.cli", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def run_once(url: str, k8s: KubernetesEmulatorServer, identity: str, tmp_path: Path) -> str:
    log_path = tmp_path / f"{identity}.log"
    with log_path.open("w") as log:
        assert start(controller_args(url, k8s, identity, "--once"), log).wait(timeout=120) == 0, (
            log_path.read_text()
        )
    return log_path.read_text()


def wait_for_holder(leases: Any, want: Any, timeout: float, count: int = 1) -> Any:
    """Wait, on a watch of the Leases, until ``want(holder)`` has been true for ``count`` changes; return the Lease."""
    seen = 0
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        stream = watch.Watch().stream(
            leases.list_namespaced_lease, "default", timeout_seconds=max(1, int(left))
        )
        for event in stream:
            lease = event["object"]
            if lease.metadata.name == "gpupool-controller" and want(lease.spec.holder_identity):
                seen += 1
                if seen >= count:
                    return lease
    raise TimeoutError(f"no matching Lease holder within {timeout} s")


def pass_lines(log: str, identity: str) -> list[str]:
    return [line for line in log.splitlines() if f"Controller pass ({identity})" in line]


# -- one pass -------------------------------------------------------------------------------------


def test_once_syncs_nodes_then_releases_a_grant_whose_pod_finished(
    url: str, k8s: KubernetesEmulatorServer, leases: Any, tmp_path: Path
) -> None:
    log = run_once(url, k8s, "cron", tmp_path)
    ledger = Ledger(url)
    try:
        assert sorted(n.name for n in ledger.snapshot().nodes) == NODES
        assert "Controller pass (cron): sync: 2 added" in log
        held = ledger.reserve(
            GpuRequest(gpus=1, node_labels=(("kubernetes.io/hostname", "gpu-b-0"),)),
            "t1",
            reservation_id="gp-done",
        )
        assert held.grant is not None
        core = core_v1_api(k8s.kubeconfig_path)
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": "train", "labels": {RESERVATION_LABEL: held.id}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "train:1"}]},
            },
        )
        k8s.wait_for_pod("train")
        log = run_once(url, k8s, "cron", tmp_path)
        assert ledger.get(held.id).state is ReservationState.RELEASED
        assert "reconcile: 1 released" in pass_lines(log, "cron")[0]
    finally:
        ledger.close()
    # The pass released its Lease on the way out: the next controller need not wait.
    assert leases.read_namespaced_lease("gpupool-controller", "default").spec.holder_identity is None


# -- two replicas ---------------------------------------------------------------------------------


def test_two_controllers_one_acts_and_the_other_takes_over_when_it_is_killed(
    url: str, k8s: KubernetesEmulatorServer, leases: Any, tmp_path: Path
) -> None:
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("ctl-a", "ctl-b")}
    procs = {name: start(controller_args(url, k8s, name), log) for name, log in logs.items()}
    try:
        lease = wait_for_holder(leases, lambda holder: holder in procs, timeout=60)
        leader = lease.spec.holder_identity
        (other,) = set(procs) - {leader}
        # Three renewals later, the leader has run passes; the other has run none.
        wait_for_holder(leases, lambda holder: holder == leader, timeout=30, count=3)
        assert pass_lines((tmp_path / f"{leader}.log").read_text(), leader)
        assert not pass_lines((tmp_path / f"{other}.log").read_text(), other)
        assert leases.read_namespaced_lease("gpupool-controller", "default").spec.holder_identity == leader

        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait(timeout=10)
        killed = time.monotonic()
        lease = wait_for_holder(leases, lambda holder: holder == other, timeout=30)
        took = time.monotonic() - killed
        assert took < LEASE_SECONDS + 2.5, f"took over after {took:.1f} s"
        assert lease.spec.lease_transitions == 1
        wait_for_holder(leases, lambda holder: holder == other, timeout=30, count=2)
        leader_log = (tmp_path / f"{leader}.log").read_text()
        other_log = (tmp_path / f"{other}.log").read_text()
        assert pass_lines(other_log, other)
        # One acted, then the other: every pass of the killed leader came before the first of the other.
        assert max(pass_lines(leader_log, leader))[:23] <= min(pass_lines(other_log, other))[:23]
        assert f"taking over from {leader}" in other_log

        procs[other].send_signal(signal.SIGTERM)
        assert procs[other].wait(timeout=30) == 0
        assert leases.read_namespaced_lease("gpupool-controller", "default").spec.holder_identity is None
        assert (
            f"Lease default/gpupool-controller released by {other}" in (tmp_path / f"{other}.log").read_text()
        )
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for log in logs.values():
            log.close()
    ledger = Ledger(url)
    try:
        assert sorted(n.name for n in ledger.snapshot().nodes) == NODES
    finally:
        ledger.close()


# -- configuration and faults --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--sync-interval", "-1", "sync interval"),
        ("--reconcile-interval", "0", "reconcile interval"),
        ("--lease-duration", "-5", "lease duration"),
    ],
)
def test_bad_configuration_exits_2(
    flag: str,
    value: str,
    message: str,
    url: str,
    k8s: KubernetesEmulatorServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = controller_args(url, k8s, "bad", "--once")
    args[args.index(flag) + 1] = value
    # Refused by argparse before anything runs (issue 12): exit 2, naming the option.
    with pytest.raises(SystemExit) as refused:
        main([a if a != value else f"{flag}={value}" for a in args if a != flag])
    assert refused.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err


def test_a_failing_step_is_logged_and_retried_at_the_next_pass(
    url: str, k8s: KubernetesEmulatorServer, leases: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-gone-0", gpus=1)]) as gone:
        dead_core = core_v1_api(gone.kubeconfig_path)
    dead_core.api_client.configuration.retries = False
    clock = FakeClock(0)
    elector = LeaderElector(leases, LeaseSettings("default", "faulty", lease_duration=60), clock=clock)
    ledger = Ledger(url)
    try:
        with GpuPoolController(
            ledger, dead_core, elector, ControllerIntervals(10, 10), clock=clock
        ) as controller:
            for _ in range(2):
                result = controller.run_pass()
                assert result.leading and result.reaped is not None
                assert [step for step, _ in result.errors] == ["sync", "reconcile", "gatekeeper"]
                clock.advance(10)
        failures = [
            r.getMessage() for r in caplog.records if "failed (retried in the next pass)" in r.getMessage()
        ]
        assert len(failures) == 6
    finally:
        ledger.close()


class SlowStep:
    """The controller's reconcile step held until released: a pass over a big cluster, longer than the Lease."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import airflow_gpupool.controller.run as run_module

        real_reconcile = run_module.reconcile
        self.started, self.finish = threading.Event(), threading.Event()

        def slow_reconcile(*args: Any, **kwargs: Any) -> Any:
            self.started.set()
            self.finish.wait(30)
            return real_reconcile(*args, **kwargs)

        monkeypatch.setattr(run_module, "reconcile", slow_reconcile)


def hold_the_lease_through_a_slow_step(
    url: str, k8s: KubernetesEmulatorServer, leases: Any, leader: LeaderElector, step: SlowStep, ready: Any
) -> LeaderElector:
    """Run the controller as ``leader`` while ``step`` runs; assert a replica never gets the Lease for
    three Lease durations once ``ready()`` says so, and that ``leader`` still leads; return the replica."""
    name = leader.lease.name
    replica = LeaderElector(leases, LeaseSettings("default", "waiting", name, lease_duration=LEASE_SECONDS))
    ledger = Ledger(url)
    controller = GpuPoolController(
        ledger, core_v1_api(k8s.kubeconfig_path), leader, ControllerIntervals(60, 60)
    )
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert step.started.wait(30) and ready()
        deadline = time.monotonic() + 3 * LEASE_SECONDS
        while time.monotonic() < deadline:
            assert not replica.try_acquire_or_renew(), "the Lease lapsed while the leader's step ran"
            time.sleep(LEASE_SECONDS / 4)
        assert leader.is_leader()
    finally:
        step.finish.set()
        stop.set()
        thread.join(timeout=30)
        ledger.close()
    assert not thread.is_alive()
    return replica


def test_a_pass_longer_than_the_lease_keeps_the_lease_from_a_replica(
    url: str, k8s: KubernetesEmulatorServer, leases: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = SlowStep(monkeypatch)
    leader = LeaderElector(
        leases, LeaseSettings("default", "busy", "gpupool-slow", lease_duration=LEASE_SECONDS)
    )
    replica = hold_the_lease_through_a_slow_step(url, k8s, leases, leader, step, lambda: True)
    assert replica.try_acquire_or_renew()  # released on the way out


class _OneSlowRenewal:
    """The Lease API, except that one renewal answers after the renew deadline (a loaded host)."""

    def __init__(self, api: Any, delay: float) -> None:
        self._api, self._delay = api, delay
        self.slowed = threading.Event()

    def replace_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        answer = self._api.replace_namespaced_lease(*args, **kwargs)
        if not self.slowed.is_set():
            self.slowed.set()
            time.sleep(self._delay)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


def test_one_renewal_slower_than_the_deadline_does_not_hand_a_long_step_s_lease_away(
    url: str, k8s: KubernetesEmulatorServer, leases: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CI flake this guards: one slow call ended leadership and the keeper never renewed again.
    step = SlowStep(monkeypatch)
    settings = LeaseSettings("default", "busy", "gpupool-hiccup", lease_duration=LEASE_SECONDS)
    api = _OneSlowRenewal(leases, delay=settings.renew_deadline + 0.2)
    leader = LeaderElector(api, settings)
    # The keeper renewed again after the slow call: the leader still leads at the end.
    hold_the_lease_through_a_slow_step(url, k8s, leases, leader, step, lambda: api.slowed.wait(30))


# -- the forecast step (issue 39) -----------------------------------------------------------------


def test_the_forecast_step_runs_on_its_interval_and_only_while_leading(
    url: str, k8s: KubernetesEmulatorServer, leases: Any
) -> None:
    from airflow_gpupool.ledger import LedgerForecasts

    clock = FakeClock(0)
    core = core_v1_api(k8s.kubeconfig_path)
    ledger = Ledger(url)
    try:
        leader = LeaderElector(leases, LeaseSettings("default", "forecaster", lease_duration=60), clock=clock)
        intervals = ControllerIntervals(forecast=30)
        controller = GpuPoolController(
            ledger, core, leader, intervals, clock=clock, count_external_pods=False
        )
        assert controller.run_pass().forecasts == 0  # synced the nodes; nothing waits yet
        ledger.reserve(GpuRequest(gpus=8), "a", reservation_id="gp-all")
        ledger.reserve(GpuRequest(gpus=8), "b", reservation_id="gp-next")
        assert controller.run_pass().forecasts is None  # not due: at most once per interval
        clock.advance(30)
        assert controller.run_pass().forecasts == 1
        stored = LedgerForecasts(ledger).get("gp-next")
        assert stored is not None and stored.status == "forecast"

        replica = LeaderElector(leases, LeaseSettings("default", "replica", lease_duration=60), clock=clock)
        other = GpuPoolController(ledger, core, replica, intervals, clock=clock, count_external_pods=False)
        ledger.reserve(GpuRequest(gpus=8), "c", reservation_id="gp-last")
        assert other.run_pass().forecasts is None  # not leading: no forecast written
        assert set(LedgerForecasts(ledger).get_many()) == {"gp-next"}
    finally:
        ledger.close()
