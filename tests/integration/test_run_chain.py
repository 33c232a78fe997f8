"""A DAG run's GPU steps as one chain, read from a real ledger (SQLite and PostgreSQL): the ledger's rows, the API, the page, the CLI.

The story (times from the fake clock's start, ``T``), run ``manual__2027-01-15T10:00:00+00:00`` of ``pipe``:
    T+0      preprocess asks for 1 GPU: granted
    T+100    preprocess ends; train asks for 2 GPUs: granted at once (no gap)
    T+700    train ends, its release saying it handed its slice on to evaluate; evaluate asks, granted
    T+750    export asks ahead of its time (not before T+2000): it waits in its place
    T+800    now
Beside it: the same DAG's run ``x/<run>`` (a run id that ends like this one), another DAG's run
of the same id, and a notebook: none of them is a step of the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from html.parser import HTMLParser
from urllib.parse import quote

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_gpupool.cli import main
from airflow_gpupool.governance.runs import RunNeed
from airflow_gpupool.ledger import Ledger, LedgerHistory
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.run_chain import read_run_chain
from airflow_gpupool.task_try import TaskTry
from tests.ledger_fixtures import FakeClock, node

RUN = "manual__2027-01-15T10:00:00+00:00"


def try_of(task: str, run_id: str = RUN, dag_id: str = "pipe") -> TaskTry:
    return TaskTry(dag_id, task, run_id, -1, 1, "worker-1")


@pytest.fixture
def story(ledger: Ledger, clock: FakeClock) -> Ledger:
    return tell_story(ledger, clock)


def tell_story(ledger: Ledger, clock: FakeClock) -> Ledger:
    """Write the module's story into ``ledger``, whose clock is ``clock``."""
    ledger.upsert_nodes([node("a1", gpus=4, pool="train")])

    def ask(task: str, gpus: int, **more: object) -> str:
        ref = try_of(task, **more)  # type: ignore[arg-type]
        ledger.reserve(
            GpuRequest(gpus=gpus, team="vision"), ref.holder, reservation_id=ref.reservation_id, ttl=3600
        )
        return ref.reservation_id

    pre = ask("preprocess", 1)
    clock.advance(100)
    ledger.release(pre)
    train = ask("train", 2)
    ask("train", 1, run_id=f"x/{RUN}")
    ask("train", 1, dag_id="other")
    clock.advance(600)
    ledger.release(train, reason="handed on to evaluate (1 GPU); the rest released")
    ask("evaluate", 1)
    clock.advance(50)
    export = try_of("export")
    ledger.reserve(
        GpuRequest(gpus=1, team="vision"),
        export.holder,
        reservation_id=export.reservation_id,
        not_before=clock.now + 1250,
    )
    ledger.reserve(GpuRequest(gpus=1, team="ops"), "notebook@laptop", reservation_id="r-notebook")
    clock.advance(50)
    return ledger


def test_the_chain_of_a_run_read_from_the_ledger(story: Ledger, clock: FakeClock) -> None:
    chain = read_run_chain(story, "pipe", RUN)

    assert [(s.task, s.try_number, s.state) for s in chain.steps] == [
        ("preprocess", 1, "released"),
        ("train", 1, "released"),
        ("evaluate", 1, "granted"),
        ("export", 1, "waiting"),
    ]
    pre, train, evaluate, export = chain.steps
    assert [s.gap_before for s in chain.steps] == [None, 0.0, 0.0, None]
    assert [s.waited for s in chain.steps] == [0.0, 0.0, 0.0, 50.0]
    assert (train.handed_on_to, evaluate.handed_on_from) == ("evaluate", "train")
    assert (pre.handed_on_to, export.handed_on_from) == (None, None)
    assert [s.queued_ahead for s in chain.steps] == [False, False, False, True]
    assert export.not_before == clock.now - 50 + 1250 and export.node is None and export.gpus == ""
    assert {s.node for s in (pre, train, evaluate)} == {"a1"}
    assert len(train.gpus.removeprefix("GPU ").split(",")) == 2
    assert chain.span == 800.0 and chain.handed_on == 1 and not chain.admitted_as_run


def test_the_ledger_reads_only_the_runs_own_rows(story: Ledger) -> None:
    history = LedgerHistory(story)
    # ``pipe/%/<run>/map-%`` also matches ``pipe/train/x/<run>/map--1``: the parse drops it.
    assert [(e.task_id, e.run_id) for e in history.of_run("pipe", RUN)] == [
        ("preprocess", RUN),
        ("train", RUN),
        ("evaluate", RUN),
        ("export", RUN),
    ]
    assert [e.task_id for e in history.of_run("pipe", f"x/{RUN}")] == ["train"]
    assert [e.task_id for e in history.of_run("other", RUN)] == ["train"]
    assert history.of_run("pipe", "manual__2027") == []
    assert history.of_run("Pipe", RUN) == []  # SQLite's LIKE ignores case; the run's name does not


def test_a_run_id_with_like_wildcards_is_read_as_written(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("a1", gpus=2)])
    for run_id in ("run_%1", "runX%1", "run_a1"):
        ref = try_of("fit", run_id=run_id)
        ledger.reserve(GpuRequest(gpus=1), ref.holder, reservation_id=ref.reservation_id, timeout=60)
    assert [e.run_id for e in LedgerHistory(ledger).of_run("pipe", "run_%1")] == ["run_%1"]


@pytest.fixture
def client(story: Ledger) -> Iterator[TestClient]:
    app = create_app(lambda: story, snapshot_ttl=0)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    yield TestClient(app)


def test_the_json_api_answers_the_chain(client: TestClient) -> None:
    data = client.get("/api/v1/run", params={"dag_id": "pipe", "run_id": RUN}).json()
    assert [s["task"] for s in data["steps"]] == ["preprocess", "train", "evaluate", "export"]
    assert data["steps"][2]["handed_on_from"] == "train" and data["steps"][3]["queued_ahead"] is True
    assert (data["dag_id"], data["run_id"], data["handed_on"], data["gap_seconds"]) == ("pipe", RUN, 1, 0.0)
    missing = client.get("/api/v1/run", params={"dag_id": "pipe", "run_id": "nope"})
    assert missing.status_code == 404 and "no GPU step of run 'nope'" in missing.json()["detail"]
    assert client.get("/api/v1/run", params={"dag_id": "pipe"}).status_code == 422
    assert client.get("/api/v1/run", params={"dag_id": "", "run_id": RUN}).status_code == 422
    # The history API carries what the chain reads: the GPUs and a queued-ahead time.
    rows = client.get("/api/v1/history", params={"dag_id": "pipe"}).json()["reservations"]
    export = next(r for r in rows if r["task_id"] == "export")
    assert export["not_before"] is not None and export["gpu_indices"] == []


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        cls = dict(attrs).get("class") or ""
        if tag == "a" and "run-link" in cls.split():
            self.hrefs.append(dict(attrs)["href"] or "")


def test_the_history_links_each_task_try_to_its_runs_page(client: TestClient) -> None:
    links = _Links()
    html = client.get("/", params={"dag_id": "pipe"}).text
    links.feed(html[html.index('<section class="history">') :])
    wanted = f"run?dag_id=pipe&run_id={quote(RUN, safe='')}"
    assert links.hrefs.count(wanted) == 4  # the run's four steps; the x/ run links elsewhere
    page = client.get(f"/{wanted}&partial=1").text
    assert (
        page.index(">preprocess<") < page.index(">train<") < page.index(">evaluate<") < page.index(">export<")
    )
    assert "handed on from train" in page and "handed on to evaluate" in page
    assert page.count('class="mark queued-ahead"') == 2  # export's, in the strip and in the table
    assert '<li class="joint handed"' in page
    assert client.get("/run", params={"dag_id": "pipe", "run_id": "nope"}).status_code == 404
    # The history's outcome says the waiting export is queued ahead.
    history = client.get("/", params={"dag_id": "pipe", "state": "waiting", "partial": 1}).text
    assert 'class="mark queued-ahead"' in history


def test_a_reservation_page_links_to_its_run(client: TestClient) -> None:
    page = client.get(f"/reservations/{try_of('train').reservation_id}", params={"partial": 1}).text
    assert f'href="../run?dag_id=pipe&amp;run_id={quote(RUN, safe="")}"' in page


def test_gpupool_chain_prints_the_run(
    story: Ledger, ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["chain", "--url", ledger_url, "pipe", RUN]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # (Its clock is the machine's, not the story's: the span is not checked here.)
    assert lines[0].startswith(
        f"run {RUN} of pipe: 4 GPU steps, 1 handed on, gaps 0s, first request to last end "
    )
    assert [line.split()[0] for line in lines[2:]] == ["preprocess", "train", "evaluate", "export"]
    assert "handed on to evaluate" in lines[3] and "handed on from train" in lines[4]
    assert "queued ahead" in lines[5] and lines[5].split()[3] == "-"  # not granted: nowhere yet
    assert main(["chain", "--url", ledger_url, "pipe", RUN, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["task"] for s in data["steps"]] == ["preprocess", "train", "evaluate", "export"]
    assert main(["chain", "--url", ledger_url, "pipe", "nope"]) == 0
    assert capsys.readouterr().out == "No GPU step of run nope of DAG pipe in the ledger.\n"


def test_the_grants_and_the_queue_link_to_the_run_and_mark_a_step_queued_ahead(client: TestClient) -> None:
    html = client.get("/", params={"partial": 1}).text
    grants = html[html.index('<section class="grants">') : html.index('<section class="queue">')]
    queue = html[html.index('<section class="queue">') : html.index('<section class="history">')]
    wanted = f'href="run?dag_id=pipe&amp;run_id={quote(RUN, safe="")}"'
    assert grants.count(wanted) == 1  # evaluate; the other runs' grants link to their own
    assert (
        queue.count(wanted) == 1 and queue.count('class="run-link"') == 1
    )  # export; the notebook is no task
    row = next(r for r in queue.split("<tr>") if "pipe / export" in r)
    assert '<span class="mark queued-ahead" title="not granted before 2027-01-15 08:33:20 UTC">' in row
    assert queue.count("mark queued-ahead") == 1


def test_a_step_admitted_with_its_run_is_marked_from_the_ledgers_own_record(ledger: Ledger) -> None:
    # The run gate stores the run's peak with its first step (no message to read once granted).
    ledger.upsert_nodes([node("a1", gpus=4)])
    first, second = try_of("prep", run_id="r-admitted"), try_of("train", run_id="r-admitted")
    need = RunNeed("pipe/r-admitted", 3000, ("train",))
    ledger.reserve(GpuRequest(gpus=1), first.holder, reservation_id=first.reservation_id, run_need=need)
    ledger.reserve(GpuRequest(gpus=2), second.holder, reservation_id=second.reservation_id)

    chain = read_run_chain(ledger, "pipe", "r-admitted")
    assert [(s.task, s.state, s.admitted_as_run) for s in chain.steps] == [
        ("prep", "granted", True),
        ("train", "granted", False),
    ]
    assert chain.admitted_as_run
