"""What the store did, counted as etcd's mvcc and lessor count it (their metrics).

etcd counts at its MVCC layer, once per *metrics transaction*: every read or write
transaction it opens on the store tallies its ranges, puts and deletes, and one whose
tally is more than one operation also counts as a txn (``etcd_mvcc_txn_total``). Its
requests open them so:

* Range: one read txn, one range; a Compact reads the key ``compaction`` for its
  header (one range); ``/health`` reads once;
* Put and DeleteRange: one write txn; a put that needs the previous value (prev_kv,
  ignore_value, ignore_lease) and a delete with prev_kv read it first (a range);
* Txn: the compares are read in a txn of their own (one range each, up to the first
  that fails), together with the reads that check ignore_value/ignore_lease puts on
  the chosen path; a Txn that can write then applies its chosen path in a second txn,
  a read-only one in the same;
* a lease revoked (or expired): one write txn, one delete per key it held;
* a watcher with prev_kv: one range per event it is sent whose previous value is read
  (every event but a key's creation);
* a Txn holding a nested txn is a write, whatever the nested one does.

The request path increments plain ints here; the metrics collector reads them when
scraped.
"""
from __future__ import annotations


class MvccCounts:
    __slots__ = ("ranges", "puts", "deletes", "txns", "put_bytes", "leases_granted", "leases_revoked",
                 "leases_expired", "rows_compacted", "compacted_at")

    def __init__(self) -> None:
        self.ranges = 0  # etcd_mvcc_range_total
        self.puts = 0  # etcd_mvcc_put_total
        self.deletes = 0  # etcd_mvcc_delete_total: DeleteRange operations (not keys)
        self.txns = 0  # etcd_mvcc_txn_total: metrics transactions of more than one operation
        self.put_bytes = 0  # etcd_debugging_mvcc_total_put_size_in_bytes: key + value of every put
        self.leases_granted = 0
        self.leases_revoked = 0  # expired ones included, as etcd counts them
        self.leases_expired = 0
        self.rows_compacted = 0  # etcd_debugging_mvcc_db_compaction_keys_total: revisions dropped
        self.compacted_at = 0  # unix seconds of the last compaction's end (0: none yet)
