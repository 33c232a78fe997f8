"""Sharing one pool between teams: quotas per resource flavor, with borrowing and lending in cohorts."""

from __future__ import annotations

from airflow_gpupool.governance.quotas import Flavor, QuotaPlan, TeamQuota, parse_quota_file

__all__ = ["Flavor", "QuotaPlan", "TeamQuota", "parse_quota_file"]
