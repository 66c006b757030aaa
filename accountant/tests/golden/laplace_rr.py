"""Golden RDP values for the Laplace mechanism and k-ary randomized response
(accountant/src/event/laplace, accountant/src/event/randomized_response;
checked by tests/integration/closed_forms.rs).

Two independent computations of each, in 50-digit mpmath, that must agree:
  * Laplace, scale b, centres 0 and 1: numerical quadrature of
    D_a = ln( integral p(x)^a q(x)^(1-a) dx ) / (a - 1), and the closed form of
    Mironov, "Renyi Differential Privacy", arXiv:1702.07476, Prop. 6:
    ln( a/(2a-1) e^((a-1)/b) + (a-1)/(2a-1) e^(-a/b) ) / (a - 1).
  * Randomized response, parameter eps, k categories: the Renyi divergence of
    the two categorical output distributions P = (p, q, q, ...),
    Q = (q, p, q, ...) with p = e^eps/(e^eps + k - 1), q = 1/(e^eps + k - 1),
    summed term by term; for k = 2 also arXiv:1702.07476, Prop. 5 in p.

Run: python3 tests/golden/laplace_rr.py > tests/golden/laplace_rr.out
"""
import mpmath as mp

mp.mp.dps = 50


def laplace_quad(b, a):
    b, a = mp.mpf(b), mp.mpf(a)

    def dens(x, mu):
        return mp.exp(-abs(x - mu) / b) / (2 * b)

    def f(x):
        return dens(x, 0) ** a * dens(x, 1) ** (1 - a)

    # Kinks at 0 and 1; the tails decay like exp(-|x|/b).
    total = mp.quad(f, [-mp.inf, 0, 1, mp.inf])
    return mp.log(total) / (a - 1)


def laplace_prop6(b, a):
    b, a = mp.mpf(b), mp.mpf(a)
    inner = a / (2 * a - 1) * mp.exp((a - 1) / b) + (a - 1) / (2 * a - 1) * mp.exp(-a / b)
    return mp.log(inner) / (a - 1)


def rr_categorical(eps, k, a):
    eps, a = mp.mpf(eps), mp.mpf(a)
    n = mp.exp(eps) + k - 1
    p, q = mp.exp(eps) / n, 1 / n
    P = [p, q] + [q] * (k - 2)
    Q = [q, p] + [q] * (k - 2)
    return mp.log(mp.fsum(x**a * y ** (1 - a) for x, y in zip(P, Q))) / (a - 1)


def rr_prop5(eps, a):
    eps, a = mp.mpf(eps), mp.mpf(a)
    p = mp.exp(eps) / (mp.exp(eps) + 1)
    return mp.log(p**a * (1 - p) ** (1 - a) + (1 - p) ** a * p ** (1 - a)) / (a - 1)


print("# laplace scale alpha rdp")
for b in ["0.1", "0.5", "1", "2", "10", "1000"]:
    for a in ["1.01", "1.5", "2", "3.5", "8", "64"]:
        quad, closed = laplace_quad(b, a), laplace_prop6(b, a)
        assert abs(quad - closed) <= mp.mpf("1e-25") * closed, (b, a, quad, closed)
        print("laplace", b, a, mp.nstr(closed, 25))
print("# rr epsilon categories alpha rdp")
for eps in ["0.01", "0.5", "1", "3", "8"]:
    for k in [2, 3, 10, 1000]:
        for a in ["1.01", "1.5", "2", "5", "32", "256"]:
            cat = rr_categorical(eps, k, a)
            if k == 2:
                p5 = rr_prop5(eps, a)
                assert abs(cat - p5) <= mp.mpf("1e-40") * cat, (eps, a, cat, p5)
            print("rr", eps, k, a, mp.nstr(cat, 25))
