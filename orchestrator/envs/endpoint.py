"""The OpenAI-compatible HTTP endpoint of an inference worker's agent episodes (aiohttp).

Contract: `Endpoint(sessions, model_names, host)`; `await start()` on the environment thread's
loop binds `host` (127.0.0.1) on an ephemeral port (`url`: `http://127.0.0.1:PORT`), `await
close()` stops it (bounded). One endpoint per worker; episodes are told apart by a key:
`{url}/e/{key}/v1` is an episode's base URL and `key` its API key. Routes under it:
`POST chat/completions`, `POST completions`, `POST responses` (`envs.responses_api`: as a chat
completion), `GET models`; `sessions[key]` (an `envs.agent_session.Session`) answers the first
three with a `Turn`, sent as the route's body (`envs.openai_api`), or with `stream: true` (chat and
completions) as server-sent events (`envs.sse`, `text/event-stream`, ending `data: [DONE]`).
Every answer to a request names what the endpoint did not do as asked, in headers:
`x-arl-overridden` (`knob=asked->used; ...`: the sampling knobs the run overrides,
`openai_api.SAMPLING`) and `x-arl-ignored` (the unknown keys, comma-separated), each only when
there is something to say.
Every refusal is OpenAI's error body (`envs.openai_api.ApiError`) with `x-should-retry: false` (so
that OpenAI's SDKs do not repeat a call that cannot succeed), never a crash:
- 401 `authentication_error`: no bearer key, or one that is no live episode's; 403
  `permission_error`: the bearer key is another live episode's (an episode sees only its own
  trajectory); 404 `episode_not_found`: the key in the URL is no live episode's (it ended).
- 400: a body that is not JSON (`malformed_json`) or not a valid request (naming the field); 404
  `model_not_found`: a `model` other than the served names.
- what the session refuses (budgets, a rewritten conversation: `envs.agent_session`).
A client that disconnects mid-call cancels its handler (`handler_cancellation`): the session aborts
the turn in the backend and takes back what the call appended.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Callable

from orchestrator.envs.openai_api import (ApiError, chat_body, chat_request, completion_body,
                                          completion_request, models_body)
from orchestrator.envs.responses_api import response_body, responses_request
from orchestrator.envs.sse import DONE, chat_chunks, completion_chunks, event

PREFIX = "/e/{key}/v1"
SHUTDOWN_S = 2.0            # close(): calls still in flight get this long (sessions cancel theirs)
log = logging.getLogger(__name__)


class Endpoint:
    def __init__(self, sessions: dict, model_names: tuple[str, ...], host: str = "127.0.0.1"):
        self.sessions, self.model_names, self.host = sessions, model_names, host
        self.url = ""
        self._runner = None

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 << 20)
        app.add_routes([web.post(PREFIX + "/chat/completions", self._route(self._chat)),
                        web.post(PREFIX + "/completions", self._route(self._completion)),
                        web.post(PREFIX + "/responses", self._route(self._responses)),
                        web.get(PREFIX + "/models", self._route(self._models))])
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                               shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        self._runner = runner
        port = runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}"

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def base_url(self, key: str) -> str:
        return f"{self.url}{PREFIX.format(key=key)}"

    # ------------------------------------------------------------------ handlers
    def _route(self, handler: Callable):
        from aiohttp import web

        async def handle(request):
            try:
                session = self._session(request)
                return await handler(session, request)
            except ApiError as err:
                return web.json_response(err.body(), status=err.status,
                                         headers={"x-should-retry": "false"})
            except Exception as exc:         # noqa: BLE001 - a bug here is a 500, the worker goes on
                log.exception("agent endpoint: %s %s failed", request.method, request.path)
                err = ApiError(500, f"internal error: {type(exc).__name__}: {exc}".splitlines()[0],
                               "server_error", "internal_error")
                return web.json_response(err.body(), status=500, headers={"x-should-retry": "false"})
        return handle

    def _session(self, request):
        key = request.match_info["key"]
        auth = request.headers.get("Authorization", "")
        bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if bearer != key:
            if bearer and bearer in self.sessions:
                raise ApiError(403, "this API key belongs to another episode: an episode sees only "
                               "its own trajectory", "permission_error", "permission_denied")
            raise ApiError(401, "no valid API key: use the api_key the episode was given",
                           "authentication_error", "invalid_api_key")
        session = self.sessions.get(key)
        if session is None:
            raise ApiError(404, "no live episode has this key (it ended)", "invalid_request_error",
                           "episode_not_found")
        return session

    async def _body(self, request) -> object:
        raw = await request.read()
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON ({exc})".splitlines()[0],
                           code="malformed_json") from None

    def _model(self, name: str) -> None:
        if name not in self.model_names:
            raise ApiError(404, f"the model {name!r} does not exist: this endpoint serves "
                           f"{', '.join(map(repr, self.model_names))}", "invalid_request_error",
                           "model_not_found", "model")

    def _headers(self, session, req) -> dict:
        out = {}
        if (over := req.overridden(session.g.temperature)):
            out["x-arl-overridden"] = over
        if (ignored := req.ignored()):
            out["x-arl-ignored"] = ignored
        return out

    async def _answer(self, request, session, req, turn_of, body, chunks):
        from aiohttp import web

        self._model(req.model)
        headers = self._headers(session, req)
        turn = await turn_of(req, asyncio.current_task())
        if not req.stream:
            return web.json_response(body(req, turn), headers=headers)
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(b"".join(event(c) for c in chunks(req, turn)) + DONE)
        await resp.write_eof()
        return resp

    async def _chat(self, session, request):
        req = chat_request(await self._body(request))
        return await self._answer(request, session, req, session.chat, chat_body, chat_chunks)

    async def _completion(self, session, request):
        req = completion_request(await self._body(request))
        return await self._answer(request, session, req, session.completion, completion_body,
                                  completion_chunks)

    async def _responses(self, session, request):
        from aiohttp import web

        req = responses_request(await self._body(request))
        self._model(req.model)
        headers = self._headers(session, req)
        turn = await session.chat(req.chat(), asyncio.current_task())
        return web.json_response(response_body(req, turn), headers=headers)

    async def _models(self, session, request):
        from aiohttp import web

        return web.json_response(models_body(self.model_names[0]))
