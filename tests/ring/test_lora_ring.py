"""LoRA adapters over the ring: a worker states its adapters in its heartbeats as it states its
models, and the ring routes each adapter's name to the links that state it (a claim for a
link's model takes them); ``/v1/models`` lists them with their base as ``parent``. The wire's
field is optional (a previous version neither sends nor reads it). The last test runs a
remote worker over mutual TLS with the openai client choosing adapters by model name."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import httpx
import openai
import pytest
import trio

from llmtrio.cli import run_worker
from llmtrio.engine import LoraSpec
from llmtrio.ring import Attach, Claim, Heartbeat, Ring, RingCore, client_ssl_context, encode
from llmtrio.web import ServeConfig, serve_ingress
from llmtrio.worker import HostConfig

from .._helpers import engine_config, eventually
from .._lora import Lora
from .test_ring_protocol import decode_all
from .test_ring_remote import Pki, pki, start_ingress, wait_attached
from .test_ring_routing import assigned, park

__all__ = ["pki"]  # the fixture, used by name


def test_a_heartbeat_states_adapters_only_when_it_has_some() -> None:
    beat = Heartbeat(0, 2, 2, adapters=("sql", "fr"))
    assert decode_all(encode(beat)) == [beat]
    # None: byte for byte the frame of a worker of the previous version.
    assert b"adapters" not in encode(Heartbeat(0, 2, 2))


def _core() -> RingCore:
    core = RingCore(max_streams=16)
    core.attach(Attach("w1", 4, models=("base",)))
    core.attach(Attach("w2", 4, models=("other",)))
    return core


def test_an_adapters_name_is_routed_to_the_link_that_states_it() -> None:
    core = _core()
    core.heartbeat("w1", Heartbeat(0, 4, 4, adapters=("sql",)))
    models = core.models()
    assert (models["sql"].parent, models["sql"].kind, models["sql"].workers) == ("base", "chat", 1)
    assert models["base"].parent is None
    # A stream for the adapter waits for a claim of its base's link, not another's.
    sql, taken = park(core, "sql")
    assert taken == []
    assert assigned(core.claim("w2", Claim(1, model="other"))) == []
    assert assigned(core.claim("w1", Claim(1, model="base"))) == [("w1", sql)]
    # A claim waiting already takes the next one at once.
    core.claim("w1", Claim(1, model="base"))
    _, taken = park(core, "sql")
    assert [worker for worker, _ in taken] == ["w1"]


def test_an_adapter_no_longer_stated_is_routed_no_more() -> None:
    core = _core()
    core.heartbeat("w1", Heartbeat(0, 4, 4, adapters=("sql", "fr")))
    core.claim("w1", Claim(2, model="base"))
    core.heartbeat("w1", Heartbeat(0, 4, 4, adapters=("fr",)))
    assert "sql" not in core.models() and core.models()["fr"].parent == "base"
    _, taken = park(core, "sql")
    assert taken == []  # parked: no link states it (the ingress refuses it once it knows)
    _, taken = park(core, "fr")
    assert [worker for worker, _ in taken] == ["w1"]


def test_two_workers_stating_one_adapter_share_its_streams() -> None:
    core = RingCore(max_streams=16)
    for name in ("w1", "w2"):
        core.attach(Attach(name, 4, models=("base",)))
        core.heartbeat(name, Heartbeat(0, 4, 4, adapters=("sql",)))
        core.claim(name, Claim(1, model="base"))
    assert core.models()["sql"].workers == 2
    served = [park(core, "sql")[1][0][0] for _ in range(2)]
    assert sorted(served) == ["w1", "w2"]


def test_a_stream_for_an_adapter_of_an_unloaded_model_asks_one_link_to_load_it() -> None:
    """Models on demand: the adapter's stream is its base's load, as the base's own stream
    would be; a second stream joins that load rather than asking another link."""
    core = RingCore(max_streams=16)
    for name in ("w1", "w2"):
        core.attach(Attach(name, 8, models=("base",)))
        beat = Heartbeat(0, 8, 8, model_state="unloaded", free_bytes=100, adapters=("sql",))
        core.heartbeat(name, beat)
        core.claim(name, Claim(4, model="base"))
    assert core.models()["sql"].state == "unloaded"
    first = park(core, "sql")[1]
    second = park(core, "base")[1]
    assert len(first) == len(second) == 1
    assert first[0][0] == second[0][0]  # one link loads it for both


async def test_a_remote_worker_serves_adapters_by_model_name_over_the_ring(
    pki: Pki, qwen35_path: Path, qwen35_loras: tuple[Lora, Lora], tmp_path: Path
) -> None:
    """Two remote workers over mutual TLS, each with its own adapter on its own qwen35
    model: a request names an adapter and is served by its worker under it (the completions
    of the openai client; the answer names the adapter); one loaded at run time from
    --lora-dir is routed as soon as it is loaded, and routed no more once unloaded."""
    lora_dir = tmp_path / "loras"
    lora_dir.mkdir()
    (lora_dir / "late.gguf").write_bytes(qwen35_loras[1].path.read_bytes())
    ring = Ring(max_streams=64, park_timeout=30)
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1)
    async with trio.open_nursery() as nursery:
        shutdown = trio.Event()
        control = await start_ingress(nursery, pki, ring)
        binds = await nursery.start(
            partial(serve_ingress, ring, config, model_name="", shutdown=shutdown)
        )
        for name, adapter in (("one", qwen35_loras[0]), ("two", qwen35_loras[1])):
            model = engine_config(
                qwen35_path, model_name=name, lora=(LoraSpec(f"{name}-tuned", adapter.path),)
            )
            context = client_ssl_context(pki.worker(name), None, pki.ingress_ca)
            await nursery.start(
                partial(
                    run_worker,
                    model,
                    [control],
                    context,
                    shutdown=shutdown,
                    name=name,
                    host=HostConfig(lora_dir=lora_dir),
                )
            )
        await wait_attached(ring, 2)
        await eventually(lambda: {"one-tuned", "two-tuned"} <= set(ring.models()))
        url = binds[0]
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

        async def complete(model: str, **extra: object) -> openai.types.Completion:
            return await client.completions.create(
                model=model,
                prompt=[5, 6, 7, 8],
                max_tokens=8,
                temperature=0,
                extra_body={"ignore_eos": True, **extra},
            )

        texts = {}
        for model in ("one", "one-tuned", "two", "two-tuned"):
            answer = await complete(model)
            assert answer.model == model
            texts[model] = answer.choices[0].text
        assert texts["one"] == texts["two"]  # one model, two names
        assert texts["one-tuned"] != texts["one"] and texts["two-tuned"] != texts["two"]
        assert texts["one-tuned"] != texts["two-tuned"]
        # llama.cpp's lora field on the base's name: the same as the adapter's name.
        by_id = await complete("two", lora=[{"id": 0, "scale": 1.0}])
        assert by_id.choices[0].text == texts["two-tuned"]

        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            listed = (await http.get("/v1/models")).json()["data"]
            parents = {entry["id"]: entry["parent"] for entry in listed}
            assert parents == {"one": None, "two": None, "one-tuned": "one", "two-tuned": "two"}
            # Loaded at run time on "two", from --lora-dir by its file's name.
            body = {"lora_name": "late", "lora_path": "late", "model": "two"}
            loaded = await http.post("/v1/load_lora_adapter", json=body)
            assert loaded.status_code == 200, loaded.text
            assert loaded.json() == {
                "success": True,
                "lora_name": "late",
                "model": "two",
                "state": "loaded",
                "id": 1,
            }
            await eventually(lambda: "late" in ring.models())
            assert ring.models()["late"].parent == "two"
            assert (await complete("late")).choices[0].text == texts["two-tuned"]
            gone = await http.post("/v1/unload_lora_adapter", json={"lora_name": "late"})
            assert gone.status_code == 200, gone.text
            assert gone.json()["state"] == "unloaded"
            await eventually(lambda: "late" not in ring.models())
            missing = await http.post(
                "/v1/chat/completions",
                json={"model": "late", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "model_not_found"
        shutdown.set()
        nursery.cancel_scope.cancel()  # the control server serves until cancelled


@pytest.mark.parametrize("unknown", ["late", ""])
async def test_unloading_needs_a_known_adapters_name(unknown: str) -> None:
    """The ingress routes an unload by its ``lora_name``: an unknown one is a 404, none a
    400 naming ``lora_name``."""
    ring = Ring(max_streams=4)
    config = ServeConfig(host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        shutdown = trio.Event()
        binds = await nursery.start(
            partial(serve_ingress, ring, config, model_name="base", shutdown=shutdown)
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=30) as http:
            body = {"lora_name": unknown} if unknown else {}
            answer = await http.post("/v1/unload_lora_adapter", json=body)
        shutdown.set()
    error = answer.json()["error"]
    if unknown:
        assert (answer.status_code, error["code"]) == (404, "model_not_found")
    else:
        assert (answer.status_code, error["param"]) == (400, "lora_name")
