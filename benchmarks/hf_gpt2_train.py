"""Hugging Face Trainer training GPT-2 124M (config built in code, random init, synthetic tokens, no
downloads): the external stack benchmarks/external_gpu.sh runs under `dlscale run --command`.

Mixed precision as dlscale's amp-bf16 (TrainingArguments.bf16: autocast, fp32 weights), the
Trainer's default optimizer (fused AdamW on CUDA), one log dict every --logging-steps steps (the
hf-trainer parser times the window from their arrival, docs/external.md).
"""
import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--seq-len", type=int, default=1024)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--logging-steps", type=int, default=5)
p.add_argument("--compile", action="store_true", help="TrainingArguments.torch_compile")
p.add_argument("--out", default="hf-gpt2-out")
args = p.parse_args()


class RandomTokens(torch.utils.data.Dataset):
    """Synthetic token sequences, the same for every run (seeded per index), made on the fly."""

    def __init__(self, n: int, seq: int, vocab: int):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": ids, "labels": ids}


torch.manual_seed(0)
cfg = GPT2Config(n_positions=args.seq_len)  # GPT-2 124M: 12 layers, 768 wide, 12 heads, vocab 50257
model = GPT2LMHeadModel(cfg)
print(f"parameters {sum(p.numel() for p in model.parameters()):,}", flush=True)
targs = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                          logging_steps=args.logging_steps, save_strategy="no", report_to=[], bf16=True,
                          torch_compile=args.compile, dataloader_num_workers=2, learning_rate=3e-4, seed=0,
                          use_cpu=not torch.cuda.is_available())  # a CPU smoke run only
Trainer(model=model, args=targs,
        train_dataset=RandomTokens(args.batch_size * args.steps * max(torch.cuda.device_count(), 1), args.seq_len,
                                   cfg.vocab_size)).train()
