"""Reference values for the unit tests of accountant/src/special.rs.

Run: python3 tests/golden/special_values.py  (needs mpmath)
"""
import mpmath as m

m.mp.dps = 50
for x in [-3, 0, 1, 10, 25, 26, 100]:
    print(f"ln erfc({x}) =", m.nstr(m.log(m.erfc(x)), 20))
