"""The explain page (`/ui`) in a real browser: Debian's chromium and chromium-driver
(`make browser` installs them), driven by selenium, against `orrery serve --sample`.

Each view is used as a person would (typing, clicking, the keyboard for tabs) and
photographed into a temporary directory (a test run leaves the tree as it found it), or
into `docs/ui/` with `ORRERY_UI_SCREENSHOTS=docs` (`make ui-screenshots`). Chromium runs
with no network but loopback: its resolver maps every other host to nothing, and the test
reads every request the page made from the browser's performance log and checks that
none left 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.conftest import Server, start_server

selenium = pytest.importorskip("selenium", reason="selenium is a dev dependency (make venv)")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ADMIN_KEY = "ui-admin"
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "ui"
T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except Exception:  # an element not there yet, a stale one
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("ui") / "data", "--sample", env={"ORRERY_ADMIN_KEY": ADMIN_KEY}
    )

    def searchable() -> bool:
        body = srv.client.get("/v1/readiness").json()
        return bool(body["ready"]) and len(body["scopes"]) == 5

    try:
        wait_for(searchable, "the sample to be searchable", timeout=300)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.fail("chromium and chromium-driver are missing: run `make browser` (apt, as root)")
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager never downloads anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
        # Nothing but loopback resolves: a request elsewhere fails instead of leaving.
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def requested_hosts(driver: WebDriver) -> set[str]:
    """Hosts of every request the page sent since the last call (performance log)."""
    hosts = set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if url.startswith(("http:", "https:", "ws:", "wss:")):
                hosts.add(urlsplit(url).hostname or "")
    return hosts


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the views are photographed: `docs/ui/` when `ORRERY_UI_SCREENSHOTS=docs`
    (refreshing the README's pictures), else a temporary directory."""
    if os.environ.get("ORRERY_UI_SCREENSHOTS") == "docs":
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        return DOCS_SHOTS
    return tmp_path_factory.mktemp("ui-shots")


def shot(driver: WebDriver, shots: Path, name: str) -> None:
    path = shots / f"{name}.png"
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 0, path


def open_ui(driver: WebDriver, server: Server) -> None:
    driver.get(f"http://127.0.0.1:{server.port}/")  # `/` redirects to the page
    wait_for(lambda: driver.current_url.endswith("/ui"), "the redirect to /ui")
    wait_for(lambda: driver.find_element(By.ID, "search-form"), "the page")


def tab(driver: WebDriver, name: str) -> None:
    driver.find_element(By.ID, f"tab-{name}").click()
    wait_for(lambda: driver.find_element(By.ID, f"view-{name}").is_displayed(), name)


def test_search_renders_the_first_result_and_its_breakdown(
    browser: WebDriver, server: Server, shots: Path
) -> None:
    open_ui(browser, server)
    query = browser.find_element(By.NAME, "query_text")
    query.clear()
    query.send_keys("Wo stand früher meine rote Thermoskanne?", Keys.ENTER)
    first = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "#results article"), "a result")
    assert first.get_attribute("data-item") == "fact:thermos_location_old"
    meters = first.find_elements(By.CSS_SELECTOR, '[role="meter"]')
    assert [m.get_attribute("aria-label").split()[0] for m in meters] == [
        "lexical",
        "vector",
        "freshness",
        "metadata",
    ]
    assert float(meters[0].get_attribute("aria-valuenow")) > 0.5  # lexical
    own = {
        o.get_attribute("data-source"): o.text
        for o in first.find_elements(By.CSS_SELECTOR, ".own-rank")
        if o.text
    }
    assert own == {"lexical": "own #1", "vector": "own #1"}
    assert browser.find_element(By.ID, "cache-state").text in ("cache miss", "cache hit")
    assert browser.find_elements(By.CSS_SELECTOR, ".stack span")
    shot(browser, shots, "search")
    assert requested_hosts(browser) == {"127.0.0.1"}


def test_search_is_usable_at_360_px(browser: WebDriver, server: Server, shots: Path) -> None:
    browser.set_window_size(360, 800)
    try:
        open_ui(browser, server)
        browser.find_element(By.CSS_SELECTOR, "#search-form button[type=submit]").click()
        wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "#results article"), "a result")
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 360, f"the page scrolls sideways at 360 px ({width} px wide)"
        shot(browser, shots, "search-360")
    finally:
        browser.set_window_size(1200, 900)


def test_tabs_work_from_the_keyboard(browser: WebDriver, server: Server) -> None:
    open_ui(browser, server)
    search_tab = browser.find_element(By.ID, "tab-search")
    search_tab.click()
    search_tab.send_keys(Keys.ARROW_RIGHT)
    assert browser.switch_to.active_element.get_attribute("id") == "tab-compare"
    assert browser.find_element(By.ID, "view-compare").is_displayed()
    assert not browser.find_element(By.ID, "view-search").is_displayed()


def test_compare_joins_the_two_profiles_ranks_with_lines(
    browser: WebDriver, server: Server, shots: Path
) -> None:
    open_ui(browser, server)
    tab(browser, "compare")
    browser.find_element(By.CSS_SELECTOR, "#compare-form button[type=submit]").click()
    lines = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#rank-lines line"), "rank lines"
    )
    left = browser.find_elements(By.CSS_SELECTOR, ".side-a li")
    right = browser.find_elements(By.CSS_SELECTOR, ".side-b li")
    assert left and right and len(lines) <= min(len(left), len(right))
    # One line per document both sides rank, and overlap@k says how many there are.
    shared = {li.get_attribute("data-doc") for li in left} & {
        li.get_attribute("data-doc") for li in right
    }
    assert {line.get_attribute("data-doc") for line in lines} == shared
    overlap = browser.find_element(By.ID, "overlap").text
    assert f"overlap@10 {len(shared) / 10:.2f}" in overlap
    assert "weighted@3" in overlap and "rrf@2" in overlap
    shot(browser, shots, "compare")
    assert requested_hosts(browser) == {"127.0.0.1"}


def test_envelope_shows_selected_rings(browser: WebDriver, server: Server, shots: Path) -> None:
    open_ui(browser, server)
    tab(browser, "envelope")
    browser.find_element(By.CSS_SELECTOR, "#envelope-form button[type=submit]").click()
    selected = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#rings .ring.selected"), "rings"
    )
    assert selected[0].get_attribute("data-ring") == "home"  # the base ring first
    assert browser.find_elements(By.CSS_SELECTOR, "#envelope-out tbody tr")
    shot(browser, shots, "envelope")
    assert requested_hosts(browser) == {"127.0.0.1"}


def _admin(server: Server) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://127.0.0.1:{server.port}", headers={"x-admin-key": ADMIN_KEY}
    )


def test_a_promote_from_the_page_changes_readiness(
    browser: WebDriver, server: Server, shots: Path
) -> None:
    with _admin(server) as admin:
        built = admin.post(
            "/v1/admin/generations/build", json={"namespace": "demo", "snapshot_kind": "objects"}
        )
        assert built.status_code == 202, built.text
        new = built.json()["row"]["generation_id"]

        def sealed() -> bool:
            state = admin.get(f"/v1/admin/generations/{new}").json()["row"]["state"]
            assert state != "failed"
            return bool(state == "sealed")

        wait_for(sealed, f"{new} to seal", timeout=300)

    def live_objects() -> str:
        scopes = server.client.get("/v1/readiness").json()["scopes"]
        return str(next(s["generation_id"] for s in scopes if s["snapshot_kind"] == "objects"))

    before = live_objects()
    assert before != new
    open_ui(browser, server)
    admin_key = browser.find_element(By.ID, "admin-key")
    admin_key.send_keys(ADMIN_KEY)
    browser.find_element(By.CSS_SELECTOR, "#keys button[type=submit]").click()
    tab(browser, "generations")
    browser.find_element(By.CSS_SELECTOR, "#generations-form button[type=submit]").click()
    verify = wait_for(
        lambda: browser.find_element(By.CSS_SELECTOR, f'[aria-label="verify {new}"]'), "rows"
    )
    verify.click()
    wait_for(
        lambda: '"verified": true' in browser.find_element(By.ID, "admin-report").text,
        "the verify report",
    )
    promote = wait_for(
        lambda: browser.find_element(By.CSS_SELECTOR, f'[aria-label="promote {new}"]'), "promote"
    )
    promote.click()
    report = wait_for(lambda: browser.find_element(By.ID, "admin-report").text, "the report")
    assert '"action": "promote"' in report and new in report
    wait_for(lambda: live_objects() == new, "readiness to name the promoted generation")
    live_row = f'[data-generation="{new}"] .state-live'
    wait_for(lambda: browser.find_element(By.CSS_SELECTOR, live_row), "the row to say live")
    shot(browser, shots, "generations")
    assert requested_hosts(browser) == {"127.0.0.1"}
    # The key never travelled in a URL.
    assert ADMIN_KEY not in browser.current_url


def test_docs_and_redoc_load_without_a_cdn(browser: WebDriver, server: Server) -> None:
    browser.get(f"http://127.0.0.1:{server.port}/docs")
    wait_for(lambda: browser.find_element(By.CSS_SELECTOR, ".swagger-ui .info"), "Swagger UI")
    assert requested_hosts(browser) == {"127.0.0.1"}
    browser.get(f"http://127.0.0.1:{server.port}/redoc")
    wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "h1"), "ReDoc")
    assert requested_hosts(browser) == {"127.0.0.1"}
