"""The HTTP contract, in one package: what the ingress (``llmtrio.web``) and the workers
(``llmtrio.worker``) both speak. Pure: no I/O, no engine, no ring.

    _routes      every route, one row each: path, method, the field table's endpoint, the
                 error family; the paths the ingress sends through the ring
    _field_spec  the field table's vocabulary (Field, check, RequestLimits)
    _fields      the request fields of every endpoint, as one table
    _errors      the error catalog and its two shapes (OpenAI's, Anthropic's); one dumps
    _durations   keep-alive durations (Ollama's forms)
    _probes      the Kubernetes probes' paths and answers
    _prefixes    what a request's prompt begins with, as digests (for prefix affinity)
    _openapi     ``/openapi.json``, made from the routes, the fields and the errors
    (the field table is split by API family: _chat_fields, _responses_fields,
    _anthropic_fields, _rerank_fields; the answers: _openapi_answers, _openapi_more)
"""

from ._anthropic_fields import ANTHROPIC_BLOCKS as ANTHROPIC_BLOCKS
from ._anthropic_fields import ANTHROPIC_IMAGE_SOURCE as ANTHROPIC_IMAGE_SOURCE
from ._anthropic_fields import ANTHROPIC_MESSAGE as ANTHROPIC_MESSAGE
from ._anthropic_fields import ANTHROPIC_OUTPUT_CONFIG as ANTHROPIC_OUTPUT_CONFIG
from ._anthropic_fields import ANTHROPIC_REFUSED_BLOCKS as ANTHROPIC_REFUSED_BLOCKS
from ._anthropic_fields import ANTHROPIC_RESULT_BLOCKS as ANTHROPIC_RESULT_BLOCKS
from ._anthropic_fields import ANTHROPIC_TEXT_BLOCKS as ANTHROPIC_TEXT_BLOCKS
from ._anthropic_fields import ANTHROPIC_THINKING as ANTHROPIC_THINKING
from ._anthropic_fields import ANTHROPIC_TOOL as ANTHROPIC_TOOL
from ._anthropic_fields import ANTHROPIC_TOOL_CHOICE as ANTHROPIC_TOOL_CHOICE
from ._audio_fields import INPUT_AUDIO_PART as INPUT_AUDIO_PART
from ._audio_fields import TRANSCRIPT_FORMATS as TRANSCRIPT_FORMATS
from ._chat_fields import IMAGE_URL_PART as IMAGE_URL_PART
from ._chat_fields import MESSAGE_FIELDS as MESSAGE_FIELDS
from ._chat_fields import MESSAGE_ROLES as MESSAGE_ROLES
from ._chat_fields import NAMED_TOOL_CHOICE as NAMED_TOOL_CHOICE
from ._chat_fields import RESPONSE_FORMAT_JSON_SCHEMA as RESPONSE_FORMAT_JSON_SCHEMA
from ._chat_fields import TEXT_PARTS as TEXT_PARTS
from ._chat_fields import TOOL_CHOICE_MODE as TOOL_CHOICE_MODE
from ._durations import FOREVER as FOREVER
from ._durations import keep_alive_seconds as keep_alive_seconds
from ._errors import ANTHROPIC_ERRORS as ANTHROPIC_ERRORS
from ._errors import ANTHROPIC_TYPES as ANTHROPIC_TYPES
from ._errors import DEFAULT_MAX_BODY_BYTES as DEFAULT_MAX_BODY_BYTES
from ._errors import ERRORS as ERRORS
from ._errors import HOST_NOT_ALLOWED as HOST_NOT_ALLOWED
from ._errors import OPENAI_ERRORS as OPENAI_ERRORS
from ._errors import ORIGIN_NOT_ALLOWED as ORIGIN_NOT_ALLOWED
from ._errors import ApiError as ApiError
from ._errors import ErrorFamily as ErrorFamily
from ._errors import ErrorKind as ErrorKind
from ._errors import body_timeout as body_timeout
from ._errors import invalid_api_key as invalid_api_key
from ._errors import invalid_request as invalid_request
from ._errors import method_not_allowed as method_not_allowed
from ._errors import missing_model as missing_model
from ._errors import model_load_failed as model_load_failed
from ._errors import model_not_found as model_not_found
from ._errors import model_unavailable as model_unavailable
from ._errors import no_worker as no_worker
from ._errors import not_found as not_found
from ._errors import rate_limited as rate_limited
from ._errors import request_timeout as request_timeout
from ._errors import request_too_large as request_too_large
from ._errors import ring_full as ring_full
from ._errors import server_error as server_error
from ._errors import shutting_down as shutting_down
from ._errors import worker_failed as worker_failed
from ._errors import wrong_model_kind as wrong_model_kind
from ._field_spec import INT32_MAX as INT32_MAX
from ._field_spec import MAX_TOP_LOGPROBS as MAX_TOP_LOGPROBS
from ._field_spec import Field as Field
from ._field_spec import RequestLimits as RequestLimits
from ._field_spec import check as check
from ._field_spec import checked_text as checked_text
from ._field_spec import choices as choices
from ._field_spec import clip as clip
from ._field_spec import describe as describe
from ._field_spec import invalid_type as invalid_type
from ._field_spec import invalid_value as invalid_value
from ._field_spec import missing as missing
from ._field_spec import show as show
from ._fields import FIELDS as FIELDS
from ._fields import form_values as form_values
from ._fields import read as read
from ._fields import read_keep_alive as read_keep_alive
from ._fields import request_schema as request_schema
from ._forms import Form as Form
from ._forms import Upload as Upload
from ._forms import form_field as form_field
from ._forms import is_form as is_form
from ._forms import read_form as read_form
from ._json import SSE_DONE as SSE_DONE
from ._json import dumps as dumps
from ._json import json_string as json_string
from ._json import sse as sse
from ._openapi import openapi as openapi
from ._openapi_more import CONTEXT_LENGTH_NAMES as CONTEXT_LENGTH_NAMES
from ._prefixes import Prefix as Prefix
from ._prefixes import prefixes_of as prefixes_of
from ._probes import LIVEZ_PATH as LIVEZ_PATH
from ._probes import PROBE_PATHS as PROBE_PATHS
from ._probes import READYZ_PATH as READYZ_PATH
from ._probes import NotReady as NotReady
from ._probes import ProbeAnswer as ProbeAnswer
from ._probes import answer_probe as answer_probe
from ._rerank_fields import DOCUMENT as DOCUMENT
from ._rerank_fields import DOCUMENT_TEXT as DOCUMENT_TEXT
from ._responses_fields import RESPONSES_CUSTOM_TOOL as RESPONSES_CUSTOM_TOOL
from ._responses_fields import RESPONSES_EFFORTS as RESPONSES_EFFORTS
from ._responses_fields import RESPONSES_FORMAT as RESPONSES_FORMAT
from ._responses_fields import RESPONSES_IMAGE_PART as RESPONSES_IMAGE_PART
from ._responses_fields import RESPONSES_NAMESPACE_TOOL as RESPONSES_NAMESPACE_TOOL
from ._responses_fields import RESPONSES_TOOL as RESPONSES_TOOL
from ._responses_fields import RESPONSES_TOOL_TYPES as RESPONSES_TOOL_TYPES
from ._routes import AUDIO_PARTS as AUDIO_PARTS
from ._routes import CHAT_MODEL as CHAT_MODEL
from ._routes import CHAT_PATH as CHAT_PATH
from ._routes import COMPLETIONS_PATH as COMPLETIONS_PATH
from ._routes import COUNT_TOKENS_PATH as COUNT_TOKENS_PATH
from ._routes import DETOKENIZE_PATH as DETOKENIZE_PATH
from ._routes import EMBEDDING_MODEL as EMBEDDING_MODEL
from ._routes import EMBEDDINGS_PATH as EMBEDDINGS_PATH
from ._routes import FORM_PATHS as FORM_PATHS
from ._routes import HEALTH_PATH as HEALTH_PATH
from ._routes import IMAGE_PARTS as IMAGE_PARTS
from ._routes import MANAGE_PATHS as MANAGE_PATHS
from ._routes import MESSAGES_PATH as MESSAGES_PATH
from ._routes import MODEL_KINDS as MODEL_KINDS
from ._routes import MODELS_LOAD_PATH as MODELS_LOAD_PATH
from ._routes import MODELS_PATH as MODELS_PATH
from ._routes import MODELS_UNLOAD_PATH as MODELS_UNLOAD_PATH
from ._routes import OPENAPI_PATH as OPENAPI_PATH
from ._routes import RERANK_ALIAS_PATH as RERANK_ALIAS_PATH
from ._routes import RERANK_MODEL as RERANK_MODEL
from ._routes import RERANK_PATH as RERANK_PATH
from ._routes import RERANK_V2_PATH as RERANK_V2_PATH
from ._routes import RESPONSES_INPUT_TOKENS_PATH as RESPONSES_INPUT_TOKENS_PATH
from ._routes import RESPONSES_PATH as RESPONSES_PATH
from ._routes import RING_PATHS as RING_PATHS
from ._routes import ROUTES as ROUTES
from ._routes import SCORE_PATH as SCORE_PATH
from ._routes import TOKENIZE_PATH as TOKENIZE_PATH
from ._routes import TRANSCRIPTIONS_PATH as TRANSCRIPTIONS_PATH
from ._routes import TRANSLATIONS_PATH as TRANSLATIONS_PATH
from ._routes import Body as Body
from ._routes import Route as Route
from ._routes import error_family as error_family

__all__ = [
    "ANTHROPIC_BLOCKS",
    "ANTHROPIC_ERRORS",
    "ANTHROPIC_IMAGE_SOURCE",
    "ANTHROPIC_MESSAGE",
    "ANTHROPIC_OUTPUT_CONFIG",
    "ANTHROPIC_REFUSED_BLOCKS",
    "ANTHROPIC_RESULT_BLOCKS",
    "ANTHROPIC_TEXT_BLOCKS",
    "ANTHROPIC_THINKING",
    "ANTHROPIC_TOOL",
    "ANTHROPIC_TOOL_CHOICE",
    "ANTHROPIC_TYPES",
    "AUDIO_PARTS",
    "CHAT_MODEL",
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "CONTEXT_LENGTH_NAMES",
    "COUNT_TOKENS_PATH",
    "DEFAULT_MAX_BODY_BYTES",
    "DETOKENIZE_PATH",
    "DOCUMENT",
    "DOCUMENT_TEXT",
    "EMBEDDINGS_PATH",
    "EMBEDDING_MODEL",
    "ERRORS",
    "FIELDS",
    "FOREVER",
    "FORM_PATHS",
    "HEALTH_PATH",
    "HOST_NOT_ALLOWED",
    "IMAGE_PARTS",
    "IMAGE_URL_PART",
    "INPUT_AUDIO_PART",
    "INT32_MAX",
    "LIVEZ_PATH",
    "MANAGE_PATHS",
    "MAX_TOP_LOGPROBS",
    "MESSAGES_PATH",
    "MESSAGE_FIELDS",
    "MESSAGE_ROLES",
    "MODELS_LOAD_PATH",
    "MODELS_PATH",
    "MODELS_UNLOAD_PATH",
    "MODEL_KINDS",
    "NAMED_TOOL_CHOICE",
    "OPENAI_ERRORS",
    "OPENAPI_PATH",
    "ORIGIN_NOT_ALLOWED",
    "PROBE_PATHS",
    "READYZ_PATH",
    "RERANK_ALIAS_PATH",
    "RERANK_MODEL",
    "RERANK_PATH",
    "RERANK_V2_PATH",
    "RESPONSES_CUSTOM_TOOL",
    "RESPONSES_EFFORTS",
    "RESPONSES_FORMAT",
    "RESPONSES_IMAGE_PART",
    "RESPONSES_INPUT_TOKENS_PATH",
    "RESPONSES_NAMESPACE_TOOL",
    "RESPONSES_PATH",
    "RESPONSES_TOOL",
    "RESPONSES_TOOL_TYPES",
    "RESPONSE_FORMAT_JSON_SCHEMA",
    "RING_PATHS",
    "ROUTES",
    "SCORE_PATH",
    "SSE_DONE",
    "TEXT_PARTS",
    "TOKENIZE_PATH",
    "TOOL_CHOICE_MODE",
    "TRANSCRIPTIONS_PATH",
    "TRANSCRIPT_FORMATS",
    "TRANSLATIONS_PATH",
    "ApiError",
    "Body",
    "ErrorFamily",
    "ErrorKind",
    "Field",
    "Form",
    "NotReady",
    "Prefix",
    "ProbeAnswer",
    "RequestLimits",
    "Route",
    "Upload",
    "answer_probe",
    "body_timeout",
    "check",
    "checked_text",
    "choices",
    "clip",
    "describe",
    "dumps",
    "error_family",
    "form_field",
    "form_values",
    "invalid_api_key",
    "invalid_request",
    "invalid_type",
    "invalid_value",
    "is_form",
    "json_string",
    "keep_alive_seconds",
    "method_not_allowed",
    "missing",
    "missing_model",
    "model_load_failed",
    "model_not_found",
    "model_unavailable",
    "no_worker",
    "not_found",
    "openapi",
    "prefixes_of",
    "rate_limited",
    "read",
    "read_form",
    "read_keep_alive",
    "request_schema",
    "request_timeout",
    "request_too_large",
    "ring_full",
    "server_error",
    "show",
    "shutting_down",
    "sse",
    "worker_failed",
    "wrong_model_kind",
]
