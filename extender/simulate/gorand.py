"""Go's `math/rand` (the pre-1.20 global source), reimplemented so FGD's workloads can be rebuilt.

FGD's simulator shuffles, tunes and ranks with Go's `math/rand` seeded 42..51; the same stream gives
the same arrival order and node ranks, so our per-seed runs are comparable to FGD's cached ones.

The source is an additive lagged Fibonacci generator (x[n] = x[n-607] + x[n-273] mod 2^64). Its
seeding XORs a Lehmer-generator stream into `rngCooked`, a table Go ships as the state of the same
generator seeded with 1 after 7.8e12 steps. We do not copy that table: we derive it. The recurrence is
linear, so the state after N steps is (x^N mod P(x)) applied to the initial state, with
P(x) = x^607 - x^334 - 1 over Z/2^64; square-and-multiply needs ~43 polynomial squarings.
The top bit of the table does not matter for `Int63` (carries only move upwards), so we keep 64 bits.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

_LEN = 607
_TAP = 273
_M = (1 << 31) - 1
_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_COOK_STEPS = 7_800_000_000_000


def _seedrand(x: int) -> int:
    """One step of the Lehmer generator x -> 48271 x mod (2^31 - 1) (Schrage's method, as Go)."""
    hi, lo = divmod(x, 44488)
    x = 48271 * lo - 3399 * hi
    return x + _M if x < 0 else x


def _seed_values(seed: int, shifts: tuple[int, int]) -> list[int]:
    """The 607 seeding words Go builds from `seed` (shifts 20/10 for the table, 40/20 for Seed)."""
    seed %= _M
    if seed == 0:
        seed = 89482311
    x = seed
    out = [0] * _LEN
    for i in range(-20, _LEN):
        x = _seedrand(x)
        if i >= 0:
            u = x << shifts[0]
            x = _seedrand(x)
            u ^= x << shifts[1]
            x = _seedrand(x)
            u ^= x
            out[i] = u & _MASK64
    return out


def _polymulmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a*b mod (x^607 - x^334 - 1), coefficients mod 2^64 (uint64 wraps)."""
    prod = np.zeros(2 * _LEN - 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in np.nonzero(a)[0]:
            prod[i : i + _LEN] += a[i] * b
        coef = [int(c) for c in prod]
    for d in range(2 * _LEN - 2, _LEN - 1, -1):  # x^d = x^(d-273) + x^(d-607)
        c = coef[d]
        if c:
            coef[d - _TAP] = (coef[d - _TAP] + c) & _MASK64
            coef[d - _LEN] = (coef[d - _LEN] + c) & _MASK64
    return np.array(coef[:_LEN], dtype=np.uint64)


def _xpow(n: int) -> np.ndarray:
    """x^n mod P(x)."""
    result = np.zeros(_LEN, dtype=np.uint64)
    result[0] = 1
    base = np.zeros(_LEN, dtype=np.uint64)
    base[1] = 1
    while n:
        if n & 1:
            result = _polymulmod(result, base)
        n >>= 1
        if n:
            base = _polymulmod(base, base)
    return result


def _advance(vec: list[int], steps: int) -> list[int]:
    """The generator's array after `steps` draws from `vec` (tap=0, feed=334), without drawing.

    Sequence view: y[t] is the value written at draw t; y[t] = y[t-607] + y[t-273], and the initial
    array gives y[s] = vec[(334 - s) % 607] for s in -606..0. After N >= 607 draws, array position
    (334 - t) % 607 holds y[t] for t in N-606..N. With z[i] = y[i-606], z[n] = sum_j c_j z[j] where
    x^n mod P = sum_j c_j x^j.
    """
    if steps < _LEN:
        raise ValueError("jump-ahead needs at least 607 steps")
    z0 = np.array([vec[(334 - (i - 606)) % _LEN] for i in range(_LEN)], dtype=np.uint64)
    out = [0] * _LEN
    poly = _xpow(steps)  # z index N corresponds to y[N-606]
    for k in range(_LEN):  # t = steps - 606 + k
        t = steps - 606 + k
        with np.errstate(over="ignore"):
            value = int(np.sum(poly * z0, dtype=np.uint64))
        out[(334 - t) % _LEN] = value
        # multiply by x: shift up, reduce x^607 = x^334 + 1
        top = poly[_LEN - 1]
        poly = np.concatenate((np.zeros(1, dtype=np.uint64), poly[:-1]))
        with np.errstate(over="ignore"):
            poly[0] += top
            poly[_LEN - _TAP] += top
    return out


@lru_cache(maxsize=1)
def cooked_table() -> tuple[int, ...]:
    """Go's `rngCooked`: the seed-1 generator's array after 7.8e12 draws (computed, ~1 s)."""
    return tuple(_advance(_seed_values(1, (20, 10)), _COOK_STEPS))


class GoRand:
    """`rand.New(rand.NewSource(seed))` with the methods FGD's simulator calls, bit-exact."""

    def __init__(self, seed: int) -> None:
        cooked = cooked_table()
        self._vec = [(u ^ c) & _MASK64 for u, c in zip(_seed_values(seed, (40, 20)), cooked, strict=True)]
        self._tap = 0
        self._feed = _LEN - _TAP

    def uint64(self) -> int:
        self._tap = self._tap - 1 if self._tap else _LEN - 1
        self._feed = self._feed - 1 if self._feed else _LEN - 1
        x = (self._vec[self._feed] + self._vec[self._tap]) & _MASK64
        self._vec[self._feed] = x
        return x

    def int63(self) -> int:
        return self.uint64() & _MASK63

    def go_int(self) -> int:
        """`rand.Int()` on a 64-bit platform."""
        return self.int63()

    def int31(self) -> int:
        return self.int63() >> 32

    def uint32(self) -> int:
        return self.int63() >> 31

    def int63n(self, n: int) -> int:
        if n <= 0:
            raise ValueError("invalid argument to int63n")
        if n & (n - 1) == 0:
            return self.int63() & (n - 1)
        maximum = (1 << 63) - 1 - (1 << 63) % n
        v = self.int63()
        while v > maximum:
            v = self.int63()
        return v % n

    def int31n(self, n: int) -> int:
        if n <= 0:
            raise ValueError("invalid argument to int31n")
        if n & (n - 1) == 0:
            return self.int31() & (n - 1)
        maximum = (1 << 31) - 1 - (1 << 31) % n
        v = self.int31()
        while v > maximum:
            v = self.int31()
        return v % n

    def intn(self, n: int) -> int:
        if n <= 0:
            raise ValueError("invalid argument to intn")
        return self.int31n(n) if n <= _M else self.int63n(n)

    def _int31n_lemire(self, n: int) -> int:
        """Go's unexported `int31n` (Lemire's multiply-shift), used by Shuffle."""
        v = self.uint32()
        prod = v * n
        low = prod & 0xFFFFFFFF
        if low < n:
            thresh = ((1 << 32) - n) % n
            while low < thresh:
                v = self.uint32()
                prod = v * n
                low = prod & 0xFFFFFFFF
        return prod >> 32

    def shuffle_indices(self, n: int) -> list[int]:
        """`rand.Shuffle(n, swap)` applied to [0..n): the permuted index list."""
        order = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.int63n(i + 1) if i > _M - 1 else self._int31n_lemire(i + 1)
            order[i], order[j] = order[j], order[i]
        return order

    def perm(self, n: int) -> list[int]:
        """`rand.Perm(n)`."""
        m = [0] * n
        for i in range(n):
            j = self.intn(i + 1)
            m[i] = m[j]
            m[j] = i
        return m

    def float64(self) -> float:
        """`rand.Float64()` (Go 1.x: retry on 1.0)."""
        while True:
            f = self.int63() / (1 << 63)
            if f != 1.0:
                return f
