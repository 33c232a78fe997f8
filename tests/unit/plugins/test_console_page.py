"""What the console writes for people: distinct ids for a gang's members, team links, the use chart."""

from __future__ import annotations

import pytest

from airflow_gpupool.plugins.console.team_page import use_chart_svg
from airflow_gpupool.plugins.holders import rid_link, short_id, team_link

LEADER = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("rid", "shown"),
    [
        pytest.param("r-train", "r-train", id="short"),
        pytest.param(LEADER, LEADER[:12], id="long"),
        pytest.param(f"{LEADER}.1", f"{LEADER[:12]}.1", id="gang-member-1"),
        pytest.param(f"{LEADER}.12", f"{LEADER[:12]}.12", id="gang-member-12"),
        pytest.param("a.b.c", "a.b.c", id="dots-no-member"),
    ],
)
def test_a_reservation_id_is_shortened_keeping_a_gang_members_index(rid: str, shown: str) -> None:
    assert short_id(rid) == shown


def test_a_gangs_members_show_distinct_ids_linking_to_their_own_pages() -> None:
    links = [rid_link(LEADER if i == 0 else f"{LEADER}.{i}") for i in range(3)]
    assert len(set(links)) == 3
    assert f'href="reservations/{LEADER}.2" title="{LEADER}.2"><code>{LEADER[:12]}.2</code>' in links[2]


def test_a_team_link_escapes_and_quotes_the_name() -> None:
    assert team_link("a&b c") == '<a class="team-link" href="teams/a%26b%20c">a&amp;b c</a>'


def test_the_use_chart_draws_the_nominal_quota_and_says_the_peak() -> None:
    svg = use_chart_svg([(0.0, 0.0), (60.0, 0.0), (60.0, 3.0), (120.0, 3.0)], 2.0, 0.0, 120.0)
    assert '<line class="nominal"' in svg
    assert "GPUs held, peak 3 · nominal 2 GPUs (dashed)" in svg
    assert "no quota stored" in use_chart_svg([(0.0, 1.0), (120.0, 1.0)], None, 0.0, 120.0)
