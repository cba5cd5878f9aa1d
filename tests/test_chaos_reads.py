"""tests/chaos_reads.py's check: a linearizable read begun after a serializable one answered at a
lower revision is caught, wherever either was answered; reads that overlap, and stale serializable
reads, are not findings."""
from __future__ import annotations

import threading

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.chaos_reads import Read, check_reads, serial_reads


def test_reads_that_never_go_back_are_counted():
    serial = [Read(1.0, 1.1, 10, "f0"), Read(2.0, 2.1, 12, "f1"), Read(3.0, 3.1, 11, "f0")]  # the last one stale
    linear = [Read(0.5, 0.6, 9, "w"), Read(1.2, 1.3, 10, "w"), Read(2.2, 2.4, 12, "f0"), Read(3.2, 3.3, 12, "f1")]
    assert check_reads(serial, linear) == ("reads: 4 linearizable ones, 3 after a serializable one, none below what "
                                           "3 serializable ones had shown")


def test_a_linearizable_read_below_what_a_serializable_one_showed_before_it_is_a_finding():
    serial = [Read(1.0, 1.1, 10, "f0"), Read(2.0, 2.1, 13, "f1"), Read(3.0, 3.1, 11, "f0")]
    linear = [Read(1.2, 1.3, 10, "w"), Read(2.2, 2.4, 12, "f0")]
    with pytest.raises(AssertionError, match=r"through f0 begun at 2\.200 answered at revision 12, below revision 13 "
                                             r"that a serializable read through f1 had answered at by 2\.100"):
        check_reads(serial, linear)


def test_a_linearizable_read_begun_before_the_serializable_one_ended_may_be_lower():
    serial = [Read(1.0, 1.5, 13, "f1")]
    linear = [Read(1.4, 1.6, 12, "w")]  # began while the serializable read was in flight: either order is fine
    assert check_reads(serial, linear).startswith("reads: 1 linearizable ones, 0 after a serializable one")


def test_serial_reads_record_each_answer(shardetcd):
    """Against a real server: each answer's header revision, in time order, until stopped."""
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        rev = pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/r", value=b"1"), timeout=10).header.revision
    stop, seen = threading.Event(), []
    reader = threading.Thread(target=serial_reads, args=(shardetcd.endpoint, stop, [b"/registry/pods/r"], seen, 1))
    reader.start()
    stop.wait(0.3)
    stop.set()
    reader.join(10)
    assert seen and all(r.revision == rev and r.member == shardetcd.endpoint and r.start <= r.end for r in seen)
