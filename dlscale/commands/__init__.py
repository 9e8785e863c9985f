"""CLI verbs of the core: run, env, sweep, slurm. Each module has register(subparsers)."""
