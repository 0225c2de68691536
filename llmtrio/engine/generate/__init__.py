"""The generating engine: :class:`Engine` (the Trio face), the decode-step core it runs on
its decode thread (scheduler, jobs, KV pool, prompt cache, drafting), and what turns a
request into tokens and tokens back into events (inputs, chat template, output), and the
LoRA adapters it serves (which set each step runs under: ``_adapter_turns``).
"""

from ._engine import Engine as Engine
from ._generation import Generation as Generation
from ._lora import ServedAdapter as ServedAdapter

__all__ = [
    "Engine",
    "Generation",
    "ServedAdapter",
]
