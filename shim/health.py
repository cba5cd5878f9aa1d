"""grpc.health.v1.Health as etcd serves it (grpc-go's health server, the empty
service name set to SERVING for as long as the server runs).

Served through the same handler wrappers as etcd's own services, so its calls
appear in the grpc_server_* metrics as etcd counts them."""
from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2

SERVING = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
UNKNOWN = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)


class HealthService:
    """Only the overall status ("") is known; it does not change while the server serves."""

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext):
        if request.service:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return SERVING

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext):
        # grpc-go answers a name it does not know with SERVICE_UNKNOWN and keeps the stream open,
        # in case the service is registered later
        yield UNKNOWN if request.service else SERVING
        await asyncio.Event().wait()  # until the client leaves or the server stops
