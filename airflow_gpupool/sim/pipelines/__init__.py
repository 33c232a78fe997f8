"""DAG runs of chained GPU steps in the governed queue simulation: hand-on, queue-ahead, run admission."""

from __future__ import annotations
