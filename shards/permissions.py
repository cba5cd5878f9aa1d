"""Key permissions of one user, merged across their roles, and etcd's checks on them.

etcd puts every permission of every role a user has into two interval trees,
one for reading and one for writing (in the user's role order, sorted by
name, and each role's permission order, sorted by key), and asks two
questions:

- one key (a request without range_end): does the tree find an interval
  that holds the key?
- a range [key, range_end): do the intervals the tree visits as overlapping
  it, in order of their start, cover it without a gap from key to range_end?

Ends follow etcd's "affine" byte strings: the empty string sorts after every
other, so a range_end of "\\0" ("to the end of the keyspace") is stored as
the empty string, and a permission without range_end is the one key
[key, key + "\\0").

The answers are etcd 3.5.1's because the tree is etcd's: a red-black tree
ordered by interval start whose nodes carry the largest end below them, with
etcd's overlap test and its pruned walk. For well-formed permissions and
requests that is plain interval logic; for degenerate ones (a permission
[c, c) that grants nothing, a request range that is empty or inverted) etcd's
answer depends on the tree's shape, and so it does here. (etcd 3.5.1 accepts
such permissions; later releases refuse them.)

Worked example: a user whose roles grant READ on [a/, a0), on x, on [m, n)
and on [n, p)::

    read a/1                 a/1 is in [a/, a0)                     allowed
    read [a/, a1)            [a/, a0) stops short of a1              denied
    read [m, p)              [m, n) then [n, p): no gap, reaches p   allowed
    read [m, q)              reaches only p                          denied
    read [x, x\\0)           the key x                               allowed
    read from a/ (end "\\0")  nothing reaches the end of the keyspace  denied
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

READ, WRITE, READWRITE = 0, 1, 2  # authpb.Permission.Type


def _cmp(a: bytes, b: bytes) -> int:
    """Three-way comparison of affine byte strings (the empty one is the largest)."""
    if not a:
        return 0 if not b else 1
    if not b:
        return -1
    return (a > b) - (a < b)


def _relation(ab: bytes, ae: bytes, bb: bytes, be: bytes) -> int:
    """etcd's interval comparison of [ab, ae) with [bb, be): -1 when the first lies
    left of the second, 1 when it starts at or after the second's end, 0 otherwise
    (they overlap)."""
    if _cmp(ab, bb) < 0 and _cmp(ae, bb) <= 0:
        return -1
    if _cmp(ab, be) >= 0:
        return 1
    return 0


class _Node:
    __slots__ = ("begin", "end", "max", "left", "right", "parent", "red")

    def __init__(self, begin: bytes, end: bytes, nil: _Node | None) -> None:
        self.begin, self.end, self.max = begin, end, end
        self.left = self.right = self.parent = nil if nil is not None else self
        self.red = nil is not None


class IntervalTree:
    """An insert-only red-black interval tree, etcd's (pkg/adt) in behaviour: the
    same insertion, rotations, upkeep of each node's max end, and walks."""

    __slots__ = ("nil", "root")

    def __init__(self) -> None:
        self.nil = _Node(b"", b"", None)  # the shared leaf: black, its own children
        self.root = self.nil

    # -- building ---------------------------------------------------------

    def insert(self, begin: bytes, end: bytes) -> None:
        nil = self.nil
        z = _Node(begin, end, nil)
        parent, x = nil, self.root
        while x is not nil:  # equal starts go right
            parent = x
            x = x.left if _cmp(begin, x.begin) < 0 else x.right
        z.parent = parent
        if parent is nil:
            self.root = z
        else:
            if _cmp(begin, parent.begin) < 0:
                parent.left = z
            else:
                parent.right = z
            self._update_max(parent)
        self._fix_after_insert(z)

    def _update_max(self, x: _Node) -> None:
        """Recompute max ends upwards from x, stopping at the first node whose max holds."""
        nil = self.nil
        while x is not nil:
            m = x.end
            if x.left is not nil and _cmp(x.left.max, m) > 0:
                m = x.left.max
            if x.right is not nil and _cmp(x.right.max, m) > 0:
                m = x.right.max
            if _cmp(x.max, m) == 0:
                return
            x.max = m
            x = x.parent

    def _fix_after_insert(self, z: _Node) -> None:
        """Red-black repair after inserting z; `left` names the side z's parent hangs on
        (the two cases mirror each other)."""
        while z.parent.red:
            grand = z.parent.parent
            left = z.parent is grand.left
            uncle = grand.right if left else grand.left
            if uncle.red:
                uncle.red = z.parent.red = False
                grand.red = True
                z = grand
                continue
            if z is (z.parent.right if left else z.parent.left):
                z = z.parent
                self._rotate(z, left=left)
            z.parent.red = False
            z.parent.parent.red = True
            self._rotate(z.parent.parent, left=not left)
        self.root.red = False

    def _rotate(self, x: _Node, left: bool) -> None:
        """Move x down to the left (or right) of its right (or left) child, keeping max
        ends as etcd does: x first, then x's old parent, then the child now above x."""
        nil = self.nil
        y = x.right if left else x.left
        if y is nil:
            return
        if left:
            x.right = y.left
            y.left.parent = x
        else:
            x.left = y.right
            y.right.parent = x
        self._update_max(x)
        y.parent = x.parent
        if x.parent is nil:
            self.root = y
        else:
            if x is x.parent.left:
                x.parent.left = y
            else:
                x.parent.right = y
            self._update_max(x.parent)
        x.parent = y
        if left:
            y.left = x
        else:
            y.right = x
        self._update_max(y)

    # -- questions ----------------------------------------------------------

    def _visit(self, x: _Node, begin: bytes, end: bytes, fn: Callable[[_Node], bool]) -> bool:
        """Call fn on the nodes the walk finds overlapping [begin, end), in start order;
        False once fn asked to stop. The walk prunes as etcd's does."""
        if x is self.nil:
            return True
        r = _relation(begin, end, x.begin, x.end)
        if r < 0:
            return self._visit(x.left, begin, end, fn)
        if r > 0:
            if _relation(x.begin, x.max, begin, end) == 0:
                return self._visit(x.left, begin, end, fn) and self._visit(x.right, begin, end, fn)
            return True
        return self._visit(x.left, begin, end, fn) and fn(x) and self._visit(x.right, begin, end, fn)

    def intersects(self, begin: bytes, end: bytes) -> bool:
        """etcd's Intersects: a descent that follows the left subtree while its max end
        lies past begin."""
        nil, x = self.nil, self.root
        while x is not nil and _relation(begin, end, x.begin, x.end) != 0:
            x = x.left if x.left is not nil and _cmp(x.left.max, begin) > 0 else x.right
        return x is not nil

    def contains(self, begin: bytes, end: bytes) -> bool:
        """etcd's Contains: the visited intervals start at or before begin, leave no gap
        and reach end."""
        nodes: list[_Node] = []
        self._visit(self.root, begin, end, lambda n: nodes.append(n) or True)
        if not nodes or _cmp(nodes[0].begin, begin) > 0:
            return False
        reach = nodes[0].end
        for n in nodes[1:]:
            if _cmp(reach, n.begin) < 0:
                return False
            if _cmp(n.end, reach) > 0:
                reach = n.end
        return _cmp(reach, end) >= 0


def permission_interval(key: bytes, range_end: bytes) -> tuple[bytes, bytes]:
    """The interval etcd stores for a permission (or asks about for a request)."""
    if not range_end:
        return key, key + b"\x00"
    return key, b"" if range_end == b"\x00" else range_end


class UserPermissions:
    """One user's merged read and write intervals."""

    __slots__ = ("read", "write")

    def __init__(self, perms: Iterable[tuple[int, bytes, bytes]]) -> None:
        self.read = IntervalTree()
        self.write = IntervalTree()
        for kind, key, range_end in perms:  # etcd's order: roles by name, each role's by key
            begin, end = permission_interval(key, range_end)
            if kind in (READ, READWRITE):
                self.read.insert(begin, end)
            if kind in (WRITE, READWRITE):
                self.write.insert(begin, end)

    def allows(self, key: bytes, range_end: bytes, write: bool) -> bool:
        tree = self.write if write else self.read
        begin, end = permission_interval(key, range_end)
        return tree.contains(begin, end) if range_end else tree.intersects(begin, end)
