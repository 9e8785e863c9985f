"""The peer of dlscale's Llama: Hugging Face's LlamaForCausalLM trained by a plain loop (loop hf-llama).

What a user writes with transformers and a few lines of PyTorch: the model built from a config in
code (random init, nothing downloaded), bf16 autocast over fp32 weights, fused AdamW (foreach on the
CPU), optionally torch.compile, one synthetic batch drawn as dlscale draws it, W warm-up steps, then
N steps between two synchronisations (CUDA events per step). The config is the published shape of
the dlscale flavour (``--flavor 1b|3b|8b|tiny``: hidden, layers, heads, kv heads, MLP width,
vocabulary, rope theta and llama3 scaling, RMSNorm eps, tied embeddings), attention ``sdpa``, at
dlscale's sequence length; the loss is the model's own (labels = the input ids, shifted inside).
``--impl dlscale`` trains dlscale's own Llama in the same loop (the model alone, without dlscale's
runner), to tell the model from the runner.

    python benchmarks/bare_llama_hf.py --flavor 1b --batch-size 4 --compile

Prints one JSON line (impl, flavor, params, tokens/s, peak memory, versions). With --out DIR it also
writes DIR/rank0.json in the shape dlscale's worker writes, so that benchmarks/run.py stores the run
as a record of its dlscale case (a suite's ``bare`` entry with ``loop: hf-llama``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch


def hf_model(cfg):
    """LlamaForCausalLM at the shape of a dlscale LlamaConfig, returning the loss as dlscale's models do."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sc = cfg.rope_scaling
    rope = None if sc is None else {"rope_type": "llama3", "factor": sc.factor, "low_freq_factor": sc.low_freq_factor,
                                    "high_freq_factor": sc.high_freq_factor,
                                    "original_max_position_embeddings": sc.original_context}
    hf = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn_hidden,
                     num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                     num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=131072, rms_norm_eps=cfg.norm_eps,
                     rope_theta=cfg.rope_theta, rope_scaling=rope, tie_word_embeddings=cfg.tied,
                     attention_bias=False, mlp_bias=False, initializer_range=cfg.init_std, use_cache=False,
                     attn_implementation="sdpa")
    model = LlamaForCausalLM(hf).float()

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, idx, targets):  # noqa: ARG002 (HF shifts the labels itself)
            return self.m(input_ids=idx, labels=idx).loss

    return WithLoss()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--impl", default="hf", choices=("hf", "dlscale"),
                    help="hf: transformers' LlamaForCausalLM; dlscale: dlscale's Llama in the same loop")
    ap.add_argument("--model", default="llama", choices=("llama",))
    ap.add_argument("--flavor", default="1b")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--precision", default="amp-bf16", choices=("amp-bf16", "fp32"))
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help="auto: CUDA when a GPU is visible")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights (the batch: seed + 12345, as dlscale)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (default mode)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=None, metavar="DIR", help="also write DIR/rank0.json (default: none)")
    return ap.parse_args()


def _write(out: str | None, result: dict) -> None:
    if out:
        path = Path(out) / "rank0.json"
        path.with_suffix(".tmp").write_text(json.dumps(result))
        os.replace(path.with_suffix(".tmp"), path)


def main() -> None:
    args = parse_args()
    from dlscale.models import count_parameters, get_model
    from dlscale.models.llama import _CONFIGS

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    spec = get_model("llama", args.flavor)
    base = {"rank": 0, "local_rank": 0, "dp_size": 1, "device": str(dev), "pid": os.getpid(),
            "device_name": torch.cuda.get_device_name(0) if cuda else None, "threads": torch.get_num_threads()}
    torch.manual_seed(args.seed)
    try:
        with dev:
            model = hf_model(_CONFIGS[args.flavor]) if args.impl == "hf" else spec.build()
        params = count_parameters(model)
        opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=spec.weight_decay,
                                fused=cuda or None, foreach=None if cuda else True)
        fn = torch.compile(model) if args.compile else model
        batch = spec.make_batch(args.batch_size, torch.device("cpu"), torch.Generator().manual_seed(args.seed + 12345))
        batch = tuple(t.to(dev) for t in batch)
        if cuda:  # as dlscale's worker: the training peak, not the construction's
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        ms, dt, warm, loss = _train(fn, opt, batch, dev, args)
    except torch.OutOfMemoryError as e:  # recorded oom, as dlscale's worker does
        _write(args.out, {**base, "status": "oom", "error": " ".join(str(e).split())[:300]})
        raise SystemExit(3) from None
    peak = torch.cuda.max_memory_allocated() if cuda else None
    _write(args.out, {**base, "status": "ok", "error": None, "window_s": dt, "warmup_s": warm, "step_times_ms": ms,
                      "params": params, "loss_last": loss, "peak_mem_allocated_bytes": peak,
                      "peak_mem_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})  # Linux: KiB
    tokens = args.steps * args.batch_size * spec.seq_len / dt
    transformers = __import__("transformers").__version__ if args.impl == "hf" else None
    print(json.dumps({"bench": "bare_llama_hf", "impl": args.impl, "flavor": args.flavor, "params": params,
                      "batch_size": args.batch_size, "seq_len": spec.seq_len, "compile": args.compile,
                      "warmup_s": round(warm, 1), "step_ms": 1e3 * dt / args.steps, "tokens_per_s": tokens,
                      "peak_mem_allocated_bytes": peak, "loss": loss, "device": base["device_name"] or "cpu",
                      "torch": torch.__version__, "transformers": transformers}), flush=True)


def _train(fn, opt, batch, dev: torch.device, args: argparse.Namespace) -> tuple[list[float], float, float, float]:
    """W warm-up steps, then the window: (step times in ms, window seconds, warm-up seconds, last loss)."""
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if args.precision == "amp-bf16" else None

    def step():
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            loss = fn(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t = time.perf_counter()
    for _ in range(args.warmup):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
        events[0].record()
    warm = time.perf_counter() - t
    marks = [time.perf_counter()]
    t0 = marks[0]
    for i in range(args.steps):
        loss = step()
        if cuda:
            events[i + 1].record()
        else:
            marks.append(time.perf_counter())
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    ms = ([events[i].elapsed_time(events[i + 1]) for i in range(args.steps)] if cuda
          else [(marks[i + 1] - marks[i]) * 1e3 for i in range(args.steps)])
    return ms, dt, warm, float(loss.detach().float())


if __name__ == "__main__":
    main()
