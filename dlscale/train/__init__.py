"""The training step on every rank: the worker's timed window, precision, compile, FP8, checkpointing, and what is measured around the window."""
