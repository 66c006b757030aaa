#!/usr/bin/env python3
"""Reference values for the outward-rounded transcendentals of privmix_renyi::round,
computed with mpmath at 60 significant digits and printed to 50.

Each line is `function x value`: `x` is an f64 written so that it parses back to the
same double (Python's shortest round-trip repr), and `value` is ln(x), ln(1+x), e^x or
e^x - 1 of that exact double, to 50 significant digits (relative error below 1e-49).
The test (../round.rs) checks `*_down(x) <= value <= *_up(x)` in exact rational
arithmetic, with the fixture's own rounding allowed for.

Run from this folder:  python3 round_values.py > round_values.txt
(The output is committed; CI does not run Python.)
"""
import math
import random
import struct

from mpmath import mp, mpf

mp.dps = 60

rng = random.Random(20240611)


def f64(bits):
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def log_uniform(lo_exp, hi_exp):
    """A random double with a uniformly random binary exponent in [lo_exp, hi_exp]."""
    return math.ldexp(1.0 + rng.random(), rng.randint(lo_exp, hi_exp))


def emit(name, xs, fn):
    for x in xs:
        print(name, repr(x), mp.nstr(fn(mpf(x)), 50, min_fixed=1, max_fixed=0, strip_zeros=False))


ulp1 = 2.0 ** -52
# ln: the whole positive range, subnormals, and the neighbourhood of 1.
ln_x = [log_uniform(-1022, 1022) for _ in range(120)]
ln_x += [f64(b) for b in (1, 2, 3, 12345, 2**52 - 1, 2**52)]
ln_x += [1.0 + k * ulp1 for k in range(1, 9)] + [1.0 - k * ulp1 / 2 for k in range(1, 9)]
ln_x += [rng.uniform(0.5, 2.0) for _ in range(40)]
ln_x += [2.0, 10.0, 0.1, 1e-300, 1.7976931348623157e308, 2.2250738585072014e-308]
emit("ln", ln_x, mp.log)

# ln(1 + x): tiny arguments of both signs, the neighbourhood of -1, large ones.
l1p = [s * log_uniform(-1074 + 52, -1) for s in (1, -1) for _ in range(40)]
l1p += [-1.0 + k * ulp1 / 2 for k in range(1, 9)]
l1p += [log_uniform(0, 1020) for _ in range(30)]
l1p += [rng.uniform(-0.9, 3.0) for _ in range(30)]
l1p += [f64(1), -f64(1), 1e-20, -1e-20, 0.5, -0.5]
emit("ln_1p", l1p, mp.log1p)

# e^x and e^x - 1: the finite, non-saturated range, with tiny arguments of both signs
# and the edges of overflow and of the subnormal range.
ex = [rng.uniform(-745.0, 709.7) for _ in range(100)]
ex += [s * log_uniform(-1070, 3) for s in (1, -1) for _ in range(30)]
ex += [709.78, 709.782712893384, -708.39, -744.4, -745.13, 1.0, -1.0, 1e-300, -1e-300]
emit("exp", ex, mp.exp)
emit("exp_m1", ex, mp.expm1)
