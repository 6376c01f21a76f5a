"""The gRPC receive limit, and the count of the calls it refuses.

KEDA's metadata is a map of short strings held in a ScaledObject, and the scaler refuses more than
``registry.MAX_METADATA_BYTES`` of it with INVALID_ARGUMENT naming the key. A request far past that is
no trigger: gRPC's core refuses it before a byte of it reaches Python (RESOURCE_EXHAUSTED "Received
message larger than max"), so an oversized request costs the process nothing but the socket buffer.

gRPC then never calls the handler, so nothing of the scaler would see the refusal. The interceptor below
serves the ExternalScaler's unary-request methods as streaming-request ones (the same bytes on the wire:
a unary request is a stream of one message): the handler starts before the request is read, and a call
whose one message never arrives, while the client did not cancel it, is the refused one. It is counted
in ``llm_scaler_rpc_refused_before_handler_total{method}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc

__all__ = ["MAX_REQUEST_BYTES", "RequestLimitInterceptor"]

# 4x the metadata the scaler accepts (256 KiB), still a quarter of gRPC's default receive limit
MAX_REQUEST_BYTES: Final = 1024 * 1024
_SERVICE_PREFIX: Final = "/externalscaler.ExternalScaler/"


async def _only_message(requests: AsyncIterator[Any]) -> list[Any]:
    """The call's one request, in a list the caller empties as it hands it on: a frame of ours must not
    hold the request while the handler runs, since a refusal's traceback keeps every frame it passed
    (and so MBs of metadata) alive in a cycle (see ``service._unary``)."""
    first: list[Any] = []
    # read to the client's half-close (a unary client sends it with the message): suspended after its first
    # message, the receiving generator would keep that one; anything past the first is dropped
    async for request in requests:
        if not first:
            first.append(request)
    return first


class RequestLimitInterceptor(grpc.aio.ServerInterceptor):
    """Counts, by method, the ExternalScaler calls gRPC ended before their request reached the handler."""

    def __init__(self, refused: Callable[[str], None]) -> None:
        self._refused = refused

    async def _never_arrived(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if context.cancelled():
            return  # the client gave up before sending: nothing was refused
        self._refused(method)
        # gRPC has already sent the client its status; this only ends the call here without a log line
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"request larger than {MAX_REQUEST_BYTES} bytes")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        path: str = details.method
        if handler is None or handler.request_streaming or not path.startswith(_SERVICE_PREFIX):
            return handler
        method = path.removeprefix(_SERVICE_PREFIX)
        if handler.response_streaming:
            unary_stream: Any = handler.unary_stream

            async def stream_behavior(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
                request = await _only_message(requests)
                if not request:
                    await self._never_arrived(method, context)
                    return
                async for response in unary_stream(request.pop(), context):
                    yield response

            return grpc.stream_stream_rpc_method_handler(
                stream_behavior,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        unary_unary: Any = handler.unary_unary

        async def unary_behavior(requests: AsyncIterator[Any], context: Any) -> Any:
            request = await _only_message(requests)
            if not request:
                await self._never_arrived(method, context)
                return None
            return await unary_unary(request.pop(), context)

        return grpc.stream_unary_rpc_method_handler(
            unary_behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
