"""Figures of the simulator's runs (``gpupool simulate --plot``); needs the ``plot`` extra.

matplotlib is imported inside each function, so the simulator itself does not need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_gpupool.sim.replay import ReplayResult


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def legend(r: ReplayResult) -> str:
    """Name a run by its allocation at the highest report point it reached (130 % when it did)."""
    point = r.last_point()
    if point is None:
        reached = float(r.arrived[-1]) if len(r.arrived) else 0.0
        return f"{r.policy} (reached {reached:.0f}% arrived)"
    return f"{r.policy} ({r.alloc_at(point):.2f}% at {point}%)"


def plot_replay(results: Sequence[ReplayResult], path: str, title: str = "") -> None:
    """Draw allocation % against arrived % for each run into a PNG file.

    :param results: the runs (one line each)
    :param path: the PNG file to write
    :param title: the figure title
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        ax.plot(r.arrived, r.alloc, label=legend(r), linewidth=1.2)
    ax.plot([0, 130], [0, 100], color="grey", linewidth=0.6, linestyle=":")
    # A small trace may never get near 50 % arrived: then show all of it.
    far = max((float(r.arrived.max()) for r in results if len(r.arrived)), default=0.0)
    ax.set_xlim(50 if far >= 100 else 0, 131)
    ax.set_ylim(50 if far >= 100 else 0, 100)
    ax.set_xlabel("arrived GPU demand, % of capacity")
    ax.set_ylabel("allocated GPU, % of capacity")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_queue(
    rows: Sequence[dict[str, Any]], series: Sequence[dict[str, Any]], path: str, title: str = ""
) -> None:
    """Draw queue mode's runs: the distribution of waits and allocation over time, side by side.

    :param rows: the summaries of :func:`~airflow_gpupool.sim.queue.simulate_queue`
    :param series: the ``series`` each run filled (``waits``, ``alloc``), in the same order
    :param path: the PNG file to write
    :param title: the figure title
    """
    import numpy as np

    plt = _pyplot()
    fig, (waits_ax, alloc_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    for row, one in zip(rows, series, strict=True):
        waits = np.sort(np.asarray(one["waits"], dtype=float))
        share = np.arange(1, len(waits) + 1) / max(len(waits), 1) * 100
        label = f"{row['policy']} (mean {row['mean_wait_s']:.0f}s, p99 {row['p99_wait_s']:.0f}s)"
        waits_ax.step(waits / 60, share, where="post", label=label, linewidth=1.2)
        hours = [h for h, _ in one["alloc"]]
        alloc = [a for _, a in one["alloc"]]
        alloc_ax.plot(hours, alloc, label=f"{row['policy']} (mean {row['mean_alloc']:.1f}%)", linewidth=1.0)
    waits_ax.set_xlabel("wait, minutes")
    waits_ax.set_ylabel("requests that waited at most that long, %")
    waits_ax.set_title("wait distribution (measured window)")
    alloc_ax.set_xlabel("simulated hours")
    alloc_ax.set_ylabel("allocated GPU, % of capacity")
    alloc_ax.set_ylim(0, 100)
    alloc_ax.set_title("allocation over time")
    for ax in (waits_ax, alloc_ax):
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
