"""The result store of a read verb: `--store DIR` (the documented spelling, as run, sweep, micro
and import write it) or the older positional STORE, resolved to ``args.store`` after parsing."""
from __future__ import annotations

import argparse

from dlscale import ConfigError

STORE_HELP = "result store: a directory of .jsonl files, or one .jsonl file"


def add_store_arguments(p: argparse.ArgumentParser, default: str | None = "results", required: bool = False,
                        help: str = STORE_HELP) -> None:
    """``--store DIR`` (shown) and a positional STORE (hidden, still accepted); ``args.store`` is
    whichever was given, else ``default``; ``required`` with no default refuses neither being given."""
    p.add_argument("store", nargs="?", default=None, metavar="STORE", help=argparse.SUPPRESS)
    shown = help if default is None else f"{help} (default: {default})"
    p.add_argument("--store", dest="store_option", metavar="DIR", default=None, help=shown)
    p.set_defaults(store_spec=(("store",), default, required))


def add_two_store_arguments(p: argparse.ArgumentParser) -> None:
    """compare's A and B: ``--store A [--store B]`` or positional ``A [B]``."""
    p.add_argument("store_a", nargs="?", default=None, metavar="A", help=argparse.SUPPRESS)
    p.add_argument("store_b", nargs="?", default=None, metavar="B", help=argparse.SUPPRESS)
    p.add_argument("--store", dest="store_option", metavar="DIR", action="append", default=None,
                   help="store A (the reference); given twice, the second is store B (default B: A again; then "
                        "--label-a/--label-b or --filter-a/--filter-b pick the two sides)")
    p.set_defaults(store_spec=(("store_a", "store_b"), None, True))


def resolve_store_args(args: argparse.Namespace) -> None:
    """Fill the store destinations from --store or the positionals; refuses both spellings at once,
    more stores than the verb takes, and a missing required store, naming the form to use."""
    spec = getattr(args, "store_spec", None)
    if spec is None:
        return
    dests, default, required = spec
    given = [getattr(args, d) for d in dests if getattr(args, d, None) is not None]
    option = args.store_option
    options = option if isinstance(option, list) else ([option] if option is not None else [])
    if given and options:
        raise ConfigError(f"give the store once, as --store {options[0]} (the positional "
                          f"{' '.join(given)} is the older spelling of the same)")
    stores = options or given
    if len(stores) > len(dests):
        raise ConfigError(f"at most {len(dests)} --store DIR, got {len(stores)}")
    if not stores and default is not None:
        stores = [default]
    if not stores and required:
        raise ConfigError("name the result store with --store DIR")
    for i, d in enumerate(dests):
        setattr(args, d, stores[i] if i < len(stores) else None)
