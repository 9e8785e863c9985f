"""What a compiled Llama keeps for its backward, and when its training step peaks, on the CPU: the
source of the compiled Llama rows of docs/plan.md's memory table.

    python benchmarks/saved_tensors.py --flavor 1b --layers 3 4                       # bytes per block
    python benchmarks/saved_tensors.py --flavor 1b --precision fp8 --layers 3 --list  # every tensor
    python benchmarks/saved_tensors.py --shape 128,2,1,384 --vocab 4096 --seq 1024 --batch 2 \
        --layers 4 --checkpointing selective --timeline                                # a small step's peak

Listing (the default): torch.compile's inductor partitions the joint forward-backward graph
(min-cut recomputation); the forward graph's outputs beside the loss are the tensors kept for the
backward. The script stops once the partition is made -- nothing runs -- so the flavours' real
shapes take seconds. With two layer counts the difference is one block between two others, in
bytes per token. Parameters, and the per-tensor scalars of float8 scaling, are not per-token.

``--precision fp8`` converts the blocks' Linears as dlscale/train/fp8.py does (needs torchao). torchao's
Float8Linear casts its input to the *CUDA* autocast dtype; on the CPU the script casts to bf16.

``--timeline`` runs two warm-up steps and one profiled step instead (bf16 autocast, fused AdamW as
on CUDA) and prints, over the parameters, optimizer state and batch, the bytes allocated when the
backward begins and at the step's peak, and the allocations just before the peak. Slow on CPUs
without bf16 units: keep the shape small.
"""
from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import replace


def build(args, layers: int):
    import torch

    from dlscale.train import checkpointing as ck
    from dlscale.models import llama as L

    cfg = replace(L._CONFIGS[args.flavor], n_layers=layers, seq_len=args.seq or L._CONFIGS[args.flavor].seq_len)
    if args.shape:
        h, nh, nkv, f = (int(x) for x in args.shape.split(","))
        cfg = replace(cfg, hidden=h, n_heads=nh, n_kv_heads=nkv, ffn_hidden=f)
    if args.vocab:
        cfg = replace(cfg, vocab=args.vocab)
    if args.untied:
        cfg = replace(cfg, tied=False)
    torch.manual_seed(0)
    with torch.device("meta" if not args.timeline else "cpu"):
        model = L.Llama(cfg)
    if not args.timeline:  # the listing only traces: real but uninitialised storage
        model = model.to_empty(device="cpu")
        model.tie_weights()
    if args.precision == "fp8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8 import float8_linear as FL

        from dlscale.train.fp8 import RECIPE, _filter

        inside = {id(m) for b in model.blocks for m in b.modules()}
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(RECIPE),
                                   module_filter_fn=_filter(inside))

        def forward(self, x):  # torchao's forward with the CPU's autocast dtype
            if torch.is_autocast_enabled("cpu"):
                x = x.to(torch.get_autocast_dtype("cpu"))
            return FL.matmul_with_hp_or_float8_args.apply(x, self.weight.t(), self.linear_mm_config, self.config)

        FL.Float8Linear.forward = forward
    if args.checkpointing != "none":
        for block in model.blocks:
            ck._wrap(block, args.checkpointing)
    return cfg, model


class _Partitioned(Exception):
    pass


def saved(args, layers: int):
    """(bytes per token by dtype, bytes not per token by dtype, rows) of what the forward graph keeps."""
    import torch
    import torch._inductor.compile_fx as cfx

    cfg, model = build(args, layers)
    outs = []
    real = cfx.min_cut_rematerialization_partition

    def partition(gm, joint_inputs, **kw):
        fw, bw = real(gm, joint_inputs, **kw)
        outs.extend(fw.graph.find_nodes(op="output")[0].args[0])
        raise _Partitioned

    cfx.min_cut_rematerialization_partition = partition
    B, T = args.batch, cfg.seq_len
    idx = torch.zeros(B, T, dtype=torch.long)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.compile(model)(idx, idx)
    except Exception as e:  # dynamo wraps the backend's exception
        if not isinstance(e, _Partitioned) and "_Partitioned" not in repr(e):
            raise
    finally:
        cfx.min_cut_rematerialization_partition = real
    per_token, fixed, rows = collections.Counter(), collections.Counter(), []
    for n in outs:
        val = getattr(n, "meta", {}).get("val") if isinstance(n, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or n.op == "placeholder":  # parameters, inputs: alive anyway
            continue
        shape, dt = tuple(val.shape), str(val.dtype).replace("torch.", "")
        tok = (len(shape) >= 2 and shape[0] == B and T in shape[1:]) or (len(shape) >= 1 and shape[0] == B * T)
        nbytes = val.numel() * val.element_size()
        (per_token if tok else fixed)[dt] += nbytes / (B * T) if tok else nbytes
        size = f"{val.numel() / (B * T):g} per token" if tok else f"{nbytes} B"
        rows.append((n.name, str(n.target), shape, dt, size))
    return per_token, fixed, rows


def timeline(args, layers: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from dlscale.train.memmeasure import _alive_bytes

    cfg, model = build(args, layers)
    fn = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.vocab, (args.batch, cfg.seq_len), generator=g)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fn(idx, idx)
        with torch.profiler.record_function("BACKWARD"):
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    step()
    start = _alive_bytes(model, opt, (idx,))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = list(prof.profiler.kineto_results.events())
    backward = next(e.start_ns() for e in events if e.name() == "BACKWARD")
    cur, curve = 0, []
    for e in sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns()):
        cur += e.nbytes()
        curve.append((e.start_ns(), cur, e.nbytes()))
    at_backward = [c for t, c, _ in curve if t <= backward][-1]
    i = max(range(len(curve)), key=lambda k: curve[k][1])
    MiB = 2 ** 20
    print(f"over parameters, optimizer state and batch ({start / MiB:.3f} MiB): backward begins "
          f"{at_backward / MiB:.3f} MiB, peak {curve[i][1] / MiB:.3f} MiB "
          f"({(curve[i][0] - backward) / 1e6:+.1f} ms from the backward's start)")
    for t, c, n in curve[max(0, i - 8):i + 2]:
        print(f"  {(t - backward) / 1e6:+10.2f} ms {c / MiB:10.3f} MiB {n / MiB:+9.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="1b", help="llama flavour whose shape to use (default 1b)")
    p.add_argument("--shape", help="hidden,heads,kv_heads,ffn instead of the flavour's")
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq", type=int, help="tokens per sample (default the flavour's)")
    p.add_argument("--batch", type=int, default=3, help="default 3: B x T then matches no other dimension")
    p.add_argument("--layers", type=int, nargs="+", default=[3, 4])
    p.add_argument("--precision", choices=("amp-bf16", "fp8"), default="amp-bf16")
    p.add_argument("--checkpointing", choices=("none", "selective", "full"), default="none")
    p.add_argument("--untied", action="store_true")
    p.add_argument("--list", action="store_true", help="print every kept tensor")
    p.add_argument("--timeline", action="store_true")
    args = p.parse_args(argv)
    if args.timeline:
        timeline(args, args.layers[0])
        return 0
    totals = []
    for layers in args.layers:
        per_token, fixed, rows = saved(args, layers)
        if args.list:
            for r in rows:
                print(f"  {r[0]:28s} {r[1]:40s} {str(r[2]):24s} {r[3]:14s} {r[4]}")
        total = sum(per_token.values())
        totals.append(total)
        print(f"{layers} blocks: {total:,.0f} bytes per token {dict(per_token)}; not per token {dict(fixed)}")
    if len(totals) == 2:
        print(f"one block: {(totals[1] - totals[0]) / (args.layers[1] - args.layers[0]):,.0f} bytes per token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
