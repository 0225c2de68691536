"""The catalog (``llmtrio.cli._catalog``): the models file, a models folder, the Hugging Face
cache and ``--model`` together, without a model loaded."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llmtrio.api import FOREVER, keep_alive_seconds
from llmtrio.cli._catalog import CatalogError, scan_hf_cache, scan_models_dir
from llmtrio.cli._catalog_build import build_catalog, read_models_file
from llmtrio.cli._configs import catalog, on_demand, startup_configs
from llmtrio.cli._main import _parser
from llmtrio.engine import EngineConfig

BASE = EngineConfig(model=None, threads=1)


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def models_file(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "models.toml"
    file.write_text(text)
    return file


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (300, 300.0),
        (2.5, 2.5),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("45s", 45.0),
        ("500ms", 0.5),
        ("120", 120.0),
        ("0", 0.0),
        (-1, FOREVER),
        ("-1", FOREVER),
        ("-5m", FOREVER),
    ],
)
def test_keep_alive_as_ollama_reads_it(value: object, seconds: float) -> None:
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", [True, None, "soon", "5 minutes", "m5", [], "nan"])
def test_keep_alive_refuses_what_is_no_duration(value: object) -> None:
    with pytest.raises(ValueError, match="seconds"):
        keep_alive_seconds(value)


def test_models_file_each_model_with_its_settings(tmp_path: Path) -> None:
    gguf = touch(tmp_path / "weights" / "tiny.gguf")
    split = tmp_path / "big"
    for part in (1, 2):
        touch(split / f"big-{part:05d}-of-00002.gguf")
    touch(split / "mmproj-big-f16.gguf")
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    file = models_file(
        tmp_path,
        """
[defaults]
ctx_size = 2048
keep_alive = "10m"

[models.tiny]
source = "weights/tiny.gguf"
max_inflight = 2
threads = 1
kv_unified = true
spec = "off"
cache_type_k = "q8_0"
cache_type_v = "q4_0"
flash_attn = true
n_gpu_layers = 0
mlock = true
mmap = false
load = true
aliases = ["small", "default"]
chat_template_file = "t.jinja"

[models."qwen:q8"]
source = "unsloth/Qwen3.5-0.8B-GGUF:Q8_0"
keep_alive = -1
cache_ram = 0
cache_dir = "snapshots"
cache_disk = 512

[models.big]
source = "big"
keep_alive = 0
""",
    )
    tiny, qwen, big = read_models_file(file, BASE)
    assert tiny.name == "tiny" and tiny.config.model == gguf and tiny.load
    assert tiny.config.model_name == "tiny"
    assert tiny.aliases == ("small", "default")
    assert tiny.keep_alive == 600.0 and not tiny.pinned
    c = tiny.config
    assert (c.ctx_size, c.max_inflight, c.threads, c.kv_unified, c.spec) == (
        2048,
        2,
        1,
        True,
        None,
    )
    assert (c.cache_type_k, c.cache_type_v, c.flash_attn, c.n_gpu_layers) == (
        "q8_0",
        "q4_0",
        "on",
        0,
    )
    assert (c.mlock, c.mmap, c.chat_template) == (True, False, "{{ messages }}")
    assert qwen.config.model is None and qwen.config.hf_repo == "unsloth/Qwen3.5-0.8B-GGUF"
    assert qwen.config.quant == "Q8_0" and qwen.config.cache_ram_mib == 0
    assert qwen.config.cache_dir == file.parent / "snapshots"  # beside the models file
    assert qwen.config.cache_disk_mib == 512 and tiny.config.cache_dir is None
    assert qwen.pinned and qwen.keep_alive == math.inf and not qwen.load
    assert big.config.model == split / "big-00001-of-00002.gguf"
    assert big.projector == split / "mmproj-big-f16.gguf"
    assert big.keep_alive == 0.0
    assert big.config.ctx_size == 2048  # from [defaults]


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ('source = "m.gguf"\nctx_size = "big"', "model 'm': key 'ctx_size': must be an integer"),
        ('source = "m.gguf"\nctx_size = true', "model 'm': key 'ctx_size': must be an integer"),
        ('source = "m.gguf"\nkv_unified = 1', "model 'm': key 'kv_unified': must be true or false"),
        ('source = "m.gguf"\nkeep_alive = "soon"', "model 'm': key 'keep_alive'"),
        ('source = "m.gguf"\naliases = "x"', "model 'm': key 'aliases': must be a list"),
        ('source = "m.gguf"\nctx-size = 4096', "model 'm': key 'ctx-size': unknown key"),
        ('source = "m.gguf"\nflash_attn = "maybe"', "model 'm': key 'flash_attn'"),
        ('source = "missing.gguf"', "model 'm': key 'source': no such file"),
        ('source = "m.gguf"\nprojector = "nope.gguf"', "model 'm': key 'projector': no such"),
        ("ctx_size = 4096", "model 'm': no 'source'"),
        ('source = "m.gguf"\nctx_size = 8', "model 'm': ctx_size must be at least 16"),
        ('source = "m.gguf"\ncache_type_k = "q5_1"', "model 'm': cache_type_k must be one of"),
        (
            'source = "m.gguf"\ncache_type_v = "q8_0"\nflash_attn = false',
            "model 'm': cache_type_v q8_0 needs flash attention",
        ),
        ('source = "m.gguf"\ncache_ram = -1', "model 'm': cache_ram must be 0 or more"),
    ],
)
def test_a_wrong_setting_is_refused_naming_the_model_and_key(
    tmp_path: Path, table: str, named: str
) -> None:
    touch(tmp_path / "m.gguf")
    file = models_file(tmp_path, f"[models.m]\n{table}\n")
    with pytest.raises(CatalogError, match=named.replace("(", r"\(")) as caught:
        read_models_file(file, BASE)
    assert str(file) in str(caught.value)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[models\n", "not TOML"),
        ("", "no \\[models.NAME\\] table"),
        ("[model.x]\nsource='a'", "unknown table 'model'"),
        ("models = 3", "no \\[models.NAME\\] table"),
        ("[models]\nx = 3", "model 'x': must be a table"),
        ("[defaults]\nsource = 'a.gguf'\n[models.x]\nsource='a'", "cannot give 'source'"),
    ],
)
def test_a_bad_models_file_is_refused(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(CatalogError, match=named):
        read_models_file(models_file(tmp_path, text), BASE)
    with pytest.raises(CatalogError, match="cannot read the models file"):
        read_models_file(tmp_path / "absent.toml", BASE)


def test_models_dir_files_and_one_model_folders(tmp_path: Path) -> None:
    touch(tmp_path / "alpha.gguf")
    touch(tmp_path / "mmproj-alpha.gguf")  # a projector alone is no model
    touch(tmp_path / "notes.txt")
    for part in (1, 2, 3):
        touch(tmp_path / f"beta-{part:05d}-of-00003.gguf")
    touch(tmp_path / "gamma-00001-of-00002.gguf")  # its second part is missing: left out
    touch(tmp_path / "delta" / "delta-Q4_K_M.gguf")
    touch(tmp_path / "delta" / "mmproj-F16.gguf")
    touch(tmp_path / "two" / "a.gguf")  # two models in one folder: left out
    touch(tmp_path / "two" / "b.gguf")
    (tmp_path / "empty").mkdir()
    found = {m.name: m for m in scan_models_dir(tmp_path, BASE)}
    assert sorted(found) == ["alpha", "beta", "delta"]
    assert found["beta"].config.model == tmp_path / "beta-00001-of-00003.gguf"
    assert found["delta"].config.model == tmp_path / "delta" / "delta-Q4_K_M.gguf"
    assert found["delta"].projector == tmp_path / "delta" / "mmproj-F16.gguf"
    assert found["alpha"].projector is None and found["alpha"].origin == "models-dir"
    assert all(m.config.model_name == m.name and not m.load for m in found.values())
    with pytest.raises(CatalogError, match="--models-dir"):
        scan_models_dir(tmp_path / "absent", BASE)


def test_the_hugging_face_cache_by_repo_and_quant(tmp_path: Path) -> None:
    storage = tmp_path / "models--unsloth--Qwen3.5-0.8B-GGUF"
    old, current = storage / "snapshots" / "old", storage / "snapshots" / "abc123"
    touch(old / "Qwen3.5-0.8B-Q2_K.gguf")
    touch(current / "Qwen3.5-0.8B-Q4_K_M.gguf")
    touch(current / "Qwen3.5-0.8B-UD-q8_0.gguf")
    touch(current / "mmproj-F16.gguf")
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text("abc123")
    touch(tmp_path / "models--x--split" / "snapshots" / "s" / "M-BF16-00001-of-00001.gguf")
    (tmp_path / "datasets--a--b").mkdir()
    found = {m.name: m for m in scan_hf_cache(tmp_path, BASE)}
    assert sorted(found) == [
        "unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M",
        "unsloth/Qwen3.5-0.8B-GGUF:Q8_0",
        "x/split:BF16",
    ]
    model = found["unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M"]
    assert model.config.model == current / "Qwen3.5-0.8B-Q4_K_M.gguf"
    assert model.projector == current / "mmproj-F16.gguf" and model.origin == "hf-cache"
    assert scan_hf_cache(tmp_path / "absent", BASE) == []


def test_explicit_models_first_and_one_name_each(tmp_path: Path) -> None:
    touch(tmp_path / "dir" / "a.gguf")
    touch(tmp_path / "dir" / "b.gguf")
    touch(tmp_path / "c.gguf")
    flag = EngineConfig(model=tmp_path / "c.gguf", threads=1)
    file = models_file(tmp_path, '[models.a]\nsource = "c.gguf"\naliases = ["x"]\n')
    built = build_catalog([flag], base=BASE, models_file=file, models_dir=tmp_path / "dir")
    assert built.names == ("c", "a", "b")  # the folder's a is the file's a: left out
    assert built.find("c") is not None and built.find("c").pinned  # type: ignore[union-attr]
    assert built.find("x") is built.find("a")
    assert built.find("a").origin == "models-file"  # type: ignore[union-attr]
    assert built.find("../c.gguf") is None and built.find(str(tmp_path / "c.gguf")) is None
    clash = models_file(tmp_path, '[models.c]\nsource = "c.gguf"\n')
    with pytest.raises(CatalogError, match="two models served as 'c'"):
        build_catalog([flag], base=BASE, models_file=clash)
    alias = models_file(tmp_path, '[models.a]\nsource = "c.gguf"\naliases = ["c"]\n')
    with pytest.raises(CatalogError, match="two models served as 'c'"):
        build_catalog([flag], base=BASE, models_file=alias)


def test_the_command_builds_the_catalog_from_its_flags(tmp_path: Path) -> None:
    a = touch(tmp_path / "a.gguf")
    file = models_file(
        tmp_path, '[models.b]\nsource = "a.gguf"\nload = true\n[models.c]\nsource = "a.gguf"\n'
    )

    def parse(*argv: str) -> object:
        return _parser().parse_args(["serve", "--threads=1", *argv])

    # the flags apply to every model, under each model's own settings
    built = catalog(parse(f"--models-file={file}", "-ctk=q8_0", "--ctx-size=512"))
    assert built.names == ("b", "c")  # no --model: the default model is not served
    assert all(m.config.cache_type_k == "q8_0" and m.config.ctx_size == 512 for m in built.models)
    assert all(m.config.threads == 1 for m in built.models)
    both = parse(f"--model={a}", f"--models-file={file}")
    assert [(c.model, c.model_name) for c in startup_configs(both)] == [(a, None)]
    assert [(m.name, m.load) for m in on_demand(both)] == [("b", True), ("c", False)]
    assert startup_configs(parse(f"--models-file={file}")) == []  # all on demand
    for argv, named in [
        ([f"--models-file={tmp_path / 'absent.toml'}"], "cannot read the models file"),
        ([f"--models-dir={tmp_path / 'absent'}"], "--models-dir"),
    ]:
        with pytest.raises(SystemExit, match=f"llmtrio serve: .*{named}"):
            catalog(parse(*argv))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no model to serve"):
        catalog(parse(f"--models-dir={tmp_path / 'empty'}"))
    bad = models_file(tmp_path, '[models.b]\nsource = "a.gguf"\nthreads = "two"\n')
    with pytest.raises(SystemExit, match="model 'b': key 'threads': must be an integer"):
        catalog(parse(f"--models-file={bad}"))


def test_the_new_engine_settings_as_flags(tmp_path: Path) -> None:
    from llmtrio.cli._configs import engine_configs

    a = touch(tmp_path / "a.gguf")
    argv = ["serve", f"--model={a}", "-ctk", "q4_0", "-ctv", "q8_0", "--flash-attn=on"]
    args = _parser().parse_args([*argv, "-ngl=0", "--mlock", "--no-mmap"])
    (config,) = engine_configs(args)
    assert config.load_settings == {
        "cache_type_k": "q4_0",
        "cache_type_v": "q8_0",
        "flash_attn": "on",
        "n_gpu_layers": 0,
        "mmap": False,
        "mlock": True,
    }
    (default,) = engine_configs(_parser().parse_args(["serve", f"--model={a}"]))
    assert default.load_settings["mmap"] is None and default.cache_type_v == "f16"
    refused = _parser().parse_args(["serve", f"--model={a}", "-ctv=q8_0", "--flash-attn=off"])
    with pytest.raises(SystemExit, match="--cache-type-v q8_0 needs flash attention"):
        engine_configs(refused)


def test_ps_lists_the_loaded_models() -> None:
    from llmtrio.cli._ps import table

    listing = [
        {"id": "a", "kind": "chat", "workers": 2, "state": "loaded", "bytes": 300 << 20},
        {"id": "b", "kind": "embedding", "workers": 1, "state": "unloaded"},
        {"id": "c", "kind": "chat", "workers": 1, "state": "loaded", "unload_in_s": -1},
        {"id": "d", "kind": "chat", "workers": 1, "state": "loaded", "unload_in_s": 125},
        {"id": "e", "kind": "chat", "workers": 1},  # a worker of the previous version
    ]
    assert [line.split() for line in table(listing).splitlines()] == [
        ["NAME", "KIND", "WORKERS", "SIZE", "UNTIL"],
        ["a", "chat", "2", "300", "MiB", "-"],
        ["c", "chat", "1", "-", "forever"],
        ["d", "chat", "1", "-", "in", "2", "min", "5", "s"],
        ["e", "chat", "1", "-", "-"],
    ]
