"""The auth store in-process: permission math, the record and table formats,
durability before visibility, and recovery through checkpoints."""
from __future__ import annotations

import asyncio

import pytest

from journal.verify import verify
from shards import errors as e
from shards.auth import AuthStore, decode_auth_record, decode_table, encode_auth_record, encode_table
from shards.auth_state import ROLE_ADD, USER_ADD, AuthState, Permission
from shards.permissions import READ, READWRITE, WRITE, UserPermissions
from shards.record import decode_extra_meta, encode_extra_meta
from shards.tokens import SimpleTokens, decode_token_record
from shards.types import PutReq
from tests.shards.store_helpers import open_store


def test_permissions_worked_example():
    """The example in permissions.py's docstring."""
    p = UserPermissions([(READ, b"a/", b"a0"), (READ, b"x", b""), (READ, b"m", b"n"), (READ, b"n", b"p")])
    read = lambda key, end=b"": p.allows(key, end, write=False)
    assert read(b"a/1") and not read(b"a/", b"a1")
    assert read(b"m", b"p") and not read(b"m", b"q")
    assert read(b"x", b"x\x00") and not read(b"a/", b"\x00")
    assert not p.allows(b"a/1", b"", write=True)


@pytest.mark.parametrize("kind, key, end", [(READ, b"", b""), (READ, b"b", b"a"), (READ, b"b", b"b"), (7, b"x", b"")])
def test_permissions_that_grant_nothing(kind, key, end):
    p = UserPermissions([(kind, key, end)])
    for k, e_ in ((b"x", b""), (b"b", b""), (b"a", b"c"), (b"\x00", b"\x00")):
        assert not p.allows(k, e_, False) and not p.allows(k, e_, True)


def test_an_inverted_request_range_follows_the_shape_of_etcds_tree():
    """etcd 3.5.1's answers (test_random_roles_and_permissions_match_etcd found them): a read
    of the inverted range [c, b0) is allowed to a user with READ on the key c, and denied
    once the role also holds the empty permission [c, c) (stored before c: same key, sorted
    stably), because etcd's tree walk then prunes the node holding c."""
    point = UserPermissions([(READ, b"c", b"")])
    both = UserPermissions([(READ, b"c", b"c"), (READ, b"c", b"")])
    assert point.allows(b"c", b"b0", False) and point.allows(b"c", b"a0", False)
    assert not both.allows(b"c", b"b0", False) and not both.allows(b"c", b"c", False)
    assert both.allows(b"c", b"", False)  # the key itself still reads
    # well-formed ranges are plain interval logic whatever the order of insertion
    for perms in ([(READ, b"a", b"b"), (READ, b"b", b"c")], [(READ, b"b", b"c"), (READ, b"a", b"b")]):
        p = UserPermissions(perms)
        assert p.allows(b"a", b"c", False) and not p.allows(b"a", b"c0", False)


def test_many_permissions_keep_a_balanced_tree():
    """Insertion keeps red-black order: a user with many permissions gets its answers from
    a tree of logarithmic height (etcd's), not a list."""
    perms = [(READ, b"k%04d" % i, b"k%04d" % (i + 1)) for i in range(0, 2000, 2)]
    p = UserPermissions(perms)

    def height(n):
        return 0 if n is p.read.nil else 1 + max(height(n.left), height(n.right))

    assert height(p.read.root) <= 2 * 11  # 2 log2(1000 + 1)
    assert p.allows(b"k0000", b"k0001", False) and not p.allows(b"k0000", b"k0002", False)
    assert p.allows(b"k1998x", b"", False) and not p.allows(b"k1999x", b"", False)


def test_readwrite_and_to_the_end_of_the_keyspace():
    p = UserPermissions([(READWRITE, b"z", b"\x00"), (WRITE, b"w", b"")])
    assert p.allows(b"zz", b"\x00", False) and p.allows(b"z", b"\x00", True) and not p.allows(b"y", b"\x00", False)
    assert p.allows(b"w", b"", True) and not p.allows(b"w", b"", False)


def test_record_and_table_round_trip():
    fields = (b"alice", b"$2b$04$hash", b"0")
    assert decode_auth_record(encode_auth_record(7, USER_ADD, fields)) == (7, USER_ADD, fields)
    s = AuthState()
    for op, f in ((USER_ADD, (b"root", b"h", b"0")), (USER_ADD, (b"carol", b"", b"1")), (ROLE_ADD, (b"r",))):
        s.apply(op, f)
    s.apply(10, (b"r", b"2", b"\xff\x00key", b"\x00"))  # ROLE_GRANT with bytes that are not UTF-8
    s.seq = 4
    back = decode_table(encode_table(s))
    assert (back.users, back.roles, back.revision, back.seq, back.enabled) == (s.users, s.roles, s.revision, 4, False)
    assert back.roles["r"].perms == (Permission(2, b"\xff\x00key", b"\x00"),)
    assert decode_extra_meta(encode_extra_meta(b"L" * 32, b"A")) == (b"L" * 32, b"A")
    assert decode_extra_meta(b"\x01" * 32) == (b"\x01" * 32, b"")  # a checkpoint from before auth


class SlowJournal:
    """A journal whose writes become durable when the test says so."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.durable = asyncio.Event()

    async def __call__(self, payload: bytes) -> None:
        self.records.append(payload)
        await self.durable.wait()


def test_a_change_is_visible_only_once_durable_and_checkpoints_include_it(run):
    async def go():
        journal = SlowJournal()
        auth = AuthStore(journal, bcrypt_cost=4)
        adding = asyncio.ensure_future(auth.role_add("r"))
        await asyncio.sleep(0.01)
        assert journal.records and "r" not in auth.state.roles  # journaled, not yet durable: not visible
        assert "r" in decode_table(auth.encode_table()).roles  # but a checkpoint taken now has it
        journal.durable.set()
        assert await adding is True and "r" in auth.state.roles and auth.state.revision == 2
        with pytest.raises(e.RoleExistsError):
            await auth.role_add("r")
        assert len(journal.records) == 1  # a refused change is not journaled

    run(go())


def test_a_caller_going_away_does_not_split_memory_from_disk(run):
    async def go():
        journal = SlowJournal()
        auth = AuthStore(journal, bcrypt_cost=4)
        adding = asyncio.ensure_future(auth.role_add("r"))
        await asyncio.sleep(0.01)
        adding.cancel()  # the client disconnects while the change is being made durable
        journal.durable.set()
        await asyncio.sleep(0.01)
        assert "r" in auth.state.roles  # the journaled change still takes effect

    run(go())


def test_replay_applies_only_changes_after_the_table(run):
    async def go():
        journal = SlowJournal()
        journal.durable.set()
        auth = AuthStore(journal, bcrypt_cost=4)
        await auth.role_add("a")
        table = auth.encode_table()
        await auth.role_add("b")
        fresh = AuthStore(journal, bcrypt_cost=4)
        fresh.load_table(table)
        for payload in journal.records:  # the record of "a" is in the table already
            fresh.replay(payload)
        assert sorted(fresh.state.roles) == ["a", "b"] and fresh.state.revision == auth.state.revision == 3

    run(go())


def test_tokens_expire_unless_used_and_end_with_their_user():
    now = [0.0]
    tokens = SimpleTokens(ttl_s=10, clock=lambda: now[0])
    t = tokens.assign("alice")
    prefix, index = t.split(".")
    assert len(prefix) == 16 and prefix.isalpha() and index.isdigit()
    now[0] = 9
    assert tokens.user(t) == "alice"  # renewed until 19
    now[0] = 18
    assert tokens.user(t) == "alice"
    now[0] = 28.5
    assert tokens.user(t) is None
    t2, t3 = tokens.assign("bob"), tokens.assign("carol")
    tokens.invalidate_user("bob")
    assert tokens.user(t2) is None and tokens.user(t3) == "carol"


def test_store_restart_through_checkpoints_keeps_auth(tmp_path, run):
    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=8 * 1024, bcrypt_cost=4)
        auth = store.auth
        await auth.user_add("root", "pw", False)
        await auth.user_grant("root", "root")
        for i in range(60):  # keys of the default shard, whose journal holds the auth records
            await store.put(PutReq(b"/app/k%d" % i, b"x" * 300))
            if i % 20 == 0:
                await auth.role_add(f"role{i}")
        await auth.enable()
        await auth.role_grant("role0", Permission(READ, b"a", b"b"))
        state = auth.state
        await store.close()
        # the segment holding the first auth records (tagged revision 1) is gone: they come back from a checkpoint
        first_revs = [r.first_rev for r in verify(tmp_path / "data" / "shards" / "default" / "journal") if r.first_rev]
        assert min(first_revs) > 1

        store = await open_store(tmp_path, checkpoint_journal_bytes=8 * 1024, bcrypt_cost=4)
        back = store.auth.state
        assert (back.users, back.roles, back.revision, back.enabled, back.seq) == \
            (state.users, state.roles, state.revision, True, state.seq)
        assert store.auth.enabled
        assert await store.auth.authenticate("root", "pw")
        await store.close()

    run(go())


def test_simple_tokens_are_journaled_and_a_follower_learns_and_ends_them(run):
    """Authenticate answers once the token's record is durable; a follower applying
    the writer's records in journal order knows the token, renews it on its own
    clock, and a password change journaled after it ends it there too."""
    async def go():
        journal, tokens = SlowJournal(), []
        durable = asyncio.Event()

        def journal_token(payload: bytes):
            tokens.append(payload)  # appended at once, in journal order with the changes
            return durable.wait()

        writer = AuthStore(journal, bcrypt_cost=4, journal_token=journal_token)
        journal.durable.set()
        await writer.user_add("root", "pw", False)
        await writer.user_grant("root", "root")
        await writer.enable()
        authenticating = asyncio.ensure_future(writer.authenticate("root", "pw"))
        while not tokens:
            await asyncio.sleep(0.01)
        assert not authenticating.done()  # not answered before the record is durable
        durable.set()
        token = await authenticating
        assert writer.user_of(token) == "root" and decode_token_record(tokens[0]) == (token, "root")

        now = [0.0]
        follower = AuthStore(journal, bcrypt_cost=4, tokens=SimpleTokens(ttl_s=10, clock=lambda: now[0]))
        for payload in journal.records:
            follower.replay(payload)
        follower.learn_token(tokens[0])
        assert follower.user_of(token) == "root" and follower.tokens.known(token)
        assert follower.tokens.assign("root").endswith(".%d" % (int(token.rpartition(".")[2]) + 1))
        await writer.user_password("root", "pw2", "")
        follower.replay(journal.records[-1])
        for auth in (writer, follower):
            with pytest.raises(e.InvalidAuthTokenError):
                auth.user_of(token)

    run(go())
