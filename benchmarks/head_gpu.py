"""Time the vocabulary head (projection + cross-entropy, forward + backward) of gpt2 and bert-base,
with the vocabulary padded to a multiple of 64 (what the models do on CUDA) and unpadded.

    python benchmarks/head_gpu.py   # one GPU; prints one JSON line per case and a table

Why it exists: the pipeline's per-piece timings showed GPT-2's head at 38 ms of a 68 ms eager
step (H200, batch 16); a 50,257-row projection leaves the logits misaligned for the tensor cores.
"""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from dlscale.models import get_model
from dlscale.models._layers import vocab_logits


def main() -> None:
    dev = torch.device("cuda")
    rows = []
    for name, batch in (("gpt2", 16), ("bert-base", 128)):
        spec = get_model(name)
        model = spec.build().to(dev)
        args = spec.make_batch(batch, dev, torch.Generator(device=dev).manual_seed(0))
        k = spec.embed_args
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
            h = model.embed(*args[:k])
        proj = model.lm_head if name == "gpt2" else model.decoder
        for multiple in (1, 64):
            def step():
                x = h.detach().requires_grad_()
                with torch.autocast("cuda", torch.bfloat16):
                    if name == "gpt2":
                        logits = vocab_logits(model.ln_f(x), proj.weight, None, multiple)
                        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), args[1].view(-1))
                    else:
                        t = model.mlm_ln(F.gelu(model.mlm_dense(x)))
                        logits = vocab_logits(t, proj.weight, proj.bias, multiple)
                        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), args[2].view(-1))
                loss.backward()
                return loss
            for _ in range(3):
                loss = step()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            n = 20
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                step()
            end.record()
            torch.cuda.synchronize()
            row = {"model": name, "batch": batch, "pad_multiple": multiple, "head_ms": start.elapsed_time(end) / n,
                   "loss": float(loss)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            model.zero_grad(set_to_none=True)
    print(f"{'model':<10} {'batch':>5} {'padded':>7} {'head ms (fwd+bwd)':>18}")
    for r in rows:
        print(f"{r['model']:<10} {r['batch']:>5} {str(r['pad_multiple'] > 1):>7} {r['head_ms']:>18.2f}")


if __name__ == "__main__":
    main()
