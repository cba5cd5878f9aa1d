"""Prometheus metrics, with etcd's names where a metric means the same thing.

Gauges are computed when scraped (nothing on the request path); the journal
reports each batch's write + sync time, which is what etcd's
``etcd_disk_wal_fsync_duration_seconds`` measures for its WAL.
"""
from __future__ import annotations

import os
import resource

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from shards import collector

from .config import ETCD_API_VERSION
from .handlers import GO_CODE_NAMES, HANDLING_BUCKETS_S, RPC_STATS, ClientRequests, Handling, Slow, Traffic
from .histogram import LoopHistogram, cumulative, exponential, go_float
from .maintenance import DEFRAG_S, HASH_REV_S, HASH_S, SNAPSHOT_S, Defragmenting
from .http import HealthChecks

FSYNC_BUCKETS_S = exponential(0.001, 14)  # etcd's WAL fsync buckets
BATCH_BYTES_BUCKETS = exponential(256, 9, 4)  # 256 B .. 16 MiB
LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
LEASE_TTL_BUCKETS_S = exponential(1.0, 24)  # etcd's etcd_debugging_lease_ttl_total: 1 s .. 2^23 s


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class _CounterType(str):
    """The type of a counter whose name has no ``_total`` (etcd has a few, e.g.
    etcd_server_health_success): prometheus_client's text writer appends ``_total`` to
    every counter's name it recognises; this type reads "counter" in the ``# TYPE`` line
    but is not recognised, so the name stays as etcd writes it."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


def _bare_counter(name: str, doc: str, value: float) -> Metric:
    family = Metric(name, doc, "gauge")
    family.type = _CounterType("counter")
    family.add_sample(name, {}, value)
    return family


def _labelled(name: str, doc: str, label: str, value: str) -> GaugeMetricFamily:
    """etcd's info gauges: 1, the information in a label."""
    family = GaugeMetricFamily(name, doc, labels=[label])
    family.add_metric([value], 1)
    return family


class _SameObservations:
    """A LoopHistogram's observations under a second name, built when scraped (nothing is
    observed twice)."""

    def __init__(self, source: LoopHistogram, name: str, doc: str) -> None:
        self.source, self.name, self.doc = source, name, doc

    def collect(self):
        yield self.source.family(self.name, self.doc)


def journal_connection(log, lease=None):
    """The NATS connection of a JetStream journal (``log``: a JetStreamLog; nothing for a local
    journal) and the writer lease held over it: what an operator alerts on before writes stall."""
    events = getattr(log, "events", None)
    if events is None:
        return
    yield _gauge("shardetcd_journal_nats_connected", "1 while the connection to NATS is up (0 while it reconnects: "
                 "writes wait).", 1 if log.connected else 0)
    yield _counter("shardetcd_journal_nats_disconnects", "Times the connection to NATS was lost.", events.disconnects)
    yield _counter("shardetcd_journal_nats_reconnects", "Times the connection to NATS was made again.", log.reconnects)
    yield _counter("shardetcd_journal_nats_errors", "Errors NATS or the connection reported (failed connects, "
                   "permissions violations, ...).", events.errors_total)
    if lease is not None:
        yield _counter("shardetcd_writer_lease_renewal_failures", "Renewals of the writer lease NATS did not "
                       "answer or refused (the lease lapses after --journal-lease-ttl without one).",
                       lease.renewal_failures)
        yield _counter("shardetcd_writer_lease_lapses", "Times the writer lease lapsed and was taken again (the "
                       "journals fenced again before the next write).", lease.lapses)


class _GcCollector:
    """The garbage collector's pauses (shards/collector.py): the event loop waits through each."""

    def collect(self):
        family = HistogramMetricFamily("shardetcd_gc_pause_seconds", "How long each run of the cyclic garbage "
                                       "collector took, by generation (2: a full collection).",
                                       labels=["generation"])
        for generation, (counts, total) in enumerate(zip(collector.Pauses.counts, collector.Pauses.sums)):
            family.add_metric([str(generation)], cumulative(collector.PAUSE_BUCKETS_S, list(counts)), total)
        yield family


class _GrpcCollector:
    """etcd's gRPC server metrics (go-grpc-prometheus), every method from the start."""

    def collect(self):
        labels = ["grpc_method", "grpc_service", "grpc_type"]
        started = CounterMetricFamily("grpc_server_started", "Total number of RPCs started on the server.",
                                      labels=labels)
        received = CounterMetricFamily("grpc_server_msg_received", "Total number of RPC stream messages received "
                                       "on the server.", labels=labels)
        sent = CounterMetricFamily("grpc_server_msg_sent", "Total number of gRPC stream messages sent by the server.",
                                   labels=labels)
        handled = CounterMetricFamily("grpc_server_handled", "Total number of RPCs completed on the server, "
                                      "regardless of success or failure.", labels=["grpc_code", *labels])
        handling = HistogramMetricFamily("grpc_server_handling_seconds", "Histogram of response latency (seconds) "
                                         "of gRPC that had been application-level handled by the server.",
                                         labels=labels)
        totals: dict[tuple[str, str, str], list] = {}
        for st in RPC_STATS:  # a server set up twice in one process (a takeover) adds its counts up
            t = totals.setdefault((st.method, st.service, st.kind),
                                  [0, 0, 0, [0] * len(GO_CODE_NAMES), [0] * len(st.took), 0.0])
            t[0] += st.started
            t[1] += st.received
            t[2] += st.sent
            t[3] = [a + b for a, b in zip(t[3], st.handled)]
            t[4] = [a + b for a, b in zip(t[4], st.took)]
            t[5] += st.took_sum
        for key, (n_started, n_received, n_sent, by_code, took, took_sum) in totals.items():
            started.add_metric(list(key), n_started)
            received.add_metric(list(key), n_received)
            sent.add_metric(list(key), n_sent)
            for name, n in zip(GO_CODE_NAMES, by_code):
                handled.add_metric([name, *key], n)
            handling.add_metric(list(key), cumulative(HANDLING_BUCKETS_S, took, go_float), took_sum)
        yield from (handled, received, sent, started)
        if Handling.on:  # --metrics=extensive, as etcd enables go-grpc-prometheus's histogram
            yield handling


class _StateCollector:
    def __init__(self, member) -> None:
        self.m = member

    def collect(self):
        m, store = self.m, self.m.store
        following = store.follower is not None
        yield _labelled("etcd_server_id", "Server or member ID in hexadecimal format.", "server_id", f"{m.member_id:x}")
        yield _labelled("etcd_server_version", "Which version is running.", "server_version", ETCD_API_VERSION)
        yield _labelled("etcd_cluster_version", "Which cluster version is running.", "cluster_version",
                        ETCD_API_VERSION.rsplit(".", 1)[0])
        yield _gauge("etcd_server_has_leader", "Whether a leader exists (always: no Raft).", 1)
        yield _counter("etcd_server_leader_changes_seen", "Leader changes seen (the writer this process started "
                       "with: 1, as etcd counts its first election).", 1)
        yield _gauge("etcd_server_proposals_pending", "Writes journaled but not yet committed.", store.pending_writes)
        yield _counter("etcd_server_proposals_failed", "Writes that failed: timed out waiting for the journal.",
                       store.proposals_failed)
        yield _counter("etcd_server_slow_apply", "Requests that took longer than "
                       "--experimental-warning-apply-duration (each logged).", Slow.count)
        yield _counter("etcd_server_read_indexes_failed", "Read index requests (a follower's linearizable reads "
                       "asking the writer its committed revision) that failed.", store.follow_stats.read_index_failures)
        yield _counter("etcd_server_slow_read_indexes", "Read index requests the writer answered after 500 ms or "
                       "more (etcd's ReadIndexRetryTime).", store.follow_stats.slow_read_indexes)
        yield _gauge("etcd_server_is_leader", "Whether this member is the leader (the writer).", 0 if following else 1)
        yield _gauge("etcd_server_is_learner", "Whether this member is a learner (never: no Raft).", 0)
        yield _gauge("etcd_disk_wal_write_bytes_total", "Journal bytes written (every shard's journal; a gauge, "
                     "as etcd declares it; a follower writes none).",
                     sum(getattr(shard.journal, "bytes_appended", 0) for shard in store.shards))
        yield _gauge("shardetcd_standby", "1 while this process stands by for the writer lease.",
                     1 if m.standing_by else 0)
        yield _gauge("etcd_server_quota_backend_bytes", "Backend quota in bytes.", m.quota.limit or 0)
        yield _gauge("etcd_mvcc_db_total_size_in_bytes", "State size, as etcd's backend file size.", store.db_size())
        yield _gauge("etcd_mvcc_db_total_size_in_use_in_bytes", "State bytes in use.", store.db_size_in_use())
        yield _gauge("etcd_mvcc_db_open_read_transactions", "Reads in flight across event-loop turns (large "
                     "ranges served in slices); a read answered within one turn is never open when this is read.",
                     store.reads_in_flight)
        yield _gauge("etcd_debugging_mvcc_keys_total", "Keys live at the latest revision.",
                     sum(len(s.live) for s in store.states))
        yield _gauge("etcd_debugging_mvcc_current_revision", "Committed revision.", store.committed)
        yield _gauge("etcd_debugging_mvcc_compact_revision", "Compacted revision.", max(store.compact_rev, 0))
        yield _gauge("etcd_debugging_mvcc_watcher_total", "Watchers.", store.hub.watcher_count)
        yield _gauge("shardetcd_leases", "Leases granted and not yet revoked or expired.", len(store.leases.leases))
        yield _counter("etcd_debugging_lease_renewed", "The number of renewed leases seen by the leader.", store.lease_renewals)
        yield from self._as_etcd_counts()
        requests = CounterMetricFamily("etcd_server_client_requests", "The total number of client requests per "
                                       "client version.", labels=("type", "client_api_version"))
        for (kind, version), n in list(ClientRequests.counts.items()):
            requests.add_metric((kind, version), n)
        yield requests
        yield _counter("etcd_network_client_grpc_received_bytes", "Bytes received from gRPC clients.", Traffic.received)
        yield _counter("etcd_network_client_grpc_sent_bytes", "Bytes sent to gRPC clients.", Traffic.sent)
        yield from self._per_shard()
        lease = m.lease
        yield from journal_connection(lease.log if lease is not None else getattr(m.link, "log", None), lease)
        if following:
            yield from self._follower()
        else:  # etcd's pair (raft indexes there; revisions here): committed - applied is the apply lag
            yield _gauge("etcd_server_proposals_committed_total", "Committed revision.", store.committed)
            yield _gauge("etcd_server_proposals_applied_total", "Applied revision.", store.committed)

    def _as_etcd_counts(self):
        """etcd's mvcc, lessor, watch and health counters, counted as etcd counts them
        (shards/counts.py); a follower counts the reads it serves, the writer the writes."""
        store = self.m.store
        c, hub = store.counts, store.hub
        yield _counter("etcd_mvcc_range", "Total number of ranges seen by this member.", c.ranges)
        yield _counter("etcd_mvcc_put", "Total number of puts seen by this member.", c.puts)
        yield _counter("etcd_mvcc_delete", "Total number of deletes seen by this member.", c.deletes)
        yield _counter("etcd_mvcc_txn", "Total number of txns seen by this member.", c.txns)
        yield _counter("etcd_debugging_mvcc_range", "Total number of ranges seen by this member.", c.ranges)
        yield _gauge("etcd_debugging_mvcc_total_put_size_in_bytes", "The total size of put kv pairs seen by "
                     "this member.", c.put_bytes)
        yield _counter("etcd_debugging_mvcc_events", "Total number of events sent by this member.",
                       hub.events_queued)
        yield _gauge("etcd_debugging_mvcc_pending_events_total", "Total number of pending events to be sent.",
                     hub.pending_events)
        yield _gauge("etcd_debugging_mvcc_slow_watcher_total", "Total number of unsynced slow watchers.",
                     hub.unsynced_count)
        yield _gauge("etcd_debugging_mvcc_watch_stream_total", "Total number of watch streams.", len(hub.streams))
        yield _counter("etcd_debugging_mvcc_db_compaction_keys", "Total number of db keys compacted.",
                       sum(state.rows_compacted for state in store.states))
        yield _gauge("etcd_debugging_mvcc_db_compaction_last", "The unix time of the last db compaction. "
                     "Resets to 0 on start.", c.compacted_at)
        yield _counter("etcd_debugging_lease_granted", "The total number of granted leases.", c.leases_granted)
        yield _counter("etcd_debugging_lease_revoked", "The total number of revoked leases.", c.leases_revoked)
        yield _counter("etcd_debugging_server_lease_expired", "The total number of expired leases.",
                       c.leases_expired)
        yield _gauge("etcd_debugging_auth_revision", "The current revision of auth store.",
                     store.auth.state.revision)
        yield _bare_counter("etcd_server_health_success", "The total number of successful health checks",
                            HealthChecks.success)
        yield _bare_counter("etcd_server_health_failures", "The total number of failed health checks",
                            HealthChecks.failures)
        yield _gauge("etcd_disk_defrag_inflight", "Whether or not defrag is active on the member. 1 means active, "
                     "0 means not.", 1 if Defragmenting.now else 0)
        yield _gauge("os_fd_used", "The number of used file descriptors.", len(os.listdir("/proc/self/fd")))
        yield _gauge("os_fd_limit", "The file descriptor limit.", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        max_vm = resource.getrlimit(resource.RLIMIT_AS)[0]
        yield _gauge("process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes.",
                     float(2**64) if max_vm == resource.RLIM_INFINITY else max_vm)

    def _follower(self):
        store = self.m.store
        stats = store.follow_stats
        applied = store.committed
        writer = max(stats.writer_rev, applied)
        yield _gauge("etcd_server_proposals_committed_total",
                     "The writer's committed revision, as last learned (etcd: the raft commit index).", writer)
        yield _gauge("etcd_server_proposals_applied_total", "Revision applied here (etcd: the raft applied index).",
                     applied)
        yield _gauge("shardetcd_follower_applied_revision", "Every revision up to this is applied here.", applied)
        yield _gauge("shardetcd_follower_writer_revision",
                     "The writer's committed revision as last learned (read index answers, forwarded answers, "
                     "the journal).", writer)
        yield _gauge("shardetcd_follower_lag_revisions", "Writer revision last learned minus applied revision.",
                     writer - applied)
        yield _gauge("shardetcd_follower_lag_seconds",
                     "How long ago the oldest journal message read but not yet applied was stored (0: none).",
                     store.follower.oldest_unapplied_s())
        yield _gauge("shardetcd_follower_last_apply_lag_seconds",
                     "The last journal message applied: from when the journal stored it to when it was applied.",
                     stats.last_lag_s)
        yield _counter("shardetcd_follower_resyncs", "State rebuilds from a checkpoint after falling behind "
                       "the journal (or diverging from it).", stats.resyncs)

    def _per_shard(self):
        store = self.m.store
        keys = GaugeMetricFamily("shardetcd_shard_keys", "Keys live in the shard.", labels=["shard"])
        writes = CounterMetricFamily("shardetcd_shard_writes", "Write records journaled.", labels=["shard"])
        jbytes = GaugeMetricFamily("shardetcd_shard_journal_bytes", "Journal bytes on disk.", labels=["shard"])
        watchers = GaugeMetricFamily("shardetcd_shard_watchers", "Range watchers following the shard.", labels=["shard"])
        ckpt_rev = GaugeMetricFamily("shardetcd_shard_checkpoint_revision", "Revision of the newest checkpoint this "
                                     "process wrote or loaded (0: none); the journal below it is released.",
                                     labels=["shard"])
        ckpts = CounterMetricFamily("shardetcd_shard_checkpoints", "Checkpoints this process wrote.", labels=["shard"])
        ckpt_failed = CounterMetricFamily("shardetcd_shard_checkpoint_failures", "Checkpoints that failed (logged "
                                          "with their error); the journal is kept until one is written.",
                                          labels=["shard"])
        for sid, shard in enumerate(store.shards):
            keys.add_metric([shard.name], len(shard.state.live))
            writes.add_metric([shard.name], shard.writes)
            jbytes.add_metric([shard.name], shard.journal.bytes_total)
            watchers.add_metric([shard.name], store.hub.range_watchers(sid))
            ckpt_rev.add_metric([shard.name], shard.checkpoint_rev)
            ckpts.add_metric([shard.name], shard.checkpoints_written)
            ckpt_failed.add_metric([shard.name], shard.checkpoint_failures)
        yield from (keys, writes, jbytes, watchers, ckpt_rev, ckpts, ckpt_failed)


class Metrics:
    def __init__(self, member) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StateCollector(member))
        self.registry.register(_GrpcCollector())
        self.registry.register(_GcCollector())
        # process_resident_memory_bytes, process_cpu_seconds_total, ... as etcd
        # exposes them (etcdctl check datascale reads the first)
        ProcessCollector(registry=self.registry)
        self.fsync = self._histogram("etcd_disk_wal_fsync_duration_seconds", "Journal batch write + fsync latency.",
                                     FSYNC_BUCKETS_S)
        # etcd's backend commit makes applied writes durable in bbolt; here the state is a cache
        # and a write is durable once its journal batch is: the same observation, under the name
        # etcd's dashboards and alerts (etcdHighCommitDurations) read for the backend's disk
        self.registry.register(_SameObservations(
            self.fsync, "etcd_disk_backend_commit_duration_seconds",
            "Journal batch write + fsync latency: the journal is the backend of record (the state is rebuilt from it)."))
        self.shard_batch = self._histogram("shardetcd_shard_journal_batch_seconds",
                                           "Journal batch write + fsync latency.", FSYNC_BUCKETS_S, ("shard",))
        self.shard_batch_bytes = self._histogram("shardetcd_shard_journal_batch_bytes",
                                                 "Bytes per journal batch (one fdatasync, or one JetStream message).",
                                                 BATCH_BYTES_BUCKETS, ("shard",))
        for shard in member.store.shards:
            shard.journal.on_batch = self._batch_observer(shard.name)
        self.apply_lag = self._histogram("shardetcd_follower_apply_lag_seconds",
                                         "Per journal message a follower applied: from when the journal stored it "
                                         "to when every revision in it was applied here.", LAG_BUCKETS_S)
        member.store.follow_stats.on_lag = self.apply_lag.observe
        member.store.on_lease_granted = self._histogram("etcd_debugging_lease_ttl_total",
                                                        "Bucketed histogram of lease TTLs.", LEASE_TTL_BUCKETS_S,
                                                        bound_text=go_float).observe
        member.store.on_compaction = self._compaction_observer()
        for timing in (DEFRAG_S, SNAPSHOT_S, HASH_S, HASH_REV_S):
            self.registry.register(timing)

    def _compaction_observer(self):
        """etcd's compaction timings, in whole milliseconds as etcd truncates them. etcd compacts its
        in-memory index in one pause, then the backend in batches of 1,000 revisions with a pause after
        each full one; a shardetcd compaction does both in time slices with a pause after each but the
        last: the index pause is the time all slices held the loop, the db pauses are those slices."""
        index = self._histogram("etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
                                "Bucketed histogram of index compaction pause duration.", exponential(0.5, 14),
                                bound_text=go_float)
        pause = self._histogram("etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds",
                                "Bucketed histogram of db compaction pause duration.", exponential(1, 13),
                                bound_text=go_float)
        total = self._histogram("etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
                                "Bucketed histogram of db compaction total duration.", exponential(100, 14),
                                bound_text=go_float)

        def observe(held: float, paused: list[float], seconds: float) -> None:
            index.observe(int(held * 1000))
            for s in paused:
                pause.observe(int(s * 1000))
            total.observe(int(seconds * 1000))

        return observe

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...],
                   labelnames: tuple[str, ...] = (), bound_text=floatToGoString) -> LoopHistogram:
        histogram = LoopHistogram(name, doc, buckets, labelnames, bound_text)
        self.registry.register(histogram)
        return histogram

    def _batch_observer(self, name: str):
        child, sizes = self.shard_batch.labels(name), self.shard_batch_bytes.labels(name)
        fsync = self.fsync

        def observe(nbytes: int, seconds: float) -> None:
            fsync.observe(seconds)
            child.observe(seconds)
            sizes.observe(nbytes)

        return observe


class _StandbyCollector:
    def __init__(self, status) -> None:
        self.status = status

    def collect(self):
        store = self.status.store
        yield _gauge("etcd_server_has_leader", "Whether a leader exists (a standby follows one).", 1)
        yield _gauge("etcd_server_is_leader", "Whether this member is the leader (a standby is not).", 0)
        yield _gauge("shardetcd_standby", "1 while this process stands by for the writer lease.", 1)
        yield _gauge("etcd_debugging_mvcc_current_revision", "Revision followed so far.",
                     store.committed if store is not None else 0)
        yield from journal_connection(self.status.log)


class StandbyMetrics:
    """What a standby's /metrics shows: its role, the revision it has followed, process metrics."""

    def __init__(self, status) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StandbyCollector(status))
        ProcessCollector(registry=self.registry)
