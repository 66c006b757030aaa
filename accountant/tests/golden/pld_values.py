"""Reference epsilons for the PLD accountant (accountant/src/pld, tests/integration/pld.rs).

Composed Poisson-subsampled Gaussian (DP-SGD), add/remove-one adjacency, from
two upstream numerical accountants:

  * dp_accounting 0.6.0 (Google), `pld.pld_privacy_accountant.PLDAccountant`
    with its defaults: value_discretization_interval = 1e-4, connect-the-dots
    discretisation, pessimistic estimate, both adjacency directions (max).
  * prv_accountant 0.2.0 (Microsoft, Gopi et al. arXiv:2106.02848),
    `PRVAccountant` with eps_error = 0.01 and delta_error = delta / 1000 (the
    settings Opacus 1.6.0 passes): prints (eps_lower, eps_estimate, eps_upper).

and, for comparison, dp_accounting 0.6.0's RDP accountant (default orders).

Run: python3 -m pip install --user dp-accounting==0.6.0 prv-accountant==0.2.0
     python3 accountant/tests/golden/pld_values.py > accountant/tests/golden/pld_values.txt
Output lines: sigma q steps delta pld_eps prv_eps_lower prv_eps_est prv_eps_upper rdp_eps
"""
import logging

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from prv_accountant import PRVAccountant
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

# dp_accounting logs a warning for each fractional order whose series does not
# converge (it drops that order); the warnings are not part of the output.
logging.disable(logging.WARNING)

SETTINGS = [
    # (sigma, q, steps)
    (0.8, 0.05, 1000),
    (0.8, 0.01, 10000),
    (1.0, 0.05, 100),
    (1.0, 0.01, 1000),
    (1.0, 0.001, 10000),
    (1.1, 0.02, 5000),
    (1.5, 0.04, 2250),
    (1.5, 0.01, 10000),
    (2.0, 0.05, 10000),
    (2.0, 0.001, 1000),
]
DELTAS = [1e-5, 1e-7]


def event(sigma, q, steps):
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)


print(f"# dp_accounting {dp_accounting.__version__ if hasattr(dp_accounting, '__version__') else '0.6.0'}, prv_accountant 0.2.0")
print("# sigma q steps delta pld_eps prv_eps_lower prv_eps_est prv_eps_upper rdp_eps")
for sigma, q, steps in SETTINGS:
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(event(sigma, q, steps))
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(event(sigma, q, steps))
    for delta in DELTAS:
        prv = PRVAccountant(
            prvs=[PoissonSubsampledGaussianMechanism(
                sampling_probability=q, noise_multiplier=sigma)],
            max_self_compositions=[steps],
            eps_error=0.01,
            delta_error=delta / 1000,
        )
        lo, est, up = prv.compute_epsilon(delta=delta, num_self_compositions=[steps])
        print(f"{sigma!r} {q!r} {steps} {delta!r} {float(pld.get_epsilon(delta))!r} "
              f"{lo!r} {est!r} {up!r} {float(rdp.get_epsilon(delta))!r}", flush=True)
