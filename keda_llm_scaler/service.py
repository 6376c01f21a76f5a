"""KEDA's ExternalScaler gRPC service. Every answer comes from a target's latest snapshot.

Errors map to status codes here and nowhere else:
BadMetadata -> INVALID_ARGUMENT, UnknownMetric -> NOT_FOUND, NoFreshData -> UNAVAILABLE (KEDA's
fallback counts it), TooManyTargets -> RESOURCE_EXHAUSTED, anything unexpected -> INTERNAL (logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

import grpc
import structlog

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.activity import target_active
from keda_llm_scaler.errors import BadMetadata, NoFreshData, ScalerError, UnknownMetric
from keda_llm_scaler.metadata import METRIC_NAME, TriggerConfig, check_object_ref
from keda_llm_scaler.policy import Composite
from keda_llm_scaler.registry import TargetRegistry, TooManyTargets
from keda_llm_scaler.target import Target
from keda_llm_scaler.telemetry import ScalerMetrics

__all__ = ["ExternalScalerService", "status_for"]

log = structlog.get_logger(__name__)

_STATUS: Final[dict[type[ScalerError], grpc.StatusCode]] = {
    BadMetadata: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownMetric: grpc.StatusCode.NOT_FOUND,
    NoFreshData: grpc.StatusCode.UNAVAILABLE,
    TooManyTargets: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
_DEADLINE_MARGIN_S: Final = 0.02

R = TypeVar("R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[R]]


def status_for(exc: ScalerError) -> grpc.StatusCode:
    for kind, code in _STATUS.items():
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _bind(ref: pb.ScaledObjectRef) -> None:
    """The call's log context, once its names are known to be Kubernetes names (BadObjectName else)."""
    structlog.contextvars.clear_contextvars()
    check_object_ref(ref.namespace, ref.name)
    structlog.contextvars.bind_contextvars(scaledobject=f"{ref.namespace}/{ref.name}")


async def _abort(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, message: str) -> None:
    """``context.abort``, for a call whose client may already be gone (its deadline passed while the call
    waited): sending the status then fails inside gRPC, and a second abort would be a usage error. Such
    a call ends as cancelled: nobody is left to answer."""
    try:
        await context.abort(code, message)
    except grpc.aio.AbortError:
        raise
    except Exception:
        raise asyncio.CancelledError from None


def _unary(method: str) -> Callable[[Handler[R]], Handler[R]]:
    def decorate(fn: Handler[R]) -> Handler[R]:
        @functools.wraps(fn)
        async def wrapper(self: ExternalScalerService, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> R:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            refused: str | None = None
            try:
                remaining = context.time_remaining()
                if remaining is not None and remaining <= 0:
                    code = grpc.StatusCode.DEADLINE_EXCEEDED
                    await _abort(context, code, "deadline exceeded before the call was handled")
                try:
                    return await fn(self, request, context)
                except ScalerError as exc:
                    code, refused = status_for(exc), str(exc)
                    log.debug("rpc_error", method=method, code=code.name, error=refused)
                # Aborted out here, with the request dropped: gRPC keeps its abort exception on the call's
                # state, and an abort raised inside the handler would chain the error's traceback, whose
                # frames hold the request (MBs of metadata) in a cycle the collector may not visit for
                # a long time (360 refused 3.5 MB requests grew the process by 2.5 GB).
                del request
                await _abort(context, code, refused)
                raise AssertionError("unreachable: abort raises")
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.AbortError:
                raise
            except Exception:
                code = grpc.StatusCode.INTERNAL
                log.exception("rpc_crashed", method=method)
                await _abort(context, code, "internal error; see the scaler's logs")
                raise
            finally:
                self._metrics.rpc_duration.labels(method, code.name).observe(time.perf_counter() - start)

        return wrapper

    return decorate


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    """StreamMetricSpec answers UNIMPLEMENTED: specs depend on metadata only, so they never change
    while a ScaledObject stays the same, and KEDA then keeps its pull-based path."""

    def __init__(
        self,
        registry: TargetRegistry,
        metrics: ScalerMetrics,
        *,
        shutdown: asyncio.Event,
        warmup_wait_s: float = 0.5,
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._shutdown = shutdown
        self._warmup_wait_s = warmup_wait_s

    # -- helpers ---------------------------------------------------------------------------------
    def _target(self, ref: pb.ScaledObjectRef) -> tuple[TriggerConfig, Target]:
        _bind(ref)
        cfg = self._registry.config_for(ref.namespace, ref.name, dict(ref.scalerMetadata))
        return cfg, self._registry.ensure(cfg)

    async def _warm(self, target: Target, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if target.snapshot is None:
            # Only a brand-new target's first call may wait, briefly and inside the caller's deadline,
            # for the first scrape cycle; every later call answers from memory at once.
            remaining = context.time_remaining()
            budget = (
                self._warmup_wait_s if remaining is None else min(self._warmup_wait_s, remaining - _DEADLINE_MARGIN_S)
            )
            await target.wait_first(budget)

    async def _answer(self, target: Target, context: grpc.aio.ServicerContext[Any, Any]) -> Composite:
        await self._warm(target, context)
        try:
            composite = target.current()[1]
        except NoFreshData as exc:
            target.note_answer(str(exc))
            raise
        target.note_answer(None)
        return composite

    # -- RPCs ------------------------------------------------------------------------------------
    @_unary("GetMetricSpec")
    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetMetricSpecResponse:
        cfg, _ = self._target(request)
        target = cfg.target_value
        # Also fill the deprecated int field where it is exact, for KEDA < 2.17 (int-only).
        legacy = int(target) if target >= 1 and target == int(target) else 0
        return pb.GetMetricSpecResponse(
            metricSpecs=[pb.MetricSpec(metricName=METRIC_NAME, targetSize=legacy, targetSizeFloat=target)]
        )

    @_unary("GetMetrics")
    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetMetricsResponse:
        asked = request.metricName
        # KEDA sends the name exactly as returned (minus the sN- prefix); the HPA path may lowercase it.
        if asked and asked.lower() != METRIC_NAME:
            _bind(request.scaledObjectRef)
            raise UnknownMetric(asked, METRIC_NAME)
        _, target = self._target(request.scaledObjectRef)
        value = (await self._answer(target, context)).value
        # KEDA uses the float only when > 0; the int (for KEDA < 2.17) is rounded up so it never
        # reads as less demand. 0 leaves both at 0, which is how 0 must be sent.
        return pb.GetMetricsResponse(
            metricValues=[
                pb.MetricValue(metricName=asked or METRIC_NAME, metricValue=math.ceil(value), metricValueFloat=value)
            ]
        )

    @_unary("IsActive")
    async def IsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.IsActiveResponse:
        _, target = self._target(request)
        await self._warm(target, context)
        try:
            active = target_active(target)  # workloadClass: keda_llm_scaler.activity
        except NoFreshData as exc:
            target.note_answer(str(exc))
            raise
        target.note_answer(None)
        return pb.IsActiveResponse(result=active)

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """The current state once it is known, then `true` only on inactive->active transitions (the state
        is IsActive's, ``keda_llm_scaler.activity``: an interactive fleet with members is always active).

        Repeated `true` would push KEDA's cooldown forward and delay scale-to-zero; `false` is ignored
        by KEDA >= 2.18 and could deactivate a ScaledObject on older releases, so only the first
        message may be `false`. Missing data sends nothing (never a `false`). On shutdown the stream
        ends with OK, which makes KEDA reconnect after 2 s instead of backing off.
        """
        try:
            _, target = self._target(request)
        except ScalerError as exc:
            refused: tuple[grpc.StatusCode, str] | None = (status_for(exc), str(exc))
        else:
            refused = None
        if refused is not None:  # aborted outside the handler, request dropped: see _unary
            del request
            await context.abort(*refused)
            return
        target.holders += 1
        log.info("stream_opened", target_id=target.id)
        try:
            last: bool | None = None
            while not self._shutdown.is_set():
                # taken before the state is read: a snapshot published while this message is being sent
                # sets this very event, so the loop cannot sleep through it until the next one
                updated = target.update_event()
                try:
                    active: bool | None = target_active(target)
                except NoFreshData:
                    active = None
                if active is not None:
                    if last is None or (active and not last):
                        yield pb.IsActiveResponse(result=active)
                    last = active
                target.touch()
                await self._wait_update_or_shutdown(updated)
        finally:
            target.holders -= 1
            log.info("stream_closed", target_id=target.id)

    async def StreamMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        # UNIMPLEMENTED on open makes KEDA (main / v2.21) stop for good and keep polling GetMetricSpec.
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "StreamMetricSpec: specs depend only on trigger metadata and never change at runtime",
        )
        yield pb.GetMetricSpecResponse()  # unreachable; makes this an async generator like the proto's stream

    async def _wait_update_or_shutdown(self, updated: asyncio.Event) -> None:
        update = asyncio.ensure_future(updated.wait())
        stop = asyncio.ensure_future(self._shutdown.wait())
        try:
            await asyncio.wait({update, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (update, stop):
                fut.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await fut
