"""torchtitan's own trainer on dlscale's Llama shapes (the harness of benchmarks/suites/titan.yaml).

torchtitan 0.3.0 configures a run in Python: ``--module M --config F`` names a function that
returns a ``Trainer.Config``, and its CLI options override fields of it. This file is such a module
(``llama_1b``, ``llama_3b``, ``llama_8b``, ``llama_debug``: torchtitan's own Llama 3 flavours ``1B``,
``3B``, ``8B``, whose shapes are dlscale's ``llama`` flavours: layers, width, heads, kv heads,
SwiGLU width, vocabulary 128,256, tied head for 1B and 3B) and the launcher that runs
``torchtitan.train.main`` with the workload's options::

    torchrun --standalone --nproc-per-node 1 benchmarks/titan_llama.py --flavor 1b --batch-size 4 \\
        --seq-len 2048 --steps 60 --compile --out DIR [-- MORE TORCHTITAN OPTIONS]

The run needs no network: the tokenizer is torchtitan's test tokenizer (benchmarks/assets-titan,
BSD-3; 2,020 ids, so the token ids stay below 2,048 while the model's vocabulary and head are the
full 128,256), and the text is written here before the run: pseudo-words in documents of about
``ROWS_PER_DOC`` rows, so nearly every row is one document and torchtitan's document-causal
attention mask is the plain causal mask dlscale trains with. torchtitan's dataloader reads it as
its ``c4_test`` dataset from ``--dataloader.dataset-path``. ``--check`` builds the configuration,
the tokenizer, the first batch and the model on the meta device and prints them, with no GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER = HERE / "assets-titan" / "tokenizer"
# dlscale flavour -> torchtitan's llama3 flavour of the same shape
FLAVORS = {"1b": "1B", "3b": "3B", "8b": "8B", "debug": "debugmodel"}
ROWS_PER_DOC = 64  # a document boundary in about one row of 64
TOKENS_PER_WORD = 4  # a lower bound for the test tokenizer on the words below (measured: about 4.5)


# ----------------------------------------------------------------------------- torchtitan configs

def _config(flavor: str):
    """The Trainer.Config of one flavour: torchtitan's defaults for a Llama 3 pre-training run
    (chunked cross-entropy, AdamW, gradient clipping at 1.0, CUDA graphs, per-block compile when
    enabled), with no checkpointing, validation or profiling, and activation checkpointing off
    (the launcher's ``--activation-checkpointing`` sets it)."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
    from torchtitan.config import TrainingConfig
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.models.common.config_utils import decoder_vocab_size
    from torchtitan.models.llama3 import model_registry
    from torchtitan.trainer import Trainer

    spec = model_registry(FLAVORS[flavor])
    return Trainer.Config(
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec))),
        hf_assets_path=str(TOKENIZER),
        model_spec=spec,
        optimizer=default_adamw(lr=3e-4),  # dlscale's Llama lr; weight decay 0.1 as dlscale's
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=2),
        training=TrainingConfig(local_batch_size=4, seq_len=2048, steps=60),
        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4_test"),
        metrics=MetricsProcessor.Config(log_freq=5, disable_color_printing=True),
        activation_checkpoint=None,
    )


def llama_1b():
    return _config("1b")


def llama_3b():
    return _config("3b")


def llama_8b():
    return _config("8b")


def llama_debug():
    return _config("debug")


# ----------------------------------------------------------------------------- the launcher

def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="titan_llama.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", choices=tuple(FLAVORS), default="1b", help="dlscale's llama flavour (default: 1b)")
    p.add_argument("--batch-size", type=int, default=4, metavar="N", help="sequences per device (default: 4)")
    p.add_argument("--seq-len", type=int, default=2048, metavar="N", help="tokens per sequence (default: 2048)")
    p.add_argument("--steps", type=int, default=60, metavar="N", help="training steps (default: 60)")
    p.add_argument("--log-freq", type=int, default=5, metavar="N",
                   help="steps between torchtitan's metrics lines (default: 5)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                   help="torch.compile the model and the loss, as torchtitan does (default: off)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="torchtitan's CUDA-graph capture of forward and backward (default: on, torchtitan's default)")
    p.add_argument("--activation-checkpointing", choices=("none", "selective", "full"), default="none",
                   help="torchtitan's activation checkpointing policy (default: none)")
    p.add_argument("--data-workers", type=int, default=1, metavar="N",
                   help="dataloader worker processes, so tokenising is off the training process (default: 1)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="torchtitan's seed (default: 0)")
    p.add_argument("--out", required=True, metavar="DIR", help="torchtitan's dump folder and the text it reads")
    p.add_argument("--check", action="store_true",
                   help="build the config, tokenizer, first batch and meta-device model, print them, exit")
    args = p.parse_args(argv)
    for name in ("batch_size", "seq_len", "steps", "log_freq"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.data_workers < 0:
        p.error(f"--data-workers must be 0 or more, got {args.data_workers}")
    return args, rest


def pseudo_words(n: int, rng: random.Random) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(n))


def write_text(folder: Path, rows: int, seq_len: int, seed: int = 0) -> Path:
    """``folder/data.json``: JSON lines ``{"text": ...}``, enough documents of about ROWS_PER_DOC
    rows each for ``rows`` rows; written once (the same content for every rank), atomically."""
    path = folder / "data.json"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    docs = math.ceil(rows / ROWS_PER_DOC) + 1
    words = math.ceil(ROWS_PER_DOC * seq_len / TOKENS_PER_WORD)
    tmp = folder / f".data.json.{os.getpid()}"
    with open(tmp, "w") as f:
        for _ in range(docs):
            f.write(json.dumps({"text": pseudo_words(words, rng)}) + "\n")
    os.replace(tmp, path)
    return path


def titan_argv(args: argparse.Namespace, data: Path, rest: list[str]) -> list[str]:
    """torchtitan's command line for the workload (the subcommand last, as tyro wants it)."""
    argv = ["--module", "titan_llama", "--config", f"llama_{args.flavor}",
            "--dump-folder", str(Path(args.out) / "titan"),
            "--training.local-batch-size", str(args.batch_size), "--training.seq-len", str(args.seq_len),
            "--training.steps", str(args.steps), "--metrics.log-freq", str(args.log_freq),
            "--dataloader.dataset-path", str(data.parent), "--dataloader.num-workers", str(args.data_workers),
            "--debug.seed", str(args.seed),
            "--compile.enable" if args.compile else "--compile.no-enable",
            "--training.no-disable-cuda-graphs" if args.cuda_graphs else "--training.disable-cuda-graphs"]
    return [*argv, *rest, f"activation-checkpoint:{args.activation_checkpointing}"]


def check(argv: list[str]) -> None:
    """What the run would train, built on the CPU: shape, parameters, the first batch."""
    import torch
    from torchtitan.config import ConfigManager

    cfg = ConfigManager().parse_args(argv)
    model_cfg = cfg.model_spec.model
    with torch.device("meta"):
        model = model_cfg.build()
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    tok = cfg.tokenizer.build(tokenizer_path=cfg.hf_assets_path)
    loader = cfg.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=cfg.training.seq_len,
                                  local_batch_size=cfg.training.local_batch_size, snapshot_every_n_steps=None)
    inputs, labels = next(iter(loader))
    pos = inputs["positions"]
    starts = int((pos == 0).sum()) - pos.shape[0]  # document starts past each row's first token
    layer = model_cfg.layers[0]
    print(json.dumps({"flavor": cfg.model_spec.flavor, "layers": len(model_cfg.layers), "dim": model_cfg.dim,
                      "vocab": model_cfg.vocab_size, "tied": getattr(model_cfg, "enable_weight_tying", None),
                      "n_heads": layer.attention.n_heads, "n_kv_heads": layer.attention.n_kv_heads,
                      "ffn_hidden": layer.feed_forward.w1.out_features, "params": params,
                      "batch": list(inputs["input"].shape), "labels": list(labels.shape),
                      "document_starts_inside_rows": starts, "tokenizer_vocab": tok.get_vocab_size(),
                      "compile": cfg.compile.enable, "cuda_graphs": not cfg.training.disable_cuda_graphs,
                      "activation_checkpoint": type(cfg.activation_checkpoint).__qualname__
                      if cfg.activation_checkpoint is not None else None}))


def main(argv: list[str] | None = None) -> None:
    args, rest = parse_args(sys.argv[1:] if argv is None else argv)
    if not TOKENIZER.is_dir():
        raise SystemExit(f"titan_llama.py: error: the tokenizer folder {TOKENIZER} is missing")
    # nothing is fetched: the dataset is a local folder, the tokenizer a local file
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = args.batch_size * args.steps * int(os.environ.get("WORLD_SIZE", "1"))
    data = write_text(Path(args.out) / "titan-data", rows, args.seq_len, args.seed)
    targv = titan_argv(args, data, rest)
    if str(HERE) not in sys.path:  # --module titan_llama imports this file by name
        sys.path.insert(0, str(HERE))
    if args.check:
        check(targv)
        return
    from torchtitan.train import main as titan_main

    sys.argv = ["torchtitan.train", *targv]
    titan_main()


if __name__ == "__main__":
    main()
