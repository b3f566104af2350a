"""The web dashboard in a real headless browser (chromium), on a running embedded cluster: the
Run:AI exercise watched from the pages, pause and resume from the job page's buttons, and a
token of one project that sees only that project. Screenshots of the main pages at laptop and
phone widths are saved in the test's folder (see tests/dashboard_support.py)."""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest
import pytest_asyncio
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from cluster.embedded import down, up
from cluster.servers import free_port
from tests.dashboard_support import Screens, binaries, chromium, console_errors, wait_for
from tests.protocols import Served

pytestmark = [pytest.mark.nats, pytest.mark.slow]
TRAINING = "large-training-job"
WORKSPACE = "jupyter-workspace"
#: A training loop that reports progress and checkpoints on the job's timeline (about once a
#: second) and resumes from its checkpoint.
TRAIN_COMMAND = [sys.executable, str(Path(__file__).resolve().parent.parent / "examples/train.py"),
                 "--steps=1000000", "--report-every=100", "--checkpoint-every=500"]  # fmt: skip


@dataclass(frozen=True)
class Cluster:
    url: str
    admin: str  # the admin token
    team_b: str  # a token for project-b only

    def api(self, token: str | None = None) -> httpx.Client:
        auth = {"Authorization": f"Bearer {token or self.admin}"}
        return httpx.Client(base_url=self.url, headers=auth, timeout=30)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    """One embedded cluster (8 GPUs) for the module, with project-a and project-b (quota 4
    each) and a token for project-b."""
    binaries()  # no cluster for nothing when the browser is missing
    with tempfile.TemporaryDirectory(prefix="fairlane-ui-") as folder:
        info = await up(Path(folder) / "fl", gpus=8, insecure_same_user=True)
        try:
            admin = Path(info.admin_token_file).read_text().strip()
            async with httpx.AsyncClient(
                base_url=info.api_url, headers={"Authorization": f"Bearer {admin}"}, timeout=30
            ) as c:
                await ready(c)
                for project in ("project-a", "project-b"):
                    made = await c.put(f"/v1/projects/{project}", json={"quota": 4})
                    assert made.status_code == 200, made.text
                token = await c.post(
                    "/v1/tokens", json={"name": "team-b", "projects": ["project-b"]}
                )
                assert token.status_code == 201, token.text
            yield Cluster(info.api_url, admin, token.json()["token"])
        finally:
            await down(Path(folder) / "fl")


async def ready(c: httpx.AsyncClient, within: float = 60.0) -> None:
    """Wait until the API answers and this machine's node has registered."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            nodes = await c.get("/v1/nodes")
            if nodes.status_code == 200 and len(nodes.json()) == 1:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        assert asyncio.get_running_loop().time() < deadline, "the API or the node never came"
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory) -> Screens:
    return Screens(tmp_path_factory.mktemp("screens"))


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    with chromium() as chrome:
        yield chrome


def sign_in(chrome: webdriver.Chrome, cluster: Served, token: str) -> None:
    chrome.get(f"{cluster.url}/")  # the API's root sends the browser to the dashboard
    field = wait_for(chrome, lambda: chrome.find_element(By.ID, "token"), "the sign-in form")
    field.send_keys(token, Keys.ENTER)
    wait_for(chrome, lambda: heading(chrome) == "Pools", "the pools page after signing in")
    # set once: it is gone if the page is ever loaded again, so the checks below see live
    # updates, not reloads
    chrome.execute_script("window.notReloaded = true")


def heading(chrome: webdriver.Chrome) -> str:
    return str(chrome.find_element(By.TAG_NAME, "h1").text)


def not_reloaded(chrome: webdriver.Chrome) -> None:
    assert chrome.execute_script("return window.notReloaded === true"), "the page was reloaded"


def go(chrome: webdriver.Chrome, link_text: str, title: str) -> None:
    chrome.find_element(By.LINK_TEXT, link_text).click()
    wait_for(chrome, lambda: heading(chrome) == title, f"the {title} page")


def project_bar(chrome: webdriver.Chrome, project: str) -> tuple[str, str]:
    """(the bar's label, usage/quota from its data) in the pools page's project chart."""
    bar = chrome.find_element(By.CSS_SELECTOR, f'li.project-bar[data-project="{project}"]')
    label = bar.find_element(By.CLASS_NAME, "bar-value").text
    return label, f"{bar.get_attribute('data-usage')}/{bar.get_attribute('data-quota')}"


def shows_usage(chrome: webdriver.Chrome, project: str, usage: str) -> Callable[[], bool]:
    return lambda: project_bar(chrome, project) == (usage, usage)


def attributes(chrome: webdriver.Chrome, css: str, name: str) -> list[str]:
    """An attribute (or property) of every element `css` selects, read at one moment."""
    found = chrome.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e[arguments[1]]"
        " ?? e.getAttribute(arguments[1]))",
        css,
        name,
    )
    return [str(value) for value in found]


@dataclass(frozen=True)
class Entry:
    type: str
    reason: str
    for_job: str
    text: str
    applied: bool  # False: a decision that had no effect (the log had moved past it)


def timeline(chrome: webdriver.Chrome) -> list[Entry]:
    """The job page's timeline as shown, read at one moment."""
    found = chrome.execute_script(
        "return [...document.querySelectorAll('#timeline > li')].map((e) =>"
        " [e.dataset.type, e.dataset.reason, e.dataset.forJob, e.innerText,"
        " !e.classList.contains('no-effect')])"
    )
    return [Entry(*row) for row in found]


def types(chrome: webdriver.Chrome) -> list[str]:
    return [e.type for e in timeline(chrome)]


def text_of(chrome: webdriver.Chrome, css: str) -> str:
    shown = chrome.execute_script(
        "return document.querySelector(arguments[0])?.textContent ?? ''", css
    )
    return str(shown)


def state(chrome: webdriver.Chrome) -> str:
    return text_of(chrome, ".heading-state .state")


def submit(cluster: Cluster, job: dict[str, Any], token: str | None = None) -> None:
    with cluster.api(token) as api:
        made = api.post("/v1/jobs", json=job)
        assert made.status_code == 201, made.text


def test_the_runai_exercise_seen_in_the_browser(
    cluster: Cluster, browser: webdriver.Chrome, screens: Screens
) -> None:
    chrome = browser
    chrome.get(f"{cluster.url}/ui/")
    wait_for(chrome, lambda: chrome.find_element(By.ID, "token"), "the sign-in form")
    screens.take(chrome, "sign-in")
    sign_in(chrome, cluster, cluster.admin)
    the_usage_chart_moves_to_4_of_4(chrome, cluster, screens)
    the_queue_says_why_the_training_job_waits(chrome, screens)
    its_page_shows_the_preemption_and_its_return(chrome, cluster, screens)
    pause_and_resume_from_the_buttons(chrome, screens)
    its_logs_or_why_there_are_none(chrome, screens)
    go(chrome, "Pools", "Pools")
    wait_for(chrome, shows_usage(chrome, "project-a", "8/4"), "project-a back at 8/4")
    not_reloaded(chrome)
    # (a 404 for the logs, where the API has no logs route, is the one error expected)
    assert console_errors(chrome, expected="/logs?") == []


def the_usage_chart_moves_to_4_of_4(
    chrome: webdriver.Chrome, cluster: Cluster, screens: Screens
) -> None:
    # the training job takes all 8 GPUs: 8 of project-a's quota of 4
    submit(cluster, {"job_id": TRAINING, "project": "project-a", "class": "train", "gpus": 8,
                     "command": TRAIN_COMMAND})  # fmt: skip
    wait_for(chrome, shows_usage(chrome, "project-a", "8/4"), "project-a at 8/4")
    pool = chrome.find_element(By.CSS_SELECTOR, 'figure.pool-chart[data-pool="default"]')
    assert pool.get_attribute("data-in-use") == "8" and pool.get_attribute("data-free") == "0"
    screens.take(chrome, "pools-8-of-4")
    # the workspace of project-b reclaims its quota: the chart moves to 4/4, live
    submit(cluster, {"job_id": WORKSPACE, "project": "project-b", "class": "interactive",
                     "gpus": 4}, cluster.team_b)  # fmt: skip
    wait_for(chrome, shows_usage(chrome, "project-b", "4/4"), "project-b at 4/4")
    wait_for(chrome, shows_usage(chrome, "project-a", "0/4"), "project-a gave its GPUs back")
    not_reloaded(chrome)
    screens.take(chrome, "pools-4-of-4")


def the_queue_says_why_the_training_job_waits(chrome: webdriver.Chrome, screens: Screens) -> None:
    go(chrome, "Queue", "Queue")

    # (it may be stopping still: its reason follows, live)
    def why() -> str:
        return text_of(chrome, f'tr[data-job="{TRAINING}"] td.why')

    wait_for(chrome, lambda: WORKSPACE in why() and "fair share" in why(), "its fair share")
    screens.take(chrome, "queue")


def its_page_shows_the_preemption_and_its_return(
    chrome: webdriver.Chrome, cluster: Cluster, screens: Screens
) -> None:
    go(chrome, "Jobs", "Jobs")
    screens.take(chrome, "jobs")
    chrome.find_element(By.LINK_TEXT, TRAINING).click()
    wait_for(chrome, lambda: "JobPreempted" in types(chrome), "the preemption on the timeline")
    (request,) = [e for e in timeline(chrome) if e.type == "JobPreemptionRequested" and e.applied]
    assert request.reason == "reclaim" and request.for_job == WORKSPACE
    assert "reclaim" in request.text and WORKSPACE in request.text, request.text
    assert attributes(chrome, "table.lost tbody tr", "data-for-job") == [WORKSPACE]
    # the facts the policy used, one keypress away
    asked = '#timeline > li[data-type="JobPreemptionRequested"]:not(.no-effect)'
    chrome.find_element(By.CSS_SELECTOR, f"{asked} summary").send_keys(Keys.ENTER)
    facts = wait_for(chrome, lambda: attributes(chrome, f"{asked} table tbody tr", "innerText"),
                     "the facts shown")  # fmt: skip
    assert [f.split() for f in facts] == [
        ["project-a", "8", "4", "4"],
        ["project-b", "0", "4", "4"],
    ]
    screens.take(chrome, "job-preempted")
    chrome.find_element(By.ID, "show-progress").click()  # the timeline drawn anew
    assert chrome.find_elements(By.CSS_SELECTOR, f"{asked} details[open]"), "closed by a redraw"
    chrome.find_element(By.ID, "show-progress").click()

    # the workspace's page names the job it preempted; it is deleted from there (confirmed in
    # a dialog), and the training job comes back on its own page, live
    chrome.find_element(By.CSS_SELECTOR, "table.lost").find_element(By.LINK_TEXT, WORKSPACE).click()
    wait_for(chrome, lambda: attributes(chrome, "table.gained tbody td:first-child", "textContent")
             == [TRAINING], "the workspace's page names its victim")  # fmt: skip
    screens.take(chrome, "job-workspace")
    chrome.find_element(By.ID, "action-delete").click()
    chrome.find_element(By.ID, "confirm-delete").click()
    wait_for(chrome, lambda: state(chrome) == "cancelled", "the workspace deleted")
    chrome.back()
    wait_for(chrome, lambda: heading(chrome) == f"Job {TRAINING}", "the training job's page")
    wait_for(chrome, lambda: state(chrome) == "running" and types(chrome).count("JobStarted") == 2,
             "the training job back")  # fmt: skip
    shown = timeline(chrome)
    kinds = [e.type for e in shown if e.applied]
    asked_at = kinds.index("JobPreemptionRequested")
    back = kinds.index("JobStarted", asked_at)
    assert asked_at < kinds.index("JobPreempted") < back, kinds
    started = [e for e in shown if e.applied][back]
    assert "attempt 2" in started.text and "resumed" in started.text
    # the workload's own reports: it resumed from its checkpoint, and goes on from there
    wait_for(chrome, lambda: "Attempt 2: step" in text_of(chrome, "#progress-title + p"),
             "attempt 2's progress")  # fmt: skip
    messages = [e.text for e in timeline(chrome) if e.type == "JobMessage"]
    assert any("resumed from step" in m for m in messages), messages
    wait_for(chrome, lambda: attributes(chrome, "table.checkpoints tbody tr", "data-attempt"),
             "its checkpoints listed")  # fmt: skip
    progress = chrome.find_element(By.ID, "show-progress")
    progress.send_keys(Keys.SPACE)  # the reports on the timeline too
    wait_for(chrome, lambda: "JobProgress" in types(chrome), "progress on the timeline")
    assert not chrome.find_elements(By.CSS_SELECTOR, "#timeline > li.no-effect")
    progress.send_keys(Keys.SPACE)
    not_reloaded(chrome)
    screens.take(chrome, "job-back")


def pause_and_resume_from_the_buttons(chrome: webdriver.Chrome, screens: Screens) -> None:
    """(the keyboard presses them)"""
    pause = chrome.find_element(By.ID, "action-pause")
    assert pause.is_enabled() and not chrome.find_element(By.ID, "action-resume").is_enabled()
    pause.send_keys(Keys.SPACE)
    wait_for(chrome, lambda: "JobPaused" in types(chrome) and state(chrome) == "paused",
             "the job paused")  # fmt: skip
    assert "Paused" in chrome.find_element(By.CLASS_NAME, "outcome").text
    screens.take(chrome, "job-paused")
    chrome.find_element(By.ID, "action-resume").send_keys(Keys.ENTER)
    wait_for(chrome, lambda: "JobResumed" in types(chrome) and state(chrome) == "running",
             "the job running again")  # fmt: skip
    kinds = types(chrome)
    assert kinds.index("JobResumed") > kinds.index("JobPaused")


def its_logs_or_why_there_are_none(chrome: webdriver.Chrome, screens: Screens) -> None:
    """The first attempt's output (it stopped when preempted), or, where the API has no logs
    route, a clear message; never an error."""
    Select(chrome.find_element(By.ID, "log-attempt")).select_by_value("1")
    chrome.find_element(By.ID, "show-logs").click()
    shown = wait_for(chrome, lambda: chrome.find_elements(
        By.CSS_SELECTOR, ".log-output pre.log, .log-output .notice"),
        "the logs, or why there are none")  # fmt: skip
    if shown[0].tag_name == "pre":
        assert "stopping at step" in shown[0].text, shown[0].text
    else:
        assert "does not serve logs" in shown[0].text, shown[0].text
    screens.take(chrome, "job-resumed-logs")


def test_a_token_of_one_project_sees_only_that_project(
    cluster: Cluster, browser: webdriver.Chrome, screens: Screens
) -> None:
    chrome = browser
    submit(cluster, {"job_id": "a-build", "project": "project-a", "gpus": 0})
    submit(cluster, {"job_id": "b-notebook", "project": "project-b", "gpus": 0}, cluster.team_b)
    sign_in(chrome, cluster, cluster.team_b)
    assert "projects: project-b" in chrome.find_element(By.ID, "who").text
    charted = wait_for(
        chrome, lambda: attributes(chrome, "li.project-bar", "data-project"), "a chart"
    )
    assert charted == ["project-b"]

    go(chrome, "Jobs", "Jobs")
    wait_for(chrome, lambda: chrome.find_elements(By.CSS_SELECTOR, 'tr[data-job="b-notebook"]'),
             "project-b's job listed")  # fmt: skip
    listed = attributes(chrome, "table.jobs tbody tr td:first-of-type", "textContent")
    assert set(listed) == {"project-b"}, listed
    options = attributes(chrome, "#filter-project option", "value")
    assert options == ["", "project-b"]
    screens.take(chrome, "jobs-team-b")

    chrome.get(f"{cluster.url}/ui/#/jobs/a-build")
    wait_for(chrome, lambda: "does not cover" in chrome.find_element(By.ID, "main").text,
             "another project's job hidden")  # fmt: skip
    assert "may not read project 'project-a'" in chrome.find_element(By.ID, "main").text
    assert not chrome.find_elements(By.ID, "action-pause")
    assert not chrome.find_elements(By.ID, "timeline")
    # the API's 403 for another project's job is the one error the browser logs
    errors = console_errors(chrome)
    assert [e for e in errors if not ("/v1/jobs/a-build " in e and "403" in e)] == [], errors


def test_without_nvml_the_nodes_page_says_unknown(
    cluster: Cluster, browser: webdriver.Chrome
) -> None:
    """This cluster's node declared its 8 GPUs (`--gpus`): no NVML, so every reading is
    unknown, never 0% (tests/test_gpus_live.py has the readings of an NVML)."""
    chrome = browser
    sign_in(chrome, cluster, cluster.admin)
    go(chrome, "Nodes", "Nodes")
    wait_for(chrome, lambda: "GPU readings unknown" in text_of(chrome, "section.node .summary"),
             "the node's readings said unknown")  # fmt: skip
    shown = attributes(chrome, "table.gpus td.util", "textContent")
    assert shown == ["unknown"] * 8, shown
    assert "0%" not in text_of(chrome, "section.node")
    with cluster.api() as api:
        metrics = api.get("/metrics").text
    assert "fairlane_gpu_utilization_percent{" not in metrics
    assert metrics.count('source="unknown"') == 8
    assert console_errors(chrome) == []


def test_a_refusal_is_shown_and_the_stream_comes_back(
    cluster: Cluster, browser: webdriver.Chrome
) -> None:
    """A page that missed an event (its live stream cut) offers an action the API refuses: the
    page shows the API's reason; once the stream is back, so is the page."""
    chrome = browser
    submit(cluster, {"job_id": "b-stale", "project": "project-b", "gpus": 0}, cluster.team_b)
    sign_in(chrome, cluster, cluster.team_b)
    chrome.execute_cdp_cmd("Network.enable", {})
    chrome.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/v1/events*"]})
    chrome.get(f"{cluster.url}/ui/#/jobs/b-stale")
    chrome.refresh()  # loaded again: its stream is cut now
    wait_for(chrome, lambda: state(chrome) == "running", "the job's page")
    wait_for(chrome, lambda: text_of(chrome, "#live") == "reconnecting…", "the stream cut")

    with cluster.api(cluster.team_b) as api:
        assert api.delete("/v1/jobs/b-stale").status_code == 200
    assert state(chrome) == "running"  # the page has not heard of it
    chrome.find_element(By.ID, "action-pause").click()
    refusal = wait_for(chrome, lambda: text_of(chrome, ".outcome .error"), "the refusal shown")
    assert "cannot be paused" in refusal and "cancelled" in refusal, refusal
    wait_for(chrome, lambda: state(chrome) == "cancelled", "the page up to date again")

    chrome.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    wait_for(chrome, lambda: text_of(chrome, "#live") == "live", "the stream back")
    assert console_errors(chrome, expected="/v1/") == []  # (the cut stream, the refusal)


def test_the_dashboard_is_served_with_a_strict_policy(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        for path in ("/ui", "/ui/"):  # what the page names is there, whichever it was
            page = c.get(path)
            assert page.status_code == 200 and "js/app.js" in page.text
            policy = page.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "connect-src 'self'" in policy
            for asset in re.findall(r'(?:href|src)="([^":]+)"', page.text):
                found = c.get(urljoin(f"{cluster.url}{path}", asset))
                assert found.status_code == 200, (path, asset)
        assert c.get("/ui/js/app.js").headers["content-type"].startswith("text/javascript")
        assert c.get("/v1/token").status_code == 401
    with cluster.api(cluster.team_b) as api:
        assert api.get("/v1/token").json() == {
            "name": "team-b", "projects": ["project-b"], "admin": False
        }  # fmt: skip


def test_a_jobs_published_port_is_a_link_on_its_page_and_in_the_list(
    cluster: Cluster, browser: webdriver.Chrome
) -> None:
    chrome = browser
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ports = [{"host": port, "container": 8888}]
    job = {"job_id": "b-lab", "project": "project-b", "gpus": 0, "ports": ports}
    submit(cluster, {**job, "command": ["sleep", "600"]}, cluster.team_b)
    sign_in(chrome, cluster, cluster.team_b)
    chrome.get(f"{cluster.url}/ui/#/jobs/b-lab")
    wait_for(chrome, lambda: attributes(chrome, f'a[href="{url}"]', "href"), "the job's URL")
    assert f"{port}:8888" in chrome.find_element(By.ID, "main").text
    go(chrome, "Jobs", "Jobs")
    wait_for(
        chrome,
        lambda: attributes(chrome, 'tr[data-job="b-lab"] td.url a', "textContent") == [url],
        "the URL in the jobs list",
    )
    with cluster.api(cluster.team_b) as api:
        assert api.delete("/v1/jobs/b-lab").status_code == 200
    assert console_errors(chrome) == []
