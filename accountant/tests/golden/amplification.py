"""Golden values for tests/integration/upstream.rs: subsampling bounds and events.

Independent sources, each named beside its numbers:
  * dp_accounting 0.4.4 (`_compute_rdp_sample_wor_gaussian`, Wang, Balle &
    Kasiviswanathan, "Subsampled Renyi Differential Privacy and Analytical
    Moments Accountant", arXiv:1808.00087, Thm 27);
  * mpmath (50 digits) evaluations of the closed forms:
      - Zhu & Wang, "Poisson Subsampled Renyi Differential Privacy" (ICML 2019),
        Thm 6, the tight Poisson bound for a general curve (restated as Thm A.4
        of Flemings et al., "Adaptively Private Next-Token Prediction of Large
        Language Models", arXiv:2410.02016),
      - arXiv:1808.00087 Thm 9 (sampling without replacement),
      - PMixED's per-query bound (arXiv:2410.02016, Thm 3.1, eq. 2),
        m = max(members, 2),
      - the Laplace mechanism's RDP (Mironov, "Renyi Differential Privacy",
        arXiv:1702.07476, Prop. 6) as a non-Gaussian base curve.

Run: python3 tests/golden/amplification.py
"""
import mpmath as mp

from dp_accounting.rdp import rdp_privacy_accountant as rdp

mp.mp.dps = 50


def laplace_rdp(alpha, b):
    """Mironov, arXiv:1702.07476, Prop. 6: Laplace mechanism with scale b, sensitivity 1."""
    a = mp.mpf(alpha)
    return mp.log(a / (2 * a - 1) * mp.exp((a - 1) / b) + (a - 1) / (2 * a - 1) * mp.exp(-a / b)) / (a - 1)


def zhu_wang(alpha, q, eps):
    """Tight Poisson subsampling at integer alpha (Zhu & Wang (ICML 2019); adapmixed Thm A.4)."""
    q = mp.mpf(q)
    a = (1 - q) ** (alpha - 1) * (1 + (alpha - 1) * q)
    for j in range(2, alpha + 1):
        a += mp.binomial(alpha, j) * q**j * (1 - q) ** (alpha - j) * mp.exp((j - 1) * eps(j))
    return mp.log(a) / (alpha - 1)


def wbk_thm9(alpha, q, eps):
    """WBK (arXiv:1808.00087) Thm 9 with eps(inf) = inf."""
    q = mp.mpf(q)
    a = 1 + q**2 * mp.binomial(alpha, 2) * min(4 * mp.expm1(eps(2)), 2 * mp.exp(eps(2)))
    for j in range(3, alpha + 1):
        a += q**j * mp.binomial(alpha, j) * 2 * mp.exp((j - 1) * eps(j))
    return mp.log(a) / (alpha - 1)


def pmixed(alpha, beta, m):
    m = max(m, 2)
    a, beta = mp.mpf(alpha), mp.mpf(beta)
    return mp.log((m - 1 + mp.exp(4 * beta * a * (a - 1))) / m) / (a - 1)


print("# Zhu-Wang Poisson, Laplace base b=2, q=0.05: (alpha, eps')")
for alpha in [2, 3, 5, 10, 32]:
    print(alpha, mp.nstr(zhu_wang(alpha, 0.05, lambda j: laplace_rdp(j, 2)), 20))

print("# WBK Thm 9, Laplace base b=2, q=0.05: (alpha, eps')")
for alpha in [2, 3, 5, 10, 32]:
    print(alpha, mp.nstr(wbk_thm9(alpha, 0.05, lambda j: laplace_rdp(j, 2)), 20))

print("# Laplace base curve b=2 at those orders")
for alpha in [2, 3, 5, 10, 32]:
    print(alpha, mp.nstr(laplace_rdp(alpha, 2), 20))

print("# dp_accounting WOR Gaussian (Thm 27), q=0.01, sigma=1.5")
orders = [2, 3, 4.5, 8, 16, 64, 255, 256, 300]
for o, v in zip(orders, rdp._compute_rdp_sample_wor_gaussian(0.01, 1.5, orders)):
    print(o, repr(float(v)))
print("# dp_accounting WOR Gaussian (Thm 27), q=0.2, sigma=0.8")
for o, v in zip(orders, rdp._compute_rdp_sample_wor_gaussian(0.2, 0.8, orders)):
    print(o, repr(float(v)))

print("# PMixED Thm 3.1, alpha=18, beta=0.001: (m, eps)")
for m in [1, 2, 10, 100]:
    print(m, mp.nstr(pmixed(18, 0.001, m), 20))
print("# PMixED subsampled (Zhu-Wang over the m=2 bound), beta=0.01, q=0.1: (alpha, eps')")
for alpha in [2, 4, 18]:
    print(alpha, mp.nstr(zhu_wang(alpha, 0.1, lambda j: pmixed(j, 0.01, 2)), 20))
print("# DPS-MOZO token 4*beta*alpha, beta=0.05, WOR q=4/1000 (Thm 9): (alpha, eps')")
for alpha in [2, 4, 8, 32]:
    print(alpha, mp.nstr(wbk_thm9(alpha, mp.mpf(4) / 1000, lambda j: 4 * mp.mpf("0.05") * j), 20))
