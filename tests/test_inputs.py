"""Real input data (dlscale/inputs): specs, checks, readers, sharding, masking, GPU-decode logic,
bad inputs; and runs reading a generated image folder (2 gloo processes) and token files."""
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import helpers_cli
from helpers_cli import names
from dlscale import ConfigError
from dlscale.case.config import DataSection, RunConfig, workload_fields
from dlscale.inputs import check_case, merge_ranks, parse_data
from dlscale.inputs import dataset_info, images, make, tokens
from dlscale.inputs.sampler import GlobalBatchSampler
from dlscale.inputs.source import Prefetcher, make_reader, open_source
from dlscale.models import get_model
from dlscale.strategies import DistEnv

CPU_RANK = DistEnv(0, 1, 0, 1, torch.device("cpu"), "gloo")  # one rank on the CPU: open_source's place

pytest.importorskip("PIL")


# ----------------------------------------------------------------------------- shared data

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A small generated ImageNet-like folder (3 classes) and token files for the tiny models."""
    root = tmp_path_factory.mktemp("data")
    stats = make.make_imagenet_like(str(root / "imgs"), 24, classes=3, seed=1, jobs=1)
    make.make_tokens(str(root / "gpt"), 40_000, "uint16", vocab=500, seed=2)
    make.make_tokens(str(root / "bert"), 40_000, "uint32", vocab=1000, seed=3)
    return SimpleNamespace(root=root, imgs=str(root / "imgs"), stats=stats,
                           gpt=f"tokens:{root}/gpt/tokens.bin", bert=f"tokens:{root}/bert/tokens.bin:uint32")


def _arange_tokens(path: Path, n: int, dtype="uint16") -> str:
    np.arange(n, dtype=dtype).tofile(path)
    return str(path)


# ----------------------------------------------------------------------------- specs and config

@pytest.mark.parametrize("text,kind,path,dtype", [
    ("synthetic", "synthetic", None, None),
    ("imagefolder:/data/imagenet/train", "imagefolder", "/data/imagenet/train", None),
    ("tokens:/d/train.bin", "tokens", "/d/train.bin", "uint16"),
    ("tokens:/d/train.bin:uint32", "tokens", "/d/train.bin", "uint32"),
    ("tokens:/d/a:b.bin", "tokens", "/d/a:b.bin", "uint16"),  # a colon in the path is kept
])
def test_parse_data(text, kind, path, dtype):
    s = parse_data(text)
    assert (s.kind, s.path, s.dtype) == (kind, path, dtype)


@pytest.mark.parametrize("text,fragment", [
    ("", "data must be synthetic, imagefolder:PATH or tokens:PATH"),
    ("imagenet", "data must be synthetic"),
    ("tokens:", "data must be synthetic"),
    ("tokens:/x.bin:int8", "token dtype must be one of uint16, uint32, got 'int8'"),
])
def test_parse_data_rejects(text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_data(text)


def test_config_fields_checked_and_case_key_kept_at_defaults():
    # the data fields at their defaults leave every earlier case key as it was
    assert "data" not in workload_fields(RunConfig().to_dict())
    assert RunConfig(data="tokens:/x.bin").case_key() != RunConfig().case_key()
    assert workload_fields(RunConfig(data="tokens:/x.bin", data_workers=0).to_dict())["data_workers"] == 0
    with pytest.raises(ConfigError, match=names("data-workers", "data-decode", "--data")):
        RunConfig(data_workers=2, data_decode="gpu")
    with pytest.raises(ConfigError, match=names("data-decode gpu", "images")):
        RunConfig(data="tokens:/x.bin", data_decode="gpu")
    with pytest.raises(ConfigError, match=names("data-workers", "0")):
        RunConfig(data="tokens:/x.bin", data_workers=-1)
    with pytest.raises(ConfigError, match=names("data-decode", "'tpu'")):
        RunConfig(data="tokens:/x.bin", data_decode="tpu")
    # --data-decoder: at its default (auto) earlier keys stand; a named decoder is another case
    imgs = "imagefolder:/d/imgs"
    assert "data_decoder" not in workload_fields(RunConfig(data=imgs, data_decode="gpu").to_dict())
    keys = {RunConfig(data=imgs, data_decode="gpu", data_decoder=d).case_key()
            for d in ("auto", "torchvision", "nvimgcodec")}
    assert len(keys) == 3
    with pytest.raises(ConfigError, match=names("data-decoder nvimgcodec", "--data-decode gpu")):
        RunConfig(data=imgs, data_decoder="nvimgcodec")
    with pytest.raises(ConfigError, match=names("data-decoder", "--data")):
        RunConfig(data_decoder="torchvision")
    with pytest.raises(ConfigError, match=names("'pillow'", "auto", "torchvision", "nvimgcodec", "dali")):
        RunConfig(data=imgs, data_decode="gpu", data_decoder="pillow")


# ----------------------------------------------------------------------------- bad inputs, up front

def _cfg(model, data, flavor="tiny", **kw):
    return RunConfig(model=model, flavor=flavor, data=data, device="cpu", **kw)


def test_bad_data_sets_are_one_line_config_errors(tmp_path, data_dir):
    (tmp_path / "empty").mkdir()
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.JPEG").write_bytes(b"x")
    noimg = tmp_path / "noimg"
    (noimg / "cls").mkdir(parents=True)
    (noimg / "cls" / "readme.txt").write_text("x")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00" * 7)
    short = _arange_tokens(tmp_path / "short.bin", 10)
    big_ids = tmp_path / "big.bin"
    np.full(10_000, 600, dtype=np.uint16).tofile(big_ids)
    cases = [
        (_cfg("resnet50", f"imagefolder:{tmp_path}/nope"), f"imagefolder {tmp_path}/nope: no such folder"),
        (_cfg("resnet50", f"imagefolder:{tmp_path}/empty"), "is empty"),
        (_cfg("resnet50", f"imagefolder:{flat}"), "has no class folders, only 1 file(s) at its top level"),
        (_cfg("resnet50", f"imagefolder:{noimg}"), "class folder 'cls' holds no image files"),
        (_cfg("resnet50", f"imagefolder:{data_dir.imgs}", batch_size=32), "24 images, fewer than one global batch"),
        (_cfg("gpt2", f"tokens:{odd}"), "size 7 bytes is not a multiple of 2 (uint16)"),
        (_cfg("gpt2", f"tokens:{short}"), "10 tokens, fewer than"),
        (_cfg("gpt2", f"tokens:{big_ids}", batch_size=2), "id 600 exceeds the model's vocabulary of 500"),
        (_cfg("gpt2", f"tokens:{tmp_path}"), "is not a file"),
        (_cfg("resnet50", data_dir.gpt), "model resnet50 trains on images"),
        (_cfg("bert-base", f"imagefolder:{data_dir.imgs}"), "trains on token sequences"),
    ]
    for cfg, fragment in cases:
        with pytest.raises(ConfigError) as e:
            check_case(cfg)
        msg = str(e.value)
        assert fragment in msg and "\n" not in msg, msg
    # more class folders than the model has outputs
    many = tmp_path / "many"
    for c in range(11):
        (many / f"c{c:02d}").mkdir(parents=True)
        os.link(next(Path(data_dir.imgs).glob("*/*.JPEG")), many / f"c{c:02d}" / "x.JPEG")
    with pytest.raises(ConfigError, match=names("11", "resnet50", "10")):  # the folders and the outputs counted
        check_case(_cfg("resnet50", f"imagefolder:{many}", batch_size=1))


def test_run_cli_bad_data_exits_2_before_anything(tmp_path, capsys):
    from dlscale.cli import main

    code = main(["run", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--store", str(tmp_path / "s"),
                 "--data", f"tokens:{tmp_path}/missing.bin"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{tmp_path}/missing.bin" in err[0]
    assert not (tmp_path / "s" / "results.jsonl").exists()


# ----------------------------------------------------------------------------- generator, identity, cache

def test_generated_imagenet_like_set_looks_like_imagenet(data_dir):
    st = data_dir.stats
    files = sorted(Path(data_dir.imgs).glob("n*/n*_*.JPEG"))
    assert st["images"] == len(files) == 24 and st["classes"] == 3
    assert json.loads((Path(data_dir.imgs) / make.MANIFEST).read_text())["mean_bytes"] == st["mean_bytes"]
    sizes = [f.stat().st_size for f in files]
    assert sum(sizes) == st["bytes"]
    assert 60e3 < st["mean_bytes"] < 170e3  # ImageNet: ~110 KB (24 images: a wide band)
    assert len(set(sizes)) == 24 and min(sizes) < 0.8 * max(sizes)
    from PIL import Image

    dims = {Image.open(f).size for f in files}
    assert len(dims) > 3 and all(200 <= max(d) <= 1000 for d in dims)
    # a pure function of the seed
    assert make.image_bytes(1, 5) == (Path(data_dir.imgs) / "n00000002" / "n00000002_5.JPEG").read_bytes()


def test_make_refuses_non_empty_out(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(ConfigError, match=names(str(tmp_path))):
        make.make_tokens(str(tmp_path), 100)
    assert [p.name for p in tmp_path.iterdir()] == ["x"]  # nothing written beside what was there


def test_identity_and_fingerprint(tmp_path, data_dir):
    spec = parse_data(data_dir.gpt)
    ident = dataset_info.identity(spec, seq_len=64)
    assert ident.n_tokens == 40_000 and ident.size_bytes == 80_000 and ident.n_samples == 625
    assert ident.vocab_check == "full" and ident.max_token_id <= 499 and ident.fits_in_memory is True
    img = dataset_info.identity(parse_data(f"imagefolder:{data_dir.imgs}"))
    assert img.n_files == 24 and img.n_classes == 3 and img.size_bytes == data_dir.stats["bytes"]
    # any change of a token file's bytes changes its fingerprint
    p = tmp_path / "t.bin"
    _arange_tokens(p, 1000)
    a = dataset_info.identity(parse_data(f"tokens:{p}"), 10).fingerprint
    data = bytearray(p.read_bytes())
    data[100] ^= 1
    p.write_bytes(bytes(data))
    os.utime(p, ns=(1, 1))
    assert dataset_info.identity(parse_data(f"tokens:{p}"), 10).fingerprint != a


def test_cold_read_evicts_where_the_kernel_says(tmp_path):
    p = tmp_path / "t.bin"
    _arange_tokens(p, 1 << 20)
    p.read_bytes()
    before = dataset_info.resident_share([str(p)])
    if before is None:
        pytest.skip("mincore is not available here")
    assert dataset_info.drop_from_cache([str(p)]) == 1
    after = dataset_info.resident_share([str(p)])
    assert after < before or before == 0  # some file systems ignore the advice; never more resident


# ----------------------------------------------------------------------------- sharding

def test_ranks_read_slices_of_the_single_process_global_batch():
    n, b, world = 103, 4, 3
    single = GlobalBatchSampler(n, b * world, 0, b * world, seed=7)
    ranks = [GlobalBatchSampler(n, b * world, r * b, b, seed=7) for r in range(world)]
    assert single.per_epoch == 103 // 12 == 8
    for m in range(20):  # past an epoch boundary
        assert sum((s.micro_batch(m) for s in ranks), []) == single.micro_batch(m)
    epoch0 = [i for m in range(8) for _, i in single.micro_batch(m)]
    assert len(set(epoch0)) == 96  # no repeats within an epoch; the last partial batch dropped
    assert single.micro_batch(8)[0][0] == 1 and single.micro_batch(0) != single.micro_batch(8)
    it = iter(ranks[1])
    assert [next(it) for _ in range(3)] == [ranks[1].micro_batch(m) for m in range(3)]
    with pytest.raises(ConfigError, match=names("5", "8")):  # the samples and the global batch

        GlobalBatchSampler(5, 8, 0, 4, 0)


# ----------------------------------------------------------------------------- token readers

def test_gpt_windows_shift_by_one_and_check_the_vocabulary(tmp_path):
    path = _arange_tokens(tmp_path / "t.bin", 1000)
    ds = tokens.TokenWindows(path, "uint16", seq_len=8, vocab=2000, seed=0)
    assert len(ds) == 124
    x, y, meta = ds.__getitems__([(0, 0), (0, 3)])
    assert x.dtype == torch.int64 and x.shape == (2, 8)
    assert x[1].tolist() == list(range(24, 32)) and y[1].tolist() == list(range(25, 33))
    assert meta["bytes"] == 2 * 9 * 2
    small = tokens.TokenWindows(path, "uint16", seq_len=8, vocab=100, seed=0)
    with pytest.raises(ConfigError) as e:  # the token id, the window and the vocabulary named
        small.__getitems__([(0, 12)])
    assert all(w in str(e.value) for w in ("104", "12", "100")) and "\n" not in str(e.value), e.value


def test_bert_pairs_look_like_the_synthetic_batch(tmp_path):
    spec = get_model("bert-base", "tiny")
    T, vocab = spec.seq_len, spec.arch.vocab
    ids_file = tmp_path / "t.bin"
    (np.arange(20_000) % 997).astype(np.uint16).tofile(ids_file)  # known content: id = position mod 997
    ds = tokens.BertPairs(str(ids_file), "uint16", T, vocab, seed=0, mlm_prob=spec.extra["mlm_prob"])
    keys = [(0, i) for i in range(64)]
    ids, types, labels, nsp, _meta = ds.__getitems__(keys)
    synth = spec.make_batch(64, torch.device("cpu"), torch.Generator().manual_seed(0))
    for real, fake in zip((ids, types, labels, nsp), synth):
        assert real.shape == fake.shape and real.dtype == fake.dtype
    assert torch.equal(types, synth[1])
    n_mask = round(0.15 * T)
    assert ((labels != -100).sum(dim=1) == n_mask).all()
    assert set(nsp.tolist()) == {0, 1}
    for r, (_, i) in enumerate(keys):
        window = (np.arange(i * T, (i + 1) * T) % 997)
        a_ok = all(labels[r, p] == window[p] for p in range(T // 2) if labels[r, p] != -100)
        assert a_ok  # masked labels of segment A are the file's ids there
        b_pos = [p for p in range(T // 2, T) if labels[r, p] != -100]
        same = all(labels[r, p] == window[p] for p in b_pos)
        if nsp[r] == 0:
            assert same  # "is next": segment B is the rest of the window
        kept = [p for p in range(T) if labels[r, p] == -100]
        if nsp[r] == 0:
            assert all(ids[r, p] == window[p] for p in kept)  # unmasked positions unchanged
    masked = labels != -100
    share_mask_token = (ids[masked] == tokens.MASK_ID).float().mean().item()
    assert 0.7 < share_mask_token < 0.9  # 80 % [MASK]
    again = ds.__getitems__(keys[:3])
    assert torch.equal(again[0], ids[:3]) and torch.equal(again[2], labels[:3])  # per-sample seeds


# ----------------------------------------------------------------------------- image readers

def test_crop_params_as_torchvision():
    rng = np.random.default_rng(0)
    for _ in range(200):
        w, h = int(rng.integers(20, 900)), int(rng.integers(20, 900))
        left, top, cw, ch = images.crop_params(w, h, rng)
        assert 0 <= left and left + cw <= w and 0 <= top and top + ch <= h and cw > 0 and ch > 0
    # no try fits a 1000x10 strip: the centre crop at the largest allowed ratio (4/3): 13 x 10
    assert images.crop_params(1000, 10, np.random.default_rng(1)) == ((1000 - 13) // 2, 0, 13, 10)
    assert images.crop_params(300, 200, images.sample_rng(0, 1, 2)) == images.crop_params(
        300, 200, images.sample_rng(0, 1, 2))


def test_image_items_labels_and_bad_files_skipped_and_counted(tmp_path, data_dir):
    listing = dataset_info.list_imagefolder(data_dir.imgs)
    assert listing.classes == ["n00000000", "n00000001", "n00000002"] and len(listing.files) == 24
    ds = images.ImageFolderData(listing.root, listing.files, listing.labels, 32, seed=0)
    img, label, nbytes, bad = ds[(0, 9)]
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8 and label == listing.labels[9] and not bad
    assert nbytes == os.path.getsize(os.path.join(listing.root, listing.files[9]))
    # a truncated and a garbage JPEG: both skipped, counted and named; the next good file fills in
    root = tmp_path / "set"
    (root / "a").mkdir(parents=True)
    good = (Path(listing.root) / listing.files[0]).read_bytes()
    (root / "a" / "0.jpg").write_bytes(good[: len(good) // 3])
    (root / "a" / "1.jpg").write_bytes(b"not an image at all")
    (root / "a" / "2.jpg").write_bytes(good)
    lst = dataset_info.list_imagefolder(str(root))
    ds = images.ImageFolderData(lst.root, lst.files, lst.labels, 16, seed=0)
    img, _, _, bad = ds[(0, 0)]
    assert img.shape == (16, 16, 3) and len(bad) == 2
    assert bad[0].startswith("a/0.jpg: OSError") and "truncated" in bad[0] and bad[1].startswith("a/1.jpg:")
    batch = images.collate_uint8([ds[(0, 0)], ds[(0, 2)]])
    assert batch[0].shape == (2, 16, 16, 3) and batch[2]["bad"] == 2 and len(batch[2]["bad_names"]) == 2
    # a folder of nothing but broken files stops the run instead of spinning
    (root / "a" / "2.jpg").write_bytes(b"broken too")
    with pytest.raises(RuntimeError, match="unreadable"):
        images.ImageFolderData(lst.root, lst.files, lst.labels, 16, seed=0)[(0, 0)]


def test_batched_crop_resize_flip_is_exact_bilinear():
    """One grid_sample over the padded batch = each crop resized by bilinear interpolation (no
    antialiasing) and flipped, image by image."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    imgs = [(torch.rand(3, 120, 90, generator=g) * 255).to(torch.uint8),
            (torch.rand(3, 70, 130, generator=g) * 255).to(torch.uint8)]
    boxes, flips = [(10, 20, 60, 80), (5, 3, 100, 50)], [False, True]
    out = images._crop_resize_flip(imgs, boxes, flips, 32, torch.device("cpu"))
    for i, (im, (left, top, w, h)) in enumerate(zip(imgs, boxes)):
        ref = F.interpolate(im[:, top:top + h, left:left + w].unsqueeze(0).float(), size=(32, 32), mode="bilinear",
                            antialias=False, align_corners=False)[0]
        ref = ref.flip(-1) if flips[i] else ref
        assert (out[i] - ref).abs().max() < 0.01
    # a box past the decoded image (its header lied): the whole image is resized instead
    out = images._crop_resize_flip(imgs, [(50, 20, 60, 80), (5, 3, 100, 50)], [False, False], 32,
                                   torch.device("cpu"))
    whole = F.interpolate(imgs[0].unsqueeze(0).float(), size=(32, 32), mode="bilinear", antialias=False,
                          align_corners=False)[0]
    assert (out[0] - whole).abs().max() < 0.01


def test_batched_crop_matches_grid_sample_image_by_image():
    """The one gather over the concatenated images = grid_sample (bilinear, align_corners=False,
    border) of each image alone, for boxes smaller than the output (upscaled), touching the image's
    right and bottom edges, flipped, and images of different sizes and aspect ratios."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    shapes = [(120, 90), (70, 130), (31, 17), (8, 8)]
    imgs = [(torch.rand(3, h, w, generator=g) * 255).to(torch.uint8) for h, w in shapes]
    boxes = [(10, 20, 60, 80), (100, 50, 30, 20), (0, 0, 17, 31), (3, 5, 5, 3)]
    flips = [False, True, True, False]
    size = 24
    out = images._crop_resize_flip(imgs, boxes, flips, size, torch.device("cpu"))
    assert out.shape == (4, 3, size, size) and out.dtype == torch.float32
    for im, (left, top, w, h), flip, got in zip(imgs, boxes, flips, out):
        hh, ww = im.shape[-2:]
        theta = torch.tensor([[[(-1.0 if flip else 1.0) * w / ww, 0.0, (2 * left + w) / ww - 1],
                               [0.0, h / hh, (2 * top + h) / hh - 1]]], dtype=torch.float64)
        grid = F.affine_grid(theta, [1, 3, size, size], align_corners=False)
        ref = F.grid_sample(im.unsqueeze(0).double(), grid, mode="bilinear", padding_mode="border",
                            align_corners=False)[0]
        assert (got.double() - ref).abs().max() < 1e-3


_KERNEL_CHECK = """
import torch
from dlscale.inputs import crop_kernel, images
assert crop_kernel.usable(torch.device("cpu"))
g = torch.Generator().manual_seed(2)
shapes = [(120, 90), (70, 130), (31, 17), (8, 8), (64, 64)]
imgs = [(torch.rand(3, h, w, generator=g) * 255).to(torch.uint8) for h, w in shapes]
boxes = [(10, 20, 60, 80), (100, 50, 30, 20), (0, 0, 17, 31), (3, 5, 5, 3), (40, 0, 60, 64)]
flips = [False, True, True, False, True]
mean, std = images._mean_std(torch.device("cpu"))
ref = images._crop_resize_flip(imgs, boxes, flips, 24, torch.device("cpu")).sub_(mean).div_(std)
for cl in (False, True):
    got = images.crop_batch(imgs, boxes, flips, 24, torch.device("cpu"), channels_last=cl)
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert got.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
    err = (got - ref).abs().max().item()
    assert err < 1e-4, err
dec = images.GpuDecoder(torch.device("cpu"), 24, True, decode=lambda datas: datas, name="x")
assert dec.crop_kernel and dec.crop_path == "one Triton kernel", dec.crop_path  # its own check passed
print("kernel ok", err)
"""


@pytest.mark.slow
def test_crop_kernel_matches_the_torch_version():
    """The Triton kernel (run by Triton's interpreter on the CPU) gives the torch version's
    normalised batch, both layouts, for the boxes of the tests above and a box at the right edge."""
    pytest.importorskip("triton")
    import subprocess

    p = subprocess.run([sys.executable, "-c", _KERNEL_CHECK], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 0 and "kernel ok" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]


def test_gpu_decode_path_matches_the_cpu_path(tmp_path, data_dir):
    """The GPU path's crop/resize/flip/normalise (driven here by a Pillow decoder on the CPU) gives
    the CPU path's batch up to interpolation rounding; PNG and broken files are handled and counted."""
    listing = dataset_info.list_imagefolder(data_dir.imgs)
    cpu = images.ImageFolderData(listing.root, listing.files, listing.labels, 48, seed=3)
    byt = images.ImageBytesData(listing.root, listing.files, listing.labels, 48, seed=3)
    dec = images.GpuDecoder(torch.device("cpu"), 48, channels_last=True, decode=images.pil_decode, name="pil")
    keys = [(1, i) for i in range(0, 24, 3)]
    x_cpu, y_cpu, _ = images.collate_normalized([cpu[k] for k in keys])
    (x_gpu, y_gpu), meta = dec(images.collate_bytes([byt[k] for k in keys]))
    assert x_gpu.shape == x_cpu.shape and x_gpu.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y_gpu, y_cpu)
    # the GPU path resizes without antialiasing (one grid_sample per batch): the same crops, their
    # statistics alike, pixel by pixel as close as aliasing of these noisy test images allows
    assert abs(x_gpu.mean() - x_cpu.mean()) < 0.05 and abs(x_gpu.std() - x_cpu.std()) < 0.2 * x_cpu.std()
    assert (x_gpu - x_cpu).abs().mean() < 0.5 * x_cpu.std()
    assert meta["decode_fallbacks"] == 0 and meta["bad"] == 0
    # a PNG goes to the host decoder; a file neither decoder reads is replaced and counted
    from PIL import Image

    png = torch.frombuffer(bytearray(_png_bytes(Image)), dtype=torch.uint8)
    junk = torch.frombuffer(bytearray(b"\xff\xd8 broken jpeg"), dtype=torch.uint8)
    _flat, _lengths, labels, boxes, flips, meta = images.collate_bytes([byt[k] for k in keys[:2]])
    item = (torch.cat([png, junk]), [len(png), len(junk)], labels, [(0, 0, 20, 20), (0, 0, 10, 10)],
            [False, True], meta)
    (x, _), meta = dec(item)
    assert x.shape == (2, 3, 48, 48) and meta["decode_fallbacks"] == 1 and meta["bad"] == 1


# ----------------------------------------------------------------------------- GPU decoder choice
# nvImageCodec needs a GPU to decode: its choice, its messages and its batch bookkeeping are checked
# here with stand-ins (monkeypatched), its decoding on the GPU machine (benchmarks/suites/data-gpu.yaml)

@pytest.fixture
def no_nvimg_cache(monkeypatch):
    """A fresh nvimgcodec_status() cache, and nvidia.* modules as they were afterwards."""
    import sys

    monkeypatch.setattr(images, "_NVIMG", {})
    before = {k: v for k, v in sys.modules.items() if k == "nvidia" or k.startswith("nvidia.")}
    yield
    for k in [k for k in sys.modules if k == "nvidia" or k.startswith("nvidia.")]:
        del sys.modules[k]
    sys.modules.update(before)


def _fake_package(root: Path, printed: str) -> None:
    """An importable ``nvidia.nvimgcodec`` that writes ``printed`` to file descriptor 2 when imported,
    as nvImageCodec's extension loaders do."""
    pkg = root / "nvidia" / "nvimgcodec"
    pkg.mkdir(parents=True)
    (root / "nvidia" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(f"import os\nos.write(2, {printed.encode()!r})\n__version__ = '0.9.0'\n")


NVIMG_LOAD_TEXT = (
    "Failed to load nvjpeg library! Please install CUDA toolkit or, if using nvImageCodec's Python distribution, "
    "the nvJPEG python wheel (e.g. python -m pip install nvidia-nvjpeg-cu13).\n"
    "\x1b[0;31m[ERROR] \x1b[0m[nvjpeg-ext] Failed to load nvJPEG library or retrieve version.\n"
    "Failed to load nvjpeg2k library! Please install nvJPEG2000.\n"
    "Note: If using nvImageCodec's Python distribution, it is enough to install the nvJPEG2000 wheel\n"
    "Failed to load nvtiff library! Please install nvTIFF.\n")


def test_nvimgcodec_import_messages_captured_and_judged(tmp_path, monkeypatch, capfd, no_nvimg_cache):
    """nvImageCodec's load-time lines: libnvjpeg missing makes it unusable (one ConfigError naming
    the wheel and the install line); JPEG 2000 / TIFF libraries are not needed and not shown; any
    other line is passed on."""
    import sys

    # the launcher's check judged here in this process (its child interpreter: the slow test below)
    monkeypatch.setattr(images, "_launcher_nvimgcodec_why", lambda: images.nvimgcodec_status()[1])
    for k in [k for k in sys.modules if k == "nvidia" or k.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, k)
    _fake_package(tmp_path / "a", NVIMG_LOAD_TEXT)
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    nv, why = images.nvimgcodec_status()
    # the library it cannot load and the wheel that has it; not a missing nvImageCodec
    assert nv is not None and "libnvjpeg" in why and "nvidia-nvjpeg" in why and "not installed" not in why, why
    assert images.nvimgcodec_status() == (nv, why)  # imported once
    assert capfd.readouterr().err == ""
    with pytest.raises(ConfigError) as e:
        images.check_gpu_decoder("nvimgcodec")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("data-decoder nvimgcodec") and why in msg  # option, value, the cause
    assert images.NVIMGCODEC_INSTALL in msg
    # libnvjpeg found: usable; an unknown line is passed on, the other codecs' are not
    images._NVIMG.clear()
    for k in [k for k in sys.modules if k == "nvidia" or k.startswith("nvidia.")]:
        del sys.modules[k]
    _fake_package(tmp_path / "b", "Failed to load nvtiff library! Please install nvTIFF.\nsomething else\n")
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    nv, why = images.nvimgcodec_status()
    assert nv.__file__.startswith(str(tmp_path / "b")) and why is None
    assert capfd.readouterr().err == "something else\n"
    images.check_gpu_decoder("nvimgcodec")


@pytest.mark.slow
def test_launcher_checks_nvimgcodec_in_a_child_interpreter(tmp_path, monkeypatch, capfd, no_nvimg_cache):
    """The launcher's check of --data-decoder nvimgcodec imports nvImageCodec in a child interpreter
    (on a GPU machine the import makes a CUDA context, which a sweep's parent would hold through
    every later case): nothing imported here, the verdict and the messages as the import gives them."""
    import sys

    for k in [k for k in sys.modules if k == "nvidia" or k.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, k)
    _fake_package(tmp_path / "b", "Failed to load nvtiff library! Please install nvTIFF.\nsomething else\n")
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    images.check_gpu_decoder("nvimgcodec")
    assert "nvidia.nvimgcodec" not in sys.modules and "module" not in images._NVIMG
    assert capfd.readouterr().err == "something else\n"
    images.check_gpu_decoder("nvimgcodec")  # judged once per process
    assert capfd.readouterr().err == ""
    images._NVIMG.clear()
    _fake_package(tmp_path / "a", NVIMG_LOAD_TEXT)
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    # the option and value, the library it cannot load (not a missing package), how to install it
    with pytest.raises(ConfigError, match=names("data-decoder nvimgcodec", "libnvjpeg", images.NVIMGCODEC_INSTALL)) as e:
        images.check_gpu_decoder("nvimgcodec")
    assert "not installed" not in str(e.value)
    assert "nvidia.nvimgcodec" not in sys.modules and capfd.readouterr().err == ""


def test_gpu_decoder_choice_and_its_errors(monkeypatch, no_nvimg_cache):
    """--data-decoder on a GPU (stand-ins for the libraries): auto takes torchvision where it imports
    (its nvJPEG picks the hardware decoders itself), else nvImageCodec, and the record's name says
    why; a named decoder is used as asked; the launcher's check names what is missing, one line."""
    cuda = torch.device("cuda", 0)
    tv = (lambda ds: ds, "torchvision 0.26.0 io.decode_jpeg on cuda (nvJPEG: hardware JPEG decoder where the GPU "
                         "has one, else CUDA)")
    state = {"tv": True, "nv": (object(), None), "hw": True}
    monkeypatch.setattr(images, "_torchvision", lambda: object() if state["tv"] else None)
    monkeypatch.setattr(images, "torchvision_decoder", lambda device: tv)
    monkeypatch.setattr(images, "nvimgcodec_status", lambda: state["nv"])
    monkeypatch.setattr(images, "_launcher_nvimgcodec_why", lambda: state["nv"][1])
    monkeypatch.setattr(images, "nvimgcodec_hardware", lambda nv, device: state["hw"])

    def nvdec(device, hardware=None):
        hw = state["hw"] if hardware is None else hardware
        return "nvdecode", f"nvImageCodec 0.9.0 on cuda:0 ({'hardware' if hw else 'cuda'})", \
            "hardware" if hw else "cuda"

    monkeypatch.setattr(images, "nvimgcodec_decoder", nvdec)

    def choose(choice="auto"):
        _decode, name, kind, backend = images.gpu_decoder(cuda, choice)
        return name, kind, backend

    assert choose() == (tv[1] + "; chosen by auto", "torchvision", "hardware-or-cuda")
    assert choose("torchvision") == (tv[1], "torchvision", "hardware-or-cuda")
    assert choose("nvimgcodec") == ("nvImageCodec 0.9.0 on cuda:0 (hardware)", "nvimgcodec", "hardware")
    state["hw"] = False  # a GPU without hardware JPEG decoders (L40S, RTX): nvImageCodec on CUDA when named
    assert choose("nvimgcodec") == ("nvImageCodec 0.9.0 on cuda:0 (cuda)", "nvimgcodec", "cuda")
    state["tv"] = False  # no torchvision: auto takes nvImageCodec, hardware or not
    for hw in (False, True):  # the decoder's own name, then why auto took it: torchvision missing
        state["hw"] = hw
        name, kind, backend = choose()
        assert name.startswith(nvdec(cuda)[1] + "; ") and "torchvision" in name.split("; ", 1)[1], name
        assert (kind, backend) == ("nvimgcodec", nvdec(cuda)[2])
    state.update(tv=True, nv=(None, "nvImageCodec (nvidia-nvimgcodec-cu13) is not installed"))
    assert choose() == (tv[1] + "; chosen by auto", "torchvision", "hardware-or-cuda")
    state["tv"] = False  # neither: refused (the launcher's check says so before any process starts)
    with pytest.raises(ConfigError, match="torchvision.*nvImageCodec"):  # both named
        choose()
    state["tv"] = True
    # the launcher's check, no CUDA context: nvimgcodec asked for and missing -> one line, how to install
    with pytest.raises(ConfigError) as e:
        images.check_gpu_decoder("nvimgcodec")
    # the option and value, the package missing (not a library it cannot load), how to install it; one line
    assert str(e.value).startswith("data-decoder nvimgcodec") and "\n" not in str(e.value)
    assert "nvidia-nvimgcodec-cu13" in str(e.value) and images.NVIMGCODEC_INSTALL in str(e.value)
    assert "libnvjpeg" not in str(e.value)
    images.check_gpu_decoder("auto")  # torchvision is there
    state["tv"] = False
    # both libraries named, each with how to install it (the package's install hints), one line
    with pytest.raises(ConfigError, match="^data-decode gpu.*torchvision.*nvImageCodec.*" + re.escape(
            images.TORCHVISION_INSTALL) + ".*" + re.escape(images.NVIMGCODEC_INSTALL.split(" (")[0]) + "$"):
        images.check_gpu_decoder("auto")
    # auto with torchvision there does not import nvImageCodec in the launcher
    state["tv"] = True
    monkeypatch.setattr(images, "nvimgcodec_status", lambda: pytest.fail("imported nvImageCodec"))
    monkeypatch.setattr(images, "_launcher_nvimgcodec_why", lambda: pytest.fail("checked nvImageCodec"))
    images.check_gpu_decoder("auto")


def test_run_cli_missing_nvimgcodec_exits_2_before_anything(tmp_path, monkeypatch, capsys, data_dir,
                                                            no_nvimg_cache):
    """dlscale run --data-decode gpu --data-decoder nvimgcodec where nvImageCodec does not import:
    one line naming it and the install, exit 2, no record (a GPU is faked visible)."""
    from dlscale.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(images, "_import_nvimgcodec",
                        lambda: (None, "", ModuleNotFoundError("No module named 'nvidia'", name="nvidia")))
    monkeypatch.setattr(images, "_launcher_nvimgcodec_why", lambda: images.nvimgcodec_status()[1])
    code = main(["run", "--model", "resnet50", "--flavor", "tiny", "--device", "cuda", "--batch-size", "4",
                 "--store", str(tmp_path / "s"), "--data", f"imagefolder:{data_dir.imgs}", "--data-decode", "gpu",
                 "--data-decoder", "nvimgcodec"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "data-decoder nvimgcodec: nvImageCodec (nvidia-nvimgcodec-cu13) is not installed; pip install " \
           "'dlscale[nvimgcodec]'" in err[0]
    assert not (tmp_path / "s" / "results.jsonl").exists()


images_mod = images  # _FakeNv.Decoder.decode has a keyword named images, as nvImageCodec's


class _FakeNv:
    """Stand-in for ``nvidia.nvimgcodec`` (the calls NvimgcodecDecode makes, with 0.9's keywords):
    decodes with Pillow to host HWC arrays, None where Pillow cannot."""

    class BackendKind:
        CPU_ONLY, GPU_ONLY, HYBRID_CPU_GPU, HW_GPU_ONLY = 1, 2, 3, 4

    class ColorSpec:
        SRGB = 1

    class Backend:
        def __init__(self, backend_kind, load_hint=1.0):
            self.backend_kind = backend_kind

    class DecodeParams:
        def __init__(self, apply_exif_orientation=True, color_spec=1, allow_any_depth=False):
            self.apply_exif_orientation, self.color_spec = apply_exif_orientation, color_spec

    class CodeStream:
        def __init__(self, array):
            assert isinstance(array, np.ndarray) and array.dtype == np.uint8
            self.array = array

    class Decoder:
        made: list = []

        def __init__(self, device_id=-1, max_num_cpu_threads=0, backends=None, options=""):
            self.device_id, self.threads = device_id, max_num_cpu_threads
            self.kinds = [b.backend_kind for b in backends]
            self.calls: list = []
            _FakeNv.Decoder.made.append(self)

        def decode(self, srcs, *, images=None, params=None, cuda_stream=0):
            self.calls.append((len(srcs), params, cuda_stream))
            out = []
            for s in srcs:
                try:
                    out.append(images_mod._pil_chw(torch.from_numpy(s.array)).permute(1, 2, 0).numpy().copy())
                except images_mod._BAD_IMAGE:
                    out.append(None)
            return out


class _FakeEvent:
    events: list = []

    def __init__(self):
        self.done, self.waited = False, False
        _FakeEvent.events.append(self)

    def record(self, stream):
        self.stream = stream

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True


def test_nvimgcodec_decode_batches_on_the_stream_and_holds_buffers(monkeypatch, data_dir):
    """NvimgcodecDecode in GpuDecoder (stand-ins for nvImageCodec and the CUDA stream): one decode
    call a batch, on the current stream, hardware then CUDA backends, RGB without EXIF rotation; a
    file it cannot decode goes to Pillow (counted); each batch's buffers and bytes are held until an
    event recorded after its crop has passed, at most HOLD batches (the oldest is waited for)."""
    stream = SimpleNamespace(cuda_stream=0xABC)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    _FakeEvent.events.clear()
    dev = torch.device("cpu")
    dec = images.NvimgcodecDecode(_FakeNv, dev, hardware=True)
    nvd = _FakeNv.Decoder.made[-1]
    assert nvd.kinds == [4, 2] and nvd.device_id == 0 and nvd.threads == images.NVIMGCODEC_CPU_THREADS
    assert dec.params.apply_exif_orientation is False and dec.params.color_spec == _FakeNv.ColorSpec.SRGB
    assert images.NvimgcodecDecode(_FakeNv, dev, hardware=False).decoder.kinds == [2]
    lst = dataset_info.list_imagefolder(data_dir.imgs)
    byt = images.ImageBytesData(lst.root, lst.files, lst.labels, 32, seed=0)
    gpu = images.GpuDecoder(dev, 32, channels_last=True, decode=dec, name="nv")
    ref = images.GpuDecoder(dev, 32, channels_last=True, decode=images.pil_decode, name="pil")
    item = images.collate_bytes([byt[(0, i)] for i in range(4)])
    (x, _), meta = gpu(item)
    assert torch.allclose(x, ref(item)[0][0]) and meta["decode_fallbacks"] == 0
    assert nvd.calls == [(4, dec.params, 0xABC)]  # one call for the batch, on the current stream
    assert len(dec._held) == 1 and not dec._pending and _FakeEvent.events[-1].stream is stream
    # a JPEG nvImageCodec cannot read (None) goes to Pillow; here Pillow cannot either: replaced, counted
    junk = torch.frombuffer(bytearray(b"\xff\xd8 broken jpeg"), dtype=torch.uint8)
    flat, lengths, labels, boxes, flips, meta0 = images.collate_bytes([byt[(0, i)] for i in range(2)])
    (x, _), meta = gpu((torch.cat([flat[:lengths[0]], junk]), [lengths[0], len(junk)], labels,
                        [boxes[0], (0, 0, 5, 5)], flips, meta0))
    assert x.shape == (2, 3, 32, 32) and meta["bad"] == 1 and meta["decode_fallbacks"] == 0
    # nothing finished on the GPU: held up to HOLD batches, then the oldest is waited for
    for _ in range(images.NvimgcodecDecode.HOLD + 2):
        gpu(item)
    assert len(dec._held) == images.NvimgcodecDecode.HOLD + 1
    waited = [e.waited for e in _FakeEvent.events]  # 8 batches, HOLD + 1 held after the last
    assert len(waited) == 8 and waited == [True] * 3 + [False] * 5
    # finished: released at the next call without waiting
    for e in _FakeEvent.events:
        e.done = True
    gpu(item)
    assert len(dec._held) == 1


def test_record_names_the_gpu_decoder_and_its_backend(monkeypatch, data_dir):
    """--data-decoder reaches the decoder, and the record's data.loader names what ran: decoder (the
    name), gpu_decoder (auto resolved) and decoder_backend."""
    from dlscale.inputs.source import start_source

    monkeypatch.setattr(images, "gpu_decoder", lambda device, choice="auto": (
        images.pil_decode, f"stand-in for {choice}", "nvimgcodec", "hardware"))
    data = DataSection(data=f"imagefolder:{data_dir.imgs}", data_decode="gpu", data_decoder="nvimgcodec")
    reader = make_reader(get_model("resnet50", "tiny"), torch.device("cpu"), data)
    assert (reader.decoder, reader.gpu_decoder, reader.decoder_backend) == \
        ("stand-in for nvimgcodec; crop: torch ops", "nvimgcodec", "hardware")
    src = start_source(reader, GlobalBatchSampler(len(reader.dataset), 4, 0, 4, 0), data, torch.device("cpu"), 0)
    try:
        loader = src.summary([], 1.0)["loader"]
    finally:
        src.close()
    assert (loader["decode"], loader["decoder"], loader["gpu_decoder"], loader["decoder_backend"]) == \
        ("gpu", "stand-in for nvimgcodec; crop: torch ops", "nvimgcodec", "hardware")


def test_gpu_decode_parts_script_runs_on_the_cpu(data_dir, capsys):
    """benchmarks/gpu_decode_parts.py (the data-gpu suite's after command) on the CPU: Pillow stands
    in for the GPU decoders, the table has its parts and an empty NVJPG column."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_decode_parts.py"
    spec = importlib.util.spec_from_file_location("gpu_decode_parts", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([data_dir.imgs, "--batches", "1", "--batch-size", "4", "--size", "32"]) == 0
    out = capsys.readouterr().out
    assert "| part | images/s | ms per batch | NVJPG busy (%) |" in out
    assert out.count("| Pillow: ") == 4 and "| — |" in out


@pytest.mark.slow
def test_decode_beside_script_runs_every_variant_on_the_cpu(data_dir, capsys):
    """benchmarks/decode_beside.py on the CPU (tiny ResNet-50, Pillow for the GPU decoder): every
    variant trains, the table has a row each, synthetic is its own reference."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "decode_beside.py"
    spec = importlib.util.spec_from_file_location("decode_beside", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    switch = sys.getswitchinterval()
    out = mod.main([data_dir.imgs, "--batch-size", "2", "--batches", "2", "--warmup", "0", "--steps", "1",
                    "--rounds", "1"])
    assert sys.getswitchinterval() == switch  # every variant's thread closed, the interval restored
    assert set(out["median_images_per_s"]) == set(mod.VARIANTS) and all(v > 0 for v in out["median_images_per_s"].values())
    text = capsys.readouterr().out
    assert "| synthetic | " in text and "| 1.000 |" in text and text.count("\n| ") >= len(mod.VARIANTS)
    with pytest.raises(SystemExit):
        mod.parse_args([data_dir.imgs, "--variants", "dlscale,nonsense"])


def _png_bytes(Image) -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(np.full((30, 40, 3), 100, dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_prefetcher_runs_ahead_hands_over_in_order_and_raises_errors():
    it = iter(range(100))
    p = Prefetcher(it, lambda i: ((torch.tensor([i]),), {"bytes": 0, "bad": 0, "bad_names": []}),
                   torch.device("cpu"), depth=2)
    assert [p.get()[0][0].item() for _ in range(5)] == [0, 1, 2, 3, 4]
    p.close()
    assert not p.thread.is_alive()

    def boom(i):
        raise ValueError(f"bad batch {i}")

    p = Prefetcher(iter(range(3)), boom, torch.device("cpu"))
    with pytest.raises(ValueError, match="bad batch 0"):
        p.get()
    p.close()


def test_in_process_sources_and_their_record(data_dir):
    """open_source with 0 workers (in this process): batches of the model's shapes, and the window record."""
    par = SimpleNamespace(info={}, dp_size=1, dp_rank=0, devices_per_process=1)
    for model, data, batch in (("resnet50", f"imagefolder:{data_dir.imgs}", 4), ("gpt2", data_dir.gpt, 4),
                               ("bert-base", data_dir.bert, 4)):
        spec = get_model(model, "tiny")
        cfg = RunConfig(model=model, flavor="tiny", data=data, batch_size=batch, device="cpu", data_workers=0,
                        grad_accum=2)
        src = open_source(spec, cfg, par, CPU_RANK, None)
        try:
            synth = spec.make_batch(batch, torch.device("cpu"), torch.Generator().manual_seed(0))
            assert len(src.batches) == 2
            for real, fake in zip(src.batches[0], synth):
                assert real.shape == fake.shape and real.dtype == fake.dtype
            src.window_start()
            src.next()
            src.window_end()
            s = src.summary([0.002], 0.1)
            assert s["samples"] == 2 * batch and s["data_wait_share"] == pytest.approx(0.02)
            assert s["input_bound"] is False and s["loader"]["workers"] == 0 and s["loader_cpu_cores"] is None
            assert s["loader"]["data_kind"] == {"resnet50": "image", "gpt2": "causal-lm", "bert-base": "mlm-nsp"}[model]
            assert s["epoch_at_window_start"] == pytest.approx(2 / s["loader"]["micro_batches_per_epoch"])
            assert s["bytes_read"] > 0 and s["page_cache"]["cold_read"] is False
            assert s["loader"]["gpu_decoder"] is None and s["loader"]["decoder_backend"] is None  # no GPU decode
        finally:
            src.close()
    # the synthetic source is the pre-made list, untouched
    cfg = RunConfig(model="gpt2", flavor="tiny", device="cpu")
    made = [("x",)]
    src = open_source(get_model("gpt2", "tiny"), cfg, par, CPU_RANK, lambda: made)
    assert src.static and src.next() is made and src.summary([], 1.0) is None


def test_data_prefetch_reaches_the_dataloader_and_the_record(data_dir, monkeypatch):
    """--data-prefetch N: the DataLoader's prefetch_factor, the record's, and the buffer the wait
    verdict counts (workers x N); refused, one line, where no worker would prefetch."""
    from dlscale.inputs import source

    got = []

    def loader(plan, cuda):  # in this process: no worker started
        got.append(plan.prefetch)
        return torch.utils.data.DataLoader(plan.dataset, batch_sampler=plan.sampler, num_workers=0,
                                           collate_fn=plan.collate)

    monkeypatch.setattr(source, "data_loader", loader)
    par = SimpleNamespace(info={}, dp_size=1, dp_rank=0, devices_per_process=1)
    for prefetch, used in ((None, 2), (5, 5)):
        cfg = RunConfig(model="gpt2", flavor="tiny", data=data_dir.gpt, batch_size=4, device="cpu", data_workers=3,
                        data_prefetch=prefetch)
        src = open_source(get_model("gpt2", "tiny"), cfg, par, CPU_RANK, None)
        try:
            s = src.summary([0.0], 1.0)
        finally:
            src.close()
        assert got[-1] == used and s["loader"]["prefetch_factor"] == used
        assert s["prefetch_buffer_batches"] == 3 * used
    assert RunConfig(data_prefetch=None).case_key() == RunConfig().case_key()  # old records keep their keys
    for bad in (dict(data_prefetch=4), dict(data=data_dir.gpt, data_workers=0, data_prefetch=4)):
        with pytest.raises(ConfigError, match="data-prefetch"):
            RunConfig(**bad)


def test_merge_ranks_takes_the_slowest_rank_for_the_verdict():
    r0 = {"rank": 0, "data": {"data_wait_share": 0.01, "loader_cpu_cores": 1.5, "storage_read_mb_s": 2.0,
                              "read_mb_s": 10.0, "bad_files": 0, "loader": {"workers": 3}}}
    r1 = {"rank": 1, "data": {"data_wait_share": 0.08, "loader_cpu_cores": 2.5, "storage_read_mb_s": None,
                              "read_mb_s": 12.0, "bad_files": 1}}
    m = merge_ranks([r1, r0])
    assert m["loader"] == {"workers": 3} and m["per_rank_data_wait_share"] == [0.08, 0.01]
    assert m["data_wait_share_max"] == 0.08 and m["input_bound"] is True
    assert m["loader_cpu_cores_total"] == 4.0 and m["read_mb_s_total"] == 22.0 and m["bad_files_total"] == 1
    assert m["storage_read_mb_s_total"] is None  # one rank did not know: no total
    assert merge_ranks([{"rank": 0}]) is None


def test_the_verdict_reads_the_gpus_idle_time_where_there_is_one():
    """A host ahead of the GPU waits for data without costing a step: with the GPU's idle time per step
    measured (CUDA events), it decides; without it (CPU), the host's wait does, as before."""
    from dlscale.inputs.source import Delivery, LoaderInfo, LoaderSource

    meta = {"bytes": 100, "bad": 0, "bad_names": []}
    info = LoaderInfo("imagefolder", "image", 0, "gpu", "x", "device thread", False, None, False, 8, 8, 64, 8)
    src = LoaderSource([((torch.zeros(1),), meta)] * 6, Delivery(lambda item: item), torch.device("cpu"), 1, info, {})
    src.window_start()
    for _ in range(4):
        src.next()
    src.window_end()
    waits = [0.02] * 4  # 80 ms of a 1 s window: 8 % host wait
    ahead = src.summary(waits, 1.0, [250.0] * 4, gpu_idle_ms=[0.0, 1.0, 0.5, 0.5])  # the GPU idled 0.2 %
    assert ahead["data_wait_share"] == pytest.approx(0.08) and ahead["data_gpu_idle_share"] == pytest.approx(0.002)
    assert ahead["input_bound"] is False and ahead["input_bound_basis"] == "gpu idle"
    starved = src.summary(waits, 1.0, [250.0] * 4, gpu_idle_ms=[20.0] * 4)
    assert starved["input_bound"] is True and starved["data_gpu_idle_ms"] == [20.0] * 4
    host = src.summary(waits, 1.0, [250.0] * 4)
    assert host["input_bound"] is True and host["input_bound_basis"] == "host wait" and host["data_gpu_idle_share"] is None
    r0, r1 = ({"rank": 0, "data": ahead}, {"rank": 1, "data": dict(ahead, data_gpu_idle_share=0.06)})
    m = merge_ranks([r0, r1])
    assert m["data_gpu_idle_share_max"] == 0.06 and m["input_bound"] is True and m["input_bound_basis"] == "gpu idle"
    m = merge_ranks([r0, {"rank": 1, "data": host}])  # one rank without the GPU's figure: the host waits decide
    assert m["data_gpu_idle_share_max"] is None and m["input_bound_basis"] == "host wait" and m["input_bound"] is True
    from dlscale.console import data_line

    line = data_line(merge_ranks([r0]))  # the GPU's idle share it states, and the verdict
    assert "0.2 %" in line and "GPU" in line and "not input-bound" in line, line
    src.close()


def test_reader_needs_a_model_that_has_one():
    spec = SimpleNamespace(data_kind=None, name="toy")
    with pytest.raises(ConfigError, match="toy"):
        make_reader(spec, torch.device("cpu"), DataSection(data="tokens:/x.bin"))


# ----------------------------------------------------------------------------- 2-process runs (gloo)

FAST = ["--flavor", "tiny", "--precision", "fp32", "--device", "cpu", "--repeats", "1", "--warmup", "2",
        "--steps", "3", "--strategy", "ddp", "--no-monitor", "--json"]


# ranks per run: the image folder's on two gloo processes (the two-rank input path: each rank's slice,
# the record merging their waits); the token file's on one, trained in the test process
WORLD = {"resnet50": 2, "gpt2": 1}


@pytest.fixture(scope="module")
def runs(data_dir, single_in_process):
    """One run per reader (image folder + breakdown, tokens), one store; both at once
    (tests/helpers_cli.py). BERT's pairs from the token file: test_in_process_sources_and_their_record
    and test_bert_pairs_look_like_the_synthetic_batch (the reader is the GPT runs' one)."""
    store = data_dir.root / "store"
    cases = {"resnet50": ["--model", "resnet50", "--batch-size", "4", "--data", f"imagefolder:{data_dir.imgs}",
                          "--breakdown"],
             "gpt2": ["--model", "gpt2", "--batch-size", "4", "--data", data_dir.gpt, "--data-workers", "1"]}
    with single_in_process():
        done = helpers_cli.dlscale_many([["run", *FAST, *args, "--nproc-per-node", str(WORLD[model]),
                                          "--store", str(store)] for model, args in cases.items()])
    out = {}
    for name, p in zip(cases, done):
        if isinstance(p, BaseException):
            raise p
        assert p.returncode == 0, p.stderr[-3000:]
        out[name] = json.loads(p.stdout)
    return SimpleNamespace(store=store, recs=out)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet50", "gpt2"])
def test_runs_read_real_data_and_record_the_wait(runs, data_dir, model):
    rec, world = runs.recs[model], WORLD[model]
    assert rec["status"] == "ok" and rec["world_size"] == world
    ds = rec["data_set"]
    assert ds["kind"] == ("imagefolder" if model == "resnet50" else "tokens")
    assert ds["fingerprint"].startswith("sha256:") and ds["fits_in_memory"] is True
    d = rec["data"]
    rep = rec["repeats"][0]
    assert rep["data"] == d  # the median repeat's, lifted to the record
    assert len(d["data_wait_ms"]) == 3 and all(w >= 0 for w in d["data_wait_ms"])
    assert d["data_wait_ms_total"] == pytest.approx(sum(d["data_wait_ms"]), rel=1e-3)
    # rank 0's share of its own window (samples over its samples/s); the record's window is the slowest rank's
    local_window_s = d["samples"] / d["samples_per_s"]
    assert local_window_s <= rep["window_s"] * (1 + 1e-9)
    assert d["data_wait_share"] == pytest.approx(d["data_wait_ms_total"] / 1e3 / local_window_s, rel=1e-6)
    assert len(d["per_rank_data_wait_share"]) == world and d["data_wait_share_max"] == max(d["per_rank_data_wait_share"])
    assert d["input_bound"] == (d["data_wait_share_max"] >= 0.05)
    assert d["samples"] == 3 * 4 and d["bytes_read"] > 0
    loader = d["loader"]
    assert loader["global_batch"] == 4 * world and loader["local_batch"] == 4 and loader["workers"] >= 1
    assert loader["data_kind"] == {"resnet50": "image", "gpt2": "causal-lm", "bert-base": "mlm-nsp"}[model]
    assert loader["persistent_workers"] is True and loader["pin_memory"] is False  # CPU: nothing to pin for
    if d["loader_cpu_cores"] is not None:
        assert d["loader_cpu_cores"] >= 0 and d["loader_cpu_cores_total"] >= d["loader_cpu_cores"]
    assert d["epoch_at_window_end"] > d["epoch_at_window_start"] > 0
    if model == "resnet50":
        assert "Pillow" in loader["decoder"] and loader["finish_on"] == "worker"
        b = rec["breakdown"]
        assert b["supported"] and b["data_ms"] >= 0  # the breakdown's data phase read from the loader
    else:
        assert loader["decoder"].startswith("numpy.memmap")


@pytest.mark.slow
def test_report_shows_the_data_wait(runs):
    p = helpers_cli.dlscale("report", str(runs.store))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "data wait (%)" in p.stdout and "loader CPU (cores)" in p.stdout
    from dlscale.report.render import DATA_NOTE

    assert "data imagefolder:" in p.stdout and DATA_NOTE in p.stdout  # the data columns come with their note


@pytest.mark.slow
def test_micro_io_measures_loaders(tmp_path, data_dir):
    p = helpers_cli.dlscale("micro", "io", "--flavor", "tiny", "--device", "cpu",
                            "--data", f"imagefolder:{data_dir.imgs}", "--workers", "1",
                            "--seconds", "0.3", "--batch-size", "4", "--pipeline", "image-cpu",
                            "--store", str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[-1])
    assert rec["micro"] == "io" and rec["status"] == "ok"
    (row,) = rec["results"]
    assert row["pipeline"] == "image-cpu" and row["workers"] == 1 and row["batch"] == 4
    assert row["samples_per_s"] > 0 and row["batches"] >= 1 and "Pillow" in row["decoder"]
    assert row["samples_per_s"] == pytest.approx(row["batches"] * 4 / row["seconds"])
    assert rec["config"]["resolved"]["generated"] is False


@pytest.mark.slow
def test_threaded_device_paths_through_worker_processes(data_dir):
    """The GPU paths' structure on the CPU: DataLoader worker processes, the input thread finishing
    one batch ahead (uint8 copy + normalise; or bytes -> decode -> crop), accounting, shutdown."""
    from dlscale.inputs.source import Delivery, LoaderInfo, LoaderSource

    lst = dataset_info.list_imagefolder(data_dir.imgs)
    dev = torch.device("cpu")
    labels = []
    for gpu in (False, True):
        if gpu:
            ds = images.ImageBytesData(lst.root, lst.files, lst.labels, 32, 0)
            collate = images.collate_bytes
            finish = images.GpuDecoder(dev, 32, True, decode=images.pil_decode, name="pil")
        else:
            ds = images.ImageFolderData(lst.root, lst.files, lst.labels, 32, 0)
            collate = images.collate_uint8

            def finish(item):
                return images.finish_on_device(item, dev, True)
        sampler = GlobalBatchSampler(len(ds), 8, 0, 8, 0)
        loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=2, collate_fn=collate,
                                             prefetch_factor=2, persistent_workers=True)
        info = LoaderInfo("imagefolder", "image", 2, "gpu" if gpu else "cpu", "x", "device thread", False, 2, True,
                          8, 8, len(ds), sampler.per_epoch)
        src = LoaderSource(loader, Delivery(finish, True), dev, 1, info, {})
        try:
            src.next()
            src.window_start()
            waits = []
            for _ in range(4):
                src.next()
                waits.append(0.0)
            src.window_end()
            s = src.summary(waits, 1.0, [10.0] * 4)
            x, y = src.batches[0]
            assert x.shape == (8, 3, 32, 32) and x.is_contiguous(memory_format=torch.channels_last)
            labels.append(y.tolist())
            assert s["samples"] == 32 and s["prefetch_buffer_batches"] == 2 * 2 + 2
            assert s["wait_may_be_understated"] is True and s["data_wait_share_last_half"] == 0.0
            assert s["loader_cpu_cores"] is None or s["loader_cpu_cores"] >= 0
        finally:
            src.close()
        assert not src.prefetcher.thread.is_alive()
    assert labels[0] == labels[1]  # same sampler, same samples, whichever decoder


@pytest.mark.slow
def test_micro_io_generates_data_that_fits_the_models(tmp_path):
    from dlscale.micro.io import _generated

    specs = _generated(str(tmp_path), ["image-cpu", "bert"], images=4, tokens=5000, flavor="tiny")
    img, tok = parse_data(specs["image"]), parse_data(specs["tokens"])
    assert len(dataset_info.list_imagefolder(img.path).files) == 4
    for model in ("gpt2", "bert-base"):  # one token file inside both tiny vocabularies
        check_case(RunConfig(model=model, flavor="tiny", data=specs["tokens"], batch_size=2, device="cpu"))
    assert dataset_info.token_count(tok) == 5000


def test_case_words_name_the_data_and_the_decoder_asked_for():
    from dlscale import inputs

    assert inputs.case_words("synthetic") == ""
    assert inputs.case_words("tokens:/t.bin", "cpu", "auto") == "data tokens:/t.bin"
    assert inputs.case_words("imagefolder:/d", "cpu", "nvimgcodec") == "data imagefolder:/d (cpu decode)"
    assert inputs.case_words("imagefolder:/d", "gpu", "auto") == "data imagefolder:/d (gpu decode)"
    assert inputs.case_words("imagefolder:/d", "gpu", "nvimgcodec") == "data imagefolder:/d (gpu decode by nvimgcodec)"


def test_window_times_take_the_idle_from_the_previous_steps_end_to_the_batch():
    """Step i's idle time for data runs from step i-1's end event to the event after step i's fetch."""
    from dlscale.train.worker import _window_times

    class Ev:
        def __init__(self, t):
            self.t = t

        def elapsed_time(self, other):
            return other.t - self.t

    ends = [Ev(t) for t in (0.0, 40.0, 95.0)]       # step ends: steps of 40 and 55 ms
    fetched = [Ev(0.0), Ev(55.0)]                   # the second batch came 15 ms after the first step's end
    assert _window_times(ends, fetched, [], 2) == ([40.0, 55.0], [0.0, 15.0])
    assert _window_times(ends, None, [], 2) == ([40.0, 55.0], None)   # synthetic data: no fetch
    assert _window_times(None, None, [1.0, 1.5, 2.5], 2) == ([500.0, 1000.0], None)  # CPU: host marks
