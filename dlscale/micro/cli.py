"""``dlscale micro matmul|bandwidth|layer|comm|io``: registration with the top-level CLI."""
from __future__ import annotations

from dlscale.micro import bandwidth, comm, io, layer, matmul

from dlscale.micro.common import watched


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "micro", help="micro-benchmarks: matmul, memory bandwidth, one transformer layer, collectives, input",
        description="Micro-benchmarks that show what the hardware delivers: dense matmul TFLOPS, "
                    "memory bandwidth, one transformer layer's TFLOPS, collective bandwidth "
                    "(nccl-tests conventions) and input-pipeline throughput (io). Each run prints a table "
                    "and appends one record of kind 'micro' to the result store. Formulas: docs/micro.md.")
    sub = p.add_subparsers(dest="micro_command", metavar="BENCHMARK")
    sub.required = True
    for mod in (matmul, bandwidth, layer, comm, io):
        mod.add_parser(sub)

    for name, parser in sub.choices.items():  # every micro-benchmark watches its cores' load (validity)
        parser.set_defaults(func=watched(parser.get_default("func")))
