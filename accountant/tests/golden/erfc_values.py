"""erfc reference values (mpmath, 40 digits) for the libm-accuracy check in
accountant/src/special.rs. Writes tests/golden/erfc_values.txt: `x erfc(x)` per
line, x on a grid over [-6, 26] that includes non-dyadic points.

Run: python3 tests/golden/erfc_values.py > tests/golden/erfc_values.txt
"""
import mpmath as mp

mp.mp.dps = 40
i = 0
while (x := -6.0 + 0.0371 * i) <= 26.0:
    print(repr(x), mp.nstr(mp.erfc(mp.mpf(x)), 25))
    i += 1
