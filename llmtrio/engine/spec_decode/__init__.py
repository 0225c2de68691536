"""Speculative decoding's policy: n-gram drafts (prompt lookup) and how many to verify.

Pure: token ids and measured step times in, draft tokens and draft lengths out; no llama.cpp.
The generating core (``generate``) carries it out: each decoding sequence's drafts go into
the one batched ``llama_decode`` of the step with logits on every position, and each
position's logits are sampled in turn, as they would be without speculation, until a sample
differs from the draft (vLLM's "prompt lookup", llama.cpp's ``ngram-simple``).

One concern a module: proposers (``_ngram``), acceptance (``_acceptance``), llama.cpp's
micro-batch split (``_batches``), step costs (``_costs``), the draft budget (``_plan``) and
its gate (``_gate``).
Verification sits beside the sampler, in ``llama``.

The parts:

- :class:`NgramDrafter` (one per sequence): the tokens that followed the latest earlier
  occurrence of the sequence's last ``n`` tokens in its own prompt and output, for the longest
  ``n`` (up to ``max_n``) that occurred before (under a grammar, the occurrences whose
  continuations the grammar takes). :class:`NgramPool` (one per core) and
  :class:`PooledDrafter`: a bounded table of what followed each ``n``-gram in every
  sequence's prompt and output, whose draft a sequence takes where it is worth more tokens
  than its own lookup's at their acceptance rates (llama.cpp's ``ngram-mod``, vLLM's suffix
  decoding; off by default, ``EngineConfig.spec_pool``).
- :class:`Acceptance` (one per sequence, and one per core that they all count into): how
  often its drafts were right, by the length of the n-gram they were found with and apart
  while it is on a run; it forgets with every verified token, and drifts back to its prior
  (the core's rates) while the sequence does not draft, so a sequence whose drafts kept
  failing stops drafting for a while and then tries again.
- :class:`StepCosts`, :func:`micro_batch_sizes` and :func:`plan_drafts`: a step's cost,
  fitted to measured steps as a fixed cost per micro-batch llama.cpp splits the batch into
  plus a cost per position with logits (a micro-batch of one token priced apart: llama.cpp
  runs it with other kernels), and the draft lengths that maximize the expected tokens per
  second of the whole step (none when the step is compute-bound; never over
  ``target_step_ms`` when it is set).
- :class:`DraftGate`: whether a step gets the drafts the budget planned, from the tokens per
  ms that steps with and without drafts realized at the same count of sequences, measured
  side by side (the budget's predictions steer which drafts; the outcome decides whether).
"""

from ._acceptance import Acceptance as Acceptance
from ._batches import micro_batch_sizes as micro_batch_sizes
from ._batches import repacked as repacked
from ._costs import Shape as Shape
from ._costs import StepCosts as StepCosts
from ._gate import DraftGate as DraftGate
from ._ngram import NgramDrafter as NgramDrafter
from ._ngram import NgramPool as NgramPool
from ._ngram import PooledDrafter as PooledDrafter
from ._plan import Candidate as Candidate
from ._plan import plan_drafts as plan_drafts

__all__ = [
    "Acceptance",
    "Candidate",
    "DraftGate",
    "NgramDrafter",
    "NgramPool",
    "PooledDrafter",
    "Shape",
    "StepCosts",
    "micro_batch_sizes",
    "plan_drafts",
    "repacked",
]
