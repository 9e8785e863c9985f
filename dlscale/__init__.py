"""dlscale: benchmark deep-learning training at scale on torch.distributed."""

__version__ = "0.1.0"


class DlscaleError(Exception):
    """Base of the errors dlscale reports as one line."""


class ConfigError(DlscaleError, ValueError):
    """Bad input: the CLI prints it on one line and exits with code 2."""
