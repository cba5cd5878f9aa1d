"""gRPC method registration for our services, from the proto descriptor.

Every method a service class defines is registered with a request
deserializer that turns undecodable bytes into etcd's answer
(INTERNAL "grpc: error unmarshalling request: …") instead of an UNKNOWN
crash report, and a serializer that passes pre-encoded response bytes
through.  Methods a class does not define are not registered, so they
answer UNIMPLEMENTED, as a Go server does for a method it lacks.
"""
from __future__ import annotations

import inspect

import grpc
from google.protobuf.message import DecodeError

from proto import rpc_pb2


class Traffic:
    """Bytes of gRPC messages received and sent (read by the metrics collector), and
    unary calls being handled right now."""

    received = 0
    sent = 0
    calls = 0


def alone() -> bool:
    """Is at most one unary call (the caller's own) being handled?"""
    return Traffic.calls <= 1


class Malformed:
    """A request the handler must refuse before looking at it, with the status etcd's Go server gives."""

    __slots__ = ("code", "message")

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code, self.message = code, message


def _deserializer(cls, max_message: int | None):
    parse = cls.FromString

    def deserialize(data: bytes):
        Traffic.received += len(data)
        if max_message is not None and len(data) > max_message:  # grpc-go's check and words
            return Malformed(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"grpc: received message larger than max ({len(data)} vs. {max_message})")
        try:
            return parse(data)
        except DecodeError as exc:
            return Malformed(grpc.StatusCode.INTERNAL, f"grpc: error unmarshalling request: {exc}")

    return deserialize


def _serialize(msg) -> bytes:
    data = msg if isinstance(msg, bytes) else msg.SerializeToString()
    Traffic.sent += len(data)
    return data


async def _reject(context: grpc.aio.ServicerContext, bad: Malformed):
    await context.abort(bad.code, bad.message)


def _unary(fn, gate=None):
    async def handle(request, context):
        if type(request) is Malformed:
            await _reject(context, request)
        Traffic.calls += 1
        try:
            if gate is not None:
                await gate(context)
            return await fn(request, context)
        finally:
            Traffic.calls -= 1

    return handle


def _unary_stream(fn, gate=None):
    async def handle(request, context):
        if type(request) is Malformed:
            await _reject(context, request)
        if gate is not None:
            await gate(context)
        async for response in fn(request, context):
            yield response

    return handle


async def _checked(requests, context):
    async for request in requests:
        if type(request) is Malformed:
            await _reject(context, request)
        yield request


def _stream_stream(fn, gate=None):
    async def handle(requests, context):
        if gate is not None:
            await gate(context)
        async for response in fn(_checked(requests, context), context):
            yield response

    return handle


def service_handler(service: str, servicer, module=rpc_pb2, gate=None, max_message: int | None = None
                    ) -> grpc.GenericRpcHandler:
    """Handlers for ``servicer``'s methods of ``service`` as declared in ``module`` (a *_pb2).
    ``gate(context)``, if given, is awaited before each call (a follower's wait
    for a token it has not learned yet). A request message over ``max_message`` bytes
    is refused as etcd's gRPC server refuses it (the server's own limit is set above it)."""
    desc = module.DESCRIPTOR.services_by_name[service]
    handlers = {}
    for method in desc.methods:
        fn = getattr(servicer, method.name, None)
        if fn is None:
            continue
        des = _deserializer(getattr(module, method.input_type.name), max_message)
        if method.client_streaming and method.server_streaming:
            h = grpc.stream_stream_rpc_method_handler(_stream_stream(fn, gate), des, _serialize)
        elif method.server_streaming:
            assert inspect.isasyncgenfunction(fn), method.full_name
            h = grpc.unary_stream_rpc_method_handler(_unary_stream(fn, gate), des, _serialize)
        else:
            h = grpc.unary_unary_rpc_method_handler(_unary(fn, gate), des, _serialize)
        handlers[method.name] = h
    return grpc.method_handlers_generic_handler(desc.full_name, handlers)


class _Unknown(grpc.GenericRpcHandler):
    def __init__(self, services) -> None:
        self.served = frozenset(services)

    def service(self, handler_call_details):
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        message = (f"unknown method {method} for service {service}" if service in self.served
                   else f"unknown service {service}")

        async def refuse(requests, context):
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)
            yield  # a stream handler answers a call of any kind

        return grpc.stream_stream_rpc_method_handler(refuse)


def unknown_methods(services) -> grpc.GenericRpcHandler:
    """The last handler: a method or service the server lacks, answered in grpc-go's words
    (grpcio's own answer is "Method not found!"). ``services``: the full names served."""
    return _Unknown(services)
