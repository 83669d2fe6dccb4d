"""The page at / as a user meets it, in headless Chromium (as tests/test_serve_browser.py drives it): errors as
one readable line, one request per Ctrl+Enter, the keyboard, right-to-left text and a quiet console."""

import pytest
from conftest import subprocess_env
from test_serve_browser import chromium  # noqa: F401  the browser, skipped where it is missing

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")


@pytest.fixture(scope="module")
def server(quick_copy_run):
    from transformer.serve.process import server_process

    with server_process(["--checkpoint", str(quick_copy_run / "checkpoint_last.pt"), "--threads", "1"],
                        subprocess_env()) as running:
        yield running


@pytest.fixture
def page(chromium, server):  # noqa: F811
    page = chromium.new_page(viewport={"width": 1000, "height": 900})
    page.console_errors = []
    page.on("console", lambda message: message.type == "error" and page.console_errors.append(message.text))
    page.on("pageerror", lambda error: page.console_errors.append(str(error)))
    page.goto(server.url)
    page.wait_for_function("document.getElementById('about').textContent.length > 0")
    yield page
    page.close()


def translate(page, text: str) -> None:
    page.fill("#source", text)
    page.click("#translate")
    page.wait_for_function("!document.getElementById('translate').disabled && "
                           "document.getElementById('status').textContent !== 'translating…'")


def error_shown(page) -> str | None:
    return page.inner_text("#error") if page.is_visible("#error") else None


def test_the_page_loads_without_a_console_error(page):
    """Each load asked for /favicon.ico, a 404 in the console."""
    translate(page, "alpha beta")
    page.wait_for_function("document.getElementById('attention-of').textContent === 'of sentence 1'")
    assert page.console_errors == [] and error_shown(page) is None


@pytest.mark.parametrize("answer, message", [
    ({"status": 502, "content_type": "text/html", "body": "<html><body>Bad Gateway</body></html>"},
     "the server answered 502 Bad Gateway"),
    ({"status": 500, "content_type": "text/plain", "body": "Internal Server Error"},
     "the server answered 500 Internal Server Error"),
    (None, "cannot reach the server: is transformer-serve still running?"),
])
def test_an_answer_that_is_not_json_or_no_answer_is_one_readable_line(page, answer, message):
    """A proxy's HTML page showed `Unexpected token '<', "<html><bod"... is not valid JSON`, a stopped server
    `Failed to fetch`."""
    page.route("**/translate", lambda route: route.fulfill(**answer) if answer else route.abort())
    translate(page, "alpha beta")
    assert error_shown(page) == message and page.inner_text("#status") == ""


def test_ctrl_enter_while_translating_sends_no_second_request(page):
    sent = []
    page.on("request", lambda request: request.url.endswith("/translate") and sent.append(request))
    page.fill("#source", "alpha beta gamma\nkappa lambda")
    page.focus("#source")
    for _ in range(3):
        page.keyboard.press("Control+Enter")
    page.wait_for_function("document.querySelectorAll('#results > li').length === 2")
    page.wait_for_timeout(500)
    assert len(sent) == 1


@pytest.mark.parametrize("beam, nbest, message", [
    ("", "1", "beam: give a whole number of 1 or more"),  # was "decode.beam_size must be >= 1, got 0"
    ("2", "1.5", "n-best: give a whole number of 1 or more, not 1.5"),
    ("-1", "1", "beam: give a whole number of 1 or more, not -1"),
])
def test_a_beam_or_nbest_box_that_is_not_a_count_is_named(page, beam, nbest, message):
    page.fill("#beam", beam)
    page.fill("#nbest", nbest)
    translate(page, "alpha beta")
    assert error_shown(page) == message


def test_a_sentence_too_long_is_named_by_its_line_in_the_box(page):
    """The server's "text[1]" counts the sentences sent, blank lines left out, from 0: the box's line 4 here."""
    translate(page, "alpha\n\n   \n" + "beta " * 500)
    assert error_shown(page) == "line 4: 2500 characters, more than this server's limit of 2000"


def test_the_heatmap_is_of_the_translation_shown_whatever_the_beam_box_says_since(page):
    """A click asked /attention with the beam box's value of now, not the one the translations were made with."""
    translate(page, "alpha beta\ngamma delta")
    page.fill("#beam", "")
    page.click("#results > li:nth-child(2)")
    page.wait_for_function("document.getElementById('attention-of').textContent === 'of sentence 2'")
    assert error_shown(page) is None


def test_the_translations_can_be_picked_with_the_keyboard(page):
    """The list items took clicks only: Tab never reached them, and no key showed a heatmap."""
    translate(page, "alpha beta\ngamma delta")
    page.wait_for_function("document.getElementById('attention-of').textContent === 'of sentence 1'")
    page.focus("#translate")
    for _ in range(3):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.matches('#results > li:nth-child(2)')"):
            break
    assert page.evaluate("document.activeElement.matches('#results > li:nth-child(2)')")
    page.keyboard.press("Enter")
    page.wait_for_function("document.getElementById('attention-of').textContent === 'of sentence 2'")
    assert "selected" in page.get_attribute("#results > li:nth-child(2)", "class")


def test_right_to_left_text_is_shown_right_to_left(page):
    translate(page, "שלום עולם 😀\nalpha")
    direction = "(selector) => getComputedStyle(document.querySelector(selector)).direction"
    assert page.evaluate(direction, "#results > li:nth-child(1) .source") == "rtl"
    assert page.evaluate(direction, "#results > li:nth-child(2) .source") == "ltr"
    page.fill("#source", "שלום")
    assert page.evaluate(direction, "#source") == "rtl"
    assert page.locator("#results > li:nth-child(1) .source").inner_text() == "שלום עולם 😀"
