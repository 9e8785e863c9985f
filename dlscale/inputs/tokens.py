"""Token files: a flat array of uint16/uint32 ids, memory-mapped (nanoGPT, llm.c, Megatron style).

Sample ``i`` is the ``i``-th window of the model's sequence length:

* GPT (``causal-lm``): x = t[i*T : i*T+T], y = t[i*T+1 : i*T+T+1] (as the synthetic batch: ids,
  then the same ids shifted by one); (n_tokens - 1) // T samples.
* BERT (``mlm-nsp``): the first T//2 ids of window i are segment A; segment B is the rest of the
  window (next-sentence label 0, "is next", as Hugging Face counts it) or, with probability 1/2,
  the second half of another window (label 1). token_type_ids 0 on A, 1 on B; exactly
  round(15 % of T) positions masked per sequence, chosen uniformly (the synthetic batch's
  count), labels = the original ids there and -100 elsewhere; of the masked inputs 80 % become
  [MASK], 10 % a random id, 10 % stay (BERT's rule). No [CLS]/[SEP] are inserted: the batch has
  exactly the synthetic batch's shapes, dtypes and layout. n_tokens // T samples.

Every batch read is checked against the vocabulary (one max over the batch, microseconds): a
file too large to scan whole up front fails at the first window holding a bad id, naming it.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from dlscale import ConfigError
from dlscale.inputs.images import sample_rng

MASK_ID = 103  # [MASK] of bert-base-uncased's vocabulary (vocab - 1 for a smaller vocabulary)


class _TokenFile(torch.utils.data.Dataset):
    def __init__(self, path: str, dtype: str, seq_len: int, vocab: int, seed: int):
        self.path, self.dtype, self.seq_len, self.vocab, self.seed = path, dtype, seq_len, vocab, seed
        self.itemsize = np.dtype(dtype).itemsize

        self.n_tokens = os.stat(path).st_size // self.itemsize
        self._mm = None  # opened in the process that reads (a DataLoader worker), not pickled

    @property
    def mm(self) -> np.memmap:
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._mm

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_mm"] = None
        return d

    def _check(self, ids: np.ndarray, first_window: int) -> None:
        top = int(ids.max())
        if top >= self.vocab:
            raise ConfigError(f"tokens {self.path}: id {top} near window {first_window} exceeds the model's "
                              f"vocabulary of {self.vocab}")

    def __getitem__(self, key):
        return self.__getitems__([key])


class TokenWindows(_TokenFile):
    """GPT batches: (x, y, meta) for a list of (epoch, index) keys."""

    def __len__(self) -> int:
        return (self.n_tokens - 1) // self.seq_len

    def __getitems__(self, keys: list) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        T = self.seq_len
        rows = np.stack([self.mm[i * T:i * T + T + 1] for _, i in keys]).astype(np.int64)
        self._check(rows, keys[0][1])
        x = torch.from_numpy(np.ascontiguousarray(rows[:, :-1]))
        y = torch.from_numpy(np.ascontiguousarray(rows[:, 1:]))
        return x, y, {"bytes": rows.size * self.itemsize, "bad": 0, "bad_names": []}


class BertPairs(_TokenFile):
    """BERT batches: (input_ids, token_type_ids, mlm_labels, nsp_labels, meta)."""

    def __init__(self, path: str, dtype: str, seq_len: int, vocab: int, seed: int, mlm_prob: float):
        super().__init__(path, dtype, seq_len, vocab, seed)
        self.n_mask = max(1, round(mlm_prob * seq_len))
        self.mask_id = MASK_ID if vocab > MASK_ID else vocab - 1

    def __len__(self) -> int:
        return self.n_tokens // self.seq_len

    def sample(self, epoch: int, i: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(input_ids, mlm_labels, nsp label) of sample i in this epoch."""
        T, half, n = self.seq_len, self.seq_len // 2, len(self)
        rng = sample_rng(self.seed, epoch, i)
        a = self.mm[i * T:i * T + half]
        if n < 2 or rng.random() < 0.5:
            b, nsp = self.mm[i * T + half:(i + 1) * T], 0
        else:
            j = int(rng.integers(0, n - 1))
            j += j >= i  # any other window
            b, nsp = self.mm[j * T + half:(j + 1) * T], 1
        ids = np.concatenate([a, b]).astype(np.int64)
        pos = rng.permutation(T)[:self.n_mask]
        labels = np.full(T, -100, dtype=np.int64)
        labels[pos] = ids[pos]
        r = rng.random(self.n_mask)
        ids[pos[r < 0.8]] = self.mask_id
        rand = pos[r >= 0.9]
        ids[rand] = rng.integers(0, self.vocab, len(rand))
        return ids, labels, nsp

    def __getitems__(self, keys: list):
        T = self.seq_len
        samples = [self.sample(e, i) for e, i in keys]
        labels = np.stack([s[1] for s in samples])
        self._check(labels, keys[0][1])  # labels hold the file's ids at the masked positions
        ids = np.stack([s[0] for s in samples])
        self._check(ids, keys[0][1])
        types = np.zeros((len(keys), T), dtype=np.int64)
        types[:, T // 2:] = 1
        nsp = np.array([s[2] for s in samples], dtype=np.int64)
        return (torch.from_numpy(ids), torch.from_numpy(types), torch.from_numpy(labels), torch.from_numpy(nsp),
                {"bytes": len(keys) * T * self.itemsize, "bad": 0, "bad_names": []})


def collate_batch(item):
    """The dataset already returns a batch (``__getitems__``)."""
    return item


def finish_on_device(item, device: torch.device, channels_last: bool = False):
    *tensors, meta = item
    return tuple(t.to(device, non_blocking=True) for t in tensors), meta
