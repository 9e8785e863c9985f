"""--data-decoder dali (dlscale/inputs/dali.py): DALI's pipeline run in CPU mode (``device_id=None``,
its CPU decoder) against the torch crop path, its flips, label pairing across batches in flight,
host fallbacks, errors and closing; the launcher's refusal where DALI is not installed (no DALI
needed). The mixed (GPU) decoder is checked on a GPU machine (docs/data.md)."""
from __future__ import annotations

import dataclasses
import importlib.util
import io
import os
import time

import pytest
import torch

from dlscale import ConfigError
from helpers_cli import names
from dlscale.case.config import DataSection, RunConfig
from dlscale.inputs import dataset_info, images, make
from dlscale.inputs.sampler import GlobalBatchSampler
from dlscale.inputs.spec import GPU_DECODERS, check_fields

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

CPU = torch.device("cpu")
SIZE = 32
# class k's colour: far apart in every channel, so a decoded, cropped, normalised image names its label
COLOURS = [(30, 200, 90), (200, 40, 160), (120, 120, 20), (60, 90, 230)]


@pytest.fixture
def dali():
    pytest.importorskip("nvidia.dali")
    from dlscale.inputs import dali as mod

    return mod


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    """8 generated ImageNet-like JPEGs (2 classes): noise, so a wrong box, flip or channel shows."""
    root = tmp_path_factory.mktemp("noisy")
    make.make_imagenet_like(str(root), 8, classes=2, seed=4, jobs=1)
    return dataset_info.list_imagefolder(str(root))


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    """24 flat-colour JPEGs of several sizes in 4 classes, the colour saying the class."""
    root = tmp_path_factory.mktemp("colours")
    for k, rgb in enumerate(COLOURS):
        (root / f"c{k}").mkdir()
        for j in range(6):
            w, h = 40 + 9 * j, 60 - 4 * j
            Image.new("RGB", (w, h), rgb).save(root / f"c{k}" / f"{j}.jpg", "JPEG", quality=95)
    return dataset_info.list_imagefolder(str(root))


def _bytes_data(listing, seed=3):
    return images.ImageBytesData(listing.root, listing.files, listing.labels, SIZE, seed)


def _run(dec, items: list, batch: int) -> list:
    """Each collate_bytes batch of ``items`` through a fresh pipeline: [((x, labels), meta)]."""
    feed = dec.feed(iter(items), batch)
    try:
        return [dec.finish(next(feed)) for _ in items]
    finally:
        feed.close()


def _torch_path(item, channels_last=False) -> torch.Tensor:
    """The other GPU path's batch for the same bytes, boxes and flips: Pillow decode, torch crop."""
    flat, lengths, _labels, boxes, flips, _meta = item
    imgs = [images._pil_chw(d) for d in torch.split(flat, lengths)]
    return images.crop_batch(imgs, boxes, flips, SIZE, CPU, channels_last, kernel=False)


def _label_of(img: torch.Tensor) -> int:
    """The class whose colour is nearest the image's mean colour (de-normalised)."""
    mean, std = images._mean_std(CPU)
    rgb = (img.unsqueeze(0) * std + mean).mean((0, 2, 3))
    return int(torch.cdist(rgb.view(1, 3), torch.tensor(COLOURS, dtype=torch.float32)).argmin())


# ----------------------------------------------------------------------------- the pipeline's batch

@pytest.mark.parametrize("channels_last", [False, True])
def test_dali_batch_is_the_torch_paths_batch(dali, noisy, channels_last):
    """Shape, dtype, layout and values of the torch crop path. Both decoders here are libjpeg-turbo
    (DALI's CPU decoder and Pillow's) and a crop larger than the output reads only pixels inside its
    box, so the two agree up to float rounding; 0.05 (3 levels of 255) leaves room for another
    libjpeg-turbo build and still fails on a box, flip, channel order or normalisation that is off."""
    ds = _bytes_data(noisy)
    item = images.collate_bytes([ds[(1, i)] for i in range(8)])
    assert min(min(b[2], b[3]) for b in item[3]) > SIZE  # downscaled: the case stated above
    dec = dali.DaliDecoder(CPU, SIZE, channels_last)
    assert dec.kind == "dali" and dec.backend == "cpu" and dec.name.startswith("DALI ")
    ((x, labels), meta), = _run(dec, [item], 8)
    assert x.shape == (8, 3, SIZE, SIZE) and x.dtype == torch.float32 and labels.dtype == torch.int64
    assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert torch.equal(labels, item[2]) and meta["decode_fallbacks"] == 0 and meta["bad"] == 0
    ref = _torch_path(item, channels_last)
    diff = (x - ref).abs()
    assert diff.max() < 0.05 and diff.mean() < 0.005, (diff.max(), diff.mean())


def test_upscaled_crops_differ_only_at_their_edge(dali, noisy):
    """A box smaller than the output: DALI resizes the decoded crop, so its outermost output pixels
    interpolate towards the crop's own edge where the torch path reads the pixels beyond the box
    (docs/data.md); inside that band the two agree."""
    ds = _bytes_data(noisy)
    items = [ds[(0, i)] for i in range(4)]
    items = [(it[0], it[1], (7 + 5 * k, 11, 13 + k, 17), k % 2 == 1, *it[4:]) for k, it in enumerate(items)]
    item = images.collate_bytes(items)
    ((x, _), _), = _run(dali.DaliDecoder(CPU, SIZE, False), [item], 4)
    diff = (x - _torch_path(item)).abs()
    band = SIZE // 13 + 2  # output pixels within one source pixel of the box's edge, and a margin
    assert diff[:, :, band:-band, band:-band].max() < 0.05
    assert diff.mean() < 0.05


def test_mirror_flips_the_asked_samples(dali, noisy):
    """The flips reach crop_mirror_normalize: a flipped sample is its unflipped image reversed along
    the width, only where asked."""
    ds = _bytes_data(noisy)
    base = [ds[(2, i)] for i in range(6)]

    def with_flips(flips):
        return images.collate_bytes([(*it[:3], f, *it[4:]) for it, f in zip(base, flips)])

    mixed = [True, False, True, True, False, False]
    dec = dali.DaliDecoder(CPU, SIZE, False)
    (plain, _), (flipped, _), (some, _) = _run(dec, [with_flips([False] * 6), with_flips([True] * 6),
                                                     with_flips(mixed)], 6)
    plain, flipped, some = plain[0], flipped[0], some[0]
    assert (plain - flipped).abs().amax((1, 2, 3)).min() > 0.5  # noisy images: a flip shows everywhere
    assert torch.allclose(flipped, plain.flip(-1), atol=1e-5)
    for i, f in enumerate(mixed):
        assert torch.allclose(some[i], (flipped if f else plain)[i], atol=1e-5)


# ----------------------------------------------------------------------------- pairing, threads, closing

def _loader(listing, batch: int, seed: int = 5):
    ds = _bytes_data(listing)
    sampler = GlobalBatchSampler(len(ds), batch, 0, batch, seed)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=0, collate_fn=images.collate_bytes)
    return loader, sampler


def test_labels_stay_paired_with_their_images_across_batches_in_flight(dali, colours):
    """Prefetch 3 in the pipeline, the Prefetcher's thread 2 ahead of that: every image's colour
    names its label, batch after batch, in the sampler's order, past an epoch's end."""
    from dlscale.inputs.source import Prefetcher

    loader, sampler = _loader(colours, 4)
    dec = dali.DaliDecoder(CPU, SIZE, False, depth=3)
    feed = dec.feed(iter(loader), 4)
    pre = Prefetcher(feed, dec.finish, CPU, depth=2)
    try:
        for m in range(9):  # 6 batches an epoch
            (x, labels), meta = pre.get()
            want = [colours.labels[i] for _e, i in sampler.micro_batch(m)]
            assert labels.tolist() == want
            assert [_label_of(im) for im in x] == want
            assert meta["decode_fallbacks"] == 0 and meta["bad"] == 0
        assert len(feed.fifo) <= dec.depth + 1  # fed ahead at most the pipeline's depth (and one being fed)
    finally:
        pre.close()
        feed.close()
    assert not pre.thread.is_alive()


def test_close_stops_the_pipeline_without_hanging(dali, colours):
    """Closing while the input thread runs ahead (its queue full, batches in flight in DALI) returns
    within seconds; DALI's threads are gone, and a closed feed says so."""
    from dlscale.inputs.source import Prefetcher

    loader, _ = _loader(colours, 4)
    dec = dali.DaliDecoder(CPU, SIZE, False)
    feed = dec.feed(iter(loader), 4)
    assert feed.thread_ids  # DALI's threads, counted as loader CPU
    pre = Prefetcher(feed, dec.finish, CPU, depth=2)
    pre.get()
    time.sleep(0.3)  # the thread fills its queue and waits
    t0 = time.monotonic()
    pre.close()
    feed.close()
    assert time.monotonic() - t0 < 5 and not pre.thread.is_alive()
    left = set(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else set()
    assert not {str(t) for t in feed.thread_ids} & left
    with pytest.raises(RuntimeError, match="closed"):
        next(feed)
    feed.close()  # twice: nothing


def test_loader_errors_reach_the_training_thread(dali, colours):
    """An error of the DataLoader (raised in DALI's source callback) surfaces from the Prefetcher's
    get() as itself, and the thread ends."""
    from dlscale.inputs.source import Prefetcher

    loader, _ = _loader(colours, 4)
    good = iter(loader)

    def failing():
        yield next(good)
        raise ValueError("worker died")

    dec = dali.DaliDecoder(CPU, SIZE, False)
    feed = dec.feed(failing(), 4)
    pre = Prefetcher(feed, dec.finish, CPU)
    try:
        with pytest.raises(ValueError, match="worker died"):
            pre.get()
    finally:
        pre.close()
        feed.close()


# ----------------------------------------------------------------------------- files DALI is not given or fails on

def _png(rgb=(100, 150, 200), size=(50, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, rgb).save(buf, "PNG")
    return buf.getvalue()


def _as_item(data: bytes, label: int, box, flip=False):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), label, box, flip, len(data), []


def test_png_goes_to_pillow_and_unreadable_files_are_replaced(dali, colours):
    """A file without the JPEG marker gets a placeholder in the pipeline and Pillow's decode (the CPU
    path's crop) in its row, counted as a fallback; one Pillow cannot read either takes another
    image of the batch and is counted bad. The JPEG rows are DALI's."""
    ds = _bytes_data(colours)
    jpegs = [ds[(0, i)] for i in (0, 7)]
    png = _png()
    items = [jpegs[0], _as_item(png, 2, (5, 4, 30, 20), True), _as_item(b"GIF89a not really", 3, (0, 0, 8, 8)),
             jpegs[1]]
    item = images.collate_bytes(items)
    ((x, labels), meta), = _run(dali.DaliDecoder(CPU, SIZE, False), [item], 4)
    assert meta["decode_fallbacks"] == 1 and meta["bad"] == 1
    assert labels.tolist() == [jpegs[0][1], 2, 3, jpegs[1][1]]
    want = images._crop_resize_pil(images._pil_rgb(png), (5, 4, 30, 20), True, SIZE)
    want = images._normalize_(torch.from_numpy(want).permute(2, 0, 1).unsqueeze(0))[0]
    assert torch.allclose(x[1], want, atol=1e-5)
    assert any(torch.equal(x[2], x[i]) for i in (0, 1, 3))  # replaced by an image of its batch
    assert _label_of(x[0]) == jpegs[0][1] and _label_of(x[3]) == jpegs[1][1]


def test_a_batch_dali_fails_on_is_decoded_on_the_host(dali, colours, capfd):
    """A damaged JPEG (the marker, then too few bytes) fails its whole batch in DALI: that batch is
    decoded by Pillow (its readable images counted as fallbacks, the damaged one replaced and
    counted bad) and the batches after it come from DALI, still paired with their labels."""
    loader, sampler = _loader(colours, 4)
    it = iter(loader)
    batches = [next(it) for _ in range(4)]
    flat, lengths, labels, boxes, flips, meta = batches[1]
    first = flat[:lengths[0]]
    broken = torch.cat([first[:len(first) // 4], flat[lengths[0]:]])
    batches[1] = (broken, [len(first) // 4, *lengths[1:]], labels, boxes, flips, meta)
    out = _run(dali.DaliDecoder(CPU, SIZE, False), batches, 4)
    # one warning of ours (DALI's own native logging may share the stream), for the one failed batch
    warned = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("dlscale:") and "DALI" in ln]
    assert len(warned) == 1, warned
    metas = [m for _, m in out]
    assert [(m["decode_fallbacks"], m["bad"]) for m in metas] == [(0, 0), (3, 1), (0, 0), (0, 0)]
    for m, ((x, lab), _meta) in enumerate(out):
        want = [colours.labels[i] for _e, i in sampler.micro_batch(m)]
        assert lab.tolist() == want
        got = [_label_of(im) for im in x]
        assert got == want if m != 1 else got[1:] == want[1:]


def test_dali_failing_batch_after_batch_stops_the_run(dali, colours, monkeypatch):
    """FAILED_IN_A_ROW failed batches in a row: DALI is not working, the run stops with its error."""
    monkeypatch.setattr(dali, "FAILED_IN_A_ROW", 2)
    bad = images.collate_bytes([_as_item(b"\xff\xd8\xff\xe0 not a jpeg", 0, (0, 0, 4, 4)) for _ in range(2)])
    dec = dali.DaliDecoder(CPU, SIZE, False, depth=2)
    feed = dec.feed(iter([bad] * 4), 2)
    try:
        with pytest.raises(RuntimeError):  # Pillow cannot read it either: no image of the batch
            dec.finish(next(feed))
        with pytest.raises(RuntimeError, match=r"DALI.*\b2\b"):  # the count of failed batches in a row
            next(feed)
    finally:
        feed.close()


# ----------------------------------------------------------------------------- wiring and the record

def test_make_reader_and_the_record_name_dali(dali, colours):
    """--data-decoder dali through make_reader and start_source (no worker processes): the model's
    batch, and data.loader naming DALI, its backend and its batches in flight."""
    from dlscale.inputs.source import make_reader, start_source
    from dlscale.models import get_model

    model = get_model("resnet50", "tiny")
    data = DataSection(data=f"imagefolder:{colours.root}", data_decode="gpu", data_decoder="dali")
    reader = make_reader(model, CPU, data)
    assert reader.gpu_decoder == "dali" and reader.decoder.startswith("DALI ") and reader.stage is not None
    sampler = GlobalBatchSampler(len(reader.dataset), 4, 0, 4, 0)
    src = start_source(reader, sampler, data, CPU, 0, 2)
    try:
        fake = model.make_batch(4, CPU, torch.Generator().manual_seed(0))
        for real, synth in zip(src.batches[0], fake):
            assert real.shape == synth.shape and real.dtype == synth.dtype
        s = src.summary([], 1.0)
    finally:
        src.close()
    loader = s["loader"]
    assert (loader["decode"], loader["gpu_decoder"], loader["decoder_backend"], loader["finish_on"]) == \
        ("gpu", "dali", "cpu", "DALI pipeline")
    assert s["prefetch_buffer_batches"] == dali.PREFETCH  # no workers, no device thread on the CPU
    with pytest.raises(ConfigError, match="data-cpu-share"):
        make_reader(model, CPU, dataclasses.replace(data, data_cpu_share=0.25), batch=4)


def test_gpu_record_names_the_hardware_share(dali, monkeypatch):
    """On a CUDA device the record says the mixed decoder and hw_decoder_load (nothing built here)."""
    dec = dali.DaliDecoder.__new__(dali.DaliDecoder)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    dali.DaliDecoder.__init__(dec, torch.device("cuda"), 224, True)
    assert dec.backend == f"hardware-and-cuda (hw_decoder_load {dali.HW_DECODER_LOAD:g})"
    assert f"on cuda:0 (decoders.image_slice mixed, hw_decoder_load {dali.HW_DECODER_LOAD:g}, prefetch " \
           f"{dali.PREFETCH})" in dec.name


# ----------------------------------------------------------------------------- without DALI

@pytest.fixture
def no_dali(monkeypatch):
    """nvidia.dali not found (whether or not it is installed), the launcher's cache fresh."""
    from dlscale.inputs import dali as mod

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.startswith("nvidia.dali") else real(name, *a, **k))
    monkeypatch.setattr(mod, "_LAUNCHER", {})
    return mod


@pytest.mark.parametrize("cuda, package", [("13.0", "nvidia-dali-cuda130"), ("12.8", "nvidia-dali-cuda120")])
def test_missing_dali_is_one_line_naming_the_wheel(no_dali, monkeypatch, cuda, package):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    with pytest.raises(ConfigError) as e:
        no_dali.check_launcher()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("data-decoder dali")
    assert f"pip install {package}" in msg and f"CUDA {cuda.split('.')[0]}" in msg  # the wheel for this CUDA
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU torch: both wheels named
    no_dali._LAUNCHER.clear()
    with pytest.raises(ConfigError, match=names("nvidia-dali-cuda130", "nvidia-dali-cuda120")):  # both wheels
        no_dali.check_launcher()


def test_run_cli_missing_dali_exits_2_before_anything(tmp_path, monkeypatch, capsys, colours, no_dali):
    """dlscale run --data-decode gpu --data-decoder dali without DALI: one line, exit 2, no record
    (a GPU is faked visible)."""
    from dlscale.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    code = main(["run", "--model", "resnet50", "--flavor", "tiny", "--device", "cuda", "--batch-size", "4",
                 "--store", str(tmp_path / "s"), "--data", f"imagefolder:{colours.root}", "--data-decode", "gpu",
                 "--data-decoder", "dali"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "data-decoder dali" in err[0] and "pip install nvidia-dali-cuda130" in err[0], err
    assert not (tmp_path / "s" / "results.jsonl").exists()


def test_dali_is_named_only_and_needs_gpu_decode_without_a_split():
    """A choice of --data-decoder; refused with CPU decode (Pillow's) and with --data-cpu-share
    (DALI splits its own decode); auto never picks it; GpuDecoder does not take it."""
    assert "dali" in GPU_DECODERS
    data = "imagefolder:/nowhere"
    check_fields(DataSection(data=data, data_decode="gpu", data_decoder="dali"))  # syntax only: no files read
    with pytest.raises(ConfigError, match=names("data-decoder dali", "--data-decode gpu")):
        RunConfig(model="resnet50", data=data, data_decode="cpu", data_decoder="dali")
    with pytest.raises(ConfigError, match=names("data-cpu-share 0.25", "--data-decoder dali")):

        RunConfig(model="resnet50", data=data, data_decode="gpu", data_decoder="dali", data_cpu_share=0.25)
    with pytest.raises(ValueError, match="own pipeline"):
        images.gpu_decoder(torch.device("cuda"), "dali")


def test_dalis_error_is_read_after_its_traceback():
    from dlscale.inputs.dali import _first_line

    msg = ("Critical error when building pipeline:\nError in MIXED operator `nvidia.dali.fn.decoders.image_slice`,\n"
           "which was used in the pipeline definition with the following traceback:\n\n  File \"x.py\", line 1\n\n"
           "Encountered:\n\nnvImageCodec is not available\nC++ context: [...]")
    assert _first_line(RuntimeError(msg)) == "nvImageCodec is not available"
    assert _first_line(RuntimeError("one line only")) == "one line only"
