"""``dlscale micro matmul|bandwidth|layer|comm|io``: registration with the top-level CLI."""
from __future__ import annotations

import argparse

from dlscale.micro import common


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default; list options (default None) state theirs in the text."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def add_common_options(p: argparse.ArgumentParser, warmup_defaults: tuple[int, int],
                       iters_defaults: tuple[int, int], nproc_help: str | None = None) -> None:
    """--nproc-per-node, --device, --warmup, --iters, --store (defaults: (GPU, CPU) pairs)."""
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help=nproc_help or "processes (devices) to use; this micro-benchmark measures one "
                                      "device in this process, so only 1 is accepted")
    p.add_argument("--device", default="auto", choices=common.DEVICES,
                   help="where to run: auto = cuda when a GPU is visible, else cpu")
    p.add_argument("--warmup", type=common.int_or_auto, default="auto", metavar="N",
                   help=f"untimed calls before timing each case; auto = {warmup_defaults[0]} on GPU, "
                        f"{warmup_defaults[1]} on CPU")
    p.add_argument("--iters", type=common.int_or_auto, default="auto", metavar="N",
                   help=f"timed samples per case (the median is reported); auto = {iters_defaults[0]} "
                        f"on GPU, {iters_defaults[1]} on CPU")
    p.add_argument("--store", default="results", metavar="DIR",
                   help="result store directory; one record of kind 'micro' is appended to "
                        "DIR/results.jsonl")


def register(subparsers) -> None:
    from dlscale.micro import bandwidth, comm, io, layer, matmul

    p = subparsers.add_parser(
        "micro", help="micro-benchmarks: matmul, memory bandwidth, one transformer layer, collectives, input",
        description="Micro-benchmarks that show what the hardware delivers: dense matmul TFLOPS, "
                    "memory bandwidth, one transformer layer's TFLOPS, collective bandwidth "
                    "(nccl-tests conventions) and input-pipeline throughput (io). Each run prints a table "
                    "and appends one record of kind 'micro' to the result store. Formulas: docs/micro.md.",
        formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="micro_command", metavar="BENCHMARK")
    sub.required = True
    for mod in (matmul, bandwidth, layer, comm, io):
        mod.add_parser(sub)
