"""The command line and the composition roots above the four rooms: ``llmtrio serve``,
``worker``, ``generate``, ``embed``, ``pull``, ``ps``. Flags are one table (``_flags``) that
builds the parser (``_parser``); ``_configs`` turns parsed flags into the rooms' configs; each
command with a body of its own has its module (``_serve``, ``_ingress``, ``_worker``,
``_ps``, ``_pull``); ``_catalog`` reads the models file, a models folder and the Hugging Face
cache as the catalog of models on demand.
"""

from ._main import main as main
from ._metrics_server import serve_metrics as serve_metrics
from ._serve import serve as serve
from ._serve import serve_until_signalled as serve_until_signalled
from ._serve import serving as serving
from ._worker import run_worker as run_worker

__all__ = ["main", "run_worker", "serve", "serve_metrics", "serve_until_signalled", "serving"]
