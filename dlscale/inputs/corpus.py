"""``dlscale data make text-corpus``: a real text corpus from files already on the machine.

The default source is the Python standard library of the interpreter that runs dlscale
(``sysconfig.get_paths()["stdlib"]``: its modules' sources and docstrings, and ``pydoc_data``'s
documentation text), so a machine without internet has real, non-random text to train to a quality
target on. Files (``.py``, ``.txt``, ``.rst``, ``.md``; ``site-packages`` and caches left out) are
listed in sorted order, shuffled by the seed, and taken until ``--size`` bytes of text; a share
of the *files* (``--val-share``) is held out as the validation split, so no document is in both.

Tokenisers: ``bytes`` (ids 0..255, the file's UTF-8 bytes; id 0 ends a document, which source
text does not hold) needs nothing; ``bpe`` trains a byte-level BPE of ``--vocab`` ids on the
training split only, offline, with Hugging Face ``tokenizers`` (id 0: ``<|endoftext|>``).

Written: ``train.bin`` and ``val.bin`` (uint16 ids, the format ``--data tokens:`` reads), the
tokenizer (``tokenizer.json`` for bpe) and ``dlscale-data.json``: every file taken (path relative
to the source, bytes, SHA-256, split), the seed, the tokenizer, token counts and the two specs.
The same source, seed and options give byte-identical files.
"""
from __future__ import annotations

import hashlib
import json
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlscale import ConfigError
from dlscale.inputs.make import MANIFEST, _prepare_out

GENERATOR = "dlscale text-corpus v1"
TOKENIZERS = ("bytes", "bpe")
EXTENSIONS = (".py", ".txt", ".rst", ".md")
SKIP_PARTS = ("site-packages", "dist-packages", "__pycache__", ".git")
END_OF_DOC = 0  # bytes: the NUL byte; bpe: the first special token
MAX_FILE_BYTES = 1 << 20  # larger files are data tables, not prose or code
TRAIN_FILE, VAL_FILE = "train.bin", "val.bin"


@dataclass(frozen=True)
class CorpusOptions:
    out: str
    size: int = 8_000_000  # bytes of text to take
    seed: int = 0
    tokenizer: str = "bytes"
    vocab: int = 500  # bpe only; 500 fits gpt2 tiny
    val_share: float = 0.05
    source: str | None = None  # default: the standard library


def default_source() -> str:
    return sysconfig.get_paths()["stdlib"]


def list_files(root: str) -> list[Path]:
    """Text files under ``root`` in sorted order (relative paths), caches and installed packages left out."""
    base = Path(root)
    if not base.is_dir():
        raise ConfigError(f"--source {root}: not a folder")
    out = []
    for p in sorted(base.rglob("*")):
        rel = p.relative_to(base)
        if p.suffix not in EXTENSIONS or any(part in SKIP_PARTS for part in rel.parts) or not p.is_file():
            continue
        if 0 < p.stat().st_size <= MAX_FILE_BYTES:
            out.append(rel)
    return out


def _read_text(path: Path) -> bytes | None:
    """The file's bytes when they are UTF-8 text without NUL (the end-of-document id), else None."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return data


def select(opts: CorpusOptions) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The files taken, in corpus order, with their split; and their contents."""
    root = Path(opts.source or default_source())
    files = list_files(str(root))
    order = np.random.default_rng(opts.seed).permutation(len(files))
    taken: list[dict[str, Any]] = []
    texts: list[bytes] = []
    total = 0
    for i in order:
        data = _read_text(root / files[i])
        if data is None:
            continue
        taken.append({"path": str(files[i]), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        texts.append(data)
        total += len(data)
        if total >= opts.size:
            break
    if len(taken) < 2:
        raise ConfigError(f"--source {root}: {len(taken)} usable text file(s); a corpus needs at least 2 "
                          f"(one for the validation split)")
    n_val = min(len(taken) - 1, max(1, round(opts.val_share * len(taken))))
    for j, entry in enumerate(taken):
        entry["split"] = "val" if j < n_val else "train"  # the order is already the seed's shuffle
    return taken, texts


def _byte_ids(texts: list[bytes]) -> np.ndarray:
    parts = []
    for t in texts:
        parts.append(np.frombuffer(t, dtype=np.uint8))
        parts.append(np.array([END_OF_DOC], dtype=np.uint8))
    return np.concatenate(parts).astype(np.uint16) if parts else np.zeros(0, np.uint16)


def _train_bpe(texts: list[bytes], vocab: int, out: Path):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # optional: tokenizers
    except ImportError:
        raise ConfigError("--tokenizer bpe needs Hugging Face tokenizers (pip install tokenizers); "
                          "--tokenizer bytes needs nothing") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((t.decode("utf-8") for t in texts), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    return tok


def _bpe_ids(tok, texts: list[bytes]) -> np.ndarray:
    ids: list[int] = []
    for enc in tok.encode_batch([t.decode("utf-8") for t in texts]):
        ids.extend(enc.ids)
        ids.append(END_OF_DOC)
    return np.asarray(ids, dtype=np.uint16)


def check_options(opts: CorpusOptions) -> None:
    if opts.tokenizer not in TOKENIZERS:
        raise ConfigError(f"--tokenizer must be one of {', '.join(TOKENIZERS)}, got {opts.tokenizer!r}")
    if opts.tokenizer == "bpe" and not 257 <= opts.vocab <= 65536:
        raise ConfigError(f"--vocab must be 257..65536 for bpe (256 byte tokens + the end of document, uint16 "
                          f"ids), got {opts.vocab}")
    if not 0 < opts.val_share < 1:
        raise ConfigError(f"--val-share must be between 0 and 1 (exclusive), got {opts.val_share}")
    if opts.size < 1000:
        raise ConfigError(f"--size must be at least 1000 bytes of text, got {opts.size}")


def make_text_corpus(opts: CorpusOptions) -> dict[str, Any]:
    """Build the corpus into ``opts.out``; returns (and writes) the manifest."""
    check_options(opts)
    if opts.source is not None and not Path(opts.source).is_dir():
        raise ConfigError(f"--source {opts.source}: not a folder")
    t0 = time.perf_counter()
    taken, texts = select(opts)
    root = Path(opts.out)
    _prepare_out(root)
    train_t = [t for e, t in zip(taken, texts) if e["split"] == "train"]
    val_t = [t for e, t in zip(taken, texts) if e["split"] == "val"]
    if opts.tokenizer == "bpe":
        tok = _train_bpe(train_t, opts.vocab, root)  # the validation split stays unseen
        train_ids, val_ids, vocab = _bpe_ids(tok, train_t), _bpe_ids(tok, val_t), tok.get_vocab_size()
    else:
        train_ids, val_ids, vocab = _byte_ids(train_t), _byte_ids(val_t), 256
    train_ids.tofile(root / TRAIN_FILE)
    val_ids.tofile(root / VAL_FILE)
    manifest = {
        "kind": "text-corpus", "generator": GENERATOR, "source": str(Path(opts.source or default_source())),
        "source_is_stdlib": opts.source is None, "seed": opts.seed, "size_requested_bytes": opts.size,
        "tokenizer": opts.tokenizer, "vocab": vocab, "dtype": "uint16", "val_share": opts.val_share,
        "train_files": sum(e["split"] == "train" for e in taken), "val_files": sum(e["split"] == "val" for e in taken),
        "train_text_bytes": sum(len(t) for t in train_t), "val_text_bytes": sum(len(t) for t in val_t),
        "train_tokens": int(train_ids.size), "val_tokens": int(val_ids.size),
        "train_sha256": _sha(root / TRAIN_FILE), "val_sha256": _sha(root / VAL_FILE),
        "spec": f"tokens:{root / TRAIN_FILE}:uint16", "eval_spec": f"tokens:{root / VAL_FILE}:uint16",
        "seconds": round(time.perf_counter() - t0, 2), "files": taken,
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
