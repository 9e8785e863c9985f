"""``dlscale tune``: the fastest configuration that fits, found by measurement (docs/tune.md).

The search in five steps, one module each:

* ``space``   -- the candidates: strategy and degrees, per-device batch and gradient accumulation
  (keeping a requested global batch), activation checkpointing, compile and its mode, precision;
  every axis pinned or restricted with `dlscale run`'s option names; invalid ones dropped with why;
* ``prune``   -- the memory plan (dlscale/planner/memplan.py) drops what cannot fit, with a headroom
  that measured peaks and out-of-memory runs widen as the search goes;
* ``rank``    -- the performance model orders what is left (one function: ``rank``);
* ``search``  -- the top candidates measured for real (``launch.measure``: fresh processes,
  warm-up skipped, repeats, validity), stored as ordinary records labelled ``tune:<id>``, widening
  to the next while they could still win and the budget allows; a rerun resumes from the store;
* ``result``  -- the winner, runners-up with compare's verdict, what was pruned, model rank vs
  measured rank, the finalists predicted at target shapes; table and JSON.
"""
