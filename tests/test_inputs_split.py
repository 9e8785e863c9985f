"""Split decode (--data-cpu-share): part of each GPU-decode batch decoded by the DataLoader workers.

The GPU decoder is driven here by a Pillow decode on the CPU (as in test_inputs.py); what is checked
is the split's bookkeeping: which images go where, that the host part is the CPU path's own batch
and the device part the GPU path's, labels in step, the record's words and the config's checks.
"""
from __future__ import annotations

import re

import pytest
import torch

from dlscale import ConfigError
from dlscale.cli import main
from dlscale.case.config import RunConfig, workload_fields
from dlscale.inputs import case_words, dataset_info, images, make
from dlscale.inputs import source
from dlscale.inputs.source import gpu_reader, resolve_workers
from helpers_cli import names


@pytest.fixture(scope="module")
def imgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    make.make_imagenet_like(str(root / "imgs"), 16, classes=3, seed=4, jobs=1)
    return dataset_info.list_imagefolder(str(root / "imgs"))


def _decoder():
    return images.GpuDecoder(torch.device("cpu"), 40, channels_last=True, decode=images.pil_decode, name="pil")


@pytest.mark.parametrize("k", [0, 3, 8])
def test_split_batch_is_the_cpu_path_then_the_gpu_path(imgs, k):
    """The first k images of a batch are the CPU path's (Pillow decode + antialiased crop of the same
    box), the rest the GPU path's, in one channels_last batch with their labels in the same order."""
    cpu_ds = images.ImageFolderData(imgs.root, imgs.files, imgs.labels, 40, seed=9)
    byt = images.ImageBytesData(imgs.root, imgs.files, imgs.labels, 40, seed=9)
    keys = [(2, i) for i in (5, 0, 11, 3, 14, 7, 1, 9)]
    items = [byt[key] for key in keys]
    (x, y), meta = _decoder()(images.collate_split(items, cpu_images=k, size=40))
    x_cpu, y_cpu, _ = images.collate_normalized([cpu_ds[key] for key in keys])
    (x_gpu, y_gpu), _ = _decoder()(images.collate_bytes(items))
    assert x.shape == (8, 3, 40, 40) and x.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, y_cpu) and torch.equal(y, y_gpu)  # no image left its place: labels in step
    assert torch.equal(x[:k], x_cpu[:k])  # bit for bit the CPU path's images
    assert torch.equal(x[k:], x_gpu[k:])  # and the GPU path's for the rest
    if 0 < k < 8:  # the two paths differ (antialiasing), so the test above tells them apart
        assert not torch.equal(x_cpu[k:], x_gpu[k:])
    assert meta["bad"] == 0 and meta["decode_fallbacks"] == 0 and meta["bytes"] == sum(it[4] for it in items)


def test_a_file_the_host_cannot_decode_goes_to_the_gpu_part(imgs):
    """A file Pillow rejects in the host part is handed to the device decoder, which counts it as
    bad and replaces it, as it does without the split; the batch keeps its size."""
    byt = images.ImageBytesData(imgs.root, imgs.files, imgs.labels, 40, seed=0)
    items = [byt[(0, i)] for i in range(4)]
    junk = torch.frombuffer(bytearray(b"\xff\xd8 broken jpeg"), dtype=torch.uint8)
    items[0] = (junk, 7, (0, 0, 10, 10), False, len(junk), [])
    cpu, flat, lengths, labels, *_ = images.collate_split(items, cpu_images=2, size=40)
    assert len(cpu) == 2 and lengths[0] == len(junk) and len(lengths) == 2  # items 1 and 2 on the host
    assert labels.tolist() == [items[1][1], items[2][1], 7, items[3][1]]
    (x, y), meta = _decoder()(images.collate_split(items, cpu_images=2, size=40))
    assert x.shape == (4, 3, 40, 40) and meta["bad"] == 1 and torch.equal(y, labels)


def test_all_on_the_host_needs_no_device_decode(imgs):
    byt = images.ImageBytesData(imgs.root, imgs.files, imgs.labels, 40, seed=0)
    calls = []

    def decode(datas):
        calls.append(len(datas))
        return images.pil_decode(datas)

    dec = images.GpuDecoder(torch.device("cpu"), 40, channels_last=True, decode=decode, name="pil")
    (x, _), meta = dec(images.collate_split([byt[(0, i)] for i in range(4)], cpu_images=4, size=40))
    assert x.shape == (4, 3, 40, 40) and x.is_contiguous(memory_format=torch.channels_last) and calls == []


def test_reader_names_the_split_and_workers_follow_it(imgs, monkeypatch):
    dec = _decoder()
    r = gpu_reader(None, dec, [], "image", cpu_images=77, batch=256)
    assert r.decoder.startswith("pil; crop: torch ops; 77 of 256 images a batch decoded on the host by Pillow")
    assert r.collate.keywords == {"cpu_images": 77, "size": 40}
    assert gpu_reader(None, dec, [], "image").collate is images.collate_bytes
    monkeypatch.setattr(source, "_cpus", lambda: 16)
    assert resolve_workers(None, "imagefolder", "gpu", 1, 0.3) == 8  # half the cores: the rest for the GPU path
    assert resolve_workers(None, "imagefolder", "gpu", 2, 0.3) == 4 and resolve_workers(None, "imagefolder", "cpu", 1) == 15
    assert resolve_workers(None, "imagefolder", "gpu", 1, 0.0) <= 4


def test_cpu_share_config_checks_and_case_identity(tmp_path):
    folder = "imagefolder:/data/inet"
    cfg = RunConfig(model="resnet50", data=folder, data_decode="gpu", data_cpu_share=0.25)
    assert cfg.case_key() != RunConfig(model="resnet50", data=folder, data_decode="gpu").case_key()
    # the default stays out of the identity: records stored before the field keep their keys
    assert "data_cpu_share" not in workload_fields(RunConfig(model="resnet50", data=folder, data_decode="gpu").to_dict())
    assert workload_fields(cfg.to_dict())["data_cpu_share"] == 0.25
    assert case_words(folder, "gpu", "torchvision", 0.25) == f"data {folder} (gpu decode by torchvision, 0.25 of it on the host)"
    assert case_words(folder, "gpu", "auto", 0.0) == f"data {folder} (gpu decode)"
    with pytest.raises(ConfigError, match=names("data-cpu-share", "0.3", "--data-decode gpu")):  # option, value, need
        RunConfig(model="resnet50", data=folder, data_cpu_share=0.3)
    with pytest.raises(ConfigError, match=names("data-cpu-share", "0.3", "--data imagefolder")):
        RunConfig(model="resnet50", data_cpu_share=0.3)
    with pytest.raises(ConfigError, match="data.cpu.share"):
        RunConfig(model="resnet50", data=folder, data_decode="gpu", data_cpu_share=1.5)


def test_cpu_share_bad_input_is_one_line_and_exit_2(capsys):
    assert main(["run", "--model", "resnet50", "--data-cpu-share", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(names("data-cpu-share", "0.5", "--data-decode gpu"), err[0]), err
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--data-cpu-share" in capsys.readouterr().out


@pytest.mark.slow
def test_split_batches_through_worker_processes_and_the_input_thread(imgs):
    """The split's collate runs in DataLoader worker processes (it must pickle) and the input
    thread joins the parts; the samples are those of the unsplit GPU path, batch by batch."""
    from dlscale.inputs.sampler import GlobalBatchSampler
    from dlscale.inputs.source import Delivery, LoaderInfo, LoaderSource

    dev = torch.device("cpu")
    ds = images.ImageBytesData(imgs.root, imgs.files, imgs.labels, 40, 0)
    labels = {}
    for k in (0, 3):
        reader = gpu_reader(ds, _decoder(), [], "image", cpu_images=k, batch=8)
        sampler = GlobalBatchSampler(len(ds), 8, 0, 8, 0)
        loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=2, collate_fn=reader.collate,
                                             prefetch_factor=2, persistent_workers=True)
        info = LoaderInfo("imagefolder", "image", 2, "gpu", reader.decoder, "device thread", False, 2, True,
                          8, 8, len(ds), sampler.per_epoch)
        src = LoaderSource(loader, Delivery(reader.finish, True), dev, 1, info, {})
        try:
            got = []
            for _ in range(3):
                x, y = src.next()[0]
                assert x.shape == (8, 3, 40, 40) and x.is_contiguous(memory_format=torch.channels_last)
                got.append(sorted(y.tolist()))
            labels[k] = got
        finally:
            src.close()
    assert labels[0] == labels[3]  # the same samples each step (the host part first within a batch)


@pytest.mark.parametrize("failure", ["raises", "wrong"])
def test_a_crop_kernel_that_fails_here_falls_back_to_torch_ops(monkeypatch, failure):
    """Where the Triton kernel could run but does not build, or computes something else, the decoder
    uses the torch version and its record says why (checked once, when the decoder is made)."""
    from dlscale.inputs import crop_kernel

    def broken(flat, par, size, mean, std, channels_last):
        if failure == "raises":
            raise RuntimeError("PTX compile failed")
        return torch.zeros((par.shape[0], 3, size, size))

    monkeypatch.setattr(crop_kernel, "usable", lambda device: True)
    monkeypatch.setattr(crop_kernel, "crop_normalize", broken)
    dec = _decoder()
    assert dec.crop_kernel is False
    # the path taken, the kernel it stands in for, and the cause: the kernel's own error, else the disagreement
    assert dec.crop_path.startswith("torch ops") and "Triton" in dec.crop_path, dec.crop_path
    if failure == "raises":
        assert "RuntimeError: PTX compile failed" in dec.crop_path and "disagreed" not in dec.crop_path
    else:
        assert "disagreed" in dec.crop_path and "Error" not in dec.crop_path
    img = [torch.randint(0, 256, (3, 20, 20), dtype=torch.uint8)]
    out = dec.augment(img, [(0, 0, 20, 20)], [False])  # the torch version: not the broken kernel's zeros
    assert out.shape == (1, 3, 40, 40) and out.abs().sum() > 0

