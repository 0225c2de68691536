"""llmtrio's engine: one GGUF model on llama.cpp, continuous batching, on Trio.

async with Engine.open(EngineConfig(model=path, max_inflight=8)) as engine:
    async with engine.submit(GenerateRequest.user("Say hi.")) as generation:
        async for event in generation:
            ...   # Token, then Done or Failed

async with EmbeddingEngine.open(EngineConfig(model=minilm)) as engine:
    vectors = (await engine.embed(["a text", "another"])).vectors   # L2-normalized rows

async with RerankEngine.open(EngineConfig(model=cross_encoder)) as engine:
    pair = engine.pair("a query", "a document")
    score = (await engine.score_tokens([pair.tokens])).scores[0]
"""

from ._audio import AUDIO_FORMATS as AUDIO_FORMATS
from ._audio import Audio as Audio
from ._audio import decode_audio as decode_audio
from ._config import DEFAULT_QUANT as DEFAULT_QUANT
from ._config import DEFAULT_REPO as DEFAULT_REPO
from ._config import EngineConfig as EngineConfig
from ._config import LoraSpec as LoraSpec
from ._cores import Cores as Cores
from ._cores import oversubscription as oversubscription
from ._cores import read_cores as read_cores
from ._cores import usable_cores as usable_cores
from ._errors import DecodeError as DecodeError
from ._errors import EngineClosedError as EngineClosedError
from ._errors import EngineError as EngineError
from ._errors import EngineFailedError as EngineFailedError
from ._errors import GrammarBugError as GrammarBugError
from ._errors import GrammarError as GrammarError
from ._errors import InvalidRequestError as InvalidRequestError
from ._errors import ModelLoadError as ModelLoadError
from ._errors import PromptTooLongError as PromptTooLongError
from ._errors import RequestError as RequestError
from ._media import MEDIA_MARKER as MEDIA_MARKER
from ._media import Image as Image
from ._media import decode_image as decode_image
from ._media import image_from_url as image_from_url
from ._open import open_engine as open_engine
from ._stats import EngineStats as EngineStats
from ._types import TEXT_INPUT as TEXT_INPUT
from ._types import Capacity as Capacity
from ._types import ChatMessage as ChatMessage
from ._types import Done as Done
from ._types import Event as Event
from ._types import Failed as Failed
from ._types import GenerateRequest as GenerateRequest
from ._types import Media as Media
from ._types import Sampling as Sampling
from ._types import StopReason as StopReason
from ._types import TextFormat as TextFormat
from ._types import Timings as Timings
from ._types import Token as Token
from ._types import TokenLogprob as TokenLogprob
from ._types import Tool as Tool
from ._types import ToolCall as ToolCall
from .embed import EMBEDDING_SEQUENCES as EMBEDDING_SEQUENCES
from .embed import EmbeddingEngine as EmbeddingEngine
from .embed import Embeddings as Embeddings
from .embed import Pair as Pair
from .embed import RerankEngine as RerankEngine
from .embed import Scores as Scores
from .generate import Engine as Engine
from .generate import Generation as Generation
from .generate import ServedAdapter as ServedAdapter
from .grammar import JSON_OBJECT_GRAMMAR as JSON_OBJECT_GRAMMAR
from .grammar import CannotTranslateError as CannotTranslateError
from .grammar import Grammar as Grammar
from .grammar import json_schema_grammar as json_schema_grammar
from .grammar import lark_grammar as lark_grammar
from .models import LoraHeader as LoraHeader
from .models import ResolvedModel as ResolvedModel
from .models import check_lora as check_lora
from .models import demo_model_path as demo_model_path
from .models import model_kind_of as model_kind_of
from .models import model_name_of as model_name_of
from .models import resolve_model as resolve_model
from .tools import ToolCallArguments as ToolCallArguments
from .tools import ToolCallEnd as ToolCallEnd
from .tools import ToolCallEvent as ToolCallEvent
from .tools import ToolCallParser as ToolCallParser
from .tools import ToolCallStart as ToolCallStart
from .tools import ToolCallStream as ToolCallStream
from .tools import new_tool_call_id as new_tool_call_id
from .tools import tool_call_grammar as tool_call_grammar

__all__ = [
    "AUDIO_FORMATS",
    "DEFAULT_QUANT",
    "DEFAULT_REPO",
    "EMBEDDING_SEQUENCES",
    "JSON_OBJECT_GRAMMAR",
    "MEDIA_MARKER",
    "TEXT_INPUT",
    "Audio",
    "CannotTranslateError",
    "Capacity",
    "ChatMessage",
    "Cores",
    "DecodeError",
    "Done",
    "EmbeddingEngine",
    "Embeddings",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineError",
    "EngineFailedError",
    "EngineStats",
    "Event",
    "Failed",
    "GenerateRequest",
    "Generation",
    "Grammar",
    "GrammarBugError",
    "GrammarError",
    "Image",
    "InvalidRequestError",
    "LoraHeader",
    "LoraSpec",
    "Media",
    "ModelLoadError",
    "Pair",
    "PromptTooLongError",
    "RequestError",
    "RerankEngine",
    "ResolvedModel",
    "Sampling",
    "Scores",
    "ServedAdapter",
    "StopReason",
    "TextFormat",
    "Timings",
    "Token",
    "TokenLogprob",
    "Tool",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallEnd",
    "ToolCallEvent",
    "ToolCallParser",
    "ToolCallStart",
    "ToolCallStream",
    "check_lora",
    "decode_audio",
    "decode_image",
    "demo_model_path",
    "image_from_url",
    "json_schema_grammar",
    "lark_grammar",
    "model_kind_of",
    "model_name_of",
    "new_tool_call_id",
    "open_engine",
    "oversubscription",
    "read_cores",
    "resolve_model",
    "tool_call_grammar",
    "usable_cores",
]
