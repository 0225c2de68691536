"""Where a model comes from (a file, split GGUF parts, the Hugging Face cache, the demo
fallback), what its GGUF header says (its kind, pooling, file type) and what names its
content across processes (``file_identity``).
"""

from ._demo import demo_model_path as demo_model_path
from ._gguf import POOLING_NAMES as POOLING_NAMES
from ._gguf import RANK_POOLING as RANK_POOLING
from ._gguf import GGUFInfo as GGUFInfo
from ._gguf import check_gguf as check_gguf
from ._gguf import model_kind as model_kind
from ._gguf import model_kind_of as model_kind_of
from ._identity import file_identity as file_identity
from ._source import HubSettings as HubSettings
from ._source import ResolvedModel as ResolvedModel
from ._source import model_name_of as model_name_of
from ._source import resolve_model as resolve_model

__all__ = [
    "POOLING_NAMES",
    "RANK_POOLING",
    "GGUFInfo",
    "HubSettings",
    "ResolvedModel",
    "check_gguf",
    "demo_model_path",
    "file_identity",
    "model_kind",
    "model_kind_of",
    "model_name_of",
    "resolve_model",
]
