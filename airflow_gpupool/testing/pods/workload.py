"""The workload a running pod simulates: log lines and checkpoint steps over its run, then its end.

:func:`checkpoint_plan` reads which training steps a pod writes (resuming after
``GPUPOOL_RESUME_FROM``, crashing after ``fail-after-step``); :class:`PodWorkload` spreads them
over the run time, stops early when the pod is interrupted and returns the pod's
:class:`~airflow_gpupool.testing.pods.pod_status.Outcome` (a crash, an OOM kill, an exit code or
success with the ``COMPLETE`` marker). A pod deleted with a grace period gets :data:`SIGTERM`
and exits with code 143 (after ``sigterm_exit_seconds``); one that opted in
(:func:`checkpoints_on_sigterm`) first writes its next step as an emergency checkpoint, as a
training container that handles SIGTERM does.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_gpupool.testing.pods import checkpoints
from airflow_gpupool.testing.pods.failures import FINISH_NOW, Interruption, interrupted
from airflow_gpupool.testing.pods.pod_status import Outcome

if TYPE_CHECKING:
    from airflow_gpupool.testing.pods.behaviour import PodBehaviour
    from airflow_gpupool.testing.pods.logs import LogBook


#: The interruption a graceful delete sends a running pod (:mod:`~airflow_gpupool.testing.pods.termination`).
SIGTERM = "SIGTERM"
#: A container's exit code after SIGTERM (128 + 15).
SIGTERM_EXIT_CODE = 143


@dataclasses.dataclass(frozen=True)
class CheckpointPlan:
    """Which checkpoint steps a run writes.

    :param root: the checkpoint directory, or an fsspec URL (``s3://...``)
    :param first: first step to write
    :param last: final step of the training
    :param crash_after: step after which the run crashes, if any
    """

    root: Path | str
    first: int
    last: int
    crash_after: int | None


def _container_env(pod: dict[str, Any], name: str) -> str | None:
    """Return the value of an environment variable of the pod's first container.

    :param pod: the pod
    :param name: the variable
    """
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    for var in containers[0].get("env") or []:
        if var.get("name") == name:
            value: str | None = var.get("value")
            return value
    return None


def checkpoint_plan(pod: dict[str, Any], behaviour: PodBehaviour) -> CheckpointPlan | None:
    """Return the checkpoints a pod writes, or ``None``.

    :param pod: the pod (its env may carry ``GPUPOOL_RESUME_FROM`` and ``GPUPOOL_CHECKPOINT_DIR``)
    :param behaviour: its behaviour
    """
    location = behaviour.checkpoint_dir or _container_env(pod, checkpoints.CHECKPOINT_DIR_ENV)
    if not location or not behaviour.checkpoint_steps:
        return None
    resumed = checkpoints.resume_step(_container_env(pod, checkpoints.RESUME_ENV))
    crash = behaviour.fail_after_step
    if crash is not None and crash <= resumed:
        crash = None  # the crash happened in an earlier run; the resumed one goes past it
    return CheckpointPlan(checkpoints.plan_root(location), resumed + 1, behaviour.checkpoint_steps, crash)


def checkpoints_on_sigterm(pod: dict[str, Any], behaviour: PodBehaviour) -> bool:
    """Return whether a pod's training writes a checkpoint on SIGTERM (it opted in).

    :param pod: the pod (its first container's env may set ``GPUPOOL_EMULATOR_CHECKPOINT_ON_SIGTERM=1``)
    :param behaviour: its behaviour (``gpupool.emulator/checkpoint-on-sigterm``)
    """
    if behaviour.checkpoint_on_sigterm is not None:
        return behaviour.checkpoint_on_sigterm
    value = _container_env(pod, checkpoints.CHECKPOINT_ON_SIGTERM_ENV) or ""
    return value.strip().lower() in {"1", "true", "yes", "on"}


class PodWorkload:
    """One run of a pod's containers, from ``Running`` to its outcome.

    :param pod: the running pod
    :param uid: its uid
    :param node: its node
    :param behaviour: its behaviour
    :param logs: the kubelet's container logs
    :param pause: sleeps for some seconds, returning early with the pod's interruption if one comes
    :param default_duration_seconds: the run time unless the behaviour says otherwise
    """

    def __init__(
        self,
        pod: dict[str, Any],
        uid: str,
        node: str,
        behaviour: PodBehaviour,
        *,
        logs: LogBook,
        pause: Callable[[float], Awaitable[Interruption | None]],
        default_duration_seconds: float,
    ) -> None:
        self.pod = pod
        self.uid = uid
        self.node = node
        self.behaviour = behaviour
        self.logs = logs
        self.pause = pause
        self.duration = (
            behaviour.duration_seconds if behaviour.duration_seconds is not None else default_duration_seconds
        )

    def log(self, line: str) -> None:
        """Write a line to every container's log.

        :param line: the text
        """
        for container in self.pod["spec"].get("containers") or []:
            self.logs.open(self.uid, container["name"]).append(line)

    async def run(self, plan_interruption: Callable[[float], asyncio.TimerHandle | None]) -> Outcome:
        """Write logs and checkpoints over the duration, then return the outcome.

        :param plan_interruption: schedules the failure the behaviour injects, given the run
            time; its timer is cancelled when the run ends
        """
        plan = checkpoint_plan(self.pod, self.behaviour)
        lines = (
            self.behaviour.log_lines
            if self.behaviour.log_lines is not None
            else (f"gpupool emulator: running {self.pod['metadata']['name']} on {self.node}",)
        )
        for line in lines:
            self.log(line)
        timer = plan_interruption(self.duration)
        try:
            outcome = await self._write_steps(plan)
        finally:
            if timer is not None:
                timer.cancel()
        return outcome if outcome is not None else self._completion(plan)

    async def _write_steps(self, plan: CheckpointPlan | None) -> Outcome | None:
        """Write the checkpoint steps at even intervals, ending early on an interruption or crash.

        :param plan: the checkpoints, if any
        :return: the outcome of an interrupted or crashed run, ``None`` when it ran to the end
        """
        steps = range(plan.first, plan.last + 1) if plan else range(0)
        interval = self.duration / (len(steps) + 1)
        for step in steps:
            if (interruption := await self.pause(interval)) is not None:
                if interruption.reason == SIGTERM:
                    return await self._sigterm(plan, step)
                return None if interruption.reason == FINISH_NOW else interrupted(interruption, self.node)
            assert plan is not None
            checkpoints.save_step(plan.root, step)
            self.log(
                f"step {step}/{plan.last}: loss={checkpoints.loss_at(step)} checkpoint {checkpoints.STEP_DIR_FORMAT.format(step)} saved"
            )
            if plan.crash_after is not None and step >= plan.crash_after:
                self.log(
                    f"Traceback (most recent call last): RuntimeError: simulated crash after step {step}"
                )
                return Outcome("Failed", 1, "Error")
        if (interruption := await self.pause(interval)) is not None and interruption.reason != FINISH_NOW:
            if interruption.reason == SIGTERM:
                return await self._sigterm(None, 0)
            return interrupted(interruption, self.node)
        return None

    async def _sigterm(self, plan: CheckpointPlan | None, step: int) -> Outcome:
        """Exit 143 after ``sigterm_exit_seconds``, an opted-in pod first writing ``step`` as an
        emergency checkpoint (none when every step is written).

        Killed before (its grace ran out), the lifecycle is cancelled here: nothing is written.

        :param plan: the checkpoints, if any
        :param step: the next step the training would have written
        """
        self.log("gpupool emulator: received SIGTERM")
        await asyncio.sleep(self.behaviour.sigterm_exit_seconds or 0.0)
        if plan is not None and checkpoints_on_sigterm(self.pod, self.behaviour):
            checkpoints.save_step(plan.root, step, emergency=True)
            self.log(
                f"step {step}/{plan.last}: emergency checkpoint {checkpoints.STEP_DIR_FORMAT.format(step)} saved on SIGTERM"
            )
        events = (("Normal", "Killing", "Stopping container", "kubelet"),)
        return Outcome("Failed", SIGTERM_EXIT_CODE, "Error", events=events)

    def _completion(self, plan: CheckpointPlan | None) -> Outcome:
        """Return the outcome of a run that was not interrupted.

        :param plan: its checkpoints
        """
        if self.behaviour.oom_killed:
            self.log("CUDA out of memory / container killed by the OOM killer")
            return Outcome("Failed", 137, "OOMKilled")
        exit_code = self.behaviour.exit_code or 0
        if exit_code != 0:
            self.log(f"gpupool emulator: exiting with code {exit_code}")
            return Outcome("Failed", exit_code, "Error")
        if plan is not None:
            checkpoints.save_complete(plan.root, plan.last)
        return Outcome("Succeeded", 0, "Completed")
