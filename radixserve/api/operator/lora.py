"""The routes that load and unload LoRA adapters (``docs/lora.md``), in SGLang's shapes and
vLLM's:

- ``POST /load_lora_adapter`` ``{"lora_name", "lora_path", "pinned"}`` and ``POST
  /unload_lora_adapter`` ``{"lora_name"}`` answer ``{"success", "error_message",
  "loaded_adapters"}`` (400 with ``success`` false when refused), as SGLang's do;
- ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` answer vLLM's plain-text
  ``Success: ...`` line, or OpenAI's error shape (404 for an unknown adapter on unload).

They are operator routes (``api/access/routes.py``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from radixserve.api.access.routes import Access, declare
from radixserve.api.errors import APIError, error_body
from radixserve.api.openapi import NOT_FOUND, TEXT
from radixserve.server.tokenizer_manager import TokenizerManager


class LoadLoraAdapterReqInput(BaseModel):
    """SGLang's body; vLLM's ``load_inplace`` is accepted too (a name is never replaced in
    place here: unload it first)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    lora_name: str
    lora_path: str
    pinned: bool = False
    load_inplace: bool = False


class UnloadLoraAdapterReqInput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    lora_name: str
    lora_int_id: int | None = None  # vLLM's, accepted: adapters are named here


def lora_router(tm: TokenizerManager) -> APIRouter:
    router = APIRouter()

    async def update(
        name: str, path: str | None, pinned: bool = False
    ) -> tuple[dict[str, str], str | None]:
        try:
            return await tm.update_lora(name, path, pinned), None
        except ValueError as exc:
            return tm.lora_adapters, str(exc)

    def sglang_reply(adapters: dict[str, str], error: str | None) -> Response:
        body: dict[str, Any] = {
            "success": error is None,
            "error_message": error,
            "loaded_adapters": adapters,
        }
        if error is not None:  # SGLang's fields, and OpenAI's error shape beside them
            body |= error_body(error, param="lora_name")
        return JSONResponse(body, status_code=200 if error is None else 400)

    @router.post("/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoraAdapterReqInput) -> Response:
        return sglang_reply(*await update(body.lora_name, body.lora_path, body.pinned))

    @router.post("/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoraAdapterReqInput) -> Response:
        return sglang_reply(*await update(body.lora_name, None))

    @router.post("/v1/load_lora_adapter", responses=TEXT)
    async def v1_load_lora_adapter(body: LoadLoraAdapterReqInput) -> Response:
        _, error = await update(body.lora_name, body.lora_path, body.pinned)
        if error is not None:
            raise APIError(error, 400, param="lora_path")
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @router.post("/v1/unload_lora_adapter", responses={**TEXT, **NOT_FOUND})
    async def v1_unload_lora_adapter(body: UnloadLoraAdapterReqInput) -> Response:
        if body.lora_name not in tm.lora_adapters:
            raise APIError(
                f"The lora adapter '{body.lora_name}' cannot be found.",
                404,
                param="lora_name",
                code="model_not_found",
            )
        _, error = await update(body.lora_name, None)
        if error is not None:
            raise APIError(error, 400, param="lora_name")
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    return declare(router, Access.OPERATOR)
