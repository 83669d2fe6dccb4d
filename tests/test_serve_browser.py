"""The page at / in a real headless Chromium (Debian's chromium, driven by Playwright): type a source text,
translate, read the translations, pick a sentence and see its attention heatmap drawn; saves a screenshot.

Skipped when Playwright or /usr/bin/chromium is missing, except under CI, where it fails: .ci/run
installs both.
"""

import importlib.util
import os
from pathlib import Path

import pytest
from conftest import TARGETS, subprocess_env
from test_multilingual import SOURCES

CHROMIUM = Path("/usr/bin/chromium")
# as root, in a sandbox with no network: no setuid sandbox, no GPU, no calls home
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")


@pytest.fixture(scope="module")
def chromium():
    missing = [name for name, found in (("playwright", importlib.util.find_spec("playwright")),
                                        (str(CHROMIUM), CHROMIUM.exists())) if not found]
    if missing:
        message = f"the browser test needs {' and '.join(missing)} (.ci/run installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def canvas_colours(page) -> dict:
    """How many pixels of the heatmap canvas are drawn, and in how many distinct colours."""
    return page.evaluate("""() => {
        const canvas = document.getElementById("heatmap");
        const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
        const colours = new Set();
        let drawn = 0;
        for (let i = 0; i < pixels.length; i += 4) {
            if (pixels[i + 3] > 0 && (pixels[i] < 250 || pixels[i + 1] < 250 || pixels[i + 2] < 250)) drawn++;
            colours.add(pixels.slice(i, i + 4).join());
        }
        return {drawn, colours: colours.size, width: canvas.width, height: canvas.height};
    }""")


def test_type_translate_read_and_see_the_heatmap(chromium, quick_copy_run, copy_corpus, tmp_path):
    from transformer.decoding.translator import Translator
    from transformer.serve.process import server_process

    checkpoint = quick_copy_run / "checkpoint_last.pt"
    lines = (copy_corpus / "valid.src").read_text().splitlines()[:3]
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    expected = translator.translate(lines)  # the page asks for the model's beam size
    with server_process(["--checkpoint", str(checkpoint), "--threads", "1"], subprocess_env()) as server:
        page = chromium.new_page(viewport={"width": 1000, "height": 900})
        page.goto(server.url)
        page.wait_for_function("document.getElementById('pair').textContent.includes('src')")
        page.fill("#source", "\n".join(lines))
        page.click("#translate")
        page.wait_for_function(f"document.querySelectorAll('#results > li').length === {len(lines)}")
        assert page.locator("#results > li .best").all_inner_texts() == [t or "(empty translation)" for t in expected]
        assert page.locator("#results > li .source").all_inner_texts() == lines
        assert page.locator("#results > li:nth-child(1) .nbest > li").count() == translator.decode.beam_size

        page.click("#results > li:nth-child(2)")
        page.wait_for_function("document.getElementById('attention-of').textContent === 'of sentence 2'")
        assert "selected" in page.get_attribute("#results > li:nth-child(2)", "class")
        pieces = translator.attention(lines[1])
        drawn = canvas_colours(page)
        assert drawn["width"] > 26 * len(pieces.source_pieces) and drawn["height"] > 26 * len(pieces.target_pieces)
        assert drawn["drawn"] > 26 * 26 * len(pieces.target_pieces) and drawn["colours"] > 10
        assert page.locator("#error").is_hidden()
        assert page.locator("#language").is_hidden()  # one target language: no picker
        page.screenshot(path=str(tmp_path / "serve.png"), full_page=True)
    assert (tmp_path / "serve.png").stat().st_size > 10_000


def test_pick_the_target_language_of_a_multilingual_model(chromium, two_target_run, tmp_path):
    from transformer import Translator
    from transformer.serve.process import server_process

    checkpoint = two_target_run / "checkpoint_last.pt"
    translator = Translator.from_checkpoint(checkpoint)
    with server_process(["--checkpoint", str(checkpoint), "--threads", "1"], subprocess_env()) as server:
        page = chromium.new_page(viewport={"width": 1000, "height": 900})
        page.goto(server.url)
        page.wait_for_function("document.getElementById('pair').textContent.includes('src→cap')")
        assert page.locator("#tgt-lang option").all_inner_texts() == ["up", "cap"]
        page.fill("#source", "\n".join(SOURCES))
        for lang in TARGETS:
            page.select_option("#tgt-lang", lang)
            expected = translator.translate(SOURCES, tgt_lang=lang)
            page.click("#translate")
            page.wait_for_function(f"document.querySelector('#results > li .best')?.textContent === {expected[0]!r}")
            assert page.locator("#results > li .best").all_inner_texts() == expected
        page.wait_for_function("document.getElementById('attention-of').textContent === 'of sentence 1'")
        assert page.locator("#error").is_hidden()
        page.screenshot(path=str(tmp_path / "multilingual.png"), full_page=True)
