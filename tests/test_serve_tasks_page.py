"""The explorer page at ``/`` with a token classifier and a question-answering model, in a real
browser (Debian's chromium driven by Playwright, headless, never ``playwright install``) against
a real ``bertforge serve``: the entities ``/tag`` finds are marked inline in their type's colour
with a legend, the answer ``/answer`` gives is highlighted in its context and the next-best
spans are listed with their scores. Screenshots go to tests/artifacts/serve/ (ignored by git;
``BERTFORGE_ARTIFACTS`` moves them); ``BERTFORGE_DOC_SHOTS=1`` also writes docs/img/serve-tag.png
and docs/img/serve-answer.png."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
sync_api = pytest.importorskip("playwright.sync_api")

from support.serve import ROOT, qa_model, request, serve, tagger_model, tiny_models  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("BERTFORGE_ARTIFACTS", ROOT / "tests" / "artifacts")) / "serve"
DOC_SHOTS = os.environ.get("BERTFORGE_DOC_SHOTS") == "1"
TEXT = "anna and tom went to see a film in new york with people from paris ."
QUESTION = "where is good ?"
CONTEXT = "the movie was a good film with some actors and a plot about people"


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    root = tmp_path_factory.mktemp("tasks-page")
    tiny = tiny_models(root)
    served = {"ner": tagger_model(root, tiny["mlm"]), "qa": qa_model(root, tiny["mlm"])}
    with serve(served, "--max_input_length", "64", log=root / "server.log") as (port, _):
        yield port


@pytest.fixture(scope="module")
def page(port):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True
        )
        page = browser.new_page(viewport={"width": 960, "height": 640})
        page.errors = []  # type: ignore[attr-defined]  # uncaught JavaScript exceptions
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{port}/")
        wait_done(page)
        yield page
        browser.close()


def wait_done(page) -> None:
    page.wait_for_function(
        "document.getElementById('status').textContent === 'done'", timeout=30_000
    )


def run(page, model: str, text: str) -> None:
    page.select_option("#model-a", model)
    page.select_option("#model-b", "")
    page.fill("#text", text)
    page.click("#run")
    wait_done(page)


def shot(page, name: str, doc: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    if DOC_SHOTS:  # the panel down to its attention view, small, for docs/serving.md
        panel = page.locator(".panel").first.bounding_box()
        attention = page.locator(".panel h3", has_text="Attention").first.bounding_box()
        clip = {**panel, "height": attention["y"] - panel["y"]}
        page.screenshot(path=str(ROOT / "docs" / "img" / doc), clip=clip, full_page=True)


def test_each_model_kind_opens_with_its_own_example_and_controls(page, port):
    # the page opened on the tagger (the first model) with the fill-mask example, "[MASK]"
    # tagged ORG, and a top-k box that does nothing for a tagger
    shot(page, "tasks-0-open-tagger", "serve-open-tagger.png")
    text = page.input_value("#text")
    assert "[MASK]" not in text and "London" in text, text
    assert page.input_value("#question") == "Where was Ada Lovelace born ?"  # qa is compared
    page.select_option("#model-b", "")
    assert page.locator("#top-k").is_hidden()  # a tagger alone: nothing for top-k to do
    page.select_option("#model-a", "qa")
    assert page.locator("#top-k").is_visible()
    context, question = page.input_value("#text"), page.input_value("#question")
    assert "London" in context and question.endswith("?") and "born" in question
    page.click("#run")
    wait_done(page)
    # the attention of what the model reads: the question, then its context (a pair)
    drawn = page.locator('.panel[data-model="qa"] .headview svg text')
    assert drawn.all_text_contents().count("[SEP]") == 4  # each token drawn left and right
    assert page.locator('.panel[data-model="qa"] .headview svg text.seg1').count() > 0
    assert page.errors == []
    shot(page, "tasks-0-open-qa", "serve-open-qa.png")
    page.fill("#text", "my own text about Paris")  # a text of the user's own stays
    page.select_option("#model-a", "ner")
    assert page.input_value("#text") == "my own text about Paris"


def test_entities_are_coloured_inline_by_type_with_a_legend(page, port):
    run(page, "ner", TEXT)
    assert page.locator("#question-row").is_hidden()  # no question for a tagger
    _, (found,) = request(port, "POST", "/tag", {"inputs": [TEXT], "model": "ner"})
    assert found, "the tiny tagger found no entity: the page test would show nothing"
    marks = page.locator('.panel[data-model="ner"] mark.ent')
    assert marks.count() == len(found)
    for k, e in enumerate(found):
        mark = marks.nth(k)
        assert mark.get_attribute("data-entity") == e["entity"]
        assert mark.inner_text().startswith(TEXT[e["start"] : e["end"]])
    # the whole text is there, entity or not, in order
    tagged = page.locator('.panel[data-model="ner"] .tagged')
    assert (
        tagged.evaluate(
            "p => [...p.childNodes].map(n => n.nodeType === 3 ? n.textContent"
            " : n.firstChild.textContent).join('')"
        )
        == TEXT
    )
    # the tag view, not the masked LM's WordPieces to click and mask
    headings = page.locator('.panel[data-model="ner"] h3').all_inner_texts()
    assert [h.lower() for h in headings] == ["entities", "attention"]
    assert page.locator('.panel[data-model="ner"] .tok').count() == 0
    assert "mask" not in page.inner_text("#text-hint").lower()
    legend = page.locator('.panel[data-model="ner"] .ent-key').all_inner_texts()
    assert [t.strip() for t in legend] == ["LOC", "PER"]
    # one colour per type: the marks of a type share their legend swatch's colour
    colours = {
        e["entity"]: marks.nth(k).evaluate("m => getComputedStyle(m).backgroundColor")
        for k, e in enumerate(found)
    }
    for entity, colour in colours.items():
        swatch = page.locator(f'.ent-key[data-entity="{entity}"] .sw')
        assert swatch.evaluate("s => getComputedStyle(s).backgroundColor") == colour
    if len(colours) == 2:
        assert len(set(colours.values())) == 2
    assert page.errors == []
    shot(page, "tasks-1-tag", "serve-tag.png")


def test_the_answer_is_highlighted_in_its_context_with_the_next_best_spans(page, port):
    page.select_option("#model-a", "qa")
    assert page.locator("#question-row").is_visible()
    assert page.inner_text("#text-name") == "Context"
    page.fill("#question", QUESTION)
    page.fill("#top-k", "4")
    run(page, "qa", CONTEXT)
    body = {"inputs": [{"question": QUESTION, "context": CONTEXT}], "model": "qa", "top_k": 4}
    _, (found,) = request(port, "POST", "/answer", body)
    panel = page.locator('.panel[data-model="qa"]')
    assert panel.locator("mark.answer").inner_text() == found["answer"] == "good"
    assert panel.locator(".answer-text").inner_text() == found["answer"]
    headings = [h.lower() for h in panel.locator("h3").all_inner_texts()]
    assert headings == ["answer", "next-best spans", "attention"]  # no WordPieces to mask
    assert panel.locator(".tok").count() == 0
    context = panel.locator(".context").inner_text()
    assert context == CONTEXT
    rows = panel.locator("table.alternatives tbody tr")
    assert rows.count() == len(found["alternatives"]) == 3
    for k, alt in enumerate(found["alternatives"]):
        cells = rows.nth(k).locator("td").all_inner_texts()
        assert cells[0] == alt["answer"] and cells[1] == f"{alt['start']}–{alt['end']}"
        assert cells[2] == f"{alt['score']:.3f}"
    # an empty question is a hint, not a request
    page.fill("#question", "")
    run(page, "qa", CONTEXT)
    assert "write one in the Question box" in panel.inner_text()
    page.fill("#question", QUESTION)
    run(page, "qa", CONTEXT)
    assert page.errors == []
    shot(page, "tasks-2-answer", "serve-answer.png")
