"""The part of a JetStreamLog a WriterLease uses, without NATS: its requests are retried as the
real connection retries them, and no permissions violation is ever reported."""
from __future__ import annotations

from journal.jetstream import retrying


class LeaseLog:
    writer_id = "me"
    denied = None

    def retrying(self, what, op, deadline_s=30.0):
        return retrying(what, op, deadline_s, log=self)
