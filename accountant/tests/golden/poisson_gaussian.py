"""Golden values for the Poisson-subsampled Gaussian (accountant/src/poisson*, tests/integration/upstream.rs).

Two independent sources:
  * mpmath quadrature of A_alpha = E_{z~N(0,s^2)}[((1-q) + q exp((2z-1)/(2 s^2)))^alpha]
    (the same integral dp_accounting's own test `_compute_a_mp` uses), 40 digits;
  * dp_accounting 0.4.4 `_compute_rdp_poisson_subsampled_gaussian` / `_compute_log_a`.

Run: python3 tests/golden/poisson_gaussian.py
"""
import mpmath as mp

from dp_accounting.rdp import rdp_privacy_accountant as rdp

mp.mp.dps = 40


def log_a_mp(q, sigma, alpha):
    q, sigma, alpha = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)

    def f(z):
        mu0 = mp.npdf(z, 0, sigma)
        return mu0 * ((1 - q) + q * mp.exp((2 * z - 1) / (2 * sigma**2))) ** alpha

    # Split the line into sigma-wide pieces around the three places where the
    # integrand changes character: 0 (the mode of mu0), z0 (where q r = 1 - q)
    # and alpha (the mode of mu0 r^alpha), so every piece is smooth and narrow.
    z0 = sigma**2 * mp.log(1 / q - 1) + mp.mpf(1) / 2
    pts = set()
    for c in (mp.mpf(0), z0, alpha):
        for k in range(-40, 41, 2):
            pts.add(c + k * sigma)
    pts = [-mp.inf] + sorted(pts) + [mp.inf]
    a = mp.quad(f, pts, maxdegree=8)
    return mp.log(a)


print("# ln A_alpha by quadrature: (q, sigma, alpha, ln A, dp_accounting ln A)")
for q, sigma, alpha in [
    (0.01, 2.5, 1.5),
    (0.01, 2.5, 2.5),
    (0.1, 100, 20.5),
    # dp_accounting's test_compute_log_a_equals_mp cases
    (1e-7, 0.1, 1.01),
    (1e-6, 0.1, 256),
    (1e-5, 0.1, 256.1),
    (1e-6, 1, 27),
    (1e-4, 1.0, 1.5),
    (1e-3, 1.0, 2),
    (0.01, 10, 20),
    (0.1, 100, 20.5),
    (0.99, 0.1, 256),
    (0.999, 100, 256.1),
    # slowly converging alternating tails (q near 1/2, alpha near 1, large sigma)
    (0.5, 20, 1.25),
    (0.5, 1, 1.001),
    (0.3, 5, 7.5),
]:
    mpv = log_a_mp(q, sigma, alpha)
    print(f"({q!r}, {sigma!r}, {alpha!r}, {mp.nstr(mpv, 17)}, {rdp._compute_log_a(q, sigma, alpha)!r}),")

print("# dp_accounting test_compute_rdp_poisson_sampled_gaussian (q=0.01, sigma=2.5, count 50)")
orders = [1.5, 2.5, 5, 50, 100]
vals = rdp._compute_rdp_poisson_subsampled_gaussian(0.01, 2.5, orders) * 50
for o, v in zip(orders, vals):
    print(o, repr(float(v)))
