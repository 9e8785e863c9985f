"""Time to quality: train to a target on a validation split (docs/quality.md).

* ``target``: ``--until`` parsed, the case checks (one line, exit 2), the learning-rate rule, the
  per-repeat seed and the case-level summary over repeats (no torch import);
* ``loop``: the worker's training loop with evaluations between timed chunks of steps.
"""
