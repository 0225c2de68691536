"""LoRA adapters in the catalog and the memory budget: ``--lora NAME=PATH[:SCALE][@BASE]``, a
models file's ``lora = [...]``, what is refused at start (naming what), adapters counted in a
model's cost and reserved from the budget as they load at run time, and a run-time load's
file: a name in ``--lora-dir``, never a path."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from llmtrio.api import ApiError, RequestLimits
from llmtrio.cli._configs import catalog
from llmtrio.cli._main import _parser
from llmtrio.cli._values import LoraFlag
from llmtrio.engine import LoraSpec
from llmtrio.worker import HostedModel
from llmtrio.worker._adapters import AdapterBook, AdapterLoad
from llmtrio.worker._load_policy import LoadPolicy

from .._helpers import engine_config
from .._lora import Lora


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("sql=/a/sql.gguf", LoraFlag("sql", Path("/a/sql.gguf"))),
        ("sql=/a/sql.gguf:0.5", LoraFlag("sql", Path("/a/sql.gguf"), 0.5)),
        ("sql=/a/sql.gguf@qwen", LoraFlag("sql", Path("/a/sql.gguf"), 1.0, "qwen")),
        ("fr=rel/fr.gguf:-1.5@qwen:8b", LoraFlag("fr", Path("rel/fr.gguf"), -1.5, "qwen:8b")),
        # A colon of the path's own is no scale.
        ("w=/mnt/c:/w.gguf", LoraFlag("w", Path("/mnt/c:/w.gguf"))),
    ],
)
def test_a_lora_flag_names_its_adapter_file_scale_and_base(text: str, parsed: LoraFlag) -> None:
    assert LoraFlag.parse(text) == parsed


@pytest.mark.parametrize("text", ["sql", "=/a.gguf", "sql=", " =x@b"])
def test_a_lora_flag_without_a_name_or_a_path_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"give NAME=PATH\[:SCALE\]\[@BASE\]"):
        LoraFlag.parse(text)


def _parse(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["serve", "--threads=1", *argv])


def test_adapters_from_flags_and_the_models_file_join_their_base(
    tmp_path: Path, gemma_path: Path, gemma_loras: tuple[Lora, Lora]
) -> None:
    a, b = (lora.path for lora in gemma_loras)
    file = tmp_path / "models.toml"
    file.write_text(
        f'[models.g]\nsource = "{gemma_path}"\n'
        f'lora = ["x={a}:0.5", {{ name = "y", path = "{b.name}", scale = 2 }}]\n'
    )
    (tmp_path / b.name).write_bytes(b.read_bytes())  # relative to the file
    built = catalog(_parse(f"--models-file={file}", f"--lora=z={b}@g"))
    (model,) = built.models
    assert model.config.lora == (
        LoraSpec("x", a, 0.5),
        LoraSpec("y", tmp_path / b.name, 2.0),
        LoraSpec("z", b, 1.0),
    )
    # One model served: --lora needs no @BASE.
    (only,) = catalog(_parse(f"--model={gemma_path}", f"--lora=z={b}")).models
    assert only.config.lora == (LoraSpec("z", b),)


def test_adapters_count_in_their_models_cost(
    gemma_path: Path, gemma_loras: tuple[Lora, Lora]
) -> None:
    bare = HostedModel.of("g", engine_config(gemma_path))
    spec = LoraSpec("a", gemma_loras[0].path)
    adapted = HostedModel.of("g", engine_config(gemma_path, lora=(spec,)))
    size = gemma_loras[0].path.stat().st_size
    assert adapted.cost.adapters == size
    assert adapted.cost.total == bare.cost.total + size


def test_an_adapter_loaded_at_run_time_reserves_its_bytes_or_is_refused() -> None:
    policy = LoadPolicy(memory_bytes=100 * 2**20)
    policy.pin("g", 60 * 2**20, now=0)
    assert policy.grow("g", 30 * 2**20) is None
    assert policy.reserved == 90 * 2**20
    refused = policy.grow("g", 20 * 2**20)
    assert refused is not None and "memory budget of 100 MiB has 10.0 MiB free" in refused
    assert policy.reserved == 90 * 2**20  # nothing reserved for a refused one
    policy.shrink("g", 30 * 2**20)
    assert policy.reserved == 60 * 2**20
    assert policy.grow("absent", 1) == "the model absent is not loaded"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--lora=g=ADAPTER"], "LoRA adapter 'g' of model 'g': 'g' is a model already"),
        (["--lora=x=ADAPTER@nope"], "--lora x: no model is served as 'nope'"),
        (["--lora=x=OTHER"], "is for the architecture 'qwen35', but the base model is 'gemma3'"),
        (["--lora=x=BASE"], "is not a LoRA adapter"),
        (["--model=h=BASE", "--lora=x=ADAPTER"], "say which model it is for"),
        (["--model=e=MINILM", "--lora=x=ADAPTER@e"], "'e' is a model of kind 'embedding'"),
    ],
)
def test_what_cannot_be_served_is_refused_at_start_naming_what(
    flags: list[str],
    named: str,
    gemma_path: Path,
    gemma_loras: tuple[Lora, Lora],
    qwen35_loras: tuple[Lora, Lora],
    minilm_path: Path,
) -> None:
    paths = {
        "MINILM": str(minilm_path),
        "ADAPTER": str(gemma_loras[0].path),
        "OTHER": str(qwen35_loras[0].path),
        "BASE": str(gemma_path),
    }
    argv = [f"--model=g={gemma_path}"]
    for flag in flags:
        for key, value in paths.items():
            flag = flag.replace(key, value)
        argv.append(flag)
    with pytest.raises(SystemExit, match=named.replace("(", r"\(")):
        catalog(_parse(*argv))


def _load(book: AdapterBook, **body: object) -> AdapterLoad:
    return AdapterLoad.parse(json.dumps(body).encode(), book, RequestLimits())


def test_a_run_time_load_names_a_file_in_the_lora_dir_never_a_path(tmp_path: Path) -> None:
    (tmp_path / "sql.gguf").write_bytes(b"GGUF")
    (tmp_path / "fr").write_bytes(b"GGUF")
    book = AdapterBook("g", (LoraSpec("x", tmp_path / "fr"),), tmp_path)
    assert _load(book, lora_name="s", lora_path="sql").spec == LoraSpec("s", tmp_path / "sql.gguf")
    assert _load(book, lora_name="f", lora_path="fr", scale=0.5).spec.scale == 0.5
    for path, why in [
        ("../sql.gguf", "not a path"),
        (str(tmp_path / "sql.gguf"), "not a path"),
        (".hidden", "not a path"),
        ("absent", "no adapter named 'absent'"),
    ]:
        with pytest.raises(ApiError, match=why) as caught:
            _load(book, lora_name="s", lora_path=path)
        assert (caught.value.status, caught.value.param) == (400, "lora_path")
    with pytest.raises(ApiError, match="serves 'x' already") as caught:
        _load(book, lora_name="x", lora_path="sql")
    assert caught.value.param == "lora_name"
    closed = AdapterBook("g")
    with pytest.raises(ApiError, match="start it with --lora-dir"):
        _load(closed, lora_name="s", lora_path="sql")
