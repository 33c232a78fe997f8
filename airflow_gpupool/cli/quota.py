"""``gpupool quota apply`` and ``gpupool quota list``: team quotas per resource flavor."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_gpupool.cli.common import open_ledger, print_json, table, url_arg
from airflow_gpupool.exceptions import QuotaFileError

if TYPE_CHECKING:
    from airflow_gpupool.governance.quotas import Headroom, QuotaPlan

__all__ = ["cmd_quota_apply", "cmd_quota_list", "load_quota_file", "register"]

_EXAMPLE = """\
example quota file:

  headroom:                          # optional: what only urgent work may use, per node pool
    share: 0.2                       # default 0.2 of every pool; 0 turns it off
    pools: {a100: 0.1}               # optional: pools with their own share
    lend_to_preemptible: false       # true: preemptible work may use it; urgent work preempts it there
    urgent_priority: 100             # default [gpupool] urgent_priority; inference is always urgent
  teams:
    - name: vision
      cohort: research
      quotas:
        - flavor: {pool: a100}       # or {model: NVIDIA-A100-SXM4-80GB}
          nominal: 4                 # GPUs; 0.25 for a quarter; a MIG slice counts its compute share
          borrowing_limit: 2         # optional: at most 2 GPUs above nominal, borrowed in the cohort
          lending_limit: 1           # optional: lend at most 1 unused GPU (default: all unused)
    - name: nlp
      cohort: research
      quotas:
        - flavor: {pool: a100}
          nominal: 4
"""


def load_quota_file(path: str) -> QuotaPlan:
    """Read and validate a quota file.

    :raises QuotaFileError: it cannot be read, is not YAML, or breaks the format (nothing written)
    """
    import yaml

    from airflow_gpupool.governance.quotas import parse_quota_file

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise QuotaFileError("quota file", path, f"a readable file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise QuotaFileError("quota file", path, f"UTF-8 text (byte {e.start} is not)") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise QuotaFileError("quota file", path, f"valid YAML ({e})") from None
    return parse_quota_file(document)


def cmd_quota_apply(args: argparse.Namespace) -> int:
    """Replace the ledger's team quotas with those of FILE (idempotent; a refused file changes nothing)."""
    from airflow_gpupool.ledger import LedgerQuotas

    plan = load_quota_file(args.file)
    ledger = open_ledger(args)
    try:
        applied = LedgerQuotas(ledger).apply(plan, dry_run=args.dry_run, strict=args.strict)
    finally:
        ledger.close()
    for warning in applied.warnings:
        print(f"gpupool: warning: {warning} (applied as Kueue does; --strict refuses it)", file=sys.stderr)
    if args.json:
        changes = {"added": applied.added, "changed": applied.changed, "removed": applied.removed}
        print_json(
            {
                "dry_run": args.dry_run,
                **{k: list(v) for k, v in changes.items()},
                "headroom_changed": applied.headroom_changed,
                "headroom": applied.headroom.to_dict(),
                "warnings": [*applied.warnings, *applied.headroom_warnings],
            }
        )
        return 0
    verb = "would change" if args.dry_run else "applied"
    print(f"quotas {verb}: {applied.summary()} ({len(plan.quotas)} quota(s) for {len(plan.teams)} team(s))")
    for what, keys in (("added", applied.added), ("changed", applied.changed), ("removed", applied.removed)):
        for key in keys:
            print(f"  {what} {key}")
    if applied.headroom_changed:
        print(f"  headroom {_headroom_text(applied.headroom)}")
    for warning in applied.headroom_warnings:
        print(f"  warning: {warning}")
    return 0


def _headroom_text(headroom: Headroom) -> str:
    """Say ``20 % of every pool (a100: 10 %) for urgent work (priority >= 100 or inference), lent to preemptible work``."""
    if not headroom.active:
        return "none"
    pools = ", ".join(f"{pool}: {share / 10:g} %" for pool, share in headroom.pools)
    priority = headroom.urgent_priority  # a stored headroom's is always a number
    lent = ", lent to preemptible work" if headroom.lend_to_preemptible else ""
    where = f"every pool ({pools})" if pools else "every pool"
    return f"{headroom.share_milli / 10:g} % of {where} for urgent work (priority >= {priority} or inference){lent}"


def cmd_quota_list(args: argparse.Namespace) -> int:
    """Show each team's quota per flavor, with what its live grants hold now."""
    from airflow_gpupool.ledger import LedgerQuotas

    ledger = open_ledger(args)
    try:
        quotas = LedgerQuotas(ledger)
        plan, used = quotas.list(), quotas.usage()
    finally:
        ledger.close()
    rows = [{**q.to_dict(), "used": used.get((q.team, q.flavor), 0) / 1000} for q in plan.quotas]
    if args.json:
        print_json({"quotas": rows, "headroom": plan.headroom.to_dict()})
        return 0
    if not rows:
        print("no quotas: every team is served as before (apply a file with `gpupool quota apply FILE`)")
        return 0
    print(f"headroom: {_headroom_text(plan.headroom)}")
    headers = ["TEAM", "COHORT", "FLAVOR", "USED", "NOMINAL", "BORROW LIMIT", "LEND LIMIT"]
    print(
        table(
            headers,
            [
                [
                    r["team"],
                    r["cohort"] or "-",
                    r["flavor"],
                    _gpus(r["used"]),
                    _gpus(r["nominal"]),
                    _gpus(r["borrowing_limit"]),
                    _gpus(r["lending_limit"]),
                ]
                for r in rows
            ],
        )
    )
    return 0


def _gpus(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def register(subparsers: Any) -> None:
    """Add ``gpupool quota apply`` and ``gpupool quota list``.

    :param subparsers: the top-level subparsers
    """
    group = subparsers.add_parser("quota", help="team quotas per GPU model or node pool")
    sub = group.add_subparsers(dest="quota_command", metavar="SUBCOMMAND")
    sub.required = True
    apply = sub.add_parser(
        "apply",
        help="replace the team quotas with those of a YAML file",
        description=cmd_quota_apply.__doc__,
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    apply.add_argument("file", metavar="FILE", help="the quota file (YAML)")
    url_arg(apply)
    apply.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    apply.add_argument(
        "--strict",
        action="store_true",
        help="refuse a nominal quota above what its flavor holds (default: apply it with a warning, as Kueue does)",
    )
    apply.add_argument("--json", action="store_true", help="print one JSON object")
    apply.set_defaults(func=cmd_quota_apply)
    show = sub.add_parser(
        "list", help="show the team quotas and their usage", description=cmd_quota_list.__doc__
    )
    url_arg(show)
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=cmd_quota_list)
