"""The dashboard in a real browser: `streamlit run dashboard/app.py` on a free localhost port,
driven by Selenium with Debian's headless Chromium (apt: chromium chromium-driver). Opens Jobs,
a Job and Best configurations, downloads an export, and saves screenshots to test-artifacts/."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
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
         "--window-size=1400,1000")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(replayed_db, tmp_path_factory):
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip(f"headless Chromium not found ({CHROMIUM}, {CHROMEDRIVER}): "
                    "apt-get install -y chromium chromium-driver")
    pytest.importorskip("selenium")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("streamlit") / "streamlit.log", "w+")
    env = dict(os.environ, PORTER_DB_URL=replayed_db.url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"),
         "--server.address", "127.0.0.1", "--server.port", str(port),
         "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{base}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"streamlit did not start:\n{log.read()[-3000:]}")
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    downloads = tmp_path_factory.mktemp("downloads")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                           {"behavior": "allow", "downloadPath": str(downloads)})
    driver.downloads = downloads
    ARTIFACTS.mkdir(exist_ok=True)
    yield driver
    driver.quit()


def _open(driver, url: str, title: str, shot: str, timeout: float = 60):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(url)
    WebDriverWait(driver, timeout).until(
        ec.text_to_be_present_in_element((By.TAG_NAME, "h1"), title))
    # the page script has finished when Streamlit's running indicator is gone
    WebDriverWait(driver, timeout).until(lambda d: not d.find_elements(
        By.CSS_SELECTOR, '[data-testid="stStatusWidget"] img, [data-testid="stSpinner"]'))
    time.sleep(1.0)
    assert not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'), \
        driver.find_element(By.CSS_SELECTOR, '[data-testid="stException"]').text
    driver.save_screenshot(str(ARTIFACTS / f"dashboard_{shot}.png"))


def test_jobs_page(server, browser):
    from selenium.webdriver.common.by import By
    _open(browser, f"{server}/jobs", "Jobs", "jobs")
    assert browser.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
    assert "done" in browser.find_element(By.TAG_NAME, "body").text


def test_job_page_and_export_download(server, browser, replayed_db):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    job = replayed_db.jobs["gemm_mma/sm_90a"]
    _open(browser, f"{server}/job?job={job}", "Job", "job")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "gemm_mma" in body and "sm_90a" in body
    assert browser.find_elements(By.CSS_SELECTOR, '[data-testid="stPlotlyChart"]')
    tab = browser.find_element(By.XPATH, '//*[@role="tab"][normalize-space()="Export"]'
                               ' | //*[@data-testid="stTab"][normalize-space()="Export"]')
    browser.execute_script("arguments[0].click();", tab)
    button = WebDriverWait(browser, 30).until(lambda d: next(
        (b for b in d.find_elements(By.CSS_SELECTOR, '[data-testid="stDownloadButton"] button')
         if b.text.strip() == "json" and b.is_displayed()), None))
    button.click()
    target = browser.downloads / f"job{job}_json.zip"
    WebDriverWait(browser, 60).until(lambda d: target.exists() and target.stat().st_size)
    browser.save_screenshot(str(ARTIFACTS / "dashboard_job_export.png"))
    names = zipfile.ZipFile(target).namelist()
    assert "manifest.json" in names and "gemm_mma_sm_90a.json" in names
    shutil.copy(target, ARTIFACTS / target.name)


def test_best_configurations_page(server, browser):
    from selenium.webdriver.common.by import By
    _open(browser, f"{server}/best", "Best configurations", "best")
    assert browser.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
    assert browser.find_elements(By.CSS_SELECTOR, '[data-testid="stPlotlyChart"]')
