"""Which model a request goes to: the ingress's resolution of a request's ``model``, the same
on every replica (pure: the request's field, the endpoint's kind, the models the ring knows
and the configured default in; a routing key or an :class:`ApiError` out).

The rules, in order, for a named model:

1. a model some attached worker serves now (or served within ``--park-timeout``:
   ``Ring.models`` keeps it), of the endpoint's kind: that model (a Hugging Face model served
   as ``owner/repo:QUANT`` is also found as ``owner/repo`` while one quant of it is served);
2. a model of another kind (a chat model asked for embeddings, an embedding model asked for
   a chat or text completion, a reranking model asked for either): 400
   ``model_not_supported`` naming the model and what it serves;
3. ``--default-model`` is set (and is not known as a model of the other kind): that model;
4. otherwise 404 ``model_not_found``; but where the default model is of the other kind and no
   model of the endpoint's kind is served at all, 400 ``model_not_supported`` naming the
   default (a chat request to a server of one embedding model is told what it serves).

``model`` omitted or empty: the default model if one is set (as in rule 3); else, while the
attached workers serve exactly one model of the endpoint's kind, that model; else 400
(``model_not_supported`` naming a default of the other kind, as in rule 4, or
``missing_required_parameter``).

Two cases keep the ring's behaviour from before models were routed: while no model is known
at all, a request that names none parks unrouted (taken by the first worker to attach, or 503
``no_worker`` after ``--park-timeout``, as an ingress started before its workers answered);
and while an attached worker lists no model (a library user's worker, which takes any), an
unknown name is routed as it is, to that worker.

``/models/load`` and ``/models/unload`` name a model exactly: one the ring knows, of either
kind, never the default; else 404 (or 400 when none is named).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..api import (
    MANAGE_PATHS,
    MODEL_KINDS,
    form_field,
    invalid_request,
    is_form,
    missing_model,
    model_not_found,
    wrong_model_kind,
)
from ..ring import CHAT_MODEL, ModelStats

__all__ = ["requested_model", "resolve_model"]


def requested_model(body: bytes, *, form: bool = False) -> object:
    """The ``model`` field of a request body (on a ``form`` route, a form's text field
    ``model``); ``None`` when it has none, or when the body is not a JSON object or a form
    (the worker answers that body's own error: a form route's, that it must be a form)."""
    if form and is_form(body):
        return form_field(body, "model")
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return fields.get("model") if isinstance(fields, dict) else None


def resolve_model(
    requested: object,
    path: str,
    models: Mapping[str, ModelStats],
    default: str | None,
    *,
    takes_any: bool = False,
) -> str:
    """The routing key of a request for ``requested`` (its ``model`` field) on ``path``, given
    the ``models`` the ring knows (``Ring.models()``) and the ``default`` model (if any); see
    the module's rules.

    Error handling: :class:`ApiError` (400 for a ``model`` that is not a string or is of
    the other kind, or when none is named and none can be chosen; 404 for an unknown one).
    """
    kind = MODEL_KINDS.get(path, CHAT_MODEL)
    if requested is not None and not isinstance(requested, str):
        raise invalid_request(
            f"'model' must be a string, not {type(requested).__name__}", param="model"
        )
    if path in MANAGE_PATHS:
        return _managed(requested, models)
    default_fits = default is not None and (
        default not in models or _fits(models[default].kind, kind)
    )
    if requested:
        known = models.get(requested) or _without_quant(requested, models)
        if known is not None:
            requested = known.name
            if not _fits(known.kind, kind):
                raise wrong_model_kind(requested, known.kind, path)
            return requested
        if default_fits:
            assert default is not None
            return default
        if takes_any:
            return requested
        _refuse_for_the_default(default, kind, path, models)
        raise model_not_found(requested)
    if default_fits:
        assert default is not None
        return default
    _refuse_for_the_default(default, kind, path, models)
    served = [m.name for m in models.values() if _fits(m.kind, kind)]
    if len(served) == 1:
        return served[0]
    if not models or (takes_any and not served):
        return ""  # nothing routed yet: any worker
    others = {m.name: m.kind for m in models.values() if not _fits(m.kind, kind)}
    raise missing_model(served, others, path)


def _fits(model_kind: str, kind: str | None) -> bool:
    """Whether a model of ``model_kind`` serves an endpoint needing ``kind``."""
    return kind is None or model_kind == kind


def _managed(requested: str | None, models: Mapping[str, ModelStats]) -> str:
    """A load's or unload's model: a name the ring knows, exactly (nothing a client sends
    is ever read as a path or a repository to fetch: an unknown name is a 404)."""
    if not requested:
        raise invalid_request(
            "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
        )
    if requested not in models:
        raise model_not_found(requested)
    return requested


def _refuse_for_the_default(
    default: str | None, kind: str | None, path: str, models: Mapping[str, ModelStats]
) -> None:
    """A request the default model would take but for its kind, where no model of the
    endpoint's kind is served at all: 400 naming the default and what it serves (a chat
    request to a server of one embedding model says so, rather than "not found")."""
    if default is None or default not in models or _fits(models[default].kind, kind):
        return
    if not any(_fits(model.kind, kind) for model in models.values()):
        raise wrong_model_kind(default, models[default].kind, path)


def _without_quant(requested: str, models: Mapping[str, ModelStats]) -> ModelStats | None:
    """The one model served as ``requested:QUANT`` (``owner/repo`` for ``owner/repo:Q4_K_M``),
    if exactly one is."""
    found = [model for name, model in models.items() if name.startswith(requested + ":")]
    return found[0] if len(found) == 1 else None
