"""Measured memory of a training step, in-process, to check the memory plan against.

``step_peak(spec, batch_size, ...)`` trains a model for a few steps on one device the way the
worker's ``single`` case does (the model's optimizer from ``make_optimizer``, the worker's
autocast, ``zero_grad(set_to_none=True)``), then reports the peak of allocated bytes during one
steady-state step: on CUDA ``torch.cuda.max_memory_allocated``; on the CPU, where torch keeps no
allocator statistics, the profiler's memory events (every allocation and free with its size)
summed in time order, plus the bytes alive when the step began (parameters, optimizer state,
the batch and the model's buffers).
"""
from __future__ import annotations

from types import SimpleNamespace

from dlscale.train import checkpointing as ac


def _alive_bytes(model, optimizer, batch) -> int:
    seen: dict[int, int] = {}
    tensors = list(model.parameters()) + list(model.buffers()) + list(batch)
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if hasattr(v, "untyped_storage")]
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def step_peak(spec, batch_size: int, precision: str = "amp-bf16", checkpointing: str = "none",
              compiled: bool = False, device: str = "cpu", warmup: int = 1) -> dict:
    """{"peak_bytes", "start_bytes", "loss"}: the peak allocated during one training step."""
    import torch  # torch: keeps start-up light

    from dlscale.strategies import make_optimizer  # torch: keeps start-up light

    dev = torch.device(device)
    torch.manual_seed(0)
    with dev:
        model = spec.build()
    ac.apply(model, spec, checkpointing)
    fn = torch.compile(model) if compiled else model
    cfg = SimpleNamespace(precision=precision)
    opt = make_optimizer(model.parameters(), spec, cfg, dev)
    batch = spec.make_batch(batch_size, dev, torch.Generator(device=dev).manual_seed(0))
    amp = precision != "fp32"

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = fn(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        start = torch.cuda.memory_allocated(dev)
        loss = step()
        torch.cuda.synchronize(dev)
        return {"peak_bytes": torch.cuda.max_memory_allocated(dev), "start_bytes": start, "loss": float(loss)}
    from torch.profiler import ProfilerActivity, profile  # torch: keeps start-up light

    start = _alive_bytes(model, opt, batch)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return {"peak_bytes": start + peak, "start_bytes": start, "loss": float(loss.detach())}
