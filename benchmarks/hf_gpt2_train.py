"""Hugging Face Trainer training GPT-2 (config built in code, random init, synthetic tokens, no
downloads): the external stack of benchmarks/suites/external.yaml, run by the driver as `dlscale
run --command ... --parser hf-trainer` runs it.

The model is GPT2LMHeadModel at the shape of a dlscale gpt2 flavour (``--flavor full``: GPT-2 124M,
12 layers, 768 wide, 12 heads, vocabulary 50,257, 1,024 positions; ``tiny`` for CPU tests), with
dropout 0 as dlscale's gpt2. Mixed precision as dlscale's amp-bf16 (TrainingArguments.bf16:
autocast over fp32 weights), the Trainer's default optimizer (fused AdamW on CUDA), one log dict
every --logging-steps steps (the hf-trainer parser times the window from their arrival,
docs/external.md).

    python benchmarks/hf_gpt2_train.py --batch-size 16 --steps 65 --logging-steps 5 --out /tmp/hf-gpt2
"""
import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from dlscale.models.gpt2 import _CONFIGS  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
p.add_argument("--flavor", default="full", choices=sorted(_CONFIGS), help="the dlscale gpt2 flavour whose shape to train")
p.add_argument("--batch-size", type=int, default=16, help="per device")
p.add_argument("--precision", default="amp-bf16", choices=("amp-bf16", "fp32"))
p.add_argument("--steps", type=int, default=60, help="optimizer steps (TrainingArguments.max_steps)")
p.add_argument("--logging-steps", type=int, default=5)
p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
p.add_argument("--compile", action="store_true", help="TrainingArguments.torch_compile")
p.add_argument("--out", default="hf-gpt2-out", help="the Trainer's output_dir (nothing is saved there but its state)")
args = p.parse_args()
shape = _CONFIGS[args.flavor]


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
cfg = GPT2Config(vocab_size=shape.vocab, n_positions=shape.block_size, n_embd=shape.hidden, n_layer=shape.n_layers,
                 n_head=shape.n_heads, resid_pdrop=shape.dropout, embd_pdrop=shape.dropout, attn_pdrop=shape.dropout)
model = GPT2LMHeadModel(cfg)
print(f"parameters {sum(p.numel() for p in model.parameters()):,}", flush=True)
targs = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                          logging_steps=args.logging_steps, save_strategy="no", report_to=[],
                          bf16=args.precision == "amp-bf16", torch_compile=args.compile,
                          dataloader_num_workers=args.workers, learning_rate=3e-4, seed=0,
                          use_cpu=not torch.cuda.is_available())
Trainer(model=model, args=targs,
        train_dataset=RandomTokens(args.batch_size * args.steps * max(torch.cuda.device_count(), 1), shape.block_size,
                                   shape.vocab)).train()
