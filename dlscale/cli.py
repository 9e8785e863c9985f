"""Command line: one subcommand per verb.

Subcommands live beside the code they drive: each module in ``COMMAND_MODULES`` has
``register(subparsers)`` which adds its parser(s) and sets ``func(args) -> exit code``.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from dlscale import ConfigError, DlscaleError, __version__
from dlscale.case.procs import EXIT_INTERRUPTED, interrupts
from dlscale.results.storeargs import resolve_store_args

COMMAND_MODULES = (
    "dlscale.commands.run",      # run, env
    "dlscale.commands.sweep",    # sweep
    "dlscale.report.cli",        # report, compare
    "dlscale.micro.cli",         # micro ...
    "dlscale.commands.slurm",    # slurm
    "dlscale.commands.predict",  # predict (and --validate)
    "dlscale.commands.cost",     # cost
    "dlscale.inputs.cli",        # data make, data info
    "dlscale.importers.cli",     # import
    "dlscale.commands.parity",   # parity
    "dlscale.commands.plan",     # plan
    "dlscale.tune.cli",          # tune
)

# Exit codes (README and docs/metrics.md list them too)
EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_OOM = 3
EXIT_TIMEOUT = 4
EXIT_FAILED = 5
EXIT_UNSUPPORTED = 6
from dlscale.results.store import EXIT_NOT_STORED  # noqa: E402,F401  (7: finished, but the store could not take it)
STATUS_EXIT = {"ok": EXIT_OK, "oom": EXIT_OOM, "timeout": EXIT_TIMEOUT, "failed": EXIT_FAILED,
               "unsupported": EXIT_UNSUPPORTED}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown once and meaningfully: not for on/off flags (their help says it), not where
    the help text already names the default, and "none" for an option that is off unless given."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._VersionAction,
                                argparse._HelpAction))
                or "default" in text or action.default is argparse.SUPPRESS):
            return text
        if not action.option_strings and action.nargs not in ("?", "*"):
            return text  # a required positional has no default
        if action.default is None or action.default == []:
            return text + " (default: none)"
        return text + " (default: %(default)s)"


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option: works for one release, with a one-line warning."""

    def __init__(self, option_strings, dest, new: str = "", **kw):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"dlscale: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        if self.nargs == 0:
            setattr(namespace, self.dest, self.const)
        elif isinstance(getattr(namespace, self.dest, None), list) and isinstance(self.default, list):
            getattr(namespace, self.dest).append(values)
        else:
            setattr(namespace, self.dest, values)


def deprecated_alias(parser, old: str, new: str, **kw) -> None:
    """Accept ``old`` for ``new`` (hidden from --help); ``kw``: the new option's type/dest/nargs."""
    parser.add_argument(old, action=DeprecatedAlias, new=new, help=argparse.SUPPRESS, default=argparse.SUPPRESS,
                        **kw)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit code 2 (its default code, kept explicit), and the
    same help format for every subcommand."""

    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        if extras:  # reported by the verb's own parser, which knows whether it takes --store
            _verb_parser(self, ns).error("unrecognized arguments: " + " ".join(extras))
        return ns

    def error(self, message: str):  # noqa: D401
        self.exit(EXIT_BAD_INPUT, f"dlscale: error: {message}{store_hint(self, message)} (see {self.prog} --help)\n")


def _verb_parser(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand parser that ``ns`` chose (``dlscale micro matmul``'s, not dlscale's)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(ns, subs[0].dest, None) if subs else None
        if chosen not in (subs[0].choices if subs else {}):
            return parser
        parser = subs[0].choices[chosen]


def store_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """A stray word on a verb that takes ``--store DIR``: most likely a store given positionally
    (`dlscale run results`), so the error names the form this verb takes."""
    if not message.startswith("unrecognized arguments:"):
        return ""
    if "--store" not in parser._option_string_actions:
        return ""

    words = [w for w in message.split(":", 1)[1].split() if not w.startswith("-")
             and (os.path.isdir(w) or w.endswith((".jsonl", "/")))]  # what looks like a store, not a typo
    return f"; a result store is named with --store {words[0]}" if words else ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dlscale", description="Benchmark deep-learning training at scale on torch.distributed.",
                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"dlscale {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                # this verb's module is not installed; anything else missing is a real error
                continue
            raise
        mod.register(sub)
    return parser


def check_store_args(args: argparse.Namespace) -> None:
    """An empty store path (--store "", STORE "") would quietly mean the current directory: refused
    for every command, before it reads or writes anything."""
    for dest, name in (("store", "--store/STORE"), ("store_a", "A"), ("store_b", "B")):
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            raise ConfigError(f"{name} must name a result store directory, got {value!r}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    # SIGTERM and SIGHUP end every command as Ctrl-C does (its processes too); the handler stays while
    # the outcome is printed, so a burst of signals ends in 130, never in death by SIGTERM (143)
    with interrupts():
        try:
            resolve_store_args(args)
            check_store_args(args)
            return int(args.func(args) or 0)
        except ConfigError as e:
            print(f"dlscale: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except DlscaleError as e:
            print(f"dlscale: error: {e}", file=sys.stderr)
            return getattr(e, "exit_code", EXIT_FAILED)  # StoreError: EXIT_NOT_STORED
        except KeyboardInterrupt as e:
            print(f"dlscale: interrupted{' by ' + e.args[0] if e.args else ''}", file=sys.stderr)
            return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
