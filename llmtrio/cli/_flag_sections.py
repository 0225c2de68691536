"""The flags several commands share, as sections of the flag table (``llmtrio.cli._flags``):
the model and its engine, the catalog of models on demand, and the request limits."""

from __future__ import annotations

import argparse
from pathlib import Path

from ._parser import OneOf, flag, section
from ._values import lora_value, mib, mmproj_value, template_file, threads_value

__all__ = ["CATALOG", "ENGINE", "LIMITS"]

ENGINE = section(
    "model and engine",
    flag(
        "--model",
        "model",
        "a model to serve: a local GGUF file (served under its stem; never falls back), "
        "NAME=PATH (under NAME), or a Hugging Face repo (under owner/repo:QUANT); give it "
        "again to serve several models, one engine each",
        action="append",
        metavar="[NAME=]PATH|OWNER/REPO[:QUANT]",
    ),
    flag("--hf-repo", "EngineConfig.hf_repo", "Hugging Face repo (default %(default)s)"),
    flag("--hf-file", "hf_file", "the GGUF file in the repo (default: chosen by --quant)"),
    flag("--quant", "EngineConfig.quant", "quantization to pick (default %(default)s)"),
    flag(
        "--max-inflight",
        "EngineConfig.max_inflight",
        "slots decoded in one batch (default %(default)s)",
        type=int,
    ),
    flag(
        "--ctx-size",
        "EngineConfig.ctx_size",
        "context tokens per slot (default %(default)s)",
        type=int,
    ),
    flag(
        "--target-step-ms",
        "EngineConfig.target_step_ms",
        "pause admission while a decode step is slower than this (0: off; default %(default)s)",
        type=float,
    ),
    flag(
        "--prefill-chunk",
        "EngineConfig.prefill_chunk",
        "prompt tokens per step (default %(default)s)",
        type=int,
    ),
    flag(
        "--prefill-share",
        "EngineConfig.prefill_share",
        "smooth streams or first tokens sooner: while streams decode, a step's prompt tokens "
        "cost at most this many decode steps, and prompts that arrive together start "
        "together; inf: each prompt starts as soon as it is in, every stream waits for it "
        "(default %(default)s)",
        type=float,
        metavar="STEPS",
    ),
    flag(
        "--no-prompt-cache",
        "EngineConfig.prompt_cache",
        "ingest every prompt whole: reuse nothing a slot already holds",
        action="store_false",
    ),
    flag(
        "--cache-ram",
        "EngineConfig.cache_ram_mib",
        "host memory for prompt snapshots other slots can restore "
        "(default %(default)s; 0: none, a slot still reuses its own memory)",
        type=mib,
        metavar="MiB",
    ),
    flag(
        "--cache-dir",
        "EngineConfig.cache_dir",
        "keep prompt snapshots on disk in DIR (a folder per model): what --cache-ram evicts, "
        "and what memory holds when a model unloads or the server drains, is written there "
        "and restored after an unload, a restart, or by another worker sharing DIR "
        "(default: none)",
        type=Path,
        metavar="DIR",
    ),
    flag(
        "--cache-disk",
        "EngineConfig.cache_disk_mib",
        "the most each model's snapshots in --cache-dir take, least recently used removed "
        "first (default %(default)s)",
        type=mib,
        metavar="MiB",
    ),
    OneOf(
        (
            flag(
                "--spec",
                "EngineConfig.spec",
                "speculative decoding: 'ngram' drafts tokens by looking the last ones up in "
                "the prompt and output, verified in the same batch (default %(default)s: None "
                "is off)",
                choices=["ngram"],
            ),
            flag(
                "--no-spec",
                "EngineConfig.spec",
                "no speculative decoding: one token per step",
                action="store_const",
                const=None,
            ),
        )
    ),
    flag(
        "--spec-draft-max",
        "EngineConfig.spec_draft_max",
        "the most draft tokens one sequence verifies in a step (1-64; default "
        "%(default)s; at most 8 on a model with recurrent state); fewer are drafted when "
        "the measured step costs say so",
        type=int,
        metavar="N",
    ),
    flag(
        "--spec-pool",
        "EngineConfig.spec_pool",
        "entries of the pool of n-grams shared by a worker's requests, which a request "
        "also drafts from (what other requests wrote; about 100 bytes an entry; default "
        "%(default)s; 0 is off: a shared pool lets one request's speed depend on what "
        "others wrote)",
        type=int,
        metavar="ENTRIES",
    ),
    flag(
        "--kv-unified",
        "EngineConfig.kv_unified",
        "one context pool of --max-inflight x --ctx-size cells shared by all slots: one "
        "request may use all of it (default %(default)s)",
        action=argparse.BooleanOptionalAction,
    ),
    flag(
        "--max-request-ctx",
        "EngineConfig.max_request_ctx",
        "the most context one request may use (default %(default)s: --ctx-size, or with "
        "--kv-unified the whole pool)",
        type=int,
        metavar="N",
    ),
    flag(
        "--threads",
        "threads",
        "llama.cpp threads of each model's engine: N for every model, NAME=N for the "
        "model served as NAME (again for others); default: the cores that NAME=N leaves, "
        "split evenly between the other models, at least 1 each",
        type=threads_value,
        action="append",
        metavar="[NAME=]N",
    ),
    flag(
        "--model-name",
        "model_name",
        "the name /v1/models shows and requests route by (one model)",
    ),
    flag(
        "--chat-template-file",
        "chat_template",
        "a Jinja chat template to use instead of the model's own (its tool-call form, "
        "XML or JSON, is the one forced calls take)",
        type=template_file,
        metavar="PATH",
    ),
    flag(
        "--no-fallback",
        "EngineConfig.allow_fallback",
        "fail when the default model cannot be had, instead of using the demo model",
        action="store_false",
    ),
    OneOf(
        (
            flag(
                "--mmproj",
                "projectors",
                "a vision projector (llama.cpp's mmproj GGUF) for the model: PATH (one "
                "model), or NAME=PATH for the model served as NAME (again for others); "
                "default: a Hugging Face repo's own mmproj-*.gguf, F16 before F32",
                type=mmproj_value,
                action="append",
                metavar="[NAME=]PATH",
            ),
            flag(
                "--no-mmproj",
                "EngineConfig.vision",
                "load no vision projector: models take no images",
                action="store_false",
            ),
        )
    ),
    flag(
        "--max-images",
        "EngineConfig.max_images",
        "images per request (default %(default)s)",
        type=int,
    ),
    flag(
        "-ctk --cache-type-k",
        "EngineConfig.cache_type_k",
        "the K cache's type: f16, q8_0 or q4_0 (default %(default)s)",
        choices=["f16", "q8_0", "q4_0"],
    ),
    flag(
        "-ctv --cache-type-v",
        "EngineConfig.cache_type_v",
        "the V cache's type: f16, q8_0 or q4_0; quantized needs flash attention "
        "(default %(default)s)",
        choices=["f16", "q8_0", "q4_0"],
    ),
    flag(
        "--flash-attn",
        "EngineConfig.flash_attn",
        "flash attention: on, off, or auto (llama.cpp's choice; default %(default)s)",
        choices=["auto", "on", "off"],
    ),
    flag(
        "-ngl --n-gpu-layers",
        "EngineConfig.n_gpu_layers",
        "layers offloaded to a GPU (-1: all; 0: none; default %(default)s)",
        type=int,
        metavar="N",
    ),
    flag(
        "--mmap",
        "EngineConfig.mmap",
        "map the model file instead of reading it (default: llama.cpp's choice)",
        action=argparse.BooleanOptionalAction,
    ),
    flag(
        "--mlock",
        "EngineConfig.mlock",
        "keep the model's weights in RAM, never swapped out",
        action="store_true",
    ),
)

CATALOG = section(
    "models on demand (a catalog: loaded on first use, unloaded when idle)",
    flag(
        "--models-dir",
        "models_dir",
        "a folder of models served on demand: each *.gguf in it, and each subfolder holding "
        "one model (its split parts and projector), under the file's or folder's name",
        type=Path,
        metavar="DIR",
    ),
    flag(
        "--models-file",
        "models_file",
        "a TOML file of models served on demand, one [models.NAME] table each with its "
        "source and settings (see the README)",
        type=Path,
        metavar="FILE",
    ),
    flag(
        "--hf-cache-models",
        "hf_cache_models",
        "add every model in the Hugging Face cache (what llmtrio pull fetched) to the catalog",
        action="store_true",
    ),
    flag(
        "--max-loaded-models",
        "HostConfig.max_loaded_models",
        "models loaded at once, --model ones included; the least recently used idle one "
        "unloads to make room (default %(default)s: no bound)",
        type=int,
        metavar="N",
    ),
    flag(
        "--memory-budget",
        "HostConfig.memory_budget_mib",
        "memory the loaded models may take, each estimated from its file, KV cache, "
        "recurrent state, --cache-ram and buffers (default %(default)s: no bound)",
        type=mib,
        metavar="MiB",
    ),
    flag(
        "--keep-alive",
        "HostConfig.keep_alive",
        "how long an idle model stays loaded: seconds or a duration like 10m; -1: for ever "
        "(default %(default)ss; a request's keep_alive overrides it)",
        metavar="DURATION",
    ),
    flag(
        "--load-timeout",
        "HostConfig.load_timeout",
        "seconds a model's load may take before its waiting requests get a 503 "
        "(default %(default)s)",
        type=float,
    ),
    flag(
        "--lora",
        "adapters",
        "a LoRA adapter served as its own model NAME on the model BASE (BASE may be left "
        "out when one model is served), at SCALE (default 1); repeatable",
        action="append",
        type=lora_value,
        metavar="NAME=PATH[:SCALE][@BASE]",
    ),
    flag(
        "--lora-dir",
        "HostConfig.lora_dir",
        "the folder POST /v1/load_lora_adapter loads adapters from, by their file's name "
        "(default: none is loaded at run time)",
        type=Path,
        metavar="DIR",
    ),
)

LIMITS = section(
    "request limits (a request over one gets a 400 naming it)",
    flag(
        "--max-messages",
        "RequestLimits.max_messages",
        "messages per chat request (default %(default)s)",
        type=int,
    ),
    flag(
        "--max-tokens-limit",  # only ``generate`` has --max-tokens
        "RequestLimits.max_tokens",
        "the most tokens a request may ask to generate (default: the slot's context)",
        type=int,
    ),
    flag(
        "--max-stop",
        "RequestLimits.max_stop",
        "stop sequences per request (default %(default)s)",
        type=int,
    ),
    flag(
        "--max-stop-chars",
        "RequestLimits.max_stop_chars",
        "characters per stop sequence (default %(default)s)",
        type=int,
    ),
    flag(
        "--max-embedding-inputs",
        "RequestLimits.max_embedding_inputs",
        "inputs per embeddings request (default %(default)s)",
        type=int,
    ),
    flag(
        "--max-rerank-documents",
        "RequestLimits.max_rerank_documents",
        "documents per reranking request, or pairs per /v1/score (default %(default)s)",
        type=int,
    ),
    flag(
        "--max-image-pixels",
        "RequestLimits.max_image_pixels",
        "an image's width x height, read from its header before decoding (default %(default)s)",
        type=int,
    ),
    flag(
        "--max-audio-seconds",
        "RequestLimits.max_audio_seconds",
        "an audio file's length in seconds, read from its header before decoding (default "
        "%(default)s)",
        type=float,
    ),
    flag(
        "--allowed-media-domains",
        "RequestLimits.allowed_media_domains",
        "hosts whose http(s) image URLs are fetched (default: none, remote URLs are refused): "
        "names or IP addresses, '*.example.com' for its subdomains, '*' for any host with "
        "public addresses",
        nargs="+",
        metavar="HOST",
    ),
    flag(
        "--media-fetch-timeout",
        "RequestLimits.media_fetch_timeout",
        "seconds an image URL's fetch may take, redirects included (default %(default)s)",
        type=float,
    ),
    flag(
        "--max-media-fetch-bytes",
        "RequestLimits.max_media_fetch_bytes",
        "largest image fetched from a URL (default %(default)s)",
        type=int,
    ),
    flag(
        "--default-max-tokens",  # llama.cpp's -n
        "RequestLimits.default_max_tokens",
        "the most tokens a request that names no output limit generates, on every route "
        "(default: until the end of generation or of the slot's context)",
        type=int,
    ),
)
