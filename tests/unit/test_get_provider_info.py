"""The provider metadata Airflow reads: valid against Airflow's schema, and every path importable."""

from __future__ import annotations

import importlib
import json
from importlib import metadata
from pathlib import Path

import airflow
import jsonschema

from airflow_gpupool import settings
from airflow_gpupool.get_provider_info import get_provider_info


def test_provider_info_matches_airflows_schema() -> None:
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_entry_point_points_at_get_provider_info() -> None:
    (entry,) = [
        e for e in metadata.entry_points(group="apache_airflow_provider") if e.dist.name == "airflow-gpupool"
    ]
    assert entry.load() is get_provider_info


def test_every_declared_class_and_module_imports() -> None:
    info = get_provider_info()
    paths = [c["hook-class-name"] for c in info["connection-types"]]
    paths += [p["plugin-class"] for p in info["plugins"]]
    paths += info["notifications"]
    for path in paths:
        module, _, name = path.rpartition(".")
        assert hasattr(importlib.import_module(module), name), path
    for group in info["triggers"]:
        for module in group["python-modules"]:
            importlib.import_module(module)


def test_config_options_have_the_defaults_settings_use() -> None:
    options = get_provider_info()["config"]["gpupool"]["options"]
    for name, default in settings.DEFAULTS.items():
        assert name in options, f"[gpupool] {name} is read but not declared"
        assert options[name]["default"] == default, name
    # And the other way: an option read outside Airflow's configuration falls back to DEFAULTS.
    assert set(options) <= set(settings.DEFAULTS), sorted(set(options) - set(settings.DEFAULTS))


def test_one_version_source_pyproject_read_by_the_package_and_the_provider_info() -> None:
    import tomllib

    import airflow_gpupool

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    version = tomllib.loads(pyproject.read_text())["project"]["version"]
    assert airflow_gpupool.__version__ == version
    assert get_provider_info()["versions"] == [version]


def test_changelog_has_a_section_for_the_version_and_the_next() -> None:

    import airflow_gpupool

    changelog = (Path(__file__).resolve().parents[2] / "CHANGELOG.md").read_text()
    assert f"\n## {airflow_gpupool.__version__} " in changelog
    assert "\n## Unreleased" in changelog
