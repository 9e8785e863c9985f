"""GPU decode in a process of its own (--data-decode-process, ``dlscale/inputs/decode_process.py``).

On the CPU the decode process runs ``GpuDecoder`` with Pillow's decode and hands batches over in
shared memory; what is checked is the hand-over (the same samples and pixels as the input thread's,
slots reused without a batch overwritten while the step holds it), the record's words, and the
faults: an error in the decode process, a decode process that dies, a training process that dies.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch

from dlscale import ConfigError
from helpers_cli import names
from dlscale.cli import main
from dlscale.case.config import RunConfig
from dlscale.inputs import case_words, config_words, dataset_info, images, make
from dlscale.inputs.decode_process import MPS_PRIORITY_VAR, MPS_SM_VAR, DecodeProcess, DecoderSpec, LoaderPlan
from dlscale.inputs.sampler import GlobalBatchSampler
from dlscale.inputs.source import Delivery, LoaderInfo, LoaderSource, data_loader, gpu_reader, process_reader

SIZE, BATCH = 40, 4


@pytest.fixture(scope="module")
def imgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dproc")
    make.make_imagenet_like(str(root / "imgs"), 16, classes=3, seed=5, jobs=1)
    return dataset_info.list_imagefolder(str(root / "imgs"))


def _source(imgs, process: bool, cpu_images: int = 0, decode=images.pil_decode, sm_share: float = 0.0,
            priority: str = "normal") -> LoaderSource:
    dev = torch.device("cpu")
    ds = images.ImageBytesData(imgs.root, imgs.files, imgs.labels, SIZE, 0)
    sampler = GlobalBatchSampler(len(ds), BATCH, 0, BATCH, 0)
    remote = None
    if process:
        reader = process_reader(ds, DecoderSpec(SIZE, True, decode=decode, name="pil", sm_share=sm_share,
                                                     priority=priority), [], "image",
                                cpu_images, BATCH)
        remote = DecodeProcess(LoaderPlan(ds, reader.collate, sampler, 1), dev, reader.process)
        loader = None
    else:
        reader = gpu_reader(ds, images.GpuDecoder(dev, SIZE, True, decode=decode, name="pil"), [], "image",
                            cpu_images, BATCH)
        loader = data_loader(LoaderPlan(ds, reader.collate, sampler, 1), False)  # the thread's, as start_source's
    info = LoaderInfo("imagefolder", "image", 1, "gpu", reader.decoder, reader.finish_on, False, 2, True,
                      BATCH, BATCH, len(ds), sampler.per_epoch)
    return LoaderSource(loader, Delivery(reader.finish, True, remote=remote), dev, 1, info, {})


def _batches(src: LoaderSource, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for _ in range(n):
        x, y = src.next()[0]
        out.append((x.clone(), y.clone()))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("cpu_images", [0, 1])
def test_the_decode_process_gives_the_input_threads_batches(imgs, cpu_images, monkeypatch):
    """Eight batches through three slots (each reused twice, the held batch never overwritten): the
    same labels and pixels as the input thread's, in the model's layout; the loader's CPU is the
    decode process's and its workers'."""
    thread = _source(imgs, False, cpu_images)
    try:
        want = _batches(thread, 8)
    finally:
        thread.close()
    monkeypatch.delenv(MPS_SM_VAR, raising=False)
    monkeypatch.delenv(MPS_PRIORITY_VAR, raising=False)
    # with an SM cap and a low priority once
    src = _source(imgs, True, cpu_images, sm_share=0.25 * cpu_images, priority="low" if cpu_images else "normal")
    try:
        # --data-decode-sm-share and --data-decode-priority set MPS's SM percentage and client priority in
        # the decode process, before its CUDA calls, and nowhere else (the training process keeps every SM
        # and its normal priority)
        assert src.remote.info["mps_sm_percent"] == ("25" if cpu_images else None)
        assert src.remote.info["mps_priority"] == ("1" if cpu_images else None)
        assert MPS_SM_VAR not in os.environ and MPS_PRIORITY_VAR not in os.environ
        src.window_start()
        got = []
        for _ in range(8):
            x, y = src.next()[0]
            assert x.shape == (BATCH, 3, SIZE, SIZE) and x.is_contiguous(memory_format=torch.channels_last)
            time.sleep(0.05)  # the decode process runs ahead meanwhile; it must not write the held slot
            got.append((x.clone(), y.clone()))
        src.window_end()
        s = src.summary([0.0] * 8, 1.0)
        assert s["prefetch_buffer_batches"] == 1 * 2 + 2  # the worker's prefetch + the slots ahead
        assert s["loader_cpu_cores"] is not None and s["loader_cpu_cores"] > 0
        procs = src.remote.processes()
        assert len(procs) == 2  # the decode process and its DataLoader worker
        if not cpu_images:  # killed, the decode process is noticed at a fetch, in time, not a hang
            os.kill(src.remote.proc.pid, signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(RuntimeError, match=names("decode process", "-9")):
                for _ in range(10):  # the batches already sent come first
                    src.next()
            assert time.monotonic() - t0 < 10
    finally:
        src.close()
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in want]
    for (gx, _), (wx, _) in zip(got, want):
        assert torch.equal(gx, wx)
    # closed, nothing is left; a killed decode process's DataLoader worker ends at its watchdog's next look
    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + (15 if not cpu_images else 0)
    while any(map(alive, procs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(alive, procs))




def test_the_sm_share_needs_a_decode_process(tmp_path):
    folder = f"imagefolder:{tmp_path}"
    proc = {"model": "resnet50", "data": folder, "data_decode": "gpu", "data_decode_process": True}
    cfg = RunConfig(**proc, data_decode_sm_share=0.2)
    assert cfg.case_key() != RunConfig(**proc).case_key()
    assert DecoderSpec(224, True, sm_share=0.2).mps_env() == {MPS_SM_VAR: "20"}
    assert DecoderSpec(224, True).mps_env() == {}
    with pytest.raises(ConfigError, match=names("data-decode-sm-share 0.2", "--data-decode-process")):
        RunConfig(model="resnet50", data=folder, data_decode="gpu", data_decode_sm_share=0.2)
    with pytest.raises(ConfigError, match=names("0.004", "1 %")):  # the value and the floor
        RunConfig(**proc, data_decode_sm_share=0.004)
    with pytest.raises(ConfigError, match="data-decode-sm-share"):
        RunConfig(**proc, data_decode_sm_share=1.5)
    assert config_words(cfg.to_dict()) == f"data {folder} (gpu decode in its own process on 0.2 of the SMs)"


def test_the_decode_priority_needs_a_decode_process(tmp_path):
    folder = f"imagefolder:{tmp_path}"
    proc = {"model": "resnet50", "data": folder, "data_decode": "gpu", "data_decode_process": True}
    cfg = RunConfig(**proc, data_decode_priority="low")
    assert cfg.case_key() != RunConfig(**proc).case_key()
    assert DecoderSpec(224, True, priority="low").mps_env() == {MPS_PRIORITY_VAR: "1"}
    assert DecoderSpec(224, True, sm_share=0.5, priority="low").mps_env() == {MPS_SM_VAR: "50", MPS_PRIORITY_VAR: "1"}
    assert DecoderSpec(224, True, priority="normal").mps_env() == {}
    with pytest.raises(ConfigError, match=names("data-decode-priority low", "--data-decode-process")):
        RunConfig(model="resnet50", data=folder, data_decode="gpu", data_decode_priority="low")
    with pytest.raises(ConfigError, match="data-decode-priority"):
        RunConfig(**proc, data_decode_priority="high")
    assert config_words(cfg.to_dict()) == f"data {folder} (gpu decode in its own process at low priority)"
    both = RunConfig(**proc, data_decode_sm_share=0.5, data_decode_priority="low")
    assert config_words(both.to_dict()) == (f"data {folder} (gpu decode in its own process on 0.5 of the SMs at "
                                            f"low priority)")


@pytest.mark.slow
def test_an_error_in_the_decode_process_is_raised_at_the_fetch(imgs):
    """An exception in the decode process (here a decoder that returns no images) ends the run with its
    reason at the next fetch, not a hang; closing leaves no process behind."""
    dec = DecoderSpec(SIZE, True, decode=_not_images, name="broken")
    ds = images.ImageBytesData(imgs.root, imgs.files, imgs.labels, SIZE, 0)
    remote = DecodeProcess(LoaderPlan(ds, images.collate_bytes, GlobalBatchSampler(len(ds), BATCH, 0, BATCH, 0), 1),
                           torch.device("cpu"), dec)
    try:
        with pytest.raises(RuntimeError, match=names("decode process", "AttributeError")):  # its reason, raised here

            remote.get()
    finally:
        remote.close()
    assert remote.proc.exitcode is not None


def _not_images(datas):
    return ["not an image"] * len(datas)


@pytest.mark.slow
def test_the_decode_process_ends_with_its_training_process(imgs, tmp_path):
    """A training process killed outright (SIGKILL: no close, no atexit) takes its decode process and
    that one's DataLoader workers with it."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time, torch
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_decode_process import _source
        from dlscale.inputs import dataset_info
        if __name__ == "__main__":  # the decode process is spawned: it imports this file again
            src = _source(dataset_info.list_imagefolder({imgs.root!r}), True)
            src.next()
            print(" ".join(str(p.pid) for p in src.remote.processes()), flush=True)
            time.sleep(60)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status()
                                                  != psutil.STATUS_ZOMBIE for p in pids):
            time.sleep(0.2)
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not left
    finally:
        proc.kill()


def test_the_option_needs_gpu_decode_by_a_decoder_dlscale_drives(tmp_path, capsys):
    folder = f"imagefolder:{tmp_path}"
    cfg = RunConfig(model="resnet50", data=folder, data_decode="gpu", data_decode_process=True)
    assert cfg.case_key() != RunConfig(model="resnet50", data=folder, data_decode="gpu").case_key()
    with pytest.raises(ConfigError, match=names("data-decode-process", "--data imagefolder:PATH", "--data-decode gpu")):
        RunConfig(model="resnet50", data=folder, data_decode_process=True)
    with pytest.raises(ConfigError, match=names("data-decode-process", "--data-decoder dali")):

        RunConfig(model="resnet50", data=folder, data_decode="gpu", data_decoder="dali", data_decode_process=True)
    assert main(["run", "--model", "resnet50", "--data", folder, "--data-decode-process"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data-decode-process" in err[0]
    assert case_words(folder, "gpu", "torchvision", 0.25, True) == \
        f"data {folder} (gpu decode by torchvision in its own process, 0.25 of it on the host)"
    assert case_words(folder, "gpu", "auto", 0.0, False) == f"data {folder} (gpu decode)"


def test_the_environment_says_whether_mps_runs(monkeypatch):
    """Processes sharing a GPU run at once under NVIDIA's MPS and by time slices without it: the record
    says which (an MPS control daemon on the host; its CUDA_MPS_* variables)."""
    from dlscale.results import envinfo

    class P:
        def __init__(self, name):
            self.info = {"name": name}

    monkeypatch.setattr(psutil, "process_iter", lambda attrs: iter([P("python"), P("nvidia-cuda-mps-control")]))
    assert envinfo.mps_daemon() is True
    monkeypatch.setattr(psutil, "process_iter", lambda attrs: iter([P("python")]))
    assert envinfo.mps_daemon() is False
    assert envinfo.tuning_env({"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps", "HOME": "/root"}) == \
        {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps"}


def test_a_decode_process_without_mps_is_warned_of_before_the_run(tmp_path, monkeypatch, capsys):
    """The machine check warns (one line, the run goes on) where no MPS daemon runs, and is quiet with one."""
    from dlscale import inputs
    from dlscale.results import envinfo
    from dlscale.inputs import images as imgs_mod

    monkeypatch.setattr(imgs_mod, "check_gpu_decoder", lambda choice: None)
    cfg = RunConfig(model="resnet50", data=f"imagefolder:{tmp_path}", data_decode="gpu", data_decode_process=True)
    monkeypatch.setattr(envinfo, "mps_daemon", lambda: False)
    inputs.check_machine(cfg, "cuda")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without NVIDIA's MPS daemon" in err[0]
    monkeypatch.setattr(envinfo, "mps_daemon", lambda: True)
    inputs.check_machine(cfg, "cuda")
    assert capsys.readouterr().err == ""
