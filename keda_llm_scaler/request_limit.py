"""The gRPC receive limit, and the count of the calls that ended before their request arrived.

KEDA's metadata is a map of short strings held in a ScaledObject, and the scaler refuses more than
``registry.MAX_METADATA_BYTES`` characters of it with INVALID_ARGUMENT naming the key. A request far past
that is no trigger: gRPC's core refuses it before a byte of it reaches Python (RESOURCE_EXHAUSTED "Received
message larger than max"), so an oversized request costs the process nothing but the socket buffer.

gRPC then never calls the handler, so nothing of the scaler would see the refusal. The interceptor below
serves the ExternalScaler's unary-request methods as streaming-request ones (the same bytes on the wire:
a unary request is a stream of one message): the handler starts before the request is read, reads the one
message, and runs the service's handler on it at once. A call whose message never arrives is counted in
``llm_scaler_rpc_no_request_total{method}``. gRPC's Python API does not say why a stream ended without a
message, so that count is what it says: refused as too large, cancelled or cut off while sending, or
half-closed without a request (that client is answered INVALID_ARGUMENT); calls past their deadline are not
counted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc

__all__ = ["MAX_REQUEST_BYTES", "RequestLimitInterceptor"]

# 4x the metadata the scaler accepts (256 KiB), still a quarter of gRPC's default receive limit
MAX_REQUEST_BYTES: Final = 1024 * 1024
_SERVICE_PREFIX: Final = "/externalscaler.ExternalScaler/"


async def _only_message(context: grpc.aio.ServicerContext[Any, Any]) -> list[Any]:
    """The call's one request, in a list the caller empties as it hands it on: a frame of ours must not
    hold the request while the handler runs, since a refusal's traceback keeps every frame it passed
    (and so MBs of metadata) alive in a cycle (see ``service._unary``). Read through the context, not the
    request iterator, whose generator would keep the message it last yielded; anything the client sends
    after it is never read."""
    message = await context.read()
    return [] if message is grpc.aio.EOF else [message]


class RequestLimitInterceptor(grpc.aio.ServerInterceptor):
    """Counts, by method, the ExternalScaler calls that ended before their request reached the handler."""

    def __init__(self, refused: Callable[[str], None]) -> None:
        self._refused = refused

    async def _never_arrived(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        remaining = context.time_remaining()
        if remaining is None or remaining > 0:
            self._refused(method)  # a call past its deadline is the client's business, not a refusal
        # Where gRPC ended the call (too large, cancelled, cut off) the client already has its status and
        # this only ends the call here without a log line; a client that half-closed without a request
        # gets this answer.
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message received")

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
                request = await _only_message(context)
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
            request = await _only_message(context)
            if not request:
                await self._never_arrived(method, context)
                return None
            return await unary_unary(request.pop(), context)

        return grpc.stream_unary_rpc_method_handler(
            unary_behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
