"""The peer for dlscale's Llama: Hugging Face's LlamaForCausalLM trained by a plain loop.

What a user writes with transformers and a few lines of PyTorch: the model built from a config in
code (random init, nothing downloaded), bf16 autocast, fused AdamW, torch.compile, synthetic
tokens, W warm-up steps, then N steps between two synchronisations. The config is the published
shape of the dlscale flavour (``--flavor 1b|3b|8b|tiny``: hidden, layers, heads, kv heads, MLP
width, vocabulary, rope theta and llama3 scaling, RMSNorm eps, tied embeddings), attention
``sdpa``, at dlscale's sequence length (2,048). ``--impl dlscale`` trains dlscale's own Llama in the
same loop (the model alone, without dlscale's runner).

    python benchmarks/bare_llama_hf.py --flavor 1b --batch-size 4 --compile

Prints one JSON line: impl, flavor, params, batch, tokens/s, MFU (dlscale's FLOPs formula, the
device's bf16 peak), peak allocated memory, versions.
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def hf_model(cfg):
    from transformers import LlamaConfig, LlamaForCausalLM

    sc = cfg.rope_scaling
    rope = None if sc is None else {"rope_type": "llama3", "factor": sc.factor, "low_freq_factor": sc.low_freq_factor,
                                    "high_freq_factor": sc.high_freq_factor,
                                    "original_max_position_embeddings": sc.original_context}
    hf = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn_hidden,
                     num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                     num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=131072, rms_norm_eps=cfg.norm_eps,
                     rope_theta=cfg.rope_theta, rope_scaling=rope, tie_word_embeddings=cfg.tied,
                     attention_bias=False, mlp_bias=False, initializer_range=cfg.init_std, use_cache=False)
    hf._attn_implementation = "sdpa"
    model = LlamaForCausalLM(hf)

    class WithLoss(torch.nn.Module):  # the loss as HF computes it (labels = the input ids, shifted inside)
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, idx, targets):
            return self.m(input_ids=idx, labels=idx).loss

    return WithLoss()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", default="hf", choices=("hf", "dlscale"))
    ap.add_argument("--flavor", default="1b")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()

    from dlscale import metrics
    from dlscale.models import count_parameters, get_model
    from dlscale.models.llama import _CONFIGS

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    spec = get_model("llama", args.flavor)
    torch.manual_seed(0)
    with dev:
        model = hf_model(_CONFIGS[args.flavor]) if args.impl == "hf" else spec.build()
    params = count_parameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda or None)
    fn = torch.compile(model) if args.compile else model
    batch = spec.make_batch(args.batch_size, dev, torch.Generator(device=dev).manual_seed(0))

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = fn(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t = time.perf_counter()
    for _ in range(args.warmup):
        step()
    warm = time.perf_counter() - t
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tokens = args.steps * args.batch_size * spec.seq_len / dt
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak, _ = metrics.peak_flops(name, "bf16")
    print(json.dumps({
        "impl": args.impl, "flavor": args.flavor, "params": params, "batch_size": args.batch_size,
        "seq_len": spec.seq_len, "compile": args.compile, "warmup_s": round(warm, 1), "step_ms": 1e3 * dt / args.steps,
        "tokens_per_s": tokens, "mfu": spec.flops_per_sample / spec.seq_len * tokens / peak if peak else None,
        "peak_mem_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "loss": float(loss.detach()), "device": name, "torch": torch.__version__,
        "transformers": __import__("transformers").__version__ if args.impl == "hf" else None}))


if __name__ == "__main__":
    main()
