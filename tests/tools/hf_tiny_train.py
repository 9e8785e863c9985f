"""Hugging Face Trainer on a tiny randomly initialised GPT-2 built in code (no downloads), on the CPU.

Run by tests/test_external_tools.py under `dlscale run --command ... --parser hf-trainer`.
"""
import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch-size", type=int, default=4)
p.add_argument("--logging-steps", type=int, default=2)
p.add_argument("--out", default="hf-out")
args = p.parse_args()


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


torch.manual_seed(0)
cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(cfg)
targs = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                          logging_steps=args.logging_steps, save_strategy="no", report_to=[], use_cpu=True,
                          dataloader_num_workers=0, learning_rate=1e-3, seed=0)
Trainer(model=model, args=targs, train_dataset=Tokens(256, 32, 128)).train()
