"""``python -m airflow_gpupool.demo``: see :mod:`airflow_gpupool.demo.run`."""

from __future__ import annotations

import sys

from airflow_gpupool.demo.run import main

sys.exit(main())
