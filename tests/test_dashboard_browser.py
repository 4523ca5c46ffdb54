"""The dashboard in a real browser: `streamlit run dashboard/app.py` on a free localhost port,
driven by Selenium with Debian's headless Chromium (apt: chromium chromium-driver) at
1500x1000. The database holds the replayed H200 jobs plus one running job that a writer thread
feeds a trial every 0.4 s through the store (as a worker would). Every page and every Job tab
is visited and must draw without any Streamlit exception text; the running job's page must show
new trials within 10 s without a reload; an export downloads. Screenshots go to
test-artifacts/ (and to $PORTER_SCREENSHOTS, e.g. docs/img, when set)."""
from __future__ import annotations

import dataclasses
import os
import sqlite3
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("PORTER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PORTER_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage", "--window-size=1500,1000")
WIDTH, HEIGHT = 1500, 1000
TABS = ("Convergence", "Trials", "Analysis", "Kernel", "Failures", "Top configurations",
        "Export")
# tabs inside a tab (their first view opens with the tab)
SUBTABS = {"Analysis": ("Slice", "Contour", "EDF", "Parallel coordinates"),
           "Kernel": ("Resources",)}
# what Streamlit prints when a script raises, whatever element shows it
EXCEPTION_TEXT = ("Traceback (most recent call last)", "StreamlitAPIException",
                  "Error running app", "Page not found")


def copy_sqlite(url: str, dest: Path) -> str:
    """A copy of a SQLite database, what its write-ahead log holds included (a plain file copy
    would miss the newest commits)."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as src, sqlite3.connect(dest) as dst:
        src.backup(dst)
    return f"sqlite:///{dest}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db_url: str, log_path: Path, app: Path = ROOT / "dashboard" / "app.py"):
    """`streamlit run` on a free port; returns (process, base URL, log file)."""
    port = _free_port()
    log = open(log_path, "w+")
    env = dict(os.environ, PORTER_DB_URL=db_url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", "127.0.0.1",
         "--server.port", str(port), "--server.headless", "true",
         "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(f"{base}/_stcore/health", timeout=2).status == 200:
                return proc, base, log
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            proc.kill()
            raise RuntimeError(f"streamlit did not start:\n{log.read()[-3000:]}")
        time.sleep(0.3)


def stop_server(proc, log) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def new_browser(downloads: Path, profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1,
                            "mobile": False})
    driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                           {"behavior": "allow", "downloadPath": str(downloads)})
    driver.downloads = downloads
    return driver


def have_browser() -> str | None:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        return (f"headless Chromium not found ({CHROMIUM}, {CHROMEDRIVER}): "
                "apt-get install -y chromium chromium-driver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    return None


def drawn(driver) -> bool:
    """The page has finished: Streamlit says its script is not running, a title, no running
    indicator or skeleton, every Plotly chart has drawn its SVG."""
    return bool(driver.execute_script("""
        const app = document.querySelector('[data-testid="stApp"]');
        if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
        const h1 = document.querySelector('h1');
        if (!h1 || !h1.innerText.trim()) return false;
        if (document.querySelector('[data-testid="stStatusWidget"] button, [data-testid="stSpinner"], [data-testid="stSkeleton"]')) return false;
        for (const c of document.querySelectorAll('[data-testid="stPlotlyChart"]'))
            if (!c.querySelector('.main-svg')) return false;
        return true;"""))


def wait_drawn(driver, timeout: float = 60) -> None:
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, timeout, poll_frequency=0.05).until(drawn)


def exception_text(driver) -> str | None:
    from selenium.webdriver.common.by import By
    shown = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    if shown:
        return shown[0].text
    body = driver.find_element(By.TAG_NAME, "body").text
    return next((t for t in EXCEPTION_TEXT if t in body), None)


def click_tab(driver, name: str) -> None:
    from selenium.webdriver.common.by import By
    tab = driver.find_element(By.XPATH, f'//*[@role="tab"][normalize-space()="{name}"]')
    driver.execute_script("arguments[0].click();", tab)


def metric(driver, label: str) -> str | None:
    from selenium.webdriver.common.by import By
    for m in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]'):
        lab = m.find_elements(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]')
        if lab and lab[0].text.strip() == label:
            return m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricValue"]').text
    return None


def shoot(driver, name: str, top_css: str | None = None) -> None:
    """A screenshot of the viewport; with top_css, scrolled so that element is at the top."""
    if top_css:
        from selenium.webdriver.common.by import By
        els = driver.find_elements(By.CSS_SELECTOR, top_css)
        if els:
            driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", els[0])
            time.sleep(0.3)
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"dashboard_{name}.png"))
    if os.environ.get("PORTER_SCREENSHOTS"):
        out = Path(os.environ["PORTER_SCREENSHOTS"])
        out.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out / f"dashboard_{name}.png"))


@dataclasses.dataclass
class LiveDb:
    url: str
    jobs: dict
    running: int
    stop: threading.Event


@pytest.fixture(scope="module")
def live_db(replayed_db, tmp_path_factory):
    """The replayed jobs plus a running job that gets a trial every 0.4 s."""
    from porter.store.base import open_store
    folder = tmp_path_factory.mktemp("live")
    url = copy_sqlite(replayed_db.url, folder / "porter.db")
    store = open_store(url)
    src = replayed_db.jobs["rmsnorm/sm_90a"]
    info = store.get_job(src)
    spec = dataclasses.replace(info.spec, trials=100_000)
    running = store.create_job(spec, info.template_name, info.template_hash, "", "",
                               status="running")
    store.set_job_notes(running, name="live feed")
    stop = threading.Event()
    done = store.trials(src)

    def feed():
        n = 0
        while not stop.wait(0.4):
            now = time.time()
            t = dataclasses.replace(done[n % len(done)], number=n, started_at=now - 0.1,
                                    finished_at=now)
            store.record_trial(running, t)
            n += 1
    writer = threading.Thread(target=feed, daemon=True)
    for _ in range(5):
        t = dataclasses.replace(done[_], number=10_000 + _)
        store.record_trial(running, t)
    writer.start()
    yield LiveDb(url, dict(replayed_db.jobs), running, stop)
    stop.set()
    writer.join(5)
    store.set_job_status(running, "done", "stopped by the test")


@pytest.fixture(scope="module")
def server(live_db, tmp_path_factory):
    reason = have_browser()
    if reason:
        pytest.skip(reason)
    proc, base, log = start_server(live_db.url, tmp_path_factory.mktemp("streamlit") / "log")
    yield base
    stop_server(proc, log)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = new_browser(tmp_path_factory.mktemp("downloads"),
                         tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


def visit(driver, url: str, title: str, shot: str | None = None) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(url)
    WebDriverWait(driver, 60).until(ec.text_to_be_present_in_element((By.TAG_NAME, "h1"),
                                                                     title))
    wait_drawn(driver)
    assert exception_text(driver) is None, exception_text(driver)
    if shot:
        shoot(driver, shot)
    return driver.find_element(By.TAG_NAME, "body").text


@pytest.mark.parametrize("path,title,shot", [
    ("/", "Jobs", None), ("/jobs", "Jobs", "jobs"), ("/best", "Best configurations", "best"),
    ("/compare", "Compare", "compare"), ("/compare?cmp_tab=Overlay+jobs", "Compare",
                                         "compare_overlay"),
    ("/submit", "Submit a porting job", "submit"), ("/?page=best", "Best configurations", None),
])
def test_every_page(server, browser, path, title, shot):
    body = visit(browser, server + path, title, shot)
    if title == "Jobs":
        assert "running" in body and "done" in body


def test_every_job_tab(server, browser, live_db):
    job = live_db.jobs["gemm_mma/sm_90a"]
    body = visit(browser, f"{server}/job?job={job}", "Job")
    assert "gemm_mma" in body and "sm_90a" in body
    for tab in TABS:
        for view in (tab, *SUBTABS.get(tab, ())):
            click_tab(browser, view)
            time.sleep(0.3)
            wait_drawn(browser)
            assert exception_text(browser) is None, (view, exception_text(browser))
            shoot(browser, "job_" + view.lower().replace(" ", "_"), '[data-testid="stTabs"]')
        assert f"tab={tab.replace(' ', '+')}" in browser.current_url or tab == TABS[0]


def test_compile_only_job_resources(server, browser, live_db):
    job = live_db.jobs["gemm_mma/sm_80"]
    body = visit(browser, f"{server}/job?job={job}&tab=Kernel&kv=Resources", "Job",
                 None)
    shoot(browser, "job_resources_compile_only", '[data-testid="stTabs"]')
    assert "Compile-only job" in body and "Occupancy from the sm_80 table" in body


def test_unknown_job_says_so(server, browser):
    body = visit(browser, f"{server}/job?job=999", "Job")
    assert "No job 999" in body and "best ratio" not in body


def test_running_job_shows_new_trials_without_a_reload(server, browser, live_db):
    visit(browser, f"{server}/job?job={live_db.running}", "Job", "job_running")
    first = int(metric(browser, "trials"))
    deadline = time.monotonic() + 10
    while int(metric(browser, "trials") or 0) <= first:
        assert time.monotonic() < deadline, f"trials stayed at {first} for 10 s"
        time.sleep(0.25)
    assert exception_text(browser) is None


def test_jobs_page_picks_up_a_job_created_after_it_opened(server, browser, live_db):
    from porter.store.base import open_store
    visit(browser, f"{server}/jobs", "Jobs")
    before = int(metric(browser, "queued"))
    store = open_store(live_db.url)
    info = store.get_job(live_db.jobs["rmsnorm/sm_90a"])
    job = store.create_job(info.spec, info.template_name, info.template_hash, "", "")
    try:
        deadline = time.monotonic() + 10
        while int(metric(browser, "queued") or 0) <= before:
            assert time.monotonic() < deadline, "the Jobs page did not show the new job in 10 s"
            time.sleep(0.25)
    finally:
        store.request_cancel(job)     # a queued job is cancelled at once


def test_export_downloads(server, browser, live_db):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    job = live_db.jobs["gemm_mma/sm_90a"]
    visit(browser, f"{server}/job?job={job}&tab=Export", "Job")
    button = WebDriverWait(browser, 30).until(lambda d: next(
        (b for b in d.find_elements(By.CSS_SELECTOR, '[data-testid="stDownloadButton"] button')
         if b.text.strip() == "json" and b.is_displayed()), None))
    button.click()
    target = browser.downloads / f"job{job}_json.zip"
    WebDriverWait(browser, 60).until(lambda d: target.exists() and target.stat().st_size)
    names = zipfile.ZipFile(target).namelist()
    assert "manifest.json" in names and "gemm_mma_sm_90a.json" in names
