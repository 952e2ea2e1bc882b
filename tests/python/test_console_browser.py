"""The operator console in a real browser: Debian's headless Chromium, driven through
its chromedriver by Selenium, against a real `switchyard serve` on the demo repository
made from the real SmolLM2 (`switchyard demo-repo`: smollm2 versions 1 and 2).

With the keyboard only (Tab to reach every control, Enter to press it) the test signs
in, sees the models, activates smollm2@2 through the confirmation dialog, sees the
active version change and a chat completion answered by `smollm2@2`, rolls back, and
checks that a cancelled dialog does nothing and that a wrong token is refused. A second
server with a routing policy shows tenants, budgets spent and split arms. Screenshots
go to target/console-screenshots/ (1280×800 and 400 px wide).

Needs `chromium` and `chromium-driver` (scripts/setup.sh installs them).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from serve_process import free_port, running_server

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "target" / "console-screenshots"
TOKEN = "console-e2e-token"
TENANT_KEY = "sk-console-e2e"


def browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("the console test needs Debian's `chromium` and `chromium-driver`: run scripts/setup.sh")
    return chromium, driver


@pytest.fixture(scope="module")
def repo(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("console-repo")
    subprocess.run([str(switchyard_bin), "demo-repo", str(out), "--base", str(smollm2_path)],
                   check=True, capture_output=True)
    return out


def serve(switchyard_bin: Path, repo: Path, extra: list[str] = ()):
    port, admin_port = free_port(), free_port()
    args = [str(switchyard_bin), "serve", "--repo", str(repo), "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin_port}", "--threads", "2", "--drain-seconds", "5",
            *extra]
    return running_server(args, port, env={"SWITCHYARD_ADMIN_TOKEN": TOKEN}), port, admin_port


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, repo: Path):
    context, port, admin_port = serve(switchyard_bin, repo)
    with context:
        yield {"base": f"http://127.0.0.1:{port}", "admin": f"http://127.0.0.1:{admin_port}"}


@pytest.fixture()
def browser():
    chromium, driver_path = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="switchyard-console-chromium-")
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-extensions", "--window-size=1280,800",
                 f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    viewport(driver, 1280, 800)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def viewport(driver, width: int, height: int):
    """Sets the page's viewport exactly (the window size includes no chrome in headless
    mode, but this does not depend on it)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def screenshot(driver, name: str, full_page: bool = False) -> Path:
    path = SHOTS / f"{name}.png"
    shot = driver.execute_cdp_cmd("Page.captureScreenshot",
                                  {"format": "png", "captureBeyondViewport": full_page})
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def wait(driver, condition, what: str, timeout: float = 30):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition(d))
    except TimeoutException:
        screenshot(driver, "failure")
        pytest.fail(f"timed out waiting for {what}; page status: "
                    f"{driver.find_element(By.ID, 'connection').text!r}")


def active(driver):
    return driver.switch_to.active_element


def tab_to(driver, element_id: str, limit: int = 300):
    """Presses Tab until `element_id` has the focus: proves it is reachable by keyboard."""
    for _ in range(limit):
        if active(driver).get_attribute("id") == element_id:
            return active(driver)
        active(driver).send_keys(Keys.TAB)
    pytest.fail(f"#{element_id} was not reached with {limit} presses of Tab")


def focus_is_visible(driver) -> bool:
    style = driver.execute_script(
        "const s = getComputedStyle(document.activeElement);"
        "return [s.outlineStyle, s.outlineWidth];")
    return style[0] != "none" and style[1] != "0px"


def active_version(driver, model: str) -> str:
    return driver.execute_script(
        "const e = document.querySelector(`[data-active-version=\"${arguments[0]}\"]`);"
        "return e ? e.textContent : null;", model)


def log_entries(driver) -> list[str]:
    return [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#log li")]


def confirm_with_keyboard(driver, button_id: str, expected_text: str):
    """Tab to `button_id`, Enter, check the dialog, Tab to Confirm, Enter."""
    button = tab_to(driver, button_id)
    assert focus_is_visible(driver), f"#{button_id} has no visible focus"
    button.send_keys(Keys.ENTER)
    dialog = driver.find_element(By.ID, "confirm")
    wait(driver, lambda d: dialog.get_attribute("open") is not None, "the confirmation dialog")
    assert expected_text in dialog.text, dialog.text
    # The safe choice has the focus; Tab moves to the confirm button.
    assert active(driver).get_attribute("id") == "confirm-cancel"
    active(driver).send_keys(Keys.TAB)
    assert active(driver).get_attribute("id") == "confirm-ok"
    active(driver).send_keys(Keys.ENTER)


def chat(base: str, model: str, key: str = "unused") -> dict:
    body = json.dumps({"model": model, "max_tokens": 8, "temperature": 0,
                       "messages": [{"role": "user", "content": "Name a colour."}]}).encode()
    request = urllib.request.Request(base + "/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


def feedback(base: str, answer_id: str, score: float, key: str) -> dict:
    body = json.dumps({"id": answer_id, "score": score}).encode()
    request = urllib.request.Request(base + "/v1/feedback", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


class TrafficFor:
    """Two clients sending chat requests to pinned checkpoints (never to `smollm2`,
    whose active version the test changes) for at least `seconds`."""

    MODELS = ["smollm2-derived-a", "smollm2@1", "smollm2-derived-b", "smollm2@2"]

    def __init__(self, base: str, seconds: float):
        self.base, self.seconds = base, seconds
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(2)]

    def client(self, index: int):
        end, i = time.time() + self.seconds, index
        while time.time() < end:
            model = self.MODELS[i % len(self.MODELS)]
            expected = model if "@" in model else f"{model}@1"
            try:
                served = chat(self.base, model)["model"]
                if served != expected:
                    self.failures.append(f"{model} answered by {served}")
            except (urllib.error.URLError, OSError) as e:
                self.failures.append(f"{model}: {e!r}")
            i += 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        for t in self.threads:
            t.join()
        assert not self.failures, self.failures


def csp_violations(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser")
            if "Content Security Policy" in entry["message"] or "Refused to" in entry["message"]]


def sign_in(driver, token: str):
    field = driver.find_element(By.ID, "token")
    wait(driver, lambda d: active(d).get_attribute("id") == "token", "the token field to have the focus")
    field.send_keys(token, Keys.ENTER)


def test_the_console_drives_versions_with_the_keyboard(server, browser):
    driver = browser
    driver.get(server["admin"] + "/admin/console")
    assert driver.title == "Switchyard console"

    # A wrong token is refused and not kept.
    sign_in(driver, "not-the-token")
    error = driver.find_element(By.ID, "sign-in-error")
    wait(driver, lambda d: "Refused" in error.text, "the wrong token to be refused")
    assert "admin token is wrong" in error.text, error.text
    assert not driver.find_element(By.ID, "dashboard").is_displayed()
    assert driver.execute_script("return sessionStorage.length") == 0
    screenshot(driver, "wrong-token-1280x800")

    # The right token: the dashboard, the token in session storage only.
    sign_in(driver, TOKEN)
    wait(driver, lambda d: d.find_element(By.ID, "dashboard").is_displayed(), "the dashboard")
    wait(driver, lambda d: active_version(d, "smollm2") == "1", "smollm2 with active version 1")
    assert driver.execute_script("return sessionStorage.getItem('switchyard.adminToken')") == TOKEN
    assert driver.execute_script("return document.cookie") == ""
    assert TOKEN not in driver.current_url
    models = {a.get_attribute("data-model") for a in driver.find_elements(By.CSS_SELECTOR, "article.model")}
    assert {"smollm2", "smollm2-derived-a", "smollm2-derived-b"} <= models, models
    smollm2 = driver.find_element(By.CSS_SELECTOR, 'article[data-model="smollm2"]')
    assert "ram" in smollm2.text and "Versions of smollm2" in smollm2.text
    overview = driver.find_element(By.ID, "overview").text
    assert "RAM resident" in overview and "MiB" in overview, overview
    # Where resident weights live: the backend's name (the device tier).
    assert "Weights on" in overview and "cpu-" in overview, overview

    # A cancelled action does nothing.
    button = tab_to(driver, "unload-smollm2-2")
    button.send_keys(Keys.ENTER)
    wait(driver, lambda d: d.find_element(By.ID, "confirm").get_attribute("open") is not None, "the dialog")
    active(driver).send_keys(Keys.ESCAPE)
    wait(driver, lambda d: d.find_element(By.ID, "confirm").get_attribute("open") is None, "the dialog to close")
    assert log_entries(driver) == []
    assert active(driver).get_attribute("id") == "unload-smollm2-2", "focus returns to the button"

    # Activate version 2: the server's answer shown, the active version changes.
    confirm_with_keyboard(driver, "activate-smollm2-2", "smollm2@2")
    wait(driver, lambda d: log_entries(d), "the server's answer")
    answer = log_entries(driver)[0]
    assert "POST /admin/models/smollm2/versions/2/activate → 200" in answer, answer
    assert '"active_version": "2"' in answer and '"previous_version": "1"' in answer, answer
    wait(driver, lambda d: active_version(d, "smollm2") == "2", "smollm2 active version 2")

    # A request for the model is answered by the version now active.
    reply = chat(server["base"], "smollm2")
    assert reply["model"] == "smollm2@2", reply["model"]
    assert reply["choices"][0]["message"]["content"]
    # Traffic over several checkpoints for a few seconds (two clients, so requests queue
    # and checkpoints swap): the charts show it.
    with TrafficFor(server["base"], seconds=8):
        wait(driver, lambda d: d.execute_script(
            "const p = document.querySelector('#chart-throughput polyline');"
            "return !!p && p.getAttribute('points').split(' ').some(xy => Number(xy.split(',')[1]) < 87);"),
            "the throughput chart to show the traffic", timeout=60)
    wait(driver, lambda d: d.execute_script(
        "const p = document.querySelector('#chart-swaps polyline');"
        "return !!p && p.getAttribute('points').split(' ').some(xy => Number(xy.split(',')[1]) < 87);"),
        "the swap chart to show swaps", timeout=60)
    driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(2.5)  # one more poll, so the tables show the traffic gone
    screenshot(driver, "dashboard-1280x800")
    screenshot(driver, "dashboard-1280-full", full_page=True)

    # Roll back: version 1 again, and requests go to it.
    confirm_with_keyboard(driver, "rollback-smollm2", "Roll back smollm2")
    wait(driver, lambda d: len(log_entries(d)) == 2, "the rollback's answer")
    answer = log_entries(driver)[0]
    assert "POST /admin/models/smollm2/rollback → 200" in answer, answer
    assert '"rolled_back_from": "2"' in answer, answer
    wait(driver, lambda d: active_version(d, "smollm2") == "1", "smollm2 back on version 1")
    assert chat(server["base"], "smollm2")["model"] == "smollm2@1"

    # Narrow window: one column, no sideways scrolling, the actions still there.
    viewport(driver, 400, 800)
    driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.5)
    width = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"horizontal overflow at 400 px: {width}"
    assert driver.find_element(By.ID, "activate-smollm2-2").is_displayed()
    screenshot(driver, "dashboard-400x800")
    screenshot(driver, "dashboard-400-full", full_page=True)
    viewport(driver, 1280, 800)

    # Signing out forgets the token.
    tab_to(driver, "sign-out").send_keys(Keys.ENTER)
    wait(driver, lambda d: d.find_element(By.ID, "sign-in").is_displayed(), "the sign-in form")
    assert driver.execute_script("return sessionStorage.length") == 0
    assert csp_violations(driver) == []


def test_a_token_changed_under_the_console_signs_it_out(server, browser):
    driver = browser
    driver.get(server["admin"] + "/admin/console")
    sign_in(driver, TOKEN)
    wait(driver, lambda d: d.find_element(By.ID, "dashboard").is_displayed(), "the dashboard")
    # As if the server restarted with another token: the next poll is refused.
    driver.execute_script("sessionStorage.setItem('switchyard.adminToken', 'stale-token')")
    wait(driver, lambda d: d.find_element(By.ID, "sign-in").is_displayed(), "the console to sign out")
    assert "admin token is wrong" in driver.find_element(By.ID, "sign-in-error").text
    assert driver.execute_script("return sessionStorage.length") == 0


POLICY = f"""\
[routing]
allow_anonymous = false

[[models]]
name = "smollm2-derived-a"
version = "1"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.5
context_limit = 2048

[[models]]
name = "smollm2-derived-b"
version = "1"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.4
context_limit = 2048

[[tenants]]
name = "acme"
api_keys = ["sha256:{hashlib.sha256(TENANT_KEY.encode()).hexdigest()}"]

[[tenants.budgets]]
window = "1h"
limit_tokens = 5000

[[splits]]
name = "derived-canary"
model = "smollm2-derived-a"
sticky = "user"
arms = [
  {{ name = "stable", target = "smollm2-derived-a@1", weight = 90 }},
  {{ name = "canary", target = "smollm2-derived-b@1", weight = 10 }},
]

[splits.rollback]
baseline = "stable"
candidate = "canary"
window = "10m"
min_samples = 5
max_error_rate_increase = 0.2
"""


def test_the_console_shows_the_routing_policy(switchyard_bin, repo, browser, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    context, port, admin_port = serve(switchyard_bin, repo, ["--policy", str(policy)])
    with context:
        base, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
        reply = chat(base, "smollm2-derived-a", key=TENANT_KEY)
        spent = reply["usage"]["total_tokens"]
        assert spent > 0
        driver = browser
        driver.get(admin + "/admin/console")
        sign_in(driver, TOKEN)
        section = driver.find_element(By.ID, "policy")
        wait(driver, lambda d: "derived-canary" in section.text, "the policy's split")
        text = section.text
        assert "acme" in text and "tokens per 1 h" in text, text
        assert f"{spent} of 5,000" in text, text
        assert "stable → smollm2-derived-a@1: 90%" in text, text
        assert "canary → smollm2-derived-b@1: 10%" in text, text
        assert "watching" in text, text
        # Quality per arm: the answer's confidence, then the client's score of it.
        assert "mean log-prob -" in text and "(n 1)" in text, text
        scored = feedback(base, reply["id"], 0.75, key=TENANT_KEY)
        assert scored["arm"] and scored["arm"].startswith("derived-canary/"), scored
        wait(driver, lambda d: "client score 0.75 [0.75, 0.75] (n 1)" in section.text, "the arm's client score")
        text = section.text
        # The answer-quality table: per checkpoint and arm.
        assert "Answer quality" in text and scored["arm"] in text, text
        assert "0.75 [0.75, 0.75] (n 1)" in text, text
        # Reload the policy file from the console: a new generation.
        policy.write_text(POLICY.replace("weight = 90", "weight = 80").replace("weight = 10", "weight = 20"))
        confirm_with_keyboard(driver, "policy-reload", str(policy))
        wait(driver, lambda d: "stable → smollm2-derived-a@1: 80%" in section.text, "the reloaded policy")
        assert "POST /admin/policy/reload → 200" in log_entries(driver)[0]
        driver.execute_script("document.getElementById('policy-title').scrollIntoView()")
        screenshot(driver, "policy-1280x800")
        viewport(driver, 400, 800)
        time.sleep(0.5)
        width = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"horizontal overflow at 400 px: {width}"
        driver.execute_script("document.getElementById('policy-title').scrollIntoView()")
        screenshot(driver, "policy-400x800")
        assert csp_violations(driver) == []
