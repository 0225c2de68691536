"""What the vision API tests share: images (random PNGs, data URIs), a server with the
gemma-3-270m test model and a random-weight ``gemma3`` projector (tests/_projector.py) beside
a text-only one, and a loopback HTTP server that serves image bytes for ``http`` image URLs."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from PIL import Image as PILImage

from llmtrio.web import ServeConfig
from llmtrio.worker import RequestLimits

from ._helpers import engine_config
from ._projector import write_gemma3_projector
from ._server import LiveServer, start_server

__all__ = ["PROMPT", "FileServer", "data_uri", "file_server", "png", "vision_server"]

PROMPT = "What is in the picture?"


def png(seed: int, size: tuple[int, int] = (40, 32)) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    PILImage.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def data_uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


@contextmanager
def vision_server(
    folder: Path,
    gemma_path: Path,
    *,
    max_images: int,
    serve: ServeConfig,
    limits: RequestLimits,
) -> Iterator[LiveServer]:
    """A server of two models, ``gemma`` (with a projector written into ``folder``, at most
    ``max_images`` images a request) and ``text-only``, one thread each."""
    projector = write_gemma3_projector(folder / "mmproj-gemma3.gguf")
    configs = [
        engine_config(
            gemma_path, model_name="gemma", mmproj=projector, threads=1, max_inflight=2,
            max_images=max_images,
        ),
        engine_config(gemma_path, model_name="text-only", threads=1, max_inflight=1),
    ]  # fmt: skip
    live = start_server(configs, serve, limits)
    try:
        yield live
    finally:
        live.stop()


class FileServer:
    """A loopback HTTP server (a thread) answering ``GET /NAME`` with ``files[NAME]`` (as
    ``image/png``, whatever the bytes are); ``hits`` counts the requests."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                body = outer.files.get(self.path.lstrip("/"))
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]

    def start(self) -> None:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"


@contextmanager
def file_server(files: dict[str, bytes]) -> Iterator[FileServer]:
    server = FileServer(files)
    server.start()
    try:
        yield server
    finally:
        server.stop()
