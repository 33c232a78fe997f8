"""``python -m airflow_gpupool.cli``: the ``gpupool`` command without its console script."""

from __future__ import annotations

import sys

from airflow_gpupool.cli import main

sys.exit(main())
