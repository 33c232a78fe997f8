"""Sphinx configuration of the airflow-gpupool documentation (``make docs`` builds it strictly)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]

from airflow_gpupool import __version__  # noqa: E402  (after the path is set)

project = "airflow-gpupool"
author = "airflow-gpupool contributors"
copyright = "airflow-gpupool contributors"
release = version = __version__

extensions = ["myst_parser", "gpupool_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Strict: `make docs` and tests/integration/test_docs.py run with -W -n, so every warning (a broken
# internal link, a missing anchor, a missing cross-reference) fails the build.
nitpicky = True
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
highlight_language = "text"
smartquotes = False  # option values and messages are quoted as typed

html_theme = "alabaster"
html_title = f"airflow-gpupool {release}"
html_theme_options = {"description": "GPU slices reserved from a shared ledger, for Apache Airflow 3"}
