"""A small synchronous watch-stream client for tests: send requests, collect responses."""
from __future__ import annotations

import queue
import threading
import time

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg


class WatchClient:
    def __init__(self, channel: grpc.Channel, metadata=None) -> None:
        self._requests: queue.Queue = queue.Queue()
        self.responses: list[pb.WatchResponse] = []
        self.error: grpc.RpcError | None = None
        self._cond = threading.Condition()
        self._call = pbg.WatchStub(channel).Watch(iter(self._requests.get, None), metadata=metadata)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for r in self._call:
                with self._cond:
                    self.responses.append(r)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.error = exc
        with self._cond:
            self._cond.notify_all()

    def create(self, key: bytes, range_end: bytes = b"", **kw) -> None:
        self._requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key, range_end=range_end, **kw)))

    def cancel(self, watch_id: int) -> None:
        self._requests.put(pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=watch_id)))

    def progress(self) -> None:
        self._requests.put(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))

    def wait_for(self, predicate, timeout: float = 10.0) -> list[pb.WatchResponse]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.responses):
                left = deadline - time.monotonic()
                if left <= 0 or (not self._thread.is_alive()):
                    raise AssertionError(f"timed out; got {len(self.responses)} responses; error={self.error}")
                self._cond.wait(left)
            return list(self.responses)

    def events(self, watch_id: int | None = None) -> list:
        with self._cond:
            return [e for r in self.responses if watch_id is None or r.watch_id == watch_id for e in r.events]

    def close(self) -> None:
        self._call.cancel()
        self._requests.put(None)
        self._thread.join(5)
