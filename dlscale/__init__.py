"""dlscale: benchmark deep-learning training at scale on torch.distributed."""

__version__ = "0.1.0"
MAX_SEED = 2**32 - 1  # numpy's and torch's seed range (config checks --seed against it)
MAX_BATCH = 1 << 20  # per device; no device holds a million samples of any model here (config, store)


class DlscaleError(Exception):
    """Base of the errors dlscale reports as one line."""


class ConfigError(DlscaleError, ValueError):
    """Bad input: the CLI prints it on one line and exits with code 2."""
