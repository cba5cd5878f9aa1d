"""gRPC method registration for our services, from the proto descriptor.

Every method a service class defines is registered with a request
deserializer that turns undecodable bytes into etcd's answer
(INTERNAL "grpc: error unmarshalling request: …", the error in gogo/protobuf's words:
shim/gogo.py) instead of an UNKNOWN
crash report, and a serializer that passes pre-encoded response bytes
through.  Methods a class does not define are not registered, so they
answer UNIMPLEMENTED, as a Go server does for a method it lacks.
"""
from __future__ import annotations

import asyncio
import bisect
import inspect
import logging
from time import perf_counter

import grpc
from google.protobuf.message import DecodeError

from proto import rpc_pb2

from .errors import NO_LEADER
from .gogo import unmarshal_error
from .gojson import go_quote_bytes
from .wire import Parts

logger = logging.getLogger(__name__)


class Traffic:
    """Bytes of gRPC messages received and sent (read by the metrics collector), and
    unary calls being handled right now."""

    received = 0
    sent = 0
    calls = 0


class Leader:
    """Whether this member has gone without a leader (shim.context.Member's monitor sets it): then
    a call carrying clientv3's WithRequireLeader metadata is refused, as etcd's interceptors do."""

    missing = False


REQUIRE_LEADER_METADATA = ("hasleader", "true")
CLIENT_API_VERSION_METADATA = "client-api-version"  # clientv3 sends its API version, e.g. "3.5"


class ClientRequests:
    """etcd_server_client_requests_total: calls started, by type ("unary" or "stream") and the
    client's API version ("unknown" without the metadata), counted where etcd's interceptors
    count them: before the leader check, after grpc-go has refused a malformed unary request."""

    counts: dict[tuple[str, str], int] = {}

    @classmethod
    def note(cls, kind: str, context: grpc.aio.ServicerContext) -> None:
        version = "unknown"
        for key, value in context.invocation_metadata() or ():
            if key == CLIENT_API_VERSION_METADATA:
                version = value
                break
        counts = cls.counts
        counts[kind, version] = counts.get((kind, version), 0) + 1


def requires_a_leader(context: grpc.aio.ServicerContext) -> bool:
    """The call carries clientv3's WithRequireLeader metadata."""
    return REQUIRE_LEADER_METADATA in (context.invocation_metadata() or ())


def alone() -> bool:
    """Is at most one unary call (the caller's own) being handled?"""
    return Traffic.calls <= 1


class Malformed:
    """A request the handler must refuse before looking at it, with the status etcd's Go server gives."""

    __slots__ = ("code", "message")

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code, self.message = code, message


def too_large(size: int, limit: int) -> str:
    """grpc-go's refusal of a request message over the server's receive limit (RESOURCE_EXHAUSTED)."""
    return f"grpc: received message larger than max ({size} vs. {limit})"


def _deserializer(cls, max_message: int | None, streaming: bool):
    parse = cls.FromString
    # grpc-go's words for bytes its codec refuses: a unary call's request, a stream's message
    refused = "grpc: failed to unmarshal the received message " if streaming else "grpc: error unmarshalling request: "

    def deserialize(data: bytes):
        Traffic.received += len(data)
        if max_message is not None and len(data) > max_message:
            return Malformed(grpc.StatusCode.RESOURCE_EXHAUSTED, too_large(len(data), max_message))
        try:
            return parse(data)
        except DecodeError as exc:  # in the words of etcd's generated code, where it refuses the bytes too
            why = unmarshal_error(cls.DESCRIPTOR, data) or str(exc)
            return Malformed(grpc.StatusCode.INTERNAL, refused + why)

    return deserialize


def _serialize(msg) -> bytes:
    data = msg if isinstance(msg, bytes) else msg.joined() if type(msg) is Parts else msg.SerializeToString()
    Traffic.sent += len(data)
    return data


def _serialize_keeping_parts(msg):
    """For a server that frames a message in Parts itself (shim.grpcserver)."""
    if type(msg) is Parts:
        Traffic.sent += msg.size
        return msg
    return _serialize(msg)


async def _reject(context: grpc.aio.ServicerContext, bad: Malformed):
    await context.abort(bad.code, bad.message)


# go-grpc-prometheus's names for the codes (grpc_code label), in code order
GO_CODE_NAMES = ("OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
                 "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
                 "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated")


# go-grpc-prometheus's handling-time buckets (Prometheus' default ones)
HANDLING_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Handling:
    """etcd's --metrics=extensive: each call's handling time is observed (grpc_server_handling_seconds,
    which etcd's etcdGRPCRequestsSlow alert reads); with basic, the default, it is not."""

    on = False


class RpcStats:
    """One method's counters as etcd's gRPC metrics keep them (go-grpc-prometheus:
    started, messages received and sent, calls handled by status code, and with
    --metrics=extensive their handling time); plain integers on the request path,
    read when /metrics is scraped."""

    __slots__ = ("service", "method", "kind", "started", "received", "sent", "handled", "took", "took_sum")

    def __init__(self, service: str, method: str, kind: str) -> None:
        self.service, self.method, self.kind = service, method, kind
        self.started = self.received = self.sent = 0
        self.handled = [0] * len(GO_CODE_NAMES)
        self.took = [0] * (len(HANDLING_BUCKETS_S) + 1)  # calls per bucket, the last above every bound
        self.took_sum = 0.0

    def handled_in(self, seconds: float) -> None:
        """A call ended (any status) this long after it started: for --metrics=extensive."""
        self.took[bisect.bisect_left(HANDLING_BUCKETS_S, seconds)] += 1
        self.took_sum += seconds

    def ended(self, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        """A call that ended in ``exc`` (one that succeeded counts itself as OK)."""
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # the client went away
            code = grpc.StatusCode.CANCELLED.value[0]
        else:  # an abort set the code; anything else reaches the client as UNKNOWN
            status = context.code()
            code = status.value[0] if isinstance(status, grpc.StatusCode) else grpc.StatusCode.UNKNOWN.value[0]
        self.handled[code] += 1


RPC_STATS: list[RpcStats] = []  # every method registered through service_handler or counted, in order


class Slow:
    """Unary calls that took longer than --experimental-warning-apply-duration (etcd's 100 ms): counted
    (etcd_server_slow_apply_total) and logged, as etcd warns "apply request took too long" -- at most
    one line a second, naming how many more there were, so an overloaded server does not also flood
    its log."""

    threshold_s = 0.1
    count = 0
    _logged_at = float("-inf")
    _unlogged = 0

    @classmethod
    def noted(cls, stats: RpcStats, took: float, request) -> None:
        cls.count += 1
        now = perf_counter()
        if now - cls._logged_at < 1.0:
            cls._unlogged += 1
            return
        key = getattr(request, "key", None)
        logger.warning("request took too long method=%s.%s took_s=%.3f expected_s=%.3f%s more_since_last=%d",
                       stats.service, stats.method, took, cls.threshold_s,
                       "" if key is None else f" key={key[:64]!r}", cls._unlogged)
        cls._logged_at, cls._unlogged = now, 0


def eager(method):
    """Mark a unary servicer method as safe to start at once (Server.begin): no task is current until
    it first waits, so nothing before that may need one (``asyncio.timeout`` does)."""
    method.eager = True
    return method


def batched(batch):
    """Mark a unary servicer method as one the native gRPC server may answer in batches: the calls to
    it whose requests were completed in one loop turn are handed at its end, together, to
    ``batch(self, requests, contexts)`` in one task, which returns per call its response or the
    exception that ended it (``context.ended_with``). A write's task, future and wake-up are then
    one per batch instead of one per call. The method itself still answers a call alone (grpc.aio's
    server, the HTTP gateway). A follower forwards its writes to the writer before these are
    reached; once it took over as the writer, its writes are batched too."""
    def mark(method):
        method.batch = batch
        return method

    return mark


def _ended(context, code: grpc.StatusCode, message: str) -> grpc.aio.AbortError:
    """A batched call refused before its handler sees it: ended now, as an abort would."""
    context.end(code, message)
    return grpc.aio.AbortError()


def _unary_batch(batch, gate, stats: RpcStats):
    """_unary for the calls of a batch (``batched``): each refused, let through ``gate`` and counted
    as _unary does one; the rest answered by ``batch`` together. Returns per call its response or
    what ended it."""
    async def handle(requests: list, contexts: list) -> list:
        results: list = [None] * len(requests)
        taken, taken_requests, taken_contexts = [], [], []
        for i, (request, context) in enumerate(zip(requests, contexts)):
            if type(request) is Malformed:  # grpc-go refuses it before its metrics see the call
                results[i] = _ended(context, request.code, request.message)
                continue
            ClientRequests.note("unary", context)
            if Leader.missing and requires_a_leader(context):
                results[i] = _ended(context, *NO_LEADER)
                continue
            taken.append(i)
            taken_requests.append(request)
            taken_contexts.append(context)
        if not taken:
            return results
        n = len(taken)
        stats.started += n
        stats.received += n
        Traffic.calls += n
        start = perf_counter()
        try:
            if gate is not None:  # a follower's: it may time itself out, which needs a task (a batch
                await asyncio.sleep(0)  # starts outside any: Server.batch); once taken over, it passes
                for context in taken_contexts:
                    await gate(context)
            answers = await batch(taken_requests, taken_contexts)
        except BaseException as exc:
            for context in taken_contexts:
                stats.ended(context, exc)
            raise
        finally:
            Traffic.calls -= n
            if (took := perf_counter() - start) > Slow.threshold_s:
                for request in taken_requests:
                    Slow.noted(stats, took, request)
            if Handling.on:
                for _ in taken:
                    stats.handled_in(took)
        for i, context, answer in zip(taken, taken_contexts, answers):
            if isinstance(answer, BaseException):
                stats.ended(context, answer)
            else:
                stats.handled[0] += 1
                stats.sent += 1
            results[i] = answer
        return results

    return handle


def _unary(fn, gate, stats: RpcStats):
    async def handle(request, context):
        if type(request) is Malformed:  # grpc-go refuses it before its metrics see the call
            await _reject(context, request)
        ClientRequests.note("unary", context)
        if Leader.missing and requires_a_leader(context):
            await context.abort(*NO_LEADER)
        stats.started += 1
        stats.received += 1
        Traffic.calls += 1
        start = perf_counter()
        try:
            if gate is not None:
                await gate(context)
            result = await fn(request, context)
        except BaseException as exc:
            stats.ended(context, exc)
            raise
        finally:
            Traffic.calls -= 1
            if (took := perf_counter() - start) > Slow.threshold_s:
                Slow.noted(stats, took, request)
            if Handling.on:
                stats.handled_in(took)
        stats.handled[0] += 1
        stats.sent += 1
        return result

    handle.eager = gate is None and getattr(fn, "eager", False)
    if (batch := getattr(fn, "batch", None)) is not None:
        handle.batch = _unary_batch(batch.__get__(fn.__self__), gate, stats)
    return handle


async def _checked(requests, context, stats: RpcStats):
    async for request in requests:
        if type(request) is Malformed:
            await _reject(context, request)
        stats.received += 1
        yield request


def _streaming(fn, gate, stats: RpcStats, client_streams: bool):
    """A server-streaming or bidi handler, counted: started, received, sent, and handled with its status."""
    async def handle(request, context):
        ClientRequests.note("stream", context)
        if Leader.missing and requires_a_leader(context):
            await context.abort(*NO_LEADER)
        stats.started += 1
        start = perf_counter()
        try:
            if client_streams:
                request = _checked(request, context, stats)
            else:
                if type(request) is Malformed:
                    await _reject(context, request)
                stats.received += 1
            if gate is not None:
                await gate(context)
            async for response in fn(request, context):
                stats.sent += 1
                yield response
        except BaseException as exc:
            stats.ended(context, exc)
            raise
        finally:
            if Handling.on:
                stats.handled_in(perf_counter() - start)
        stats.handled[0] += 1

    return handle


def service_handler(service: str, servicer, module=rpc_pb2, gate=None, max_message: int | None = None,
                    parts: bool = False) -> grpc.GenericRpcHandler:
    """Handlers for ``servicer``'s methods of ``service`` as declared in ``module`` (a *_pb2).
    ``gate(context)``, if given, is awaited before each call (a follower's wait
    for a token it has not learned yet). A request message over ``max_message`` bytes
    is refused as etcd's gRPC server refuses it (the server's own limit is set above it).
    ``parts``: the server takes a response given as wire.Parts as it is (else it is joined)."""
    serialize = _serialize_keeping_parts if parts else _serialize
    desc = module.DESCRIPTOR.services_by_name[service]
    handlers = {}
    for method in desc.methods:
        fn = getattr(servicer, method.name, None)
        if fn is None:
            continue
        des = _deserializer(getattr(module, method.input_type.name), max_message,
                            method.client_streaming or method.server_streaming)
        kind = ("bidi_stream" if method.client_streaming and method.server_streaming else "server_stream"
                if method.server_streaming else "client_stream" if method.client_streaming else "unary")
        stats = RpcStats(desc.full_name, method.name, kind)
        RPC_STATS.append(stats)
        if method.client_streaming and method.server_streaming:
            h = grpc.stream_stream_rpc_method_handler(_streaming(fn, gate, stats, True), des, serialize)
        elif method.server_streaming:
            assert inspect.isasyncgenfunction(fn), method.full_name
            h = grpc.unary_stream_rpc_method_handler(_streaming(fn, gate, stats, False), des, serialize)
        else:
            h = grpc.unary_unary_rpc_method_handler(_unary(fn, gate, stats), des, serialize)
        handlers[method.name] = h
    return grpc.method_handlers_generic_handler(desc.full_name, handlers)


def counted(service: str, method: str, kind: str, fn):
    """``fn``, a handler of raw bytes that is no servicer's (a follower handing calls to the writer),
    counted as a servicer's method is: etcd's gRPC metrics, client requests, slow calls, leader
    checks. ``kind``: "unary", "unary_stream" or "stream_stream"."""
    stats = RpcStats(service, method, {"unary": "unary", "unary_stream": "server_stream"}.get(kind, "bidi_stream"))
    RPC_STATS.append(stats)  # summed with the servicer's own, if this process registers one too
    if kind == "unary":
        return _unary(fn, None, stats)
    return _streaming(fn, None, stats, kind == "stream_stream")


class _Unknown(grpc.GenericRpcHandler):
    def __init__(self, services) -> None:
        self.served = frozenset(services)

    def service(self, handler_call_details):
        path = handler_call_details.method
        service, slash, method = path[path.startswith("/"):].rpartition("/")
        code = grpc.StatusCode.UNIMPLEMENTED
        if not slash:  # etcd's grpc-go: no "/" between a service and a method
            code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, f"malformed method name: {go_quote_bytes(path.encode())}"
        elif service in self.served:
            message = f"unknown method {method} for service {service}"
        else:
            message = f"unknown service {service}"

        async def refuse(requests, context):
            await context.abort(code, message)
            yield  # a stream handler answers a call of any kind

        return grpc.stream_stream_rpc_method_handler(refuse)


def unknown_methods(services) -> grpc.GenericRpcHandler:
    """The last handler: a method or service the server lacks, answered in grpc-go's words
    (grpcio's own answer is "Method not found!"). ``services``: the full names served."""
    return _Unknown(services)
