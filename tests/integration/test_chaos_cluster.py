"""One round of each fault of tests/chaos_cluster.py against ``shardetcd cluster``: on three NATS
servers, two partitions, each two processes on one URL (one serving, one standing by) and a
follower; and on local journals, each partition one process and a follower of its data dir. The
faults kill, pause or hang a partition's processes (a hung one must be replaced within 30 s), or kill the supervisor (its processes must
stop with it; started again, it serves the same URLs). After each round every check of
tests/chaos.py holds on the chaos partition, and the other partition's client history is
linearizable and its members agree (``python -m tests.chaos --cluster [--journal local] --minutes N``
runs random rounds for longer, NATS faults among them)."""
from __future__ import annotations

from tests import chaos
from tests.chaos_cluster import CLUSTER_FAULTS, CLUSTER_LOCAL_FAULTS
from tests.integration.test_chaos import assert_every_round_checked

# the NATS faults but losing the quorum run in tests/integration/test_chaos.py
JETSTREAM = tuple(f for f in CLUSTER_FAULTS if f not in ("kill-nats", "pause-nats"))
LOCAL = ("kill-writer", "pause-writer", "hang-writer", "kill-member", "kill-supervisor")


def run_rounds(tmp_path, capsys, faults, *flags: str) -> list[str]:
    assert chaos.main(["--cluster", *flags, "--faults", ",".join(faults), "--seed", "0", "--dir", str(tmp_path),
                       "--server-args", "--checkpoint-journal-bytes 20000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert_every_round_checked(out, faults)
    other = [line for line in out if "the other partition's members agree: " in line]
    assert len(other) == len(faults), out
    back = [line for line in out if "the supervisor is back" in line]
    assert len(back) == 1, out
    return out


def test_one_round_of_each_fault_on_a_cluster_on_jetstream(tmp_path, capsys):
    out = run_rounds(tmp_path, capsys, JETSTREAM)
    verified = [line for line in out if "journal verify: all sound; acknowledged: main: writes up to" in line
                and "acknowledged: nodes: writes up to" in line]
    assert len(verified) == len(JETSTREAM), out
    replaced = [line for line in out if "main served a write " in line and line.endswith("was killed")]
    assert len(replaced) == 1, out  # hang-writer: the supervisor killed the hung writer


def test_one_round_of_faults_on_a_cluster_on_local_journals(tmp_path, capsys):
    assert set(LOCAL) <= set(CLUSTER_LOCAL_FAULTS)
    out = run_rounds(tmp_path, capsys, LOCAL, "--journal", "local")
    replaced = [line for line in out if "main served a write " in line and line.endswith("was killed")]
    assert len(replaced) == 1, out  # hang-writer: the supervisor found it silent and killed it
