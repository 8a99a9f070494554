"""POST /tokenize and /detokenize as vLLM serves them, so clients can count and inspect tokens exactly as
the completions and chat endpoints will (same encoding, same chat rendering). GET /tokenizer_info gives the
special tokens and the chat template."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, StrictBool, ValidationError

from minedraft.batch_manager.backend import GenerationBackend
from minedraft.batch_manager.chat import RenderOptions, chat_template, special_tokens
from minedraft.batch_manager.openai_models import ChatMessage, StrictModel
from minedraft.batch_manager.prompt_ids import chat_ids, encode_prompt
from minedraft.core.errors import InvalidRequestError

ModelCheck = Callable[[str | None], None]


class TokenizeCompletion(StrictModel):
    model: str | None = None
    prompt: str
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool | None = False


class TokenizeChat(StrictModel):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool | None = None  # None: as the chat endpoint encodes (only without a template)
    return_token_strs: StrictBool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None
    tools: list[dict[str, Any]] | None = None


class Detokenize(StrictModel):
    model: str | None = None
    tokens: list[int]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


async def _body(request: Request, model: type[BaseModel]) -> Any:
    """The JSON body as `model`; its errors answered like every other endpoint's (400 naming the field)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


async def tokenize(backend: GenerationBackend, check_model: ModelCheck, request: Request) -> TokenizeResponse:
    tok = backend.tokenizer
    try:
        data = json.loads(await request.body())
    except ValueError:
        data = None  # answered by the validation below
    body = await _body(request, TokenizeChat if isinstance(data, dict) and "messages" in data else TokenizeCompletion)
    check_model(body.model)
    if isinstance(body, TokenizeChat):
        if body.tools:
            raise InvalidRequestError("tools: tool calling is not supported yet", param="tools")
        if body.add_generation_prompt and body.continue_final_message:
            raise InvalidRequestError("continue_final_message and add_generation_prompt cannot both be true",
                                      param="continue_final_message")
        options = RenderOptions(body.add_generation_prompt, body.continue_final_message, body.chat_template,
                                dict(body.chat_template_kwargs or {}), body.documents, body.add_special_tokens)
        ids = await chat_ids(tok, body.messages, backend.max_context, options)
    else:
        ids = await encode_prompt(tok, body.prompt, backend.max_context, body.add_special_tokens)
    strs = [tok.backend.id_to_token(t) or "" for t in ids] if body.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=backend.max_context, tokens=ids, token_strs=strs)


async def detokenize(backend: GenerationBackend, check_model: ModelCheck, request: Request) -> dict[str, str]:
    body = await _body(request, Detokenize)
    check_model(body.model)
    vocab = backend.tokenizer.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(f"tokens {bad[:5]} are outside the vocabulary [0, {vocab})", param="tokens")
    return {"prompt": backend.tokenizer.decode(body.tokens, skip_special_tokens=False)}


def tokenizer_info(backend: GenerationBackend) -> dict[str, Any]:
    tok = backend.tokenizer
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": backend.max_context,
            "vocab_size": tok.vocab_size, "chat_template": chat_template(tok), **special_tokens(tok)}


def install_tokenize_routes(app: FastAPI, backend: GenerationBackend, check_model: ModelCheck) -> None:
    """`check_model` raises for a `model` field naming another model (the 404 of the other endpoints)."""

    async def tokenize_route(request: Request) -> dict[str, Any]:
        return (await tokenize(backend, check_model, request)).model_dump(exclude_none=True)

    async def detokenize_route(request: Request) -> dict[str, str]:
        return await detokenize(backend, check_model, request)

    async def info_route() -> dict[str, Any]:
        return tokenizer_info(backend)

    app.add_api_route("/tokenize", tokenize_route, methods=["POST"])
    app.add_api_route("/detokenize", detokenize_route, methods=["POST"])
    app.add_api_route("/tokenizer_info", info_route, methods=["GET"])
