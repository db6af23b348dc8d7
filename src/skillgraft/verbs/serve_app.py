"""The web layer of ``skillgraft serve``: an OpenAI-compatible API over :class:`RoutedSkills` (FastAPI).

    GET  /v1/models                 the skills, ``auto`` (when the folder has a router) and ``base``
    POST /v1/completions            causal skills: a completion per prompt (``model``: a skill, ``auto``, ``base``)
    POST /v1/chat/completions       causal skills: the messages as one prompt (the tokenizer's chat template, if any)
    POST /v1/classify               classifier skills: a label and each label's probability per input text
    GET  /health

Imported only by ``skillgraft serve`` (FastAPI at module level: its handlers' annotations are read from here).
Every answer names the skill used and its graft's digest (``skill``, ``graft_digest``; per choice / row too, and the
``x-skillgraft-skill`` header). Errors are OpenAI's JSON shape ``{"error": {"message", "type", "code"}}`` with the
status a client expects: malformed body 400, unknown model 404, body over ``--max-body-bytes`` 413, a route the
skills cannot answer 400; an unexpected failure 500 with one line, never a traceback. The model work runs in worker
threads; RoutedSkills lets callers of one skill share the model and makes callers of another wait.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from skillgraft.errors import SkillgraftError


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str


class _Sampling(_Request):
    """The sampling fields OpenAI's completion and chat requests share."""

    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    stream: bool = False


class CompletionRequest(_Sampling):
    prompt: str | list[str]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[dict] | None = None


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class ClassifyRequest(_Request):
    input: str | list[str]
    input_pair: str | list[str] | None = None


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind


@dataclass
class State:
    skills: object
    spec: object
    model_ids: list[str] = field(default_factory=list)
    base_id: str | None = "base"
    requests: int = 0
    created: int = field(default_factory=lambda: int(time.time()))


def build_app(skills, spec):
    """The FastAPI app serving ``skills`` under ``spec`` (:class:`~skillgraft.verbs.serve.ServeSpec`), and its
    :class:`State` (model ids, requests answered)."""
    from skillgraft.graft.router import BASE  # noqa: PLC0415

    state = State(skills, spec)
    state.base_id = BASE if BASE not in skills.skills else None  # a skill named "base" keeps its name
    state.model_ids = [*skills.tasks, *(["auto"] if skills.router is not None else []),
                       *([state.base_id] if state.base_id else [])]
    app = FastAPI(title="skillgraft serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, limit=spec.max_body_bytes)

    def error(status: int, message: str, code: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}},
                            status_code=status)

    @app.exception_handler(ApiError)
    async def _api(request, e: ApiError):
        return error(e.status, e.message, e.code, e.kind)

    @app.exception_handler(HTTPException)
    async def _http(request, e: HTTPException):
        codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        return error(e.status_code, str(e.detail), codes.get(e.status_code, "http_error"))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        return error(400, f"malformed request: {e.errors()[0].get('msg', 'invalid')}"[:300], "invalid_request")

    async def parse(request: Request, model: type[BaseModel]):
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"malformed request body: not JSON ({e})"[:300], "invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "malformed request body: expected a JSON object", "invalid_request")
        try:
            return model.model_validate(body)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "body"
            raise ApiError(400, f"malformed request: field {where!r}: {first.get('msg', 'invalid')}"[:300],
                           "invalid_request") from None

    def skill_of(model: str) -> str:
        if model in skills.skills or model == "auto" and skills.router is not None:
            return model
        if model == state.base_id:
            return BASE
        raise ApiError(404, f"the model {model!r} does not exist; the models are {', '.join(state.model_ids)}",
                       "model_not_found")

    def rows(value, what: str) -> list[str]:
        out = [value] if isinstance(value, str) else list(value)
        if not out:
            raise ApiError(400, f"{what}: give at least one", "invalid_request")
        if len(out) > spec.max_rows:
            raise ApiError(400, f"{what}: {len(out)} given, at most {spec.max_rows} per request (--max-rows)",
                           "too_many_rows")
        return out

    def tokens(asked: int | None) -> int:
        if asked is not None and asked > spec.max_tokens:
            raise ApiError(400, f"max_tokens {asked} is over this server's {spec.max_tokens} (--max-tokens)",
                           "max_tokens_too_large")
        return asked or 16

    def plain(body) -> None:
        if body.stream:
            raise ApiError(400, "streaming is not supported: send stream=false", "unsupported")
        if body.n != 1:
            raise ApiError(400, "n must be 1 (one completion per prompt)", "unsupported")

    async def run(fn, *args, **kwargs):
        try:
            return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
        except SkillgraftError as e:
            raise ApiError(400, str(e).splitlines()[0][:300], "invalid_request") from None

    def named(results, model: str) -> dict:
        used = sorted({r.skill for r in results})
        one = used[0] if len(used) == 1 else None
        return {"model": model, "skill": one or "mixed", "skills": [r.skill for r in results],
                "graft_digest": skills.digests.get(one) if one else None}

    def answer(payload: dict) -> JSONResponse:
        state.requests += 1
        return JSONResponse(payload, headers={"x-skillgraft-skill": payload.get("skill", "")})

    def usage(results) -> dict:
        p, c = sum(r.prompt_tokens for r in results), sum(r.completion_tokens for r in results)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def choice_meta(r) -> dict:
        return {"skill": r.skill, "graft_digest": r.digest, "route_confidence": r.confidence}

    @app.get("/health")
    async def health():
        return {"status": "ok", "skills": skills.tasks}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [describe(m) for m in state.model_ids]}

    @app.get("/v1/models/{model_id}")
    async def one_model(model_id: str):
        skill_of(model_id)
        return describe(model_id)

    def describe(model_id: str) -> dict:
        info = {"id": model_id, "object": "model", "created": state.created, "owned_by": "skillgraft",
                "kind": skills.kind}
        if model_id in skills.skills:
            info.update(skill=model_id, graft_digest=skills.digests.get(model_id),
                        labels=[str(x) for x in skills.labels.get(model_id) or []])
        else:
            info["skill"] = "auto: routed per row" if model_id == "auto" else "the base model, no skill"
        if model_id == "auto" and skills.router is not None:  # the tasks whose requests the router mistakes (dev)
            from skillgraft.graft.router import confused  # noqa: PLC0415

            info["name_the_skill_for"] = sorted(confused(skills.router.info.get("dev_routes") or {}))
        return info

    def generative(model: str) -> None:
        if skills.kind != "generative":
            raise ApiError(400, f"the model {model!r} is a {skills.kind} skill: send its texts to /v1/classify",
                           "wrong_route")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        skill = skill_of(body.model)
        generative(body.model)
        plain(body)
        prompts = rows(body.prompt, "prompt")
        stop = [body.stop] if isinstance(body.stop, str) else body.stop
        out = await run(skills.generate, prompts, skill, max_new_tokens=tokens(body.max_tokens),
                        temperature=body.temperature, top_p=body.top_p, stop=stop, threshold=spec.threshold)
        return answer({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                       **named(out, body.model), "usage": usage(out),
                       "choices": [{"index": i, "text": r.text, "finish_reason": r.finish_reason, "logprobs": None,
                                    **choice_meta(r)} for i, r in enumerate(out)]})

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await parse(request, ChatRequest)
        skill = skill_of(body.model)
        generative(body.model)
        plain(body)
        prompt = chat_prompt(skills, body.messages)
        stop = [body.stop] if isinstance(body.stop, str) else body.stop
        out = await run(skills.generate, [prompt], skill, max_new_tokens=tokens(body.max_completion_tokens
                                                                                or body.max_tokens),
                        temperature=body.temperature, top_p=body.top_p, stop=stop, threshold=spec.threshold)
        r = out[0]
        return answer({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                       **named(out, body.model), "usage": usage(out),
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text},
                                    "finish_reason": r.finish_reason, "logprobs": None, **choice_meta(r)}]})

    @app.post("/v1/classify")
    async def classify(request: Request):
        body = await parse(request, ClassifyRequest)
        skill = skill_of(body.model)
        if skills.kind != "classifier":
            raise ApiError(400, f"the model {body.model!r} is a {skills.kind} skill: use /v1/completions or "
                                "/v1/chat/completions", "wrong_route")
        texts = rows(body.input, "input")
        pairs = None if body.input_pair is None else rows(body.input_pair, "input_pair")
        if pairs is not None and len(pairs) != len(texts):
            raise ApiError(400, f"input has {len(texts)} texts but input_pair {len(pairs)}", "invalid_request")
        out = await run(skills.score, texts, skill, pairs=pairs, threshold=spec.threshold)
        return answer({"object": "list", **named(out, body.model),
                       "data": [{"index": i, "label": r.label, "probabilities": r.probabilities, **choice_meta(r)}
                                for i, r in enumerate(out)]})

    return app, state


def chat_prompt(skills, messages: list[Message]) -> str:
    """The messages as one prompt: the tokenizer's chat template with the assistant's turn opened, else their
    contents one per line (a skill fine-tuned on plain prompts sees a plain prompt)."""
    def text(m: Message) -> str:
        if isinstance(m.content, list):
            return "".join(str(part.get("text", "")) for part in m.content if isinstance(part, dict))
        return m.content or ""

    turns = [{"role": m.role, "content": text(m)} for m in messages]
    if getattr(skills.tokenizer, "chat_template", None):
        with skills._tokenizing:
            return skills.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return "\n".join(t["content"] for t in turns)


class _TooLarge(Exception):
    pass


class Guard:
    """ASGI middleware: a request whose declared or streamed body passes ``limit`` bytes gets 413 (JSON) before
    its body is read whole; an unexpected failure 500 with one line (to the client and to stderr), no traceback."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def _refuse(self, send, status: int = 413, message: str | None = None) -> None:
        body = json.dumps({"error": {"message": message or f"request body over {self.limit} bytes (--max-body-bytes)",
                                     "type": "invalid_request_error" if status < 500 else "server_error",
                                     "param": None,
                                     "code": "request_too_large" if status == 413 else "internal_error"}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await self._refuse(send)
        seen, started = 0, False

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracked)
        except _TooLarge:
            if not started:
                await self._refuse(send)
        except Exception as e:  # noqa: BLE001 - one line, never a traceback
            import sys  # noqa: PLC0415

            line = f"internal error: {type(e).__name__}: {e}".splitlines()[0][:300]
            print(f"skillgraft serve: {scope.get('method')} {scope.get('path')}: {line}", file=sys.stderr)
            if not started:
                await self._refuse(send, 500, line)
