"""No folder of the package too full to find one's way in, no module too long to read.

The ledger holds itself to less (:mod:`tests.unit.ledger.test_room_sizes`); these are the limits
every folder keeps (STYLE.md): a folder past them is grouped into sub-packages named by job, a
module split along its second job.
"""

from __future__ import annotations

from pathlib import Path

import airflow_gpupool

PACKAGE = Path(airflow_gpupool.__file__).parent
MAX_MODULES_PER_FOLDER = 20
MAX_LINES_PER_MODULE = 500


def test_no_folder_holds_more_than_twenty_modules() -> None:
    folders = {path.parent for path in PACKAGE.rglob("*.py")}
    full = {
        str(folder.relative_to(PACKAGE.parent)): n
        for folder in folders
        if (n := sum(1 for p in folder.glob("*.py") if p.name != "__init__.py")) > MAX_MODULES_PER_FOLDER
    }
    assert full == {}, f"group these into sub-packages by job: {full}"


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES_PER_MODULE
    }
    assert long == {}, f"split these by job: {long}"
