"""The explorer page at ``/`` in a real browser: Debian's chromium driven by Playwright
(headless, never ``playwright install``) against a real ``bertforge serve`` process. Types a
sentence with [MASK], sees the predictions the API gives, masks a token by clicking it and by
the keyboard, switches attention layer, head and view, compares two models, shows an API
error in place, saves the view as HTML and PNG, and gives a classifier fine-tuned on text
pairs its two texts (and one that may take either, an optional second). Screenshots go to tests/artifacts/serve/
(ignored by git; ``BERTFORGE_ARTIFACTS`` moves them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
sync_api = pytest.importorskip("playwright.sync_api")

from support.serve import ROOT, pair_model, request, serve, tiny_models  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("BERTFORGE_ARTIFACTS", ROOT / "tests" / "artifacts")) / "serve"


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip(
            "Debian's chromium is not installed (apt-get install -y chromium; .ci/run does)"
        )
    root = tmp_path_factory.mktemp("page")
    models = tiny_models(root)
    # a second masked LM from another seed: "random init A vs B" side by side
    import torch

    from bertforge.modeling.model import BertForMaskedLM
    from bertforge.tokenizer import Tokenizer

    torch.manual_seed(7)
    other = BertForMaskedLM.from_pretrained(models["mlm"])
    other.init_weights()
    other.save_pretrained(root / "mlm-b", tokenizer=Tokenizer.from_file(models["mlm"]))
    nli = pair_model(root, models["mlm"])  # premise + hypothesis
    served = {"mlm": models["mlm"], "mlm-b": root / "mlm-b", "clf": models["clf"], "nli": nli}
    with serve(served, "--max_input_length", "40", log=root / "server.log") as (port, _):
        yield port


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for the module (Playwright's sync API runs one at a time)."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True
        )
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(port, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.errors = []  # type: ignore[attr-defined]  # uncaught JavaScript exceptions
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{port}/")
    wait_done(page)
    yield page
    context.close()


def wait_done(page) -> None:
    page.wait_for_function(
        "document.getElementById('status').textContent === 'done'", timeout=30_000
    )


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def predictions(page, model: str) -> list[str]:
    return page.locator(
        f'.panel[data-model="{model}"] .mask-block .bar-row .name'
    ).all_inner_texts()


def run_text(page, text: str) -> None:
    page.fill("#text", text)
    page.press("#text", "Control+Enter")
    page.wait_for_selector(".panel")
    page.wait_for_function("!document.getElementById('run').disabled", timeout=30_000)


def test_fill_mask_click_to_mask_attention_and_two_models(page, port):
    page.select_option("#model-a", "mlm")
    page.select_option("#model-b", "mlm-b")
    page.fill("#top-k", "4")
    text = "the movie was a [MASK] film about people in town ."
    run_text(page, text)
    assert page.locator(".panel").count() == 2  # side by side
    for model in ("mlm", "mlm-b"):
        _, (answer,) = request(
            port, "POST", "/fill-mask", {"inputs": text, "model": model, "top_k": 4}
        )
        assert predictions(page, model) == [c["token"] for c in answer["masks"][0]]
    assert predictions(page, "mlm") != predictions(page, "mlm-b")  # two different models
    shot(page, "1-fill-mask-two-models")

    # click the WordPiece "people": its word becomes [MASK] and both models answer again
    page.locator('.panel[data-model="mlm"] button.tok', has_text="people").first.click()
    page.wait_for_function("!document.getElementById('run').disabled", timeout=30_000)
    assert page.input_value("#text") == "the movie was a [MASK] film about [MASK] in town ."
    assert page.locator('.panel[data-model="mlm"] .mask-block').count() == 2
    assert page.locator('.panel[data-model="mlm-b"] .mask-block').count() == 2
    shot(page, "2-clicked-token")

    # the keyboard alone: Tab to a token, Enter masks it
    page.locator('.panel[data-model="mlm"] button.tok', has_text="town").first.focus()
    page.keyboard.press("Enter")
    page.wait_for_function("!document.getElementById('run').disabled", timeout=30_000)
    assert page.input_value("#text").endswith("[MASK] in [MASK] .")

    # attention: head view of layer 2, head 3, then the model view's grid
    page.select_option("#layer", index=1)
    page.select_option("#head", index=3)  # after "average"
    label = page.locator('.panel[data-model="mlm"] .headview svg').get_attribute("aria-label")
    assert label == "attention of mlm, layer 2, head 3"
    assert page.locator('.panel[data-model="mlm"] .headview line').count() > 0
    shot(page, "3-head-view-layer2-head3")
    page.select_option("#view", "model")
    assert page.locator('.panel[data-model="mlm"] .modelview canvas').count() == 2 * 4
    shot(page, "4-model-view")
    page.locator('.panel[data-model="mlm-b"] .modelview .cell').nth(5).click()  # layer 2, head 2
    assert page.input_value("#view") == "head" and page.input_value("#layer") == "1"
    assert page.input_value("#head") == "1"
    assert not page.errors, page.errors


def test_classifier_attribution_errors_in_place_and_saving(page, port):
    page.select_option("#model-a", "clf")
    page.select_option("#model-b", "mlm")
    text = "a good film about people"
    run_text(page, text)
    _, (prediction,) = request(port, "POST", "/predict", {"inputs": text, "model": "clf"})
    panel = page.locator('.panel[data-model="clf"]')
    assert panel.locator(".prediction strong").inner_text() == prediction["label"]
    colours = [
        b.evaluate("e => getComputedStyle(e).backgroundColor") for b in panel.locator(".tok").all()
    ]
    assert len(set(colours)) > 1  # tokens coloured by their attribution
    # the classify view: WordPieces coloured, not the masked LM's buttons that mask a word
    heading = panel.locator("h3").first.inner_text().lower()
    assert "attribution" in heading and "mask" not in heading
    assert panel.locator("button.tok").count() == 0
    mlm_heading = page.locator('.panel[data-model="mlm"] h3').first.inner_text().lower()
    assert "click one to mask" in mlm_heading
    # the masked LM cannot answer a text without [MASK]: said in its panel, not an alert box
    assert "No [MASK]" in page.locator('.panel[data-model="mlm"]').inner_text()
    shot(page, "5-classifier-attribution")

    run_text(page, "the movie " * 30 + "[MASK]")  # 63 tokens: over --max_input_length 40
    error = page.locator('.panel[data-model="mlm"] .error')
    assert "--max_input_length=40" in error.inner_text()
    assert page.locator("#cap").inner_text() == "64"
    shot(page, "6-error-in-place")

    run_text(page, "the [MASK] was a film .")
    with page.expect_download() as download:
        page.click("#save-html")
    html_path = ARTIFACTS / "saved-view.html"
    download.value.save_as(html_path)
    html = html_path.read_text()
    assert "<script" not in html and "bertforge explorer" in html and "[MASK]" in html
    with page.expect_download() as download:
        page.click("#save-png")
    png_path = ARTIFACTS / "saved-view.png"
    download.value.save_as(png_path)
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png_path.stat().st_size > 10_000
    # the saved HTML stands alone: it renders from the file, with no server
    page.goto(html_path.as_uri())
    assert page.locator(".panel").count() == 2
    shot(page, "7-saved-html-reopened")
    assert not page.errors, page.errors


def attributed(row) -> dict[str, str]:
    """WordPiece -> its background colour, of one row of a panel's tokens."""
    return {
        b.inner_text(): b.evaluate("e => getComputedStyle(e).backgroundColor")
        for b in row.locator(".tok").all()
    }


def test_a_pair_classifier_reads_both_texts(page, port):
    page.goto(f"http://127.0.0.1:{port}/")
    wait_done(page)
    page.select_option("#model-b", "")
    page.select_option("#model-a", "mlm")
    assert page.locator("#pair-row").is_hidden()  # a masked LM reads one text
    assert "[MASK]" in page.locator("#text-hint").inner_text()
    page.select_option("#model-a", "nli")
    assert "[MASK]" not in page.locator("#text-hint").inner_text()  # no model predicts words
    # the second box appears, both named after the columns the model was fine-tuned on
    assert page.locator("#pair-row").is_visible()
    assert page.locator('label[for="text"]').inner_text().startswith("premise")
    assert page.locator('label[for="text-pair"]').inner_text().startswith("hypothesis")
    pair = ["a story about people in town", "the music was good"]
    page.fill("#text", pair[0])
    page.fill("#text-pair", pair[1])
    page.click("#run")
    page.wait_for_function("!document.getElementById('run').disabled", timeout=30_000)
    wait_done(page)
    panel = page.locator('.panel[data-model="nli"]')
    assert panel.locator(".error").inner_text() == ""
    _, (predicted,) = request(port, "POST", "/predict", {"inputs": [pair], "model": "nli"})
    assert panel.locator(".prediction strong").inner_text() == predicted["label"]
    shown = sorted(panel.locator(".bar-row .name").all_inner_texts())
    assert shown == sorted(predicted["scores"])  # entailment, contradiction
    # attributions over the tokens of both texts: one row each, [CLS] a [SEP] / b [SEP]
    rows = panel.locator(".segment")
    assert rows.count() == 2
    assert rows.nth(0).locator(".seg-name").inner_text() == "premise"
    assert rows.nth(1).locator(".seg-name").inner_text() == "hypothesis"
    first, second = attributed(rows.nth(0)), attributed(rows.nth(1))
    assert list(first)[0] == "[CLS]" and list(first)[-1] == "[SEP]" and list(second)[-1] == "[SEP]"
    assert {"story", "people", "town"} <= set(first) and {"music", "good"} <= set(second)
    _, explained = request(port, "POST", "/attribute", {"inputs": pair, "model": "nli"})
    assert explained["tokens"].count("[SEP]") == 2
    for row in (first, second):  # coloured by attribution in both texts
        words = [colour for token, colour in row.items() if not token.startswith("[")]
        assert len(set(words)) > 1 and "rgba(0, 0, 0, 0)" not in words
    assert "pushes towards" in panel.locator(".legend").inner_text()
    # the head view marks the second text's tokens
    assert panel.locator(".headview svg text.seg1").count() == 2 * (len(second))
    page.screenshot(path="/tmp/pair-page.png", full_page=True)
    shot(page, "8-pair-classifier")

    # a classifier nothing says anything about ("texts or pairs"): the second box is optional
    page.select_option("#model-a", "clf")
    assert page.locator("#pair-row").is_visible()
    assert "optional" in page.locator("#pair-hint").inner_text()
    page.click("#run")
    wait_done(page)
    clf = page.locator('.panel[data-model="clf"]')
    _, (as_pair,) = request(port, "POST", "/predict", {"inputs": [pair], "model": "clf"})
    assert clf.locator(".segment").count() == 2
    assert clf.locator(".bar-row.top .value").inner_text() == (
        f"{max(as_pair['scores'].values()) * 100:.1f}%"
    )
    page.fill("#text-pair", "")
    page.click("#run")
    wait_done(page)
    _, (alone,) = request(port, "POST", "/predict", {"inputs": [pair[0]], "model": "clf"})
    assert clf.locator(".segment").count() == 0 and clf.locator(".tok:not(.special)").count() == 6
    assert clf.locator(".bar-row.top .value").inner_text() == (
        f"{max(alone['scores'].values()) * 100:.1f}%"
    )
    assert not page.errors, page.errors


# ---- a server with an API key ---------------------------------------------------------------------
KEY = "page-test-key"


@pytest.fixture(scope="module")
def keyed_port(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    root = tmp_path_factory.mktemp("page-key")
    models = tiny_models(root)
    options = ("--api_key", KEY, "--num_threads", "1")
    with serve({"mlm": models["mlm"]}, *options, log=root / "server.log") as (port, _):
        yield port


def test_the_page_asks_for_the_key_once_and_then_works(keyed_port, browser):
    url = f"http://127.0.0.1:{keyed_port}/"
    context = browser.new_context(viewport={"width": 1280, "height": 700})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_selector("#key-form", state="visible", timeout=30_000)
        assert page.locator(".panel").count() == 0  # nothing asked without the key
        assert page.evaluate("document.activeElement.id") == "api-key"
        page.fill("#api-key", "not-the-key")
        page.press("#api-key", "Enter")
        page.wait_for_function(
            "document.getElementById('key-note').textContent.includes('refused')"
        )
        assert page.is_visible("#key-form")
        shot(page, "key-1-refused")
        page.fill("#api-key", KEY)
        page.click("#key-form button")
        wait_done(page)
        assert page.is_hidden("#key-form")
        text = page.input_value("#text")
        headers = {"Authorization": f"Bearer {KEY}"}
        _, (answer,) = request(
            keyed_port, "POST", "/fill-mask", {"inputs": text, "top_k": 5}, headers=headers
        )
        assert predictions(page, "mlm") == [c["token"] for c in answer["masks"][0]]
        assert page.evaluate(f"sessionStorage.getItem('{KEY_ITEM}')") == KEY
        shot(page, "key-2-accepted")
        # the nav's /info and /metrics: fetched with the key and shown in the page (a plain
        # link cannot send the header, and gets 401)
        assert request(keyed_port, "GET", "/info")[0] == 401
        page.click("nav a[href='/info']")
        page.wait_for_selector("#raw", state="visible")
        assert page.url == url and page.inner_text("#raw-title") == "GET /info"
        shown = json.loads(page.inner_text("#raw-body"))
        assert shown["default_model"] == "mlm" and shown["models"][0]["kind"] == "masked-lm"
        shot(page, "key-3-info")
        page.click("nav a[href='/metrics']")
        page.wait_for_function(
            "document.getElementById('raw-title').textContent === 'GET /metrics'"
        )
        metrics = page.inner_text("#raw-body")
        assert "# TYPE bertforge_requests_total counter" in metrics
        assert 'bertforge_requests_total{route="/fill-mask",status="200"}' in metrics
        shot(page, "key-4-metrics")
        page.click("#raw-close")
        assert page.is_hidden("#raw")
        page.reload()  # the same tab keeps the key: not asked again
        wait_done(page)
        assert page.is_hidden("#key-form") and predictions(page, "mlm")
        other = browser.new_context()  # another session is asked again
        other.new_page().goto(url)
        other.pages[0].wait_for_selector("#key-form", state="visible", timeout=30_000)
        other.close()
    finally:
        context.close()
    assert not errors, errors


KEY_ITEM = "bertforge-api-key"
