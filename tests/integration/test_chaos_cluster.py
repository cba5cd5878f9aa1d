"""One round of each fault of tests/chaos_cluster.py against ``shardetcd cluster`` on three NATS
servers: two partitions, each two processes on one URL (one serving, one standing by) and a
follower, supervised; the faults kill or pause a partition's processes, or kill the supervisor
(its processes must stop with it; started again, it serves the same URLs). After each round every
check of tests/chaos.py holds on the chaos partition, and the other partition's client history is
linearizable and its members agree (``python -m tests.chaos --cluster --minutes N`` runs random
rounds for longer)."""
from __future__ import annotations

from tests import chaos
from tests.chaos_cluster import CLUSTER_FAULTS
from tests.integration.test_chaos import assert_every_round_checked


def test_one_round_of_each_fault_on_a_cluster(tmp_path, capsys):
    assert chaos.main(["--cluster", "--faults", ",".join(CLUSTER_FAULTS), "--seed", "0", "--dir", str(tmp_path),
                       "--server-args", "--checkpoint-journal-bytes 20000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert_every_round_checked(out, CLUSTER_FAULTS)
    other = [line for line in out if "the other partition's members agree: " in line]
    assert len(other) == len(CLUSTER_FAULTS), out
    verified = [line for line in out if "journal verify: all sound; acknowledged: main: writes up to" in line
                and "acknowledged: nodes: writes up to" in line]
    assert len(verified) == len(CLUSTER_FAULTS), out
    back = [line for line in out if "the supervisor is back" in line]
    assert len(back) == 1, out
