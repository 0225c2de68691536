"""A query and a document as one sequence of a cross-encoder (:func:`pair_tokens`), as llama.cpp's
server writes it (``format_prompt_rerank``, 0.3.36's vendored ``tools/server/server-common.cpp``).

Pure: the tokenizer comes in as two functions, so the format and its truncation are tested
without a model.

- A model whose GGUF has a ``rerank`` chat template (a decoder reranker: Qwen3-Reranker) gets
  the template with ``{query}`` and then ``{document}`` replaced, tokenized whole with special
  tokens parsed and none added (the template writes them). Special-token text in the query or
  the document is read as those tokens, as llama.cpp's server reads it.
- Any other (an encoder cross-encoder: BERT's ms-marco models, bge-reranker) gets
  ``[BOS] query [EOS] [SEP] document [EOS]``: the query and the document tokenized apart with
  no special tokens, the BOS where the vocabulary adds one, the EOS (the SEP where the
  vocabulary has no EOS) where it adds one, the SEP where it adds one. A BERT vocabulary adds
  BOS and EOS, which are ``[CLS]`` and ``[SEP]``: ``[CLS] query [SEP] document [SEP]``.

Truncation cuts the document's end, never the query: to ``max_document_tokens`` of the
document's own tokens (Cohere's ``max_tokens_per_doc``), and, when a ``limit`` is given, to as
many as let the whole pair fit it. With a template, the document's kept tokens are turned back
into text and the template is tokenized again (a cut may merge differently at its edge), until
the pair fits.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

__all__ = ["Pair", "PairFormat", "pair_tokens"]

#: ``tokenize(text, parse_special)``: the text's token ids, no special tokens added.
Tokenize = Callable[[str, bool], list[int]]
#: ``detokenize(ids)``: the text of token ids.
Detokenize = Callable[[list[int]], str]


@attrs.frozen
class PairFormat:
    """How a model makes one sequence of a query and a document: its ``rerank`` ``template``,
    or the special tokens around the two texts (``bos`` when the vocabulary adds one; ``eos``
    after each text when ``add_eos``; ``sep`` between them when ``add_sep``)."""

    template: str | None = None
    bos: int | None = None
    eos: int | None = None
    sep: int | None = None
    add_eos: bool = False
    add_sep: bool = False


@attrs.frozen
class Pair:
    """One pair's tokens, and whether its document was cut to make them."""

    tokens: list[int]
    truncated: bool = False


def pair_tokens(
    form: PairFormat,
    tokenize: Tokenize,
    detokenize: Detokenize,
    query: str,
    document: str,
    *,
    limit: int | None = None,
    max_document_tokens: int | None = None,
) -> Pair:
    """The tokens of ``query`` and ``document`` as one sequence of ``form``.

    ``max_document_tokens`` cuts the document to that many of its tokens; ``limit`` cuts its
    end until the pair has at most that many tokens (``None``: the pair is as long as it is,
    and the caller refuses one over the model's context). A pair whose query alone is over
    ``limit`` keeps no document and is still over it: the caller refuses the query.
    """
    if form.template is not None:
        return _templated(form.template, tokenize, detokenize, query, document, limit,
                          max_document_tokens)  # fmt: skip
    document_ids = tokenize(document, False)
    cut = max_document_tokens is not None and len(document_ids) > max_document_tokens
    if cut:
        document_ids = document_ids[:max_document_tokens]
    end = [form.eos] if form.add_eos and form.eos is not None else []
    head = [form.bos] if form.bos is not None else []
    head += tokenize(query, False) + end
    if form.add_sep and form.sep is not None:
        head.append(form.sep)
    if limit is not None and len(head) + len(document_ids) + len(end) > limit:
        document_ids = document_ids[: max(0, limit - len(head) - len(end))]
        cut = True
    return Pair(head + document_ids + end, cut)


def _templated(
    template: str,
    tokenize: Tokenize,
    detokenize: Detokenize,
    query: str,
    document: str,
    limit: int | None,
    max_document_tokens: int | None,
) -> Pair:
    def render(text: str) -> list[int]:
        # the query first, then the document: llama.cpp's order (a query holding
        # "{document}" gets the document there too)
        return tokenize(template.replace("{query}", query).replace("{document}", text), True)

    cut = False
    document_ids: list[int] | None = None
    if max_document_tokens is not None:
        document_ids = tokenize(document, False)
        if len(document_ids) > max_document_tokens:
            document_ids = document_ids[:max_document_tokens]
            document = detokenize(document_ids)
            cut = True
    tokens = render(document)
    if limit is None or len(tokens) <= limit:
        return Pair(tokens, cut)
    if document_ids is None or cut:
        document_ids = tokenize(document, False)
    keep = len(document_ids) - (len(tokens) - limit)
    while keep > 0:
        tokens = render(detokenize(document_ids[:keep]))
        if len(tokens) <= limit:
            return Pair(tokens, True)
        keep -= len(tokens) - limit
    return Pair(render(""), True)
