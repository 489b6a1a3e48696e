"""OpenAI-compatible inference endpoints: /v1/models, /v1/completions, /v1/chat/completions.

Shapes follow vLLM's OpenAI server (ids ``cmpl-<hex>`` / ``chatcmpl-<hex>``, SSE ``data:``
chunks ending with ``data: [DONE]``, usage in streams only with ``stream_options.include_usage``,
errors as ``{"error": {...}}``). The "model" is a dummy: one word per token, one token per word.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engine_watchdog.sim.client import Delta, EngineDeadError, EngineGroup, RequestState
from engine_watchdog.sim.settings import SimSettings

WORDS = (
    *("the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "a"),
    *("watchdog", "counts", "every", "token", "and", "waits", "for", "the", "engine", "to", "move"),
)


class OpenAIError(Exception):
    """An error answered as vLLM does: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status)


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, "BadRequestError", message, param)


def engine_dead() -> OpenAIError:
    return OpenAIError(500, "InternalServerError", str(EngineDeadError()))


def detokenize(token_ids: list[int]) -> str:
    return "".join(" " + WORDS[i % len(WORDS)] for i in token_ids)


def count_tokens(text: str) -> int:
    """The dummy tokenizer: one token per whitespace-separated word (at least one)."""
    return max(1, len(text.split()))


@dataclass(frozen=True)
class Parsed:
    """What the handlers need from a request body."""

    chat: bool
    request_id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool


def parse(body: Any, chat: bool, settings: SimSettings, headers: Mapping[str, str]) -> Parsed:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model") or settings.served_model_name
    if model != settings.served_model_name:
        raise OpenAIError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
    prompt_tokens = _chat_tokens(body) if chat else _prompt_tokens(body.get("prompt"))
    max_tokens = body.get("max_completion_tokens") if chat else None
    max_tokens = max_tokens or body.get("max_tokens", 16)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad_request("max_tokens must be an integer >= 1.", "max_tokens")
    limit = settings.kv_capacity_tokens
    if prompt_tokens + max_tokens > limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} "
            "in the completion). Please reduce the length of the messages or completion."
        )
    if body.get("n", 1) != 1:
        raise bad_request("The simulator serves n=1 only.", "n")
    options = body.get("stream_options") or {}
    base = headers.get("X-Request-Id") or uuid.uuid4().hex
    return Parsed(
        chat=chat,
        request_id=f"{'chatcmpl' if chat else 'cmpl'}-{base}",
        model=str(model),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        ignore_eos=bool(body.get("ignore_eos", False)),
    )


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    raise bad_request("prompt must be a string or a list of token ids (one prompt).", "prompt")


def _chat_tokens(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list.", "messages")
    total = 1  # the generation prompt
    for m in messages:
        if not isinstance(m, dict):
            raise bad_request("each message must be an object.", "messages")
        content = m.get("content") or ""
        text = content if isinstance(content, str) else json.dumps(content)
        total += 3 + count_tokens(text)  # the chat template's role markers
    return total


class OpenAIHandlers:
    """The inference routes of one simulated server."""

    def __init__(
        self, settings: SimSettings, group: EngineGroup, on_inference: Callable[[], None]
    ) -> None:
        self.settings = settings
        self.group = group
        self._on_inference = on_inference  # lets a start-up api-freeze fire on first use
        self.created = int(time.time())

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self.models),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
        ]

    async def models(self, request: web.Request) -> web.Response:
        name = self.settings.served_model_name
        card = {"id": name, "object": "model", "created": self.created, "owned_by": "vllm"}
        card |= {"root": name, "parent": None, "max_model_len": self.settings.kv_capacity_tokens}
        return web.json_response({"object": "list", "data": [card]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        self._on_inference()
        try:
            try:
                body = await request.json()
            except ValueError as exc:
                raise bad_request(f"Invalid JSON: {exc}") from exc
            req = parse(body, chat, self.settings, request.headers)
            try:
                state = self.group.add_request(
                    req.request_id, req.prompt_tokens, req.max_tokens, req.ignore_eos
                )
            except ValueError as exc:
                raise bad_request(str(exc)) from exc
            except EngineDeadError as exc:
                raise engine_dead() from exc
            if req.stream:
                return await self._stream(request, req, state)
            return await self._full(req, state)
        except OpenAIError as err:
            return err.response()

    async def _full(self, req: Parsed, state: RequestState) -> web.Response:
        text, reason, n = "", None, 0
        try:
            async with contextlib.aclosing(self.group.deltas(state)) as deltas:
                async for delta in deltas:
                    text += detokenize(delta.token_ids)
                    n += len(delta.token_ids)
                    reason = delta.finish_reason
        except EngineDeadError as exc:
            raise engine_dead() from exc
        if req.chat:
            message = {"role": "assistant", "content": text, "tool_calls": []}
            choice: dict[str, Any] = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": text, "prompt_logprobs": None}
        choice |= {"logprobs": None, "finish_reason": reason, "stop_reason": None}
        doc = self._envelope(req, "chat.completion" if req.chat else "text_completion")
        doc |= {"choices": [choice], "usage": _usage(req, n)}
        return web.json_response(doc)

    async def _stream(
        self, request: web.Request, req: Parsed, state: RequestState
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        try:
            try:
                await self._stream_deltas(resp, req, state)
            except EngineDeadError:
                await _send(resp, engine_dead().body())  # vLLM: an error event, then [DONE]
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client left; its request was aborted on the way out
        return resp

    async def _stream_deltas(
        self, resp: web.StreamResponse, req: Parsed, state: RequestState
    ) -> None:
        n = 0
        async with contextlib.aclosing(self.group.deltas(state)) as deltas:
            async for delta in deltas:
                if req.chat and n == 0:
                    # vLLM sends the role with the engine's first output, after the prefill
                    # (chat_completion/serving.py, first_iteration), not before it.
                    await self._send(
                        resp, self._chunk(req, {"role": "assistant", "content": ""}, None)
                    )
                n += len(delta.token_ids)
                await self._send(resp, self._chunk(req, detokenize(delta.token_ids), delta))
        if req.include_usage:
            usage = {"choices": [], "usage": _usage(req, n)}
            await self._send(resp, self._envelope(req, _chunk_object(req)) | usage)

    async def _send(self, resp: web.StreamResponse, doc: dict[str, Any]) -> None:
        if self.settings.stamp_events:
            doc["sim_t"] = time.time()
        await _send(resp, doc)

    def _chunk(self, req: Parsed, content: Any, delta: Delta | None) -> dict[str, Any]:
        reason = delta.finish_reason if delta else None
        if req.chat:
            body = content if isinstance(content, dict) else {"content": content}
            choice: dict[str, Any] = {"index": 0, "delta": body, "logprobs": None}
        else:
            choice = {"index": 0, "text": content, "logprobs": None}
        choice |= {"finish_reason": reason, "stop_reason": None}
        return self._envelope(req, _chunk_object(req)) | {"choices": [choice]}

    def _envelope(self, req: Parsed, obj: str) -> dict[str, Any]:
        return {
            "id": req.request_id,
            "object": obj,
            "created": int(time.time()),
            "model": req.model,
        }


def _chunk_object(req: Parsed) -> str:
    return "chat.completion.chunk" if req.chat else "text_completion"


def _usage(req: Parsed, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


async def _send(resp: web.StreamResponse, doc: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")
