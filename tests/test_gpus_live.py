"""GPU utilization on a running embedded cluster whose node has a fake NVML
(tests/fake_nvml.py: the executor's real pynvml calls a `libnvidia-ml.so.1` built from C):
the GPUs are discovered and sampled through it, and what they report is seen through the API,
`/metrics`, `fairlane nodes`, `fairlane list`, `fairlane top` (in tmux) and the dashboard's
nodes page; a job whose GPUs sit at 0% for the idle time is flagged idle, and the event that
ends its attempt carries its average utilization. A reading NVML cannot give says "unknown"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from cluster.embedded import down, up
from tests.dashboard_support import SCREENSHOTS_ENV, Screens, chromium, console_errors, wait_for
from tests.fake_nvml import FakeNvml, Gpu
from tests.test_cli_live import until
from tests.test_dashboard import go, heading, ready, sign_in, text_of

pytestmark = [pytest.mark.nats, pytest.mark.slow]
#: The node's four GPUs, GPU 3 a board without utilization or temperature sensors.
BOARDS = ("GPU-1f0e6b4e-0000", "GPU-1f0e6b4e-0001", "GPU-1f0e6b4e-0002", "GPU-1f0e6b4e-0003")
IDLE_AFTER_S = 3


@dataclass(frozen=True)
class Cluster:
    url: str
    admin: str
    nvml: FakeNvml
    folder: Path

    def api(self) -> httpx.Client:
        auth = {"Authorization": f"Bearer {self.admin}"}
        return httpx.Client(base_url=self.url, headers=auth, timeout=30)

    def cli(self, *args: str) -> str:
        config = str(self.folder / "no-config.yaml")
        env = {**os.environ, "FAIRLANE_API": self.url, "FAIRLANE_TOKEN": self.admin,
               "FAIRLANE_CONFIG": config, "COLUMNS": "200"}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "fairlane.cli", *args],
            capture_output=True, text=True, timeout=60, env=env, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"fairlane {' '.join(args)}: {done.stderr}"
        return done.stdout

    def gpus(self) -> dict[str, Any]:
        with self.api() as api:
            found = api.get("/v1/gpus")
        assert found.status_code == 200, found.text
        report: dict[str, Any] = found.json()
        return report


def boards(utilization: dict[int, int]) -> list[Gpu]:
    """The four GPUs, each at the utilization given (0 otherwise); GPU 3 without sensors."""
    return [
        Gpu(uuid, utilization=utilization.get(i, 0), memory_used_mib=1000 * i + 512,
            temperature_c=40 + i, power_mw=100_000 + 1000 * i)
        if i < 3
        else Gpu(uuid, utilization=None, temperature_c=None, memory_used_mib=300)
        for i, uuid in enumerate(BOARDS)
    ]  # fmt: skip


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="fairlane-gpus-") as folder:
        nvml = FakeNvml(Path(folder) / "nvml")
        nvml.set(boards({}))
        saved = dict(os.environ)
        # the executor `up` starts inherits these: the fake library, a sample a second, and
        # jobs idle after 3 s at 0%
        os.environ.update(nvml.env())
        os.environ.update({"FAIRLANE_GPU_SAMPLE": "1", "FAIRLANE_IDLE_AFTER": f"{IDLE_AFTER_S}s"})
        try:
            info = await up(
                Path(folder) / "fl", insecure_same_user=True
            )  # no --gpus: NVML (the fake) says how many
        finally:
            os.environ.clear()
            os.environ.update(saved)
        try:
            admin = Path(info.admin_token_file).read_text().strip()
            async with httpx.AsyncClient(
                base_url=info.api_url, headers={"Authorization": f"Bearer {admin}"}, timeout=30
            ) as c:
                await ready(c, within=90.0)
                made = await c.put("/v1/projects/team-a", json={"quota": 4})
                assert made.status_code == 200, made.text
            yield Cluster(info.api_url, admin, nvml, Path(folder))
        finally:
            await down(Path(folder) / "fl")


def scrape(cluster: Cluster) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """`/metrics`, each sample by its name and sorted labels."""
    with cluster.api() as api:
        text = api.get("/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def devices(report: dict[str, Any]) -> list[dict[str, Any]]:
    (node,) = report["nodes"]
    found: list[dict[str, Any]] = node["devices"]
    return found


def test_the_gpus_are_sampled_through_nvml(cluster: Cluster) -> None:
    cluster.nvml.set(boards({0: 11, 1: 22, 2: 33}))
    report = until(
        cluster.gpus,
        lambda r: [d["utilization"] for d in devices(r)] == [11.0, 22.0, 33.0, None],
        "the sampled utilization",
    )
    (node,) = report["nodes"]
    assert node["gpus"] == 4 and node["source"] == "nvml" and node["sample_every_s"] == 1.0
    first, fourth = devices(report)[0], devices(report)[3]
    assert first["uuid"] == BOARDS[0] and first["model"] == "NVIDIA H100 80GB HBM3"
    assert (first["memory_used_mb"], first["memory_total_mb"]) == (512, 81559)
    assert (first["temperature_c"], first["power_w"]) == (40, 100.0)
    # the board without those sensors: unknown, never 0
    assert (fourth["utilization"], fourth["temperature_c"]) == (None, None)
    assert fourth["memory_used_mb"] == 300

    seen = scrape(cluster)
    name = node["node"]
    assert seen[("fairlane_gpu_utilization_percent", (("gpu", "2"), ("node", name)))] == 33.0
    assert seen[("fairlane_gpu_temperature_celsius", (("gpu", "0"), ("node", name)))] == 40.0
    total = seen[("fairlane_gpu_memory_total_bytes", (("gpu", "1"), ("node", name)))]
    assert total == float(81559 << 20)
    # unknown: absent, not 0; the GPU itself is listed
    assert ("fairlane_gpu_utilization_percent", (("gpu", "3"), ("node", name))) not in seen
    info = [k for k in seen if k[0] == "fairlane_gpu_info" and ("gpu", "3") in k[1]]
    assert len(info) == 1 and ("source", "nvml") in info[0][1]

    said = cluster.cli("nodes")
    assert "GPU UTIL" in said and "unknown" in said  # GPU 3 makes the node's mean unknown
    for text in ("11%", "22%", "33%", "0.5/80 GiB", "40°C", "100 W", "NVIDIA H100 80GB HBM3"):
        assert text in said, f"{text!r} not in:\n{said}"


def job_gpus(cluster: Cluster, job: str) -> Callable[[], dict[str, Any] | None]:
    def look() -> dict[str, Any] | None:
        return next((j for j in cluster.gpus()["jobs"] if j["job_id"] == job), None)

    return look


def test_a_job_at_zero_is_flagged_idle_and_its_average_kept(cluster: Cluster) -> None:
    done = cluster.folder / "busy-done"
    command = ["sh", "-c", f"while [ ! -e {done} ]; do sleep 0.2; done"]
    with cluster.api() as api:
        made = api.post("/v1/jobs", json={"job_id": "busy", "project": "team-a", "gpus": 2,
                                          "command": command})  # fmt: skip
        assert made.status_code == 201, made.text
    held = until(job_gpus(cluster, "busy"), lambda j: j is not None, "busy's GPUs sampled")
    indexes = [d["index"] for d in devices(cluster.gpus()) if d["job_id"] == "busy"]
    assert len(indexes) == 2 and held["gpus"] == 2
    cluster.nvml.set(boards(dict.fromkeys(indexes, 80)))
    until(
        job_gpus(cluster, "busy"),
        lambda j: j is not None and j["utilization"] == 80.0,
        "busy at 80%",
    )
    listed = cluster.cli("list")
    assert "80%" in listed and "IDLE" not in listed

    # its GPUs drop to 0%: flagged idle once they stayed there for the idle time
    cluster.nvml.set(boards({}))
    at_zero = until(
        job_gpus(cluster, "busy"), lambda j: j is not None and j["utilization"] == 0.0, "busy at 0%"
    )
    assert not at_zero["idle"]
    idle = until(
        job_gpus(cluster, "busy"), lambda j: j is not None and j["idle"], "busy flagged idle", 30
    )
    assert idle["idle_since"] is not None and 0.0 < idle["average"] < 80.0
    assert "IDLE" in cluster.cli("list")
    assert any(d["idle"] for d in devices(cluster.gpus()) if d["job_id"] == "busy")
    assert scrape(cluster)[("fairlane_job_gpu_idle", (("job", "busy"), ("project", "team-a")))]
    the_terminal_shows_it(cluster)

    # it ends: JobCompleted carries the attempt's average utilization
    done.touch()

    def completed() -> dict[str, Any] | None:
        with cluster.api() as api:
            items = api.get("/v1/jobs/busy/timeline", params={"type": "JobCompleted"}).json()
        return next(iter(items["items"]), None)

    ended = until(completed, lambda e: e is not None, "busy completed")
    average = ended["event"]["gpu_utilization"]
    assert 0.0 < average < 80.0, ended
    assert f"GPU utilization {average:.0f}%" in cluster.cli("describe", "busy", "--events")


def the_terminal_shows_it(cluster: Cluster) -> None:
    """`fairlane top` in a real terminal (tmux): the node's GPUs and the idle flag."""
    tmux = shutil.which("tmux")
    if tmux is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is needed for the terminal test (apt-get install tmux)")
        return
    session = f"gpus-{os.getpid()}"
    socket = ["-L", session]
    env = [f"FAIRLANE_API={cluster.url}", f"FAIRLANE_TOKEN={cluster.admin}"]
    # the terminal's own size, not one inherited from this process's environment
    command = f"env -u COLUMNS -u LINES {' '.join(env)} {sys.executable} -m fairlane.cli top"

    def run(*args: str) -> str:
        done = subprocess.run([tmux, *socket, *args], capture_output=True, text=True,
                              check=True, timeout=20)  # fmt: skip
        return done.stdout

    try:
        run("new-session", "-d", "-s", session, "-x", "200", "-y", "60", command)
        screen = until(
            lambda: run("capture-pane", "-p", "-t", session),
            lambda s: "IDLE" in s and "Nodes" in s,
            "top shows the idle job",
        )
        assert "busy" in screen and "unknown" in screen and "0%" in screen
        if os.environ.get(SCREENSHOTS_ENV):  # kept to be looked at
            Path(os.environ[SCREENSHOTS_ENV]).mkdir(parents=True, exist_ok=True)
            (Path(os.environ[SCREENSHOTS_ENV]) / "top-gpus.txt").write_text(screen)
        run("send-keys", "-t", session, "q")
    finally:
        subprocess.run([tmux, *socket, "kill-server"], capture_output=True, check=False)


# -- the dashboard ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory) -> Screens:
    return Screens(tmp_path_factory.mktemp("screens"))


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    with chromium() as chrome:
        yield chrome


def submit(cluster: Cluster, job_id: str, command: list[str], gpus: int = 1) -> None:
    with cluster.api() as api:
        made = api.post("/v1/jobs", json={"job_id": job_id, "project": "team-a", "gpus": gpus,
                                          "command": command})  # fmt: skip
        assert made.status_code == 201, made.text


def node_state(chrome: webdriver.Chrome) -> str:
    return attribute(chrome, "section.node", "data-state")


def cells(chrome: webdriver.Chrome, gpu: int) -> list[str]:
    """A GPU's row on the nodes page, read at one moment (the page redraws as samples come)."""
    found = chrome.execute_script(
        "return [...document.querySelectorAll(`table.gpus tr[data-gpu='${arguments[0]}'] td`)]"
        ".map((c) => c.innerText)",
        gpu,
    )
    return [str(c) for c in found]


def press(chrome: webdriver.Chrome, css: str) -> None:
    """Click what `css` selects, again if it was redrawn meanwhile."""

    def clicked() -> bool:
        chrome.find_element(By.CSS_SELECTOR, css).click()
        return True

    wait_for(chrome, clicked, css)


def count(chrome: webdriver.Chrome, css: str) -> int:
    return int(chrome.execute_script("return document.querySelectorAll(arguments[0]).length", css))


def attribute(chrome: webdriver.Chrome, css: str, name: str) -> str:
    return str(chrome.execute_script(
        "return document.querySelector(arguments[0])?.getAttribute(arguments[1])", css, name
    ))  # fmt: skip


def test_the_nodes_page_and_its_buttons(
    cluster: Cluster, browser: webdriver.Chrome, screens: Screens
) -> None:
    chrome = browser
    submit(cluster, "idler", ["sh", "-c", "sleep 3600"])
    cluster.nvml.set(boards({1: 64, 2: 7}))  # idler's GPU (whichever) stays at 0% or not
    until(job_gpus(cluster, "idler"), lambda j: j is not None, "idler sampled")
    (index,) = [d["index"] for d in devices(cluster.gpus()) if d["job_id"] == "idler"]
    cluster.nvml.set(boards({i: u for i, u in {0: 12, 1: 64, 2: 7}.items() if i != index}))
    until(
        job_gpus(cluster, "idler"), lambda j: j is not None and j["idle"], "idler flagged idle", 30
    )

    sign_in(chrome, cluster, cluster.admin)
    go(chrome, "Nodes", "Nodes")
    wait_for(chrome, lambda: cells(chrome, index)[2:3] == ["0%"], "idler's GPU at 0%")
    row = cells(chrome, index)
    assert "idler" in row[6] and "IDLE" in row[6].upper(), row
    # the board without sensors: unknown, not 0%
    assert cells(chrome, 3)[2] == "unknown" and cells(chrome, 3)[4] == "unknown"
    busy = next(i for i in (1, 2, 0) if i != index)
    assert cells(chrome, busy)[2] == {0: "12%", 1: "64%", 2: "7%"}[busy]
    assert count(chrome, 'table.idle tr[data-job="idler"]') == 1
    assert attribute(chrome, 'g.gpu-bar[data-gpu="3"]', "data-utilization") == "unknown"
    screens.take(chrome, "nodes")

    # the job page says it is idle, with its utilization
    press(chrome, 'table.idle a[href="#/jobs/idler"]')
    wait_for(chrome, lambda: "idle" in text_of(chrome, ".heading-state"), "the idle flag")
    assert "0%" in text_of(chrome, "#gpu-utilization")
    screens.take(chrome, "job-idle")

    # Cordon, Drain and Uncordon, pressed
    go(chrome, "Nodes", "Nodes")
    node = cluster.gpus()["nodes"][0]["node"]
    wait_for(chrome, lambda: node_state(chrome) == "ready", "the node ready")
    press(chrome, f"#cordon-{node}")
    wait_for(chrome, lambda: node_state(chrome) == "cordoned", "the node cordoned")
    assert attribute(chrome, f"#cordon-{node}", "disabled") == ""  # pressed once, no more
    assert "cordoned" in text_of(chrome, ".outcome")
    screens.take(chrome, "node-cordoned")
    press(chrome, f"#drain-{node}")
    wait_for(chrome, lambda: node_state(chrome) == "drained", "the node drained")
    # draining stopped the idle job: it waits, its GPU is free
    wait_for(chrome, lambda: cells(chrome, index)[6:] == ["free"], "idler stopped")
    press(chrome, f"#uncordon-{node}")
    wait_for(chrome, lambda: node_state(chrome) == "ready", "the node back in service")
    with cluster.api() as api:
        kinds = [e["type"] for e in api.get("/v1/nodes/" + node + "/timeline").json()["items"]]
    assert "NodeCordoned" in kinds and "NodeUncordoned" in kinds
    with cluster.api() as api:
        api.delete("/v1/jobs/idler")
    assert console_errors(chrome) == []


def test_a_project_token_gets_no_node_buttons_and_a_failure_is_explained(
    cluster: Cluster, browser: webdriver.Chrome, screens: Screens
) -> None:
    chrome = browser
    with cluster.api() as api:
        made = api.post("/v1/tokens", json={"name": "team-a-ui", "projects": ["team-a"]})
        assert made.status_code == 201, made.text
    token = made.json()["token"]
    submit(cluster, "broken", ["sh", "-c", "echo no data here; exit 3"])
    sign_in(chrome, cluster, token)
    go(chrome, "Nodes", "Nodes")
    wait_for(chrome, lambda: count(chrome, "section.node"), "a node")
    assert count(chrome, "section.node button") == 0
    chrome.get(f"{cluster.url}/ui/#/jobs/broken")
    wait_for(chrome, lambda: "exited with code 3" in text_of(chrome, ".failure"), "the reason")
    assert "no data here" in text_of(chrome, ".failure")
    screens.take(chrome, "job-failed")
    assert console_errors(chrome) == []


def test_submit_set_a_project_and_the_history(  # noqa: PLR0915 (one walk through three pages)
    cluster: Cluster, browser: webdriver.Chrome, screens: Screens
) -> None:
    chrome = browser
    sign_in(chrome, cluster, cluster.admin)

    # an admin sets a project's terms from the form
    go(chrome, "Projects", "Projects")
    chrome.find_element(By.ID, "terms-project").send_keys("team-b")
    chrome.find_element(By.ID, "terms-quota").send_keys("2")
    chrome.find_element(By.ID, "terms-weight").send_keys("3")
    chrome.find_element(By.ID, "terms-limit").send_keys("4")
    chrome.find_element(By.ID, "terms-priority").send_keys("7")
    chrome.find_element(By.ID, "terms-button").click()
    row = 'table.terms tr[data-project="team-b"]'
    wait_for(chrome, lambda: text_of(chrome, f"{row} td.quota") == "2", "team-b's quota shown")
    assert [text_of(chrome, f"{row} td.{c}") for c in ("weight", "limit", "priority")] == [
        "3",
        "4",
        "7",
    ]
    with cluster.api() as api:
        (terms,) = api.get("/v1/projects/team-b").json()["pools"]
    assert (terms["quota"], terms["over_quota_weight"], terms["limit"], terms["priority"]) == (
        2, 3, 4, 7
    )  # fmt: skip
    # a refusal is shown as the API says it
    chrome.find_element(By.ID, "terms-project").clear()
    chrome.find_element(By.ID, "terms-project").send_keys("team-b")
    chrome.find_element(By.ID, "terms-pool").send_keys("no-such-pool")
    chrome.find_element(By.ID, "terms-button").click()
    wait_for(chrome, lambda: text_of(chrome, ".outcome .error"), "the refusal")
    # and a pool's scheduler, time-aware fairness (rule 11) on: 2 hours, k 0.5
    chrome.find_element(By.ID, "pool-name").send_keys("default")
    Select(chrome.find_element(By.ID, "pool-scheduler")).select_by_value("fair_share")
    chrome.find_element(By.ID, "pool-half-life").send_keys("2")
    chrome.find_element(By.ID, "pool-k").send_keys("0.5")
    chrome.find_element(By.ID, "pool-button").click()
    wait_for(chrome, lambda: text_of(chrome, ".outcome .ok") == "Pool default set.", "pool set")
    with cluster.api() as api:
        page = api.get("/v1/timeline", params={"type": "PoolConfigured", "newest": 1}).json()
    set_at = page["items"][0]["event"]["scheduler"]
    assert (set_at["usage_half_life_s"], set_at["usage_k"]) == (7200.0, 0.5)
    chrome.find_element(By.ID, "pool-half-life").clear()
    chrome.find_element(By.ID, "pool-half-life").send_keys("0")  # the API's refusal, shown
    chrome.find_element(By.ID, "pool-button").click()
    wait_for(chrome, lambda: "got 0.0s" in text_of(chrome, ".outcome .error"), "refused")
    screens.take(chrome, "projects")

    # a job submitted from the form runs; a name taken is refused with the API's reason
    go(chrome, "Submit", "Submit a job")
    wait_for(chrome, lambda: chrome.find_elements(By.CSS_SELECTOR, "#submit-project option"),
             "the projects to choose from")  # fmt: skip
    Select(chrome.find_element(By.ID, "submit-project")).select_by_value("team-a")
    chrome.find_element(By.ID, "submit-job").send_keys("from-the-form")
    chrome.find_element(By.ID, "submit-gpus").clear()
    chrome.find_element(By.ID, "submit-gpus").send_keys("2")
    chrome.find_element(By.ID, "submit-command").send_keys("sh\n-c\nsleep 3600")
    screens.take(chrome, "submit")
    chrome.find_element(By.ID, "submit-button").click()
    wait_for(chrome, lambda: heading(chrome) == "Job from-the-form", "the new job's page")
    wait_for(chrome, lambda: text_of(chrome, ".heading-state .state") == "running", "it runs")
    with cluster.api() as api:
        job = api.get("/v1/jobs/from-the-form").json()
    assert (job["project"], job["gpus"], job["gpus_held"]) == ("team-a", 2, 2)
    go(chrome, "Submit", "Submit a job")
    wait_for(chrome, lambda: chrome.find_elements(By.CSS_SELECTOR, "#submit-project option"),
             "the projects to choose from")  # fmt: skip
    chrome.find_element(By.ID, "submit-job").send_keys("from-the-form")
    chrome.find_element(By.ID, "submit-button").click()
    wait_for(chrome, lambda: text_of(chrome, ".outcome .error"), "the refusal of a name taken")
    assert heading(chrome) == "Submit a job"

    # the history: team-a's GPUs in use over time reached 2 (busy, then from-the-form)
    go(chrome, "History", "History")
    chart = 'figure.project-history[data-project="team-a"]'
    wait_for(chrome, lambda: chrome.find_elements(By.CSS_SELECTOR, chart), "team-a's history")
    assert int(str(chrome.find_element(By.CSS_SELECTOR, chart).get_attribute("data-peak"))) >= 2
    label = chrome.find_element(By.CSS_SELECTOR, f"{chart} svg").get_attribute("aria-label")
    assert "against a quota of 4" in str(label)
    pool = chrome.find_element(By.CSS_SELECTOR, "figure.pool-history")
    assert int(str(pool.get_attribute("data-peak"))) >= 2
    screens.take(chrome, "history")
    Select(chrome.find_element(By.ID, "history-window")).select_by_value("900")
    wait_for(chrome, lambda: "window=900" in chrome.current_url, "the window in the address")
    wait_for(chrome, lambda: chrome.find_elements(By.CSS_SELECTOR, chart), "the last 15 minutes")
    with cluster.api() as api:
        api.delete("/v1/jobs/from-the-form")
    # the refusals above are the errors expected (the browser logs a failed request)
    assert [e for e in console_errors(chrome, "status of 422") if "/v1/pools/" not in e] == []


def test_history_through_the_api(cluster: Cluster) -> None:
    with cluster.api() as api:
        found = api.get("/v1/history", params={"points": 30}).json()
    (pool,) = found["pools"]
    assert pool["pool"] == "default" and pool["points"][-1]["gpus"] == 4  # the node's GPUs
    team_a = next(s for s in found["projects"] if s["project"] == "team-a")
    points = team_a["points"]
    assert len(points) <= 30 and max(p["usage"] for p in points) >= 2
    assert {p["quota"] for p in points} == {4}  # its quota, at every point
    assert any(p["fair_share"] > 0 for p in points)  # a fair share while it ran
