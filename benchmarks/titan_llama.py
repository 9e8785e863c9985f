"""torchtitan's own trainer on dlscale's Llama shapes (the harness of benchmarks/suites/titan.yaml).

    torchrun --standalone --nproc-per-node 1 benchmarks/titan_llama.py --flavor 1b --batch-size 4 \\
        --seq-len 2048 --steps 60 --compile --out DIR [-- MORE TORCHTITAN OPTIONS]

runs ``torchtitan.train`` on the Llama 3 shape of dlscale's ``llama`` flavour (layers, width, heads,
kv heads, SwiGLU width, vocabulary 128,256) with the workload as torchtitan's own options. Two
releases, told apart by the installed version:

* **0.2.x** (runs on torch 2.11): flavours are a dict in code, so ``1B`` and ``3B`` are added to
  ``torchtitan.models.llama3.llama3_args`` here (``8B`` is its own); its Llama has an untied head
  (dlscale's 1b and 3b tie it: the same FLOPs, 262M more parameters for AdamW at 1B) and SDPA
  causal attention.
* **0.3.x** (needs a newer torch than 2.11: it imports ``torch.distributed.fsdp.DataParallelMeshDims``
  and passes ``separate_full_blocks`` to ``create_block_mask``): a run is configured in Python,
  ``--module M --config F`` naming a function that returns a ``Trainer.Config``; this file is that
  module (``llama_1b``, ``llama_3b``, ``llama_8b``, ``llama_debug``: its own flavours, tied 1B/3B
  heads), with flex attention on a document-causal mask and CUDA graphs by default.

The run needs no network: the tokenizer is torchtitan's test tokenizer (benchmarks/assets-titan,
BSD-3; 2,020 ids, so token ids stay below 2,048 while the model's vocabulary and head are the full
128,256), and the text is written here first: pseudo-words in documents of about ``ROWS_PER_DOC``
rows, so nearly every row is one document (0.3's document-causal mask is then the causal mask).
torchtitan's dataloader reads it as its ``c4_test`` dataset from a local folder. ``--check`` builds
the configuration, the tokenizer, the first batch and the model on the meta device and prints them
as one JSON line, with no GPU.
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
# torchtitan 0.2's TransformerModelArgs of the flavours it lacks (its 8B and debugmodel are its own);
# rope scaling factor 32 as Llama 3.2 (speed does not depend on it)
V02_FLAVORS = {"1B": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5, multiple_of=1024),
               "3B": dict(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim_multiplier=1.0, multiple_of=1024)}
ROWS_PER_DOC = 64  # a document boundary in about one row of 64
TOKENS_PER_WORD = 4  # a lower bound for the test tokenizer on the words below (measured: about 4.5)


# ----------------------------------------------------------------------------- torchtitan 0.3 configs

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


# ----------------------------------------------------------------------------- torchtitan 0.2 flavours

def register_v02_flavors() -> None:
    """Add the flavours torchtitan 0.2 lacks to its llama3 flavour dict (the train spec holds it)."""
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs

    for name, kw in V02_FLAVORS.items():
        llama3_args.setdefault(name, TransformerModelArgs(**kw, vocab_size=128256, rope_theta=500000,
                                                          rope_scaling_args=RoPEScalingArgs(scaling_factor=32.0)))


# ----------------------------------------------------------------------------- the launcher

def titan_release() -> tuple[int, int] | None:
    """(major, minor) of the installed torchtitan, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        parts = version("torchtitan").split(".")
    except PackageNotFoundError:
        return None
    return int(parts[0]), int(parts[1])


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
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="torchtitan 0.3's CUDA-graph capture of forward and backward (default: torchtitan's, on)")
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
    args.release = titan_release()
    if args.release is None:
        p.error("torchtitan is not installed (benchmarks/run.py --wheels DIR installs its wheels)")
    if args.release < (0, 3) and args.cuda_graphs is not None:
        p.error(f"--cuda-graphs/--no-cuda-graphs: torchtitan {args.release[0]}.{args.release[1]} has no CUDA graphs "
                f"(0.3 and later)")
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


def _common(args: argparse.Namespace, data: Path) -> list[str]:
    return ["--training.local-batch-size", str(args.batch_size), "--training.seq-len", str(args.seq_len),
            "--training.steps", str(args.steps), "--metrics.log-freq", str(args.log_freq),
            "--metrics.disable-color-printing", "--debug.seed", str(args.seed),
            "--compile.enable" if args.compile else "--compile.no-enable"]


def _selective_op(args: argparse.Namespace) -> list[str]:
    # dlscale's selective is torchtitan's op-level policy; 0.2's default checkpoints every 2nd block
    return ["--activation-checkpoint.selective-ac-option", "op"] if args.activation_checkpointing == "selective" else []


def titan_argv(args: argparse.Namespace, data: Path, rest: list[str]) -> list[str]:
    """torchtitan's command line for the workload, in the release's own option names."""
    dump = str(Path(args.out) / "titan")
    if args.release < (0, 3):
        return ["--job.dump-folder", dump, "--model.name", "llama3", "--model.flavor", FLAVORS[args.flavor],
                "--model.hf-assets-path", str(TOKENIZER), "--optimizer.lr", "3e-4",
                "--lr-scheduler.warmup-steps", "2", "--training.dataset", "c4_test",
                "--training.dataset-path", str(data.parent),
                "--training.dataloader.num-workers", str(args.data_workers), *_common(args, data),
                "--activation-checkpoint.mode", args.activation_checkpointing, *_selective_op(args), *rest]
    argv = ["--module", "titan_llama", "--config", f"llama_{args.flavor}", "--dump-folder", dump,
            "--dataloader.dataset-path", str(data.parent), "--dataloader.num-workers", str(args.data_workers),
            *_common(args, data)]
    if args.cuda_graphs is not None:
        argv.append("--training.no-disable-cuda-graphs" if args.cuda_graphs else "--training.disable-cuda-graphs")
    # tyro wants the subcommand after the options
    return [*argv, *rest, f"activation-checkpoint:{args.activation_checkpointing}"]


def built(argv: list[str], release: tuple[int, int]) -> tuple[dict, object, object, object]:
    """(facts, model on the meta device, tokenizer, dataloader) of the run, as torchtitan builds them."""
    import torch
    from torchtitan.config import ConfigManager

    cfg = ConfigManager().parse_args(argv)
    if release < (0, 3):
        from torchtitan.protocols.train_spec import get_train_spec

        spec = get_train_spec(cfg.model.name)
        margs = spec.model_args[cfg.model.flavor]
        margs.update_from_config(cfg)
        with torch.device("meta"):
            model = spec.model_cls(margs)
        tok = spec.build_tokenizer_fn(cfg)
        loader = spec.build_dataloader_fn(dp_world_size=1, dp_rank=0, tokenizer=tok, job_config=cfg)
        facts = {"flavor": cfg.model.flavor, "attention": margs.attn_type, "cuda_graphs": False,
                 "activation_checkpoint": cfg.activation_checkpoint.mode}
        return facts, model, tok, loader
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    tok = cfg.tokenizer.build(tokenizer_path=cfg.hf_assets_path)
    loader = cfg.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=cfg.training.seq_len,
                                  local_batch_size=cfg.training.local_batch_size, snapshot_every_n_steps=None)
    ac = cfg.activation_checkpoint
    facts = {"flavor": cfg.model_spec.flavor,
             "attention": type(cfg.model_spec.model.layers[0].attention.inner_attention).__qualname__,
             "cuda_graphs": not cfg.training.disable_cuda_graphs,
             "activation_checkpoint": type(ac).__qualname__ if ac is not None else "none"}
    return facts, model, tok, loader


def check(argv: list[str], release: tuple[int, int], compile_: bool) -> dict:
    """What the run would train, built on the CPU: shape, parameters, the first batch."""
    from torch import nn

    facts, model, tok, loader = built(argv, release)
    layers = model.layers
    block = next(iter(layers.values())) if isinstance(layers, nn.ModuleDict) else layers[0]
    head = getattr(model, "output", None) or getattr(model, "lm_head", None)
    inputs, labels = next(iter(loader))
    tokens = inputs["input"]
    out = {"torchtitan": ".".join(map(str, release)), **facts, "layers": len(layers),
           "dim": model.norm.weight.shape[0], "vocab": model.tok_embeddings.weight.shape[0],
           "tied": head is not None and head.weight is model.tok_embeddings.weight,
           "attn_projections": {n: m.out_features for n, m in block.attention.named_modules()
                                if isinstance(m, nn.Linear)},
           "ffn_hidden": block.feed_forward.w1.out_features,
           "params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
           "batch": list(tokens.shape), "labels": list(labels.shape), "tokenizer_vocab": tok.get_vocab_size(),
           "max_token_id": int(tokens.max()), "compile": compile_}
    if "positions" in inputs:  # 0.3: document starts past each row's first token
        pos = inputs["positions"]
        out["document_starts_inside_rows"] = int((pos == 0).sum()) - pos.shape[0]
    print(json.dumps(out))
    return out


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
    # before any torchtitan import: 0.2's ConfigManager.parse_args binds sys.argv[1:] as its default
    sys.argv = ["torchtitan.train", *targv]
    if args.release < (0, 3):
        register_v02_flavors()
    elif str(HERE) not in sys.path:  # --module titan_llama imports this file by name
        sys.path.insert(0, str(HERE))
    if args.check:
        check(targv, args.release, args.compile)
        return
    if args.release < (0, 3):
        from torchtitan.train import Trainer, main as titan_main

        titan_main(Trainer)
    else:
        from torchtitan.train import main as titan_main

        titan_main()


if __name__ == "__main__":
    main()
