"""One transformer layer (BERT, GPT-2, T5 encoder or decoder, Llama 3, GPT-3 shapes) in plain torch.

BERT, GPT-2 and T5 are compact re-implementations with the original models' shapes, not the models
themselves: attention through ``F.scaled_dot_product_attention``, a two-matmul MLP and the
norms of each family (BERT post-LayerNorm + GELU; GPT-2 pre-LayerNorm + tanh-GELU, causal; T5
pre-RMSNorm, no biases, ReLU, no relative position bias). ``llama`` is dlscale's own Llama block
(RMSNorm, grouped-query attention with rotary embeddings, SwiGLU) at Llama 3 8B and 70B shapes;
``gpt3`` is dlscale's GPT-2 block at the GPT-3 175B shape. The modules: dlscale/micro/blocks.py.
FLOPs: ``layer_flops``.
"""
from __future__ import annotations

import sys

import contextlib
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from dlscale import ConfigError
from dlscale.cli import deprecated_alias
from dlscale.micro import common
from dlscale.micro.matmul import float32_precision
from dlscale.results.metrics import peak_flops

KINDS = ("bert", "gpt2", "t5-encoder", "t5-decoder", "llama", "gpt3")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")  # rows and the peak table use the compute dtype's name
# --precision takes dlscale run's names
CLI_PRECISIONS = ("fp32", "fp32-strict", "tf32", "amp-bf16", "amp-fp16", "fp8")


@dataclass(frozen=True)
class LayerShape:
    d_model: int
    d_ff: int
    heads: int
    kv_heads: int = 0  # grouped-query attention's key/value heads; 0 = heads

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the keys and of the values: kv heads x head dim."""
        return self.d_model // self.heads * self.kv


# per family and size; a family's first size is its default
SHAPES: dict[str, dict[str, LayerShape]] = {
    "bert": {"base": LayerShape(768, 3072, 12), "large": LayerShape(1024, 4096, 16)},
    "gpt2": {"base": LayerShape(768, 3072, 12), "large": LayerShape(1024, 4096, 16)},  # large = gpt2-medium
    "t5-encoder": {"base": LayerShape(768, 3072, 12), "large": LayerShape(1024, 4096, 16)},
    "t5-decoder": {"base": LayerShape(768, 3072, 12), "large": LayerShape(1024, 4096, 16)},
    # Llama 3.1 8B and 70B, 3.2 1B (config.json on the Hugging Face Hub); tiny for the CPU
    "llama": {"8b": LayerShape(4096, 14336, 32, 8), "70b": LayerShape(8192, 28672, 64, 8),
              "1b": LayerShape(2048, 8192, 32, 8), "tiny": LayerShape(64, 128, 4, 2)},
    # GPT-3 175B (Brown et al. 2020, table 2.1: d_model 12288, 96 heads, d_ff = 4 x d_model)
    "gpt3": {"175b": LayerShape(12288, 49152, 96), "tiny": LayerShape(64, 256, 4)},
}
NO_DROPOUT = ("llama",)  # the Llama block has no dropout
PASSES = ("forward", "forward+backward")
GPU_BATCH, GPU_SEQ = 8, 512
CPU_BATCH, CPU_SEQ = 2, 128


def shape_of(kind: str, size: str) -> LayerShape:
    """The shape of ``kind`` at ``size``; ConfigError naming the choices otherwise."""
    if kind not in KINDS:
        raise ConfigError(f"unknown layer kind {kind!r}; choose from: {', '.join(KINDS)}")
    if size not in SHAPES[kind]:
        raise ConfigError(f"unknown layer size {size!r} for {kind}; choose from: {', '.join(SHAPES[kind])}")
    return SHAPES[kind][size]


def layer_flops(kind: str, batch: int, seq: int, d_model: int, d_ff: int,
                enc_seq: int | None = None, kv_dim: int | None = None) -> dict[str, int]:
    """Matmul FLOPs of one layer (norms, softmax, activations, rotary and dropout are not counted).

    With b = batch, s = seq, h = d_model, f = d_ff, k = kv_dim (the keys' and values' width: h
    unless grouped-query attention shares heads) (a multiply-add = 2 FLOPs):

    * self-attention projections (Q and output h x h, K and V h x k): 4·b·s·h² + 4·b·s·h·k,
      8·b·s·h² for k = h
    * self-attention scores Q·Kᵀ and context P·V: 2·b·s²·h each, 4·b·s²·h together
      (causal self-attention is counted in full, as usual in MFU)
    * feed-forward (h -> f -> h): 4·b·s·h·f, which is 16·b·s·h² for f = 4h; Llama's SwiGLU has
      three h x f matrices: 6·b·s·h·f
    * T5 decoder only, cross-attention over an encoder output of length e (default e = s):
      Q and output projections on decoder tokens 4·b·s·h², K and V projections on encoder
      tokens 4·b·e·h², scores + context 4·b·s·e·h; with e = s: 8·b·s·h² + 4·b·s²·h.

    forward = the sum above; BERT/GPT-2/GPT-3/T5 encoder: 24·b·s·h² + 4·b·s²·h when f = 4h;
    T5 decoder (e = s): 32·b·s·h² + 8·b·s²·h when f = 4h.
    forward_backward = 3 x forward (the backward pass computes input and weight gradients:
    two matmuls per forward matmul).
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown layer kind {kind!r}; choose from: {', '.join(KINDS)}")
    b, s, h, f = batch, seq, d_model, d_ff
    k = h if kv_dim is None else kv_dim
    parts = {"attn_proj": 4 * b * s * h * h + 4 * b * s * h * k, "attn_core": 4 * b * s * s * h,
             "ffn": (6 if kind == "llama" else 4) * b * s * h * f, "cross_proj": 0, "cross_core": 0}
    if kind == "t5-decoder":
        e = s if enc_seq is None else enc_seq
        parts["cross_proj"] = 4 * b * s * h * h + 4 * b * e * h * h
        parts["cross_core"] = 4 * b * s * e * h
    fwd = sum(parts.values())
    return {**parts, "forward": fwd, "forward_backward": 3 * fwd}


# ---------------------------------------------------------------------------------------------
# modules (built lazily so that importing this file does not import torch)

def check_layer(kind: str, size: str, dropout: float) -> LayerShape:
    """The layer's shape; ConfigError where the kind, the size or the dropout is not one it has."""
    shape = shape_of(kind, size)
    if dropout and kind in NO_DROPOUT:
        raise ConfigError(f"--dropout: the {kind} block has no dropout; use 0")
    return shape


def build_layer(kind: str, size: str, dropout: float = 0.0, max_seq: int = 8192):
    """The nn.Module of one layer; forward(x) or, for t5-decoder, forward(x, memory). ``max_seq``: the
    longest sequence a Llama block's rotary tables cover."""
    shape = check_layer(kind, size, dropout)
    from dlscale.micro import blocks  # torch: keeps start-up light

    if kind == "llama":
        return blocks.llama_block(shape.d_model, shape.d_ff, shape.heads, shape.kv, max_seq)
    if kind == "gpt3":
        return blocks.gpt_block(shape.d_model, shape.heads, dropout)
    return blocks.Layer(kind, shape.d_model, shape.d_ff, shape.heads, dropout)


def row_precision(cli: str, device: str, capability: tuple[int, int] | None) -> str:
    """What ``--precision`` runs, as `dlscale run` reads it: fp32 is TF32 on a CUDA device that has it
    (compute capability 8.0 and later, as the worker sets it), fp32-strict is IEEE fp32 everywhere."""
    if cli == "fp32-strict":
        return "fp32"
    if cli == "fp32" and device == "cuda" and capability is not None and capability >= (8, 0):
        return "tf32"
    return cli


def _capability(device: str) -> tuple[int, int] | None:
    import torch  # torch: keeps start-up light

    return tuple(torch.cuda.get_device_capability()) if device == "cuda" else None


def precision_support(precision: str, dev) -> str | None:
    import torch  # torch: keeps start-up light

    if precision == "tf32" and dev.type != "cuda":
        return "tf32 is a CUDA tensor-core mode; there is no tf32 on CPU"
    if precision == "fp8":
        from dlscale.train import fp8  # keeps the CLI start-up light

        return fp8.device_reason(dev.type, dev.index if dev.type == "cuda" else None) or (
            "precision fp8 needs torchao (float8 training); pip install 'dlscale[fp8]'"
            if importlib.util.find_spec("torchao") is None else None)
    if dev.type == "cuda" and precision in ("tf32", "bf16"):
        major, minor = torch.cuda.get_device_capability(dev)
        if major < 8:
            return f"{precision} needs compute capability >= 8.0 (Ampere), device has {major}.{minor}"
    return None


def to_float8(layer, dev) -> dict[str, Any]:
    """Swap the layer's Linears for torchao's Float8Linear as `dlscale run --precision fp8` swaps a model's
    blocks' (dlscale/train/fp8.py: one recipe, one filter); what it converted."""
    from dlscale.train import fp8  # keeps the CLI start-up light

    whole = SimpleNamespace(blocks=lambda m: [m])  # the layer is the model's one block
    return fp8.convert(layer, whole, SimpleNamespace(precision="fp8"), dev)["fp8"]


@contextlib.contextmanager
def precision_context(precision: str, dev):
    """fp32/tf32: fp32 math with TF32 off/on; bf16/fp16: autocast (fp32 weights, AMP-style); fp8: bf16
    autocast around the float8 Linears (as `dlscale run --precision fp8`)."""
    import torch  # torch: keeps start-up light

    with float32_precision("tf32" if precision == "tf32" else "fp32"):
        if precision in ("bf16", "fp16", "fp8"):
            dtype = torch.float16 if precision == "fp16" else torch.bfloat16
            with torch.autocast(device_type=dev.type, dtype=dtype):
                yield
        else:
            yield


@dataclass(frozen=True)
class LayerCase:
    """What ``run_layer`` measures: one layer of ``kind`` at ``size``, at every (batch, seq), in one
    precision (``PRECISIONS`` or "auto" = bf16 autocast on GPU, fp32 on CPU)."""

    kind: str
    size: str
    batches: tuple[int, ...]
    seqs: tuple[int, ...]
    precision: str = "auto"
    dropout: float = 0.0
    compiled: bool = False  # torch.compile of the one block (after the float8 swap)


def run_layer(case: LayerCase, device: str = "auto", timing: common.Timing | None = None) -> list[dict[str, Any]]:
    """Forward and forward+backward TFLOPS of one layer for each (batch, seq); two rows each.

    Rows: kind, size, d_model, d_ff, heads, kv_heads, batch, seq, precision, pass ("forward" |
    "forward+backward"), flops, time_us, tflops, tokens_per_s, peak_tflops, pct_of_peak, status, reason,
    compiled; fp8 rows also fp8_linears and fp8_casts ("unfused" eager: torchao fuses its float8 casts and
    amax reductions only under torch.compile, so an eager row is not torchao's fp8 speed; "compiled").
    """
    dev = common.torch_device(common.resolve_device(device))
    precision = case.precision if case.precision != "auto" else ("bf16" if dev.type == "cuda" else "fp32")
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; choose from: auto, {', '.join(PRECISIONS)}")
    shape = check_layer(case.kind, case.size, case.dropout)

    # fp8 against the bf16 peak, as dlscale run reports an fp8 run's MFU: it compares with the bf16 row
    peak, peak_src = peak_flops(common.device_name(dev), "bf16" if precision == "fp8" else precision)
    bench = _Bench(case, shape, precision, dev, timing or common.Timing())
    rows: list[dict[str, Any]] = []
    for batch in case.batches:
        for seq in case.seqs:
            flops = layer_flops(case.kind, batch, seq, shape.d_model, shape.d_ff, kv_dim=shape.kv_dim)
            base = {"kind": case.kind, "size": case.size, "d_model": shape.d_model, "d_ff": shape.d_ff,
                    "heads": shape.heads, "kv_heads": shape.kv, "batch": batch, "seq": seq, "precision": precision,
                    "status": "ok", "reason": None, "time_us": None, "tflops": None, "tokens_per_s": None,
                    "peak_tflops": peak / 1e12 if peak else None, "pct_of_peak": None, "peak_source": peak_src,
                    "compiled": case.compiled}
            if precision == "fp8":
                base["fp8_casts"] = "compiled" if case.compiled else "unfused"
            if bench.float8:
                base["fp8_linears"] = bench.float8["converted_linears"]
            for p in PASSES:
                row = {**base, "pass": p, "flops": flops["forward" if p == "forward" else "forward_backward"]}
                bench.measure(row, peak)
                rows.append(row)
    return rows


class _Bench:
    """The layer built on its device (or why it is not: an unsupported precision, no memory for it)
    and how each pass is timed."""

    def __init__(self, case: LayerCase, shape: LayerShape, precision: str, dev, timing: common.Timing):
        import torch  # torch: keeps start-up light

        self.case, self.d_model, self.precision, self.dev, self.timing = case, shape.d_model, precision, dev, timing
        self.layer = self.float8 = self.run = None
        self.status, self.reason = "unsupported", precision_support(precision, dev)
        if self.reason:
            return
        try:
            with dev:  # built where it runs: a GPT-3 block's 1.8 G parameters are slow to initialise on the host
                layer = build_layer(case.kind, case.size, case.dropout, max(case.seqs, default=1))
            torch.manual_seed(0)
            self.layer = layer.to(dev).train()
            self.float8 = to_float8(self.layer, dev) if precision == "fp8" else None
            # compiled on its first call, in the timer's warm-up; the parameters (and their grads) are the layer's
            self.run = torch.compile(self.layer) if case.compiled else self.layer
        except Exception as e:  # noqa: BLE001 - a layer too large for the device is its rows' status
            self.status, self.reason = common.classify_error(e), common.error_reason(e)
            common.free_memory(dev)

    def measure(self, row: dict[str, Any], peak: float | None) -> None:
        """Time ``row``'s pass at its batch and sequence length; fill its timing or its status."""
        if self.layer is None:
            row.update(status=self.status, reason=self.reason)
            return
        try:
            row.update(self._time_pass(row["pass"], row["batch"], row["seq"]))
            secs = row["time_us"] * 1e-6
            row.update(tflops=row["flops"] / secs / 1e12, tokens_per_s=row["batch"] * row["seq"] / secs)
            row["pct_of_peak"] = common.pct(row["tflops"] * 1e12, peak)
        except Exception as e:  # noqa: BLE001
            row.update(status=common.classify_error(e), reason=common.error_reason(e))
        self.layer.zero_grad(set_to_none=True)
        if row["status"] == "oom":
            common.free_memory(self.dev)

    def _time_pass(self, which: str, batch: int, seq: int) -> dict[str, Any]:
        import torch  # torch: keeps start-up light

        layer, run, precision, dev = self.layer, self.run, self.precision, self.dev
        inputs = [torch.randn(batch, seq, self.d_model, device=dev, requires_grad=True)]
        if self.case.kind == "t5-decoder":  # encoder output of the same length, part of the graph like in training
            inputs.append(torch.randn(batch, seq, self.d_model, device=dev, requires_grad=True))
        if which == "forward":
            # as in training: autograd records the graph, the output is dropped
            def step() -> None:
                with precision_context(precision, dev):
                    run(*inputs)
        else:
            with precision_context(precision, dev):
                grad_out = torch.randn_like(run(*inputs))

            def step() -> None:
                layer.zero_grad(set_to_none=True)
                for t in inputs:
                    t.grad = None
                with precision_context(precision, dev):
                    out = run(*inputs)
                out.backward(grad_out)
        return common.timing_fields(self.timing.measure(step, dev))


# ---------------------------------------------------------------------------------------------
# CLI

def add_parser(sub) -> None:

    p = sub.add_parser(
        "layer", help="forward and forward+backward TFLOPS of one transformer layer",
        description="Time one transformer layer with BERT, GPT-2, T5, Llama 3 or GPT-3 shapes (plain torch: "
                    "SDPA attention, MLP, norms; llama and gpt3 are dlscale's own Llama and GPT-2 blocks) in "
                    "forward and forward+backward; TFLOPS from the analytic matmul FLOPs (docs/micro.md: "
                    "forward 24*b*s*h^2 + 4*b*s^2*h for d_ff = 4h, T5 decoder adds cross-attention, Llama "
                    "counts its grouped K/V and three SwiGLU matrices, forward+backward = 3 x forward).")

    p.add_argument("--model", dest="kind", default="bert", help=f"layer family: {', '.join(KINDS)}")
    deprecated_alias(p, "--kind", "--model", dest="kind")
    p.add_argument("--size", default="auto",
                   help="bert, gpt2, t5-*: base (d_model 768, d_ff 3072, 12 heads) or large (1024, 4096, 16 "
                        "heads; for gpt2 the gpt2-medium shapes); llama: 8b (4096, 14336, 32 heads, 8 kv heads), "
                        "70b (8192, 28672, 64 heads, 8 kv heads), 1b (2048, 8192, 32 heads, 8 kv heads) or tiny; gpt3: 175b (12288, 49152, 96 heads) "
                        "or tiny; auto (default) = the first of the family's sizes")
    p.add_argument("--batch-size", dest="batch", action="append", default=None, metavar="B[,B...]",
                   help=f"batch sizes, comma-separated or repeated (default: auto = {GPU_BATCH} on GPU, "
                        f"{CPU_BATCH} on CPU)")
    p.add_argument("--seq-len", dest="seq", action="append", default=None, metavar="S[,S...]",
                   help=f"sequence lengths, comma-separated or repeated (the T5 decoder attends to an "
                        f"encoder output of the same length) (default: auto = {GPU_SEQ} on GPU, {CPU_SEQ} on CPU)")
    deprecated_alias(p, "--batch", "--batch-size", dest="batch")
    deprecated_alias(p, "--seq", "--seq-len", dest="seq")
    p.add_argument("--precision", default="auto",
                   help=f"one of {', '.join(CLI_PRECISIONS)} (dlscale run's names: amp-* = autocast over fp32 "
                        "weights; fp32 = as run: TF32 on where the GPU has it, rows say tf32; fp32-strict = "
                        "TF32 off; fp8 = torchao float8 Linears under bf16 autocast, as dlscale run --precision "
                        "fp8, %% of peak against the bf16 peak); auto = amp-bf16 on GPU, fp32 on CPU")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout probability on attention and residual branches (default 0 = off; the llama "
                        "block has none)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the block before timing it (default: off, eager); fp8 rows measured "
                        "eager carry fp8_casts=unfused: torchao fuses its float8 casts only when compiled")
    common.add_common_options(p, warmup_defaults=(5, 2), iters_defaults=(20, 10))
    p.set_defaults(func=main)


def main(args) -> int:
    kind = args.kind.lower()
    if kind not in KINDS:
        raise ConfigError(f"unknown layer --model {args.kind!r}; choose from: {', '.join(KINDS)}")
    size = args.size.lower()
    if size == "auto":
        size = next(iter(SHAPES[kind]))
    precision = args.precision.lower()
    if precision in ("bf16", "fp16"):  # the old spellings
        print(f"dlscale: warning: --precision {precision} is deprecated; use amp-{precision}", file=sys.stderr)
    precision = {"amp-bf16": "bf16", "amp-fp16": "fp16"}.get(precision, precision)
    if precision != "auto" and precision not in PRECISIONS + ("fp32-strict",):
        raise ConfigError(f"unknown precision {args.precision!r}; choose from: auto, {', '.join(CLI_PRECISIONS)}")
    if not 0.0 <= args.dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {args.dropout}")
    check_layer(kind, size, args.dropout)
    device = common.resolve_device(args.device)
    common.check_nproc(args.nproc_per_node, "layer")
    warmup = common.resolve_count(args.warmup, "warmup", 5, 2, device, 0)
    iters = common.resolve_count(args.iters, "iters", 20, 10, device, 1)
    batches = common.parse_positive_ints([b for b in common.split_list(args.batch) if b.lower() != "auto"],
                                         "batch") or [GPU_BATCH if device == "cuda" else CPU_BATCH]
    seqs = common.parse_positive_ints([s for s in common.split_list(args.seq) if s.lower() != "auto"],
                                      "seq") or [GPU_SEQ if device == "cuda" else CPU_SEQ]
    if precision == "auto":
        precision = "bf16" if device == "cuda" else "fp32"
    precision = row_precision(precision, device, _capability(device))
    common.check_store(args.store)

    case = LayerCase(kind, size, tuple(batches), tuple(seqs), precision, args.dropout, args.compile)
    rows = run_layer(case, device, common.Timing(warmup, iters))
    status = common.record_status(rows)
    config = common.args_config(args)
    config.update(resolved={"device": device, "kind": kind, "size": size, "batches": batches, "seqs": seqs,
                            "precision": precision, "warmup": warmup, "iters": iters, "compiled": args.compile})
    x = "seq" if len(seqs) > 1 or len(batches) == 1 else "batch"
    plot = {"x": x, "y": "tflops", "series": "pass", "xlabel": "sequence length" if x == "seq" else "batch size",
            "ylabel": f"TFLOPS ({precision})", "logx": True}
    dev_name = common.device_name(common.torch_device(device))
    error = common.failed_reasons(rows, lambda r: f"b={r['batch']} s={r['seq']} {r['pass']}")
    record = common.make_record(common.Outcome("layer", status, config, rows, plot, device, dev_name, error))
    mode = ", compiled" if args.compile else ""
    common.print_table(f"{kind}-{size} layer on {dev_name} ({device}, {precision}{mode}), median of {iters}",
                       [("batch", "batch"), ("seq", "seq"), ("pass", "pass"), ("flops", "GFLOP"),
                        ("time_us", "time (us)"), ("tflops", "TFLOPS"), ("tokens_per_s", "tokens/s"),
                        ("pct_of_peak", "% of peak")],
                       rows, formatters={"flops": lambda v: f"{v / 1e9:.2f}" if v else "-"})
    path = common.append_record(args.store, record)
    common.print_done(record, path)
    return common.exit_code(status)
