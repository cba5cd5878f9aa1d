"""Routing, revisions and per-shard MVCC state (no gRPC here)."""
