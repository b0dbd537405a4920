"""A fault-injecting stand-in of the reward API, for the client's failure tests only.

It answers ``POST /reward/schema`` with real ``shared`` scores, but can first fail with a chosen
status, delay every answer, or drop ids, and it counts every request it received. Real uvicorn on a
free loopback port, in a thread. Success-path tests use the real ``services.reward_api`` instead.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from shared import PROMPT_VERSION, compute_schema_reward_single
from tests.helpers.servers import ThreadServer


@dataclass
class Faults:
    fail_first: int = 0  # answer the first N requests with `status`
    status: int = 503
    error: str = "injected"  # the ErrorBody's `error` of an injected failure
    delay_s: float = 0.0
    requests: int = 0
    batch_sizes: list[int] = field(default_factory=list)


class FaultyRewardApi:
    def __init__(self, faults: Faults | None = None) -> None:
        self.faults = faults or Faults()
        app = FastAPI()

        @app.post("/reward/schema")
        async def schema(request: Request) -> JSONResponse:
            body: dict[str, Any] = await request.json()
            f = self.faults
            f.requests += 1
            f.batch_sizes.append(len(body["items"]))
            if f.delay_s:
                await asyncio.sleep(f.delay_s)
            if f.requests <= f.fail_first:
                return JSONResponse({"error": f.error, "detail": f"fault {f.status}"}, status_code=f.status)
            results = [
                {"id": it["id"], **compute_schema_reward_single(it["prediction"], it["gold_schema"]).as_dict()}
                for it in body["items"]
            ]
            answer = {"results": results, "count": len(results), "prompt_version": PROMPT_VERSION, "elapsed_ms": 0}
            return JSONResponse(answer)

        self._server = ThreadServer(app)
        self.port = self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    def __enter__(self) -> FaultyRewardApi:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(None, None, None)
