"""A real headless browser for the dashboard's tests: Debian's chromium driven by its
chromedriver through selenium (`.ci/browser` installs both). Missing: the tests skip, or fail
with `CI=true`. Nothing is downloaded at run time: both binaries are passed explicitly."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

LAPTOP: Final = (1366, 900)
PHONE: Final = (390, 844)
#: Where screenshots are copied besides the test's own folder, when set.
SCREENSHOTS_ENV: Final = "FAIRLANE_SCREENSHOTS"


def binaries() -> tuple[str, str]:
    """chromium and chromedriver, or skip (fail with CI=true) if either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        why = "chromium and chromedriver are needed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (CI=true: run .ci/browser first)")
        pytest.skip(why)
    return browser, driver


@contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    browser, driver = binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", f"--window-size={LAPTOP[0]},{LAPTOP[1]}"):  # fmt: skip
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    chrome.set_window_size(*LAPTOP)
    try:
        yield chrome
    finally:
        chrome.quit()


def wait_for(
    chrome: webdriver.Chrome, holds: Callable[[], Any], what: str, within: float = 90.0
) -> Any:
    """Wait until `holds()` gives something true (elements re-drawn meanwhile are retried)."""

    def check(_: webdriver.Chrome) -> Any:
        try:
            return holds()
        except StaleElementReferenceException:
            return False

    try:
        return WebDriverWait(chrome, within, poll_frequency=0.2).until(check)
    except Exception as e:
        raise AssertionError(f"{what} (page: {chrome.current_url})") from e


def console_errors(chrome: webdriver.Chrome, expected: str | None = None) -> list[str]:
    """The page's errors in the browser's console (a script's uncaught error, a refused
    policy, a failed request), except those that mention `expected`."""
    entries = chrome.get_log("browser")  # type: ignore[no-untyped-call]  # selenium: unannotated
    return [
        e["message"]
        for e in entries
        if e["level"] == "SEVERE" and (expected is None or expected not in e["message"])
    ]


class Screens:
    """Full-page screenshots at laptop and phone widths, in the test's folder (and copied to
    $FAIRLANE_SCREENSHOTS when set); each also checks that nothing is wider than the screen."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.copy_to = (
            Path(os.environ[SCREENSHOTS_ENV]) if os.environ.get(SCREENSHOTS_ENV) else None
        )
        self.taken: list[Path] = []

    def take(self, chrome: webdriver.Chrome, name: str) -> None:
        for label, (width, height) in (("laptop", LAPTOP), ("phone", PHONE)):
            chrome.set_window_size(width, height)
            wide = chrome.execute_script("return document.documentElement.scrollWidth")
            inner = chrome.execute_script("return window.innerWidth")
            assert wide <= inner, f"{name} at {width}px: the page is {wide}px wide"
            tall = chrome.execute_script("return document.documentElement.scrollHeight")
            chrome.set_window_size(width, min(max(height, tall + 140), 6000))
            path = self.folder / f"{name}-{label}.png"
            assert chrome.save_screenshot(str(path)), f"no screenshot of {name}"
            self.taken.append(path)
            if self.copy_to is not None:
                self.copy_to.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, self.copy_to / path.name)
        chrome.set_window_size(*LAPTOP)
