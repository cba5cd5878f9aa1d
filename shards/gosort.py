"""Go's sort.Sort as etcd 3.5.1 runs it (built with Go 1.16): where elements tie, the order etcd returns.

Go's sort.Sort before Go 1.19 is not stable: a quicksort (Bentley-McIlroy pivoting,
median of three, Tukey's ninther above 40 elements, a scan for runs of elements equal to
the pivot), a heapsort past a depth limit, and below 13 elements one Shell pass of gap 6
then an insertion sort. Two ways etcd shows the resulting order of equal elements to
clients: a Range sorted by value, version, create or mod revision (keys that tie come
back in this order, which is neither key order nor its reverse), and the order in which a
role's permissions are checked. This module runs the same comparisons and swaps on a
Python list, so ties come out as etcd puts them; a differential test sorts random ranges
on a real etcd and here.
"""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


class _Sorter:
    __slots__ = ("v", "lt")

    def __init__(self, items: list, less: Callable[[object, object], bool]) -> None:
        self.v = items
        self.lt = less

    def less(self, i: int, j: int) -> bool:
        return self.lt(self.v[i], self.v[j])

    def swap(self, i: int, j: int) -> None:
        v = self.v
        v[i], v[j] = v[j], v[i]

    def insertion(self, a: int, b: int) -> None:
        for i in range(a + 1, b):
            j = i
            while j > a and self.less(j, j - 1):
                self.swap(j, j - 1)
                j -= 1

    def sift_down(self, lo: int, hi: int, first: int) -> None:
        root = lo
        while True:
            child = 2 * root + 1
            if child >= hi:
                return
            if child + 1 < hi and self.less(first + child, first + child + 1):
                child += 1
            if not self.less(first + root, first + child):
                return
            self.swap(first + root, first + child)
            root = child

    def heap(self, a: int, b: int) -> None:
        first, hi = a, b - a
        for i in range((hi - 1) // 2, -1, -1):
            self.sift_down(i, hi, first)
        for i in range(hi - 1, -1, -1):
            self.swap(first, first + i)
            self.sift_down(0, i, first)

    def median_of_three(self, m1: int, m0: int, m2: int) -> None:
        """Leaves the median of the three at m1 (data[m0] <= data[m1] <= data[m2])."""
        if self.less(m1, m0):
            self.swap(m1, m0)
        if self.less(m2, m1):
            self.swap(m2, m1)
            if self.less(m1, m0):
                self.swap(m1, m0)

    def pivot(self, lo: int, hi: int) -> tuple[int, int]:
        m = (lo + hi) >> 1
        if hi - lo > 40:  # Tukey's ninther
            s = (hi - lo) // 8
            self.median_of_three(lo, lo + s, lo + 2 * s)
            self.median_of_three(m, m - s, m + s)
            self.median_of_three(hi - 1, hi - 1 - s, hi - 1 - 2 * s)
        self.median_of_three(lo, m, hi - 1)
        pivot = lo
        a, c = lo + 1, hi - 1
        while a < c and self.less(a, pivot):
            a += 1
        b = a
        while True:
            while b < c and not self.less(pivot, b):  # data[b] <= pivot
                b += 1
            while b < c and self.less(pivot, c - 1):  # data[c-1] > pivot
                c -= 1
            if b >= c:
                break
            self.swap(b, c - 1)
            b += 1
            c -= 1
        protect = hi - c < 5
        if not protect and hi - c < (hi - lo) // 4:
            dups = 0
            if not self.less(pivot, hi - 1):  # data[hi-1] == pivot
                self.swap(c, hi - 1)
                c += 1
                dups += 1
            if not self.less(b - 1, pivot):  # data[b-1] == pivot
                b -= 1
                dups += 1
            if not self.less(m, pivot):  # data[m] == pivot
                self.swap(m, b - 1)
                b -= 1
                dups += 1
            protect = dups > 1
        if protect:  # many elements equal the pivot: gather them at [b, c)
            while True:
                while a < b and not self.less(b - 1, pivot):
                    b -= 1
                while a < b and self.less(a, pivot):
                    a += 1
                if a >= b:
                    break
                self.swap(a, b - 1)
                a += 1
                b -= 1
        self.swap(pivot, b - 1)
        return b - 1, c

    def quick(self, a: int, b: int, depth: int) -> None:
        while b - a > 12:
            if depth == 0:
                self.heap(a, b)
                return
            depth -= 1
            mlo, mhi = self.pivot(a, b)
            if mlo - a < b - mhi:
                self.quick(a, mlo, depth)
                a = mhi
            else:
                self.quick(mhi, b, depth)
                b = mlo
        if b - a > 1:
            for i in range(a + 6, b):  # one Shell pass, gap 6
                if self.less(i, i - 6):
                    self.swap(i, i - 6)
            self.insertion(a, b)


def go_sort(items: list[T], less: Callable[[T, T], bool]) -> list[T]:
    """Sort ``items`` in place as Go 1.16's sort.Sort would with this ``less``; returns it."""
    depth = 0
    i = len(items)
    while i > 0:
        depth += 1
        i >>= 1
    _Sorter(items, less).quick(0, len(items), depth * 2)
    return items
