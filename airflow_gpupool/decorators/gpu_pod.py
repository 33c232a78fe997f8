"""``@task.gpu_pod``: run a Python function in a pod on a GPU slice reserved from the ledger.

The cncf provider's ``@task.kubernetes`` on top of :class:`~airflow_gpupool.operators.GpuPodOperator`
instead of ``KubernetesPodOperator``: the decorator takes every ``GpuPodOperator`` argument (the
request: ``gpus``, ``gpu_milli``, ``mig_profile``, ``team``...; the pod: ``image``, ``namespace``...)::

    @task.gpu_pod(image="pytorch/pytorch:2.5", gpus=1, team="vision")
    def train(epochs: int) -> float: ...

The function's source and arguments travel to the container in environment variables, exactly as
``@task.kubernetes`` does. They are written when the pod is built, not in ``execute``: a task whose
reservation waited deferred resumes in ``execute_granted`` and builds its pod there.
"""

from __future__ import annotations

import base64
import os
import pickle
from collections.abc import Callable, Sequence
from tempfile import TemporaryDirectory
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.decorators.kubernetes import _KubernetesDecoratedOperator
from airflow.providers.cncf.kubernetes.python_kubernetes_script import write_python_script
from airflow.providers.common.compat.sdk import DecoratedOperator, task_decorator_factory
from kubernetes.client import models as k8s

from airflow_gpupool.operators.gpu_pod import GpuPodOperator

if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import TaskDecorator
    from airflow.sdk import Context

__all__ = ["gpu_pod_task"]

# The names @task.kubernetes's command reads (cncf's decorators/kubernetes.py): the same script runs.
_SCRIPT_ENV = "__PYTHON_SCRIPT"
_INPUT_ENV = "__PYTHON_INPUT"


def _b64(path: str) -> str:
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


class _GpuPodDecoratedOperator(_KubernetesDecoratedOperator, GpuPodOperator):
    """``@task.kubernetes``'s operator with ``GpuPodOperator`` beneath it (reserve, pin, release)."""

    custom_operator_name = "@task.gpu_pod"
    template_fields: Sequence[str] = tuple(
        {"op_args", "op_kwargs", *GpuPodOperator.template_fields} - {"cmds", "arguments"}
    )

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("name", f"gpu-pod-{kwargs['python_callable'].__name__}")
        super().__init__(**kwargs)

    def execute(self, context: Context) -> Any:
        """Run DecoratedOperator's execute over GpuPodOperator's: the script is set in the pod build."""
        return DecoratedOperator.execute(self, context)

    def build_pod_request_obj(self, context: Context | None = None, *, dry_run: bool = False) -> k8s.V1Pod:
        """Put the function and its arguments into the container, then build the pod."""
        self._write_script()
        return super().build_pod_request_obj(context, dry_run=dry_run)

    def _write_script(self) -> None:
        with TemporaryDirectory(prefix="gpupool-task") as tmp:
            script, inputs = os.path.join(tmp, "script.py"), os.path.join(tmp, "script.in")
            with open(inputs, "wb") as f:
                pickle.dump({"args": self.op_args, "kwargs": self.op_kwargs}, f)
            write_python_script(
                jinja_context={
                    "op_args": self.op_args,
                    "op_kwargs": self.op_kwargs,
                    "pickling_library": "pickle",
                    "python_callable": self.python_callable.__name__,
                    "python_callable_source": self.get_python_source(),  # type: ignore[no-untyped-call]
                    "string_args_global": False,
                },
                filename=script,
            )
            kept = [e for e in self.env_vars or [] if e.name not in (_SCRIPT_ENV, _INPUT_ENV)]
            self.env_vars = [
                *kept,
                k8s.V1EnvVar(name=_SCRIPT_ENV, value=_b64(script)),
                k8s.V1EnvVar(name=_INPUT_ENV, value=_b64(inputs)),
            ]
        self.cmds = self._generate_cmds()


def gpu_pod_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> TaskDecorator:
    """Run the decorated function in a pod on a GPU slice (``@task.gpu_pod``).

    :param python_callable: the function
    :param multiple_outputs: unroll a dict return value into one XCom per key
    :param kwargs: any :class:`~airflow_gpupool.operators.GpuPodOperator` argument
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_GpuPodDecoratedOperator,
        **kwargs,
    )
