"""The one "skip here, fail under CI" helper."""

from __future__ import annotations

import pytest

from tests.skips import skip_or_fail, under_ci


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("TRUE", True), (" True ", True), ("false", False), ("1", False), ("", False)],
)
def test_ci_is_read_case_insensitively(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("CI", value)
    assert under_ci() is expected


def test_without_ci_it_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="^no promtool here$"):
        skip_or_fail("no promtool here", what="promtool")


def test_under_ci_it_fails_naming_what_ci_must_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "True")
    with pytest.raises(pytest.fail.Exception, match="^CI must run promtool: no promtool here$"):
        skip_or_fail("no promtool here", what="promtool")
