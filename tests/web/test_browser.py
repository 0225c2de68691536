"""The chat page in real headless Chromium (Debian's), against ``llmtrio serve``."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from llmtrio.api import CHAT_PATH

from .._helpers import engine_config
from .._server import LiveServer

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(autouse=True)
def chromium() -> None:
    """Skip without Debian's chromium on a developer's machine; in CI (``CI`` set) its absence
    is a failure, never a silent skip."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("CI is set but Debian's chromium is missing (scripts/test installs it)")
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")


ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]


@contextmanager
def opened_page(**options: Any) -> Iterator[tuple[Page, list[str]]]:
    """A new page in headless Chromium (``options`` for ``new_page``), and the errors its
    scripts raise (each test ends with none); the browser is closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(**options)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page, errors
        finally:
            browser.close()


def test_chat_page_streams_and_stop_cancels_on_the_server(
    live_server: LiveServer, artifacts: Path
) -> None:
    from playwright.sync_api import expect

    with opened_page(viewport={"width": 1100, "height": 800}) as (page, errors):
        page.goto(live_server.url + "/")
        expect(page.locator("#model-name")).to_contain_text("gemma")

        # A whole answer: streamed text, stats, a finish reason.
        page.fill("#max-tokens", "24")
        page.fill("#prompt", "Write one sentence about the moon.")
        page.click("#send")
        first = page.locator(".msg.assistant").nth(0)
        expect(first).to_have_attribute("data-finish", "length", timeout=60_000)
        assert first.locator(".answer").inner_text().strip()
        expect(first.locator(".stats .tps")).to_contain_text("tok/s")

        # A long answer, stopped mid-way: the server frees the slot.
        page.fill("#max-tokens", "400")
        page.fill("#prompt", "Tell me a very long story about a lighthouse keeper.")
        page.click("#send")
        second = page.locator(".msg.assistant").nth(1)
        # Streamed text is arriving (the page's CSP forbids eval, so no wait_for_function).
        expect(second.locator(".answer")).to_have_text(re.compile(r".{20,}", re.S), timeout=60_000)
        assert live_server.inflight() == 1
        page.click("#stop")
        expect(second).to_have_attribute("data-finish", "aborted")
        live_server.wait_idle()
        page.screenshot(path=str(artifacts / "chat-page.png"), full_page=True)
        assert errors == []


def test_chat_page_shows_tool_calls_and_json_legibly(
    live_server: LiveServer, artifacts: Path
) -> None:
    """The page sends neither tools nor a response format, so the server's real replies to
    requests that do are recorded first and handed to the page's own request."""
    import httpx
    from playwright.sync_api import Route, expect

    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
            },
        },
    }
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    common = {"max_tokens": 120, "stream": True, "stream_options": {"include_usage": True}}
    recorded = [
        httpx.post(
            live_server.url + CHAT_PATH,
            json={**common, "messages": ask, "tools": [tool], "tool_choice": "required"},
            timeout=60,
        ).content,
        httpx.post(
            live_server.url + CHAT_PATH,
            json={
                **common,
                "messages": ask,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "weather",
                        "schema": {
                            "type": "object",
                            "properties": {
                                "city": {"type": "string", "maxLength": 20},
                                "sky": {"enum": ["sunny", "cloudy", "rainy"]},
                            },
                            "required": ["city", "sky"],
                        },
                    },
                },
            },
            timeout=60,
        ).content,
    ]
    assert b'"tool_calls"' in recorded[0]

    def replay(route: Route) -> None:
        route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=recorded.pop(0)
        )

    with opened_page(viewport={"width": 1100, "height": 800}) as (page, errors):
        page.goto(live_server.url + "/")
        page.route("**/v1/chat/completions", replay)

        page.fill("#prompt", "Weather in Paris?")
        page.click("#send")
        first = page.locator(".msg.assistant").nth(0)
        expect(first).to_have_attribute("data-finish", "tool_calls", timeout=60_000)
        expect(first.locator(".tool-call .tool-name")).to_have_text("Tool call: get_weather")
        arguments = first.locator(".tool-call pre").inner_text()
        assert arguments.startswith('{\n  "city": ')  # indented JSON

        page.fill("#prompt", "And as JSON?")
        page.click("#send")
        second = page.locator(".msg.assistant").nth(1)
        expect(second).to_have_attribute("data-finish", "stop", timeout=60_000)
        shown = second.locator(".answer pre.json").inner_text()
        assert shown.startswith('{\n  "city": ') and '"sky": ' in shown
        page.screenshot(path=str(artifacts / "chat-page-tools-json.png"), full_page=True)
        assert errors == []


def test_chat_page_asks_for_the_api_key_once_and_keeps_it_in_the_browser(
    gemma_path: Path,
) -> None:
    from playwright.sync_api import Dialog, Request, expect

    from llmtrio.web import ServeConfig

    from .._server import start_server

    server = start_server(
        engine_config(gemma_path, max_inflight=1, ctx_size=256),
        ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1, api_keys=["page-key"]),
    )
    try:
        with opened_page() as (page, errors):
            asked: list[str] = []

            def answer(dialog: Dialog) -> None:
                asked.append(dialog.message)
                dialog.accept("page-key")

            page.on("dialog", answer)
            sent: list[str | None] = []

            def record(request: Request) -> None:
                if request.url.endswith(CHAT_PATH):
                    sent.append(request.headers.get("authorization"))

            page.on("request", record)
            page.goto(server.url + "/")
            expect(page.locator("#model-name")).to_contain_text("gemma")  # open paths
            for turn in range(2):
                page.fill("#max-tokens", "3")
                page.fill("#prompt", "Say hi.")
                page.click("#send")
                reply = page.locator(".msg.assistant").nth(turn)
                expect(reply).to_have_attribute("data-finish", "length", timeout=60_000)
            assert len(asked) == 1 and "API key" in asked[0]
            # First try without a key (401), the retry and the next turn with it.
            assert sent == [None, "Bearer page-key", "Bearer page-key"]
            stored = page.evaluate("() => localStorage.getItem('llmtrio.apiKey')")
            assert stored == "page-key"
            assert errors == []
    finally:
        server.stop()


def predicted(url: str) -> dict[str, float]:
    """Tokens each model's engine generated so far (``/metrics``), by model name; models that
    generated none are left out."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        sample.labels["model_name"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "llamacpp:tokens_predicted_total" and sample.value
    }


def test_chat_page_picks_among_the_chat_models_and_sends_the_one_chosen(
    gemma_path: Path, qwen35_path: Path, minilm_path: Path
) -> None:
    """Three models behind the endpoint, one of them an embedding model: the picker lists the
    two chat models only, and a turn goes to the one chosen (the request names it, and its
    engine is the one that generated)."""
    import json

    from playwright.sync_api import Request, expect

    from llmtrio.web import ServeConfig

    from .._server import start_server

    server = start_server(
        [
            engine_config(gemma_path, max_inflight=1, ctx_size=256, model_name="gemma"),
            engine_config(qwen35_path, max_inflight=1, ctx_size=256, model_name="tiny"),
            engine_config(minilm_path, max_inflight=1, ctx_size=256, model_name="minilm"),
        ],
        ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1),
    )
    try:
        with opened_page() as (page, errors):
            sent: list[object] = []

            def record(request: Request) -> None:
                if request.url.endswith(CHAT_PATH):
                    sent.append(json.loads(request.post_data or "{}").get("model"))

            page.on("request", record)
            predicted_before: dict[str, float] = {}
            page.goto(server.url + "/")
            picker = page.locator("#model-pick")
            expect(picker).to_be_visible(timeout=30_000)
            options = picker.locator("option")
            expect(options).to_have_count(2)
            assert sorted(options.all_inner_texts()) == ["gemma", "tiny"]
            for turn, model in enumerate(["tiny", "gemma"]):
                picker.select_option(model)
                page.fill("#max-tokens", "3")
                page.fill("#prompt", "Say hi.")
                page.click("#send")
                reply = page.locator(".msg.assistant").nth(turn)
                expect(reply).to_have_attribute(
                    "data-finish", re.compile("length|stop"), timeout=60_000
                )
                assert sent[-1] == model
                now = predicted(server.url)
                assert now.get(model, 0) > predicted_before.get(model, 0)
                others = {name for name in now if name != model}
                assert {n: now[n] for n in others} == {n: predicted_before[n] for n in others}
                predicted_before = now
            assert sent == ["tiny", "gemma"]
            assert errors == []
    finally:
        server.stop()


def test_chat_page_attaches_images_from_the_picker_and_a_paste(
    gemma_path: Path, tmp_path: Path, artifacts: Path
) -> None:
    import base64

    import numpy as np
    from PIL import Image as PILImage
    from playwright.sync_api import expect

    from llmtrio.web import ServeConfig

    from .._projector import write_gemma3_projector
    from .._server import start_server

    projector = write_gemma3_projector(tmp_path / "mmproj-gemma3.gguf")
    pictures = []
    for seed in (1, 2):
        path = tmp_path / f"picture-{seed}.png"
        pixels = np.random.default_rng(seed).integers(0, 256, (32, 48, 3), dtype=np.uint8)
        PILImage.fromarray(pixels).save(path)
        pictures.append(path)
    server = start_server(
        engine_config(gemma_path, mmproj=projector, max_inflight=1, threads=1, spec=None),
        ServeConfig(host="127.0.0.1", port=0, graceful_timeout=2),
    )
    sent: list[str] = []
    try:
        with opened_page(viewport={"width": 1100, "height": 800}, bypass_csp=True) as (
            page,
            errors,
        ):
            page.on(
                "request",
                lambda request: (
                    sent.append(request.post_data or "")
                    if request.url.endswith(CHAT_PATH)
                    else None
                ),
            )
            page.goto(server.url + "/")
            expect(page.locator("#model-name")).not_to_have_text("loading model…")
            # the file picker
            page.set_input_files("#attach-file", str(pictures[0]))
            expect(page.locator("#attachments img")).to_have_count(1)
            # a paste of an image into the prompt
            page.evaluate(
                """async (b64) => {
                  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
                  const data = new DataTransfer();
                  data.items.add(new File([bytes], "pasted.png", { type: "image/png" }));
                  document.querySelector("#prompt").dispatchEvent(new ClipboardEvent(
                    "paste", { clipboardData: data, bubbles: true, cancelable: true }));
                }""",
                base64.b64encode(pictures[1].read_bytes()).decode(),
            )
            expect(page.locator("#attachments img")).to_have_count(2)
            page.fill("#max-tokens", "4")
            page.fill("#prompt", "What is in the pictures?")
            page.click("#send")
            turn = page.locator(".msg.assistant").nth(0)
            expect(turn).to_have_attribute("data-finish", "length", timeout=60_000)
            expect(page.locator(".msg.user .images img")).to_have_count(2)
            expect(page.locator("#attachments")).to_be_hidden()
            page.screenshot(path=str(artifacts / "chat-page-images.png"), full_page=True)
            assert errors == []
    finally:
        server.stop()
    body = sent[-1]
    assert body.count('"type":"image_url"') == 2
    assert body.count("data:image/png;base64,") == 2
