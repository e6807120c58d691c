"""The demo page in headless chromium (chromium-driver, python3-selenium): served with the COOP/COEP
headers (the page is cross-origin isolated, as the threaded module needs), it trains on the
threaded module with 2 threads; it must reach 97% held-out accuracy, draw a chart (the screenshot
is not blank), and its downloads must hold what it trained: the exported inference model gives the
page's logits in onnxtrain natively, and the checkpoint loads natively.

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q web/tests/test_demo_browser.py

Needs make web and web/tests/make_fixtures.py (make test-web does both); ONNXTRAIN_WEB_DIR and
ONNXTRAIN_WEB_FIXTURES say where they are.
"""
import base64
import io
import os
import sys
import threading

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "web", "demo"))
import serve  # noqa: E402  (web/demo/serve.py)

WEB_BUILD = os.path.join(ROOT, os.environ.get("ONNXTRAIN_WEB_DIR", "build-web"))
FIXTURES = os.path.join(ROOT, os.environ.get("ONNXTRAIN_WEB_FIXTURES", os.path.join(WEB_BUILD, "fixtures")))
EPOCHS = 12
THREADS = 2


@pytest.fixture(scope="module")
def page_url():
    server = serve.serve(0, WEB_BUILD, FIXTURES)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_address[1]}/demo/index.html"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    yield driver
    driver.quit()


def test_demo_page_trains_to_97_percent_and_its_downloads_run_natively(page_url, browser, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{page_url}?epochs={EPOCHS}&threads={THREADS}&auto=1")
    state = lambda: browser.execute_script("return window.onnxtrainDemo && window.onnxtrainDemo.state")  # noqa: E731
    WebDriverWait(browser, 300, poll_frequency=0.5).until(lambda _: state() in ("done", "error"))
    demo = browser.execute_script("const d = window.onnxtrainDemo; return {state: d.state, error: d.error, "
                                  "accuracy: d.accuracy, threads: d.threads, isolated: crossOriginIsolated, "
                                  "rate: d.stepsPerSecond, steps: d.losses.length, "
                                  "workers: d.session._api.m.PThread ? d.session._api.m.PThread.runningWorkers.length : 0};")
    assert demo["state"] == "done", demo.get("error")
    assert demo["isolated"] and demo["threads"] == THREADS, f"a cross-origin isolated page on {THREADS} threads: {demo}"
    # The team starts its workers at its first region of more than one thread: the steps ran some.
    assert demo["workers"] == THREADS - 1, f"kernel threads started besides the page's: {demo}"
    assert demo["accuracy"] >= 0.97, demo
    print(f"demo page: {demo['accuracy']:.4f} held-out accuracy, {demo['steps']} steps at {demo['rate']:.1f} steps/s "
          f"on {demo['threads']} threads")

    # The chart is drawn: the screenshot is not one flat colour.
    from PIL import Image
    shot = np.asarray(Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("L"), dtype=np.float32)
    (tmp_path / "demo.png").write_bytes(browser.get_screenshot_as_png())
    assert shot.std() > 10 and len(np.unique(shot)) > 16, f"a blank screenshot (std {shot.std():.1f})"

    # The downloads: the inference model gives the page's logits natively; the checkpoint loads.
    exports = browser.execute_async_script("const done = arguments[0]; window.onnxtrainDemo.exports().then(done, "
                                           "e => done({error: String(e)}));")
    assert "error" not in exports, exports.get("error")
    model, checkpoint = tmp_path / "digits_inference.onnx", tmp_path / "digits_checkpoint"
    model.write_bytes(base64.b64decode(exports["model"]))
    checkpoint.write_bytes(base64.b64decode(exports["checkpoint"]))
    import onnxtrain
    from onnxtrain.api import CheckpointState

    x_test = np.fromfile(os.path.join(FIXTURES, "digits_raw", "x_test.f32"), dtype="<f4").reshape(-1, 1, 8, 8)
    logits = onnxtrain.InferenceSession(str(model)).run(None, {"input": x_test})[0]
    np.testing.assert_allclose(logits, np.asarray(exports["logits"], dtype=np.float32).reshape(logits.shape),
                               rtol=1e-4, atol=1e-4)
    state = CheckpointState.load_checkpoint(str(checkpoint))
    assert len(list(state.parameters.keys())) > 0
