"""DeepSpeed on the CPU (no compiled ops): a tiny MLP through deepspeed.initialize, its throughput timer
printing every 2 steps -- what `dlscale run --command ... --parser deepspeed` reads."""
import argparse
import os

import torch
from torch import nn

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")

import deepspeed  # noqa: E402
from deepspeed.utils.logging import set_log_level_from_string  # noqa: E402

# DeepSpeed logs at WARNING by default; its throughput timer prints at INFO
set_log_level_from_string("info")

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--batch-size", type=int, default=8)
args = p.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
cfg = {"train_batch_size": args.batch_size, "train_micro_batch_size_per_gpu": args.batch_size,
       "steps_per_print": 2, "wall_clock_breakdown": False}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
x, y = torch.randn(args.batch_size, 64), torch.randn(args.batch_size, 1)
for _ in range(args.steps):
    loss = nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
