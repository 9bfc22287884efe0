"""One-off design check (reproduction/design/README.md, "The noise is not binomial"): would a misfit check whose
floor is the residual SD of the fitted part (instead of the binomial SE) identify A at the pilot's noise?

    PYTHONPATH=$PWD .venv/bin/python reproduction/design/misfit_floor_variant.py resid 800 1 10   # the variant
    PYTHONPATH=$PWD .venv/bin/python reproduction/design/misfit_floor_variant.py binom 800 1 10   # the rule as is

Arguments: floor (resid|binom), steps, RNG seed, repetitions. Prints how many runs were identified, how many
of those were more than 0.02 off, and the reasons for the rest. Measured 2026-11-25: 0 of 10 either way.
"""
import collections
import math
import sys

import numpy as np

import scalerl_mega.scaling.identify as idf
from scalerl_mega.scaling.fit import sigmoid_law
variant = sys.argv[1] == 'resid'
orig = idf.holdout_check
def patched(c, r, *, fit, options, n_samples=None, **kw):
    ho = orig(c, r, fit=fit, options=options, n_samples=n_samples, **kw)
    if not variant: return ho
    # residual SD of the part fit (fitted points only)
    import dataclasses
    cc, rr = idf._as_series(c, r)
    part = options.fit(cc, rr, r0=fit.R0, fit_to=ho.split_compute, refine=True)
    sd = math.sqrt(part.sse / max(part.n_points - 3, 1))
    floor = max(ho.noise_floor, math.sqrt(2/math.pi)*sd)
    ratio = ho.mae/floor
    return dataclasses.replace(ho, noise_floor=floor, ratio=ratio, passed=ratio <= kw.get('misfit_ratio', 2.0))
idf.holdout_check = patched
rng = np.random.default_rng(int(sys.argv[3]))
steps=int(sys.argv[2]); extra=0.035; n=1600
c = np.arange(0, steps+1, 20, dtype=float)
tr=dict(R0=0.20, A=0.42, B=2.0, C_mid=40.0)
p = sigmoid_law(np.maximum(c,1e-9), **tr); p[0]=tr['R0']
ident=wrong=0; reasons=collections.Counter(); errs=[]
for _ in range(int(sys.argv[4])):
    r = rng.binomial(n,p)/n + rng.normal(0,extra,p.shape)
    a = idf.assess(c, r, options=idf.options_for(c, grid='relative'), n_samples=n)
    if a.identified:
        ident+=1; errs.append(a.A-tr['A']); wrong += abs(a.A-tr['A'])>0.02
    else:
        for x in a.reason.split('; '): reasons[x.split(':')[0][:40]]+=1
print(sys.argv[1:], 'P(id)', ident, 'wrong', wrong, 'errs', np.round(errs,3), dict(reasons))
