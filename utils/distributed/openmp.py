"""OpenMP's wait, set for the process before torch loads: the four scripts import this module first.

torch's CPU kernels run on GNU OpenMP threads, which spin after each parallel region, by libgomp's default for
300000 rounds (milliseconds), before they sleep. Through every serial stretch of a training step (the loss's
assignment, the optimizer, Python) they keep the other cores busy doing nothing, cores the DataLoader workers and
other ranks need. Unless the user chose (GOMP_SPINCOUNT or OMP_WAIT_POLICY set), the spin is cut to 10000 rounds
(docs/performance.md has what it saves). OpenMP reads it once, when torch loads: a process that imported torch
before this module keeps its own. Nothing else is imported here, so importing it never loads torch.

It is the one module whose import acts (it must, to come before torch): only the scripts import it, never the
library (tests/test_layers.py), so importing the library changes nothing in the process.
"""

import os

PROCESS_DEFAULTS: dict[str, str] = {}  # what this module set in os.environ (a benchmark's baselines run without it)
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    PROCESS_DEFAULTS["GOMP_SPINCOUNT"] = "10000"
os.environ.update(PROCESS_DEFAULTS)
