"""The prompt cache's snapshots on disk: a sequence's state after some tokens, kept in files
across unloads, restarts and processes, under a byte budget (least recently used removed
first), and never restored where it does not belong.

- ``_prefix``: what memory holding some tokens serves of a prompt (the one rule the prompt
  cache in host memory and the files on disk both follow);
- ``_format``: a file's layout, its key (the model file's identity, the llama.cpp build's
  state format, the context settings) and its checksums; pure;
- ``_index``: the disk budget's policy (which files serve a prompt, which go); pure;
- ``_store``: the I/O shell: one model's folder, scanned, read and written.
"""

from ._format import SnapshotFormatError as SnapshotFormatError
from ._format import SnapshotKey as SnapshotKey
from ._index import DiskEntry as DiskEntry
from ._index import DiskIndex as DiskIndex
from ._index import Found as Found
from ._prefix import Tokens as Tokens
from ._prefix import as_tokens as as_tokens
from ._prefix import common_prefix as common_prefix
from ._prefix import covers as covers
from ._prefix import reusable as reusable
from ._prefix import worth as worth
from ._store import Loaded as Loaded
from ._store import SnapshotStore as SnapshotStore
from ._store import StoreStats as StoreStats

__all__ = [
    "DiskEntry",
    "DiskIndex",
    "Found",
    "Loaded",
    "SnapshotFormatError",
    "SnapshotKey",
    "SnapshotStore",
    "StoreStats",
    "Tokens",
    "as_tokens",
    "common_prefix",
    "covers",
    "reusable",
    "worth",
]
