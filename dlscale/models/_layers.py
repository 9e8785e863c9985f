"""Layers shared by the language models."""
from __future__ import annotations

import torch
import torch.nn.functional as F

# A logit this low gets probability exactly 0 in a float32 softmax (exp(-1e4) underflows), and is
# still finite in fp16/bf16, so padded vocabulary columns change neither the loss nor a gradient.
_MASKED_LOGIT = -1.0e4


def vocab_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 multiple: int | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` over the vocabulary, computed with the vocabulary padded on CUDA.

    Why: a vocabulary such as GPT-2's 50,257 or BERT's 30,522 rows is not a multiple of 8, so the
    logits' row stride is misaligned for the tensor cores and cuBLAS takes slow kernels for the
    projection and its two backward matmuls (measured on an H200: GPT-2's head, the
    vocabulary projection with its cross-entropy, took 38 ms of a 68 ms eager step at batch 16).
    The weight is padded with zero rows to a multiple of ``multiple`` (default: 64 on CUDA, no
    padding elsewhere) and the padded columns get the logit -1e4, so softmax and cross-entropy
    over the returned (..., padded) logits equal those over the real vocabulary: the parameter
    stays the model's own (tied, unpadded), and the targets are real token ids. DTensor weights
    (tensor parallel) take the plain path.
    """
    if multiple is None:
        multiple = 64 if x.is_cuda else 1
    vocab = weight.shape[0]
    pad = -vocab % multiple
    if pad == 0 or type(weight).__name__ == "DTensor":
        return F.linear(x, weight, bias)
    w = F.pad(weight, (0, 0, 0, pad))
    if bias is None:
        b = torch.zeros(vocab + pad, dtype=weight.dtype, device=weight.device)
        b[vocab:] = _MASKED_LOGIT
    else:
        b = F.pad(bias, (0, pad), value=_MASKED_LOGIT)
    return F.linear(x, w, b)


class VocabProjection(torch.nn.Linear):
    """``nn.Linear`` onto the vocabulary whose forward is :func:`vocab_logits`.

    A module (not a bare function in the head) so that module hooks still see it: FSDP's
    unsharding, tensor parallel's input conversion, the pipeline splitter's discovery of which
    modules the head uses. Its output may be wider than ``out_features`` (masked columns).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return vocab_logits(x, self.weight, self.bias)
