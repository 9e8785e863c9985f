"""Environment capture: what a record must say about where it was measured."""
from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import dlscale
from dlscale.frameworks import versions


def _run(cmd: list[str], timeout: float = 10.0) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_sha() -> str | None:
    root = Path(dlscale.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return archive_sha(Path(dlscale.__file__).resolve().parent / "ARCHIVE_SHA")
    sha = _run(["git", "-C", str(root), "rev-parse", "HEAD"])
    if sha and _run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"]):
        sha += "-dirty"
    return sha


def archive_sha(path: Path) -> str | None:
    """The commit a ``git archive`` copy was made from: ``git archive`` fills ARCHIVE_SHA's
    placeholder (export-subst in .gitattributes); a copy made any other way leaves it unfilled."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text if re.fullmatch(r"[0-9a-f]{40}", text) else None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> dict[str, Any]:
    """GPU names, memory, driver via NVML where present; nulls where not."""
    info: dict[str, Any] = {"driver": None, "gpus": [], "nvml": False}
    try:
        import pynvml  # optional: pynvml

        pynvml.nvmlInit()
    except Exception:
        return info
    try:
        info["nvml"] = True
        drv = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = drv.decode() if isinstance(drv, bytes) else drv
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            info["gpus"].append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                                 "memory_total_bytes": int(mem.total)})
    except Exception as e:  # a partial answer is still worth recording
        info["error"] = str(e)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return info


# Variables that change what a benchmark measures (NCCL's algorithms and channels, the comm
# stream's priority, the allocator, thread counts, inductor); a record without them cannot be
# reproduced. Matched by prefix or exact name; nothing else from the environment is recorded.
TUNING_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCHINDUCTOR_", "NVSHMEM_",
                   "TORCH_SYMM_MEM_", "XLA_", "JAX_",  # XLA_FLAGS, XLA_PYTHON_CLIENT_*: the JAX runs
                   "CUDA_MPS_")  # the MPS server a process's CUDA contexts go through, its SM share
TUNING_NAMES = ("CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
                "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "OMP_NUM_THREADS")


def tuning_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The performance-relevant variables set in ``environ`` (default: this process's), sorted."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ)
            if k.startswith(TUNING_PREFIXES) or k in TUNING_NAMES}


def mps_daemon() -> bool | None:
    """Whether NVIDIA's MPS control daemon runs on this host: then the CUDA contexts of processes
    that share a GPU run at once instead of by time slices (None: not known)."""
    import psutil  # psutil: keeps the CLI start-up light

    try:
        return any(p.info["name"] == "nvidia-cuda-mps-control" for p in psutil.process_iter(["name"]))
    except (psutil.Error, OSError):
        return None


def affinity_count() -> int | None:
    """How many cores this process may run on (fewer than cpu_count under taskset or a cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


# the packages whose versions move results (read from their metadata: importing JAX would take a GPU)
PACKAGES = ("numpy", "jax", "jaxlib", "optax", "transformers", "accelerate", "torchao", "deepspeed", "torchvision",
            "triton")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """{package: installed version, or None when it is not installed}."""
    from importlib import metadata  # importlib: keeps the CLI start-up light

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def capture(include_topology: bool = True, framework: str = "torch",
            device_type: str | None = None) -> dict[str, Any]:
    """Environment of this host: versions, devices, host, CPU, topology; for framework jax also
    jax/jaxlib/optax/flax versions and the backend the workers are told to use."""
    import psutil  # psutil: keeps the CLI start-up light
    import torch  # torch: keeps start-up light

    env: dict[str, Any] = {
        "dlscale": dlscale.__version__,
        "git_sha": git_sha(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": None,
        "host": socket.gethostname(),
        "os": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": affinity_count(),  # the cores this process may use (cgroups, taskset)
        "memory_total_bytes": psutil.virtual_memory().total,
        "cuda_available": torch.cuda.is_available(),
        "env_vars": tuning_env(),
        "packages": package_versions(),
        "mps_daemon": mps_daemon(),
    }
    if torch.cuda.is_available():
        try:
            env["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            pass
    env.update(gpu_info())
    if torch.cuda.is_available() and not env["gpus"]:
        env["gpus"] = [{"index": i, "name": torch.cuda.get_device_name(i),
                        "memory_total_bytes": torch.cuda.get_device_properties(i).total_memory}
                       for i in range(torch.cuda.device_count())]
    env["framework"] = framework
    if framework == "jax":
        # the backend the JAX worker is pinned to (jax_platforms); never initialised here, where
        # it would take the GPUs' memory from the workers
        env["jax"] = {**versions("jax"), "backend": {"cuda": "gpu", "cpu": "cpu"}.get(device_type or "", None)}
    env["topology"] = None
    if include_topology and shutil.which("nvidia-smi"):
        env["topology"] = _run(["nvidia-smi", "topo", "-m"])
    return env


def format_env(env: dict[str, Any]) -> str:
    """Paste-ready text of an environment dict."""
    lines = []
    for k, v in env.items():
        if k == "topology" and v:
            lines.append("topology:")
            lines.extend("    " + line for line in str(v).splitlines())
        elif k == "env_vars":
            lines.append("env_vars: " + (" ".join(f"{n}={x}" for n, x in v.items()) if v else "none set"))
        elif k == "packages":
            lines.append("packages: " + ", ".join(f"{n} {x or 'not installed'}" for n, x in v.items()))
        elif k == "gpus":
            if not v:
                lines.append("gpus: none")
            for g in v:
                lines.append(f"gpu {g['index']}: {g['name']} ({g['memory_total_bytes'] / 2**30:.1f} GiB)")
        else:
            lines.append(f"{k}: {v}")
    return "\n".join(lines)
