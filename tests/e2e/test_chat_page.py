"""The chat page that `ggml-rpc-cli serve` answers `/` with, driven in a real headless
Chromium (Debian's `chromium` through its `chromedriver`, by Selenium): a typed message
streams an answer equal to what the same request gets over plain HTTP, the page shows
tokens/s, and the second message is sent with the first exchange before it.

Without a browser the test skips, saying so, unless GGMLRPC_REQUIRE_BROWSER is set (CI
sets it), in which case a missing browser is a failure."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from ggmlrpc.llm import synth
from tests.e2e.test_serve import N_CTX, Serve

MAX_TOKENS = 12
# a template of the model's own (not the ChatML fallback), so the page goes through it
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def browser_paths() -> tuple[str, str]:
    chrome = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if chrome and driver:
        return chrome, driver
    why = "no Chromium with chromedriver on PATH (Debian: apt-get install chromium chromium-driver)"
    if os.environ.get("GGMLRPC_REQUIRE_BROWSER"):
        pytest.fail(why + "; GGMLRPC_REQUIRE_BROWSER is set")
    pytest.skip(why + "; set GGMLRPC_REQUIRE_BROWSER to make this a failure")


@pytest.fixture(scope="module")
def browser():
    chrome, driver = browser_paths()

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--window-size=1000,800"):
        opts.add_argument(arg)
    # the driver named explicitly: Selenium Manager is never asked to fetch one
    b = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    yield b
    b.quit()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("page")
    plain = synth.write_llama(d / "plain.gguf", synth.LlamaShape(n_ctx=N_CTX), "f32", seed=1)
    (d / "template.jinja").write_text(TEMPLATE)
    model = d / "chat.gguf"
    subprocess.run([sys.executable, "-P", "-m", "gguf.scripts.gguf_new_metadata", str(plain), str(model),
                    "--chat-template-file", str(d / "template.jinja")],
                   check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return model


@pytest.fixture(scope="module")
def serve(model):
    p = Serve(model, "-t", "1")
    yield p.url
    out, err = p.stop()
    assert "Traceback" not in err, err


def answer_over_http(url: str, messages: list[dict]) -> str:
    r = httpx.post(url + "/v1/chat/completions", timeout=120,
                   json={"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def send_and_wait(b, text: str, n_answers: int) -> str:
    """Type `text`, click Send, wait until the answer has streamed; its text as shown."""

    b.find_element(By.ID, "input").send_keys(text)
    b.find_element(By.ID, "send").click()
    WebDriverWait(b, 120).until(
        lambda b: b.execute_script("return document.body.dataset.state") == "idle"
        and len(b.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == n_answers)
    assert not b.find_elements(By.CSS_SELECTOR, ".msg.error")
    # textContent, not .text: the page shows the answer verbatim (white-space: pre-wrap)
    return b.execute_script(
        "const a = document.querySelectorAll('.msg.assistant .content'); return a[a.length - 1].textContent")


def test_chat_page_streams_and_keeps_the_conversation(browser, serve):
    b = browser
    b.get(serve + "/")
    assert b.title == "ggml-rpc-cli serve"
    for field, value in (("temp", "0"), ("max", str(MAX_TOKENS))):
        b.find_element(By.ID, field).send_keys(value)
    # the request bodies the page sends, as the server gets them
    b.execute_script("window.sent = []; const f = window.fetch;"
                     "window.fetch = (url, init) => { window.sent.push(init && init.body); return f(url, init); }")

    first = "tell me about the old fisherman"
    shown = send_and_wait(b, first, 1)
    conversation = [{"role": "user", "content": first}]
    expected = answer_over_http(serve, conversation)
    assert shown and shown == expected
    stats = b.find_element(By.ID, "stats").text
    assert re.search(r"\d+ tokens, \d+\.\d tokens/s", stats), stats

    second = "and what about the village by the sea"
    shown2 = send_and_wait(b, second, 2)
    conversation += [{"role": "assistant", "content": shown}, {"role": "user", "content": second}]
    assert shown2 == answer_over_http(serve, conversation)
    sent = [json.loads(body) for body in b.execute_script("return window.sent")]
    assert [s["messages"] for s in sent] == [conversation[:1], conversation]
    assert all(s["stream"] is True and s["temperature"] == 0 and s["max_tokens"] == MAX_TOKENS for s in sent)
    # the first exchange is still on the page, in order
    roles = [e.get_attribute("class").split()[1] for e in b.find_elements(By.CSS_SELECTOR, ".msg")]
    assert roles == ["user", "assistant", "user", "assistant"]


def test_chat_page_shows_the_servers_error(browser, serve):
    b = browser
    b.get(serve + "/")
    b.find_element(By.ID, "max").send_keys(str(N_CTX * 4))      # more than the context holds
    b.find_element(By.ID, "input").send_keys("hello")
    b.find_element(By.ID, "send").click()
    WebDriverWait(b, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.error"))
    r = httpx.post(serve + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hello"}], "stream": True, "max_tokens": N_CTX * 4})
    assert r.status_code == 400
    shown = b.find_element(By.CSS_SELECTOR, ".msg.error .content").text
    assert shown == "error: " + r.json()["error"]["message"]
    # the question is back in the box to be sent again, and the page is ready for it
    assert b.find_element(By.ID, "input").get_attribute("value") == "hello"
    assert b.execute_script("return document.body.dataset.state") == "idle"


def test_chat_page_sends_the_api_key(browser, model):
    p = Serve(model, "-t", "1", "--api-key", "sesame")
    try:
        b = browser
        b.get(p.url + "/")
        b.find_element(By.ID, "max").send_keys(str(MAX_TOKENS))
        b.find_element(By.ID, "input").send_keys("hello")
        b.find_element(By.ID, "send").click()
        WebDriverWait(b, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.error"))
        refused = httpx.post(p.url + "/v1/chat/completions", json={"messages": []}, timeout=60)
        assert refused.status_code == 401
        assert b.find_element(By.CSS_SELECTOR, ".msg.error .content").text == \
            "error: " + refused.json()["error"]["message"]
        b.find_element(By.ID, "key").send_keys("sesame")
        b.find_element(By.ID, "send").click()          # the question is still in the box
        WebDriverWait(b, 120).until(
            lambda b: len(b.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
            and b.execute_script("return document.body.dataset.state") == "idle")
        assert len(b.find_elements(By.CSS_SELECTOR, ".msg.error")) == 1
        assert b.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")[1].text
    finally:
        p.stop()
