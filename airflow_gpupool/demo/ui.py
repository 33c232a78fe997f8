"""``make ui``'s processes under one supervisor: Ctrl-C or SIGTERM stops every one of them.

In order: the Kubernetes emulator (waited for until its kubeconfig is written), one inventory
sync into the SQLite ledger, a node agent per fake NVML spec, the controller, then
``airflow standalone``. The Makefile writes the files they read and sets Airflow's environment;
:mod:`airflow_gpupool.demo.supervise` explains how they are stopped.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from airflow_gpupool.demo.supervise import Service, Supervisor
from airflow_gpupool.exceptions import ServiceEndedError, SupervisorStoppedError


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Read the command line.

    :param argv: the arguments (``sys.argv[1:]`` when ``None``)
    """
    parser = argparse.ArgumentParser(prog="python -m airflow_gpupool.demo.ui", description=__doc__)
    parser.add_argument("--dir", type=Path, required=True, help="where make ui keeps its files")
    parser.add_argument("--emulator-port", type=int, default=8001)
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    return parser.parse_args(argv)


def services(ui_dir: Path, emulator_port: int) -> tuple[Service, Service, list[Service], Service, Service]:
    """Return the emulator, the sync step, the agents, the controller and Airflow for ``ui_dir``.

    :param ui_dir: the folder ``make ui`` prepared
    :param emulator_port: where the emulator listens
    """
    python = sys.executable
    gpupool = [python, "-m", "airflow_gpupool.cli"]
    ledger = f"sqlite:///{ui_dir}/ledger.db"
    kubeconfig = str(ui_dir / "kubeconfig")
    env = dict(os.environ)
    emulator = Service(
        "emulator",
        [
            python,
            "-m",
            "airflow_gpupool.testing.emulator",
            "--port",
            str(emulator_port),
            "--kubeconfig",
            kubeconfig,
        ]
        + ["--nodes", str(ui_dir / "nodes.json")],
        env={**env, "GPUPOOL_FAKE_NVML_DIR": str(ui_dir / "nvml")},
    )
    sync = Service(
        "inventory sync", [*gpupool, "inventory", "sync", "--url", ledger, "--kubeconfig", kubeconfig]
    )
    agents = [
        Service(
            f"agent {spec.stem}",
            [*gpupool, "agent", "run", "--url", ledger, "--node", spec.stem, "--backend", "fake"]
            + ["--fake-spec", str(spec), "--interval", "10"],
            stderr=ui_dir / "agents.log",
        )
        for spec in sorted((ui_dir / "nvml").glob("*.yaml"))
    ]
    controller = Service(
        "controller",
        [*gpupool, "controller", "run", "--url", ledger, "--kubeconfig", kubeconfig]
        + ["--sync-interval", "30", "--reconcile-interval", "15"],
        stderr=ui_dir / "controller.log",
    )
    # airflow standalone starts its components as `airflow ...` from PATH: this venv's first.
    path = os.pathsep.join([os.path.dirname(python), env.get("PATH", "")])
    airflow = Service(
        "airflow standalone", [python, "-m", "airflow", "standalone"], env={**env, "PATH": path}
    )
    return emulator, sync, agents, controller, airflow


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``make ui``'s processes until Ctrl-C, SIGTERM or the end of one; return the exit status.

    :param argv: the arguments (``sys.argv[1:]`` when ``None``)
    """
    args = parse_args(argv)
    emulator, sync, agents, controller, airflow = services(args.dir.resolve(), args.emulator_port)
    kubeconfig = args.dir / "kubeconfig"
    kubeconfig.unlink(missing_ok=True)  # its appearance says the emulator is up
    with Supervisor(grace=args.grace) as supervisor:
        try:
            supervisor.start(emulator)
            supervisor.wait_until(
                lambda: kubeconfig.is_file() and kubeconfig.stat().st_size > 0,
                timeout=60,
                what="the emulator",
            )
            supervisor.run(sync)
            for service in (*agents, controller, airflow):
                supervisor.start(service)
        except SupervisorStoppedError as stopped:
            return 128 + stopped.signum
        except (ServiceEndedError, TimeoutError) as error:
            print(f"make ui: {error}; stopping the rest", file=sys.stderr)
            return 1
        return supervisor.watch()


if __name__ == "__main__":
    sys.exit(main())
