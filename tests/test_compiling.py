"""--compile-mode and --inductor-option: validation, what torch.compile gets, suites, and one real
compiled run on the CPU (inductor's C++ backend; CUDA graphs are skipped off the GPU)."""
import json

import pytest
import torch

import helpers_cli
from dlscale import ConfigError
from dlscale.train import compiling
from dlscale.case.config import RunConfig, validate_case
from dlscale.strategies import make_optimizer
from dlscale.models import get_model
from dlscale.case.suite import parse_suite


def refused(make, *named: str) -> str:
    """``make()`` raises a one-line ConfigError naming each of ``named`` (what is wrong, what is
    allowed); its wording is free to change. The message."""
    with pytest.raises(ConfigError) as e:
        make()
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in named), (msg, named)
    return msg


def test_modes_and_options_need_compile_and_known_values():
    refused(lambda: RunConfig(compile_mode="reduce-overhead"), "reduce-overhead", "--compile")
    refused(lambda: RunConfig(inductor_options={"coordinate_descent_tuning": True}), "coordinate_descent_tuning",
            "--compile")
    refused(lambda: RunConfig(compile=True, compile_mode="fast"), "'fast'", *compiling.COMPILE_MODES)
    # a near miss names the setting it probably meant
    refused(lambda: validate_case(RunConfig(compile=True, inductor_options={"coordinate_descent_tunin": True})),
            "coordinate_descent_tunin", "coordinate_descent_tuning")
    refused(lambda: validate_case(RunConfig(compile=True, inductor_options={"coordinate_descent_tuning": 1})),
            "coordinate_descent_tuning", "bool", "1")
    refused(lambda: validate_case(RunConfig(compile=True, inductor_options={"inductor_default_autotune_rep": True})),
            "inductor_default_autotune_rep", "int", "True")
    validate_case(RunConfig(compile=True, compile_mode="max-autotune",
                            inductor_options={"coordinate_descent_tuning": False, "triton.max_tiles": 3}))


def test_cuda_graphs_only_with_single_and_ddp():
    for strategy in ("single", "ddp"):
        validate_case(RunConfig(strategy=strategy, compile=True, compile_mode="reduce-overhead"))
    refused(lambda: validate_case(RunConfig(strategy="fsdp", nproc_per_node=2, compile=True,
                                            compile_mode="reduce-overhead")), "reduce-overhead", "ddp", "single", "fsdp")

    # explicit triton.cudagraphs counts as much as the mode, either way
    with pytest.raises(ConfigError, match="not zero1"):
        validate_case(RunConfig(strategy="zero1", nproc_per_node=2, compile=True,
                                inductor_options={"triton.cudagraphs": True}))
    validate_case(RunConfig(strategy="fsdp", nproc_per_node=2, compile=True, compile_mode="reduce-overhead",
                            inductor_options={"triton.cudagraphs": False}))
    validate_case(RunConfig(strategy="fsdp", nproc_per_node=2, compile=True,
                            compile_mode="max-autotune-no-cudagraphs"))


def test_options_are_the_modes_then_the_users():
    cfg = RunConfig(compile=True, compile_mode="reduce-overhead", inductor_options={"coordinate_descent_tuning": True})
    assert compiling.inductor_options(cfg) == {"triton.cudagraphs": True, "coordinate_descent_tuning": True}
    assert compiling.uses_cudagraphs(cfg)
    over = RunConfig(compile=True, compile_mode="max-autotune", inductor_options={"triton.cudagraphs": False})
    assert compiling.inductor_options(over) == {"max_autotune": True, "triton.cudagraphs": False,
                                               "coordinate_descent_tuning": True}
    assert not compiling.uses_cudagraphs(over)
    assert compiling.inductor_options(RunConfig(compile=True)) == {}
    assert not compiling.uses_cudagraphs(RunConfig(compile_mode="default"))


def test_case_key_keeps_earlier_records_keys_and_tells_modes_apart():
    base = RunConfig(compile=True)
    # the key of a config without the late fields, as records made before them were keyed
    from dlscale.case.config import LATE_FIELD_DEFAULTS, PROCEDURE_FIELDS

    legacy = {k: v for k, v in base.to_dict().items() if k not in LATE_FIELD_DEFAULTS and k not in PROCEDURE_FIELDS}
    assert {"compile_mode", "inductor_options"} <= set(LATE_FIELD_DEFAULTS)
    import hashlib

    assert base.case_key() == hashlib.sha1(json.dumps(legacy, sort_keys=True, default=str).encode()).hexdigest()[:16]
    graphs = RunConfig(compile=True, compile_mode="reduce-overhead")
    tuned = RunConfig(compile=True, compile_mode="reduce-overhead", inductor_options={"coordinate_descent_tuning": True})
    assert len({base.case_key(), graphs.case_key(), tuned.case_key()}) == 3


def test_suite_axes_apply_to_compiled_cases_only(tmp_path):
    suite = parse_suite({"matrix": {"models": ["gpt2"], "flavors": ["tiny"], "strategies": ["single"],
                                    "batch_sizes": [2], "compile": [False, True],
                                    "compile_modes": ["default", "reduce-overhead"],
                                    "inductor_options": [{}, {"coordinate_descent_tuning": True}]}},
                        tmp_path / "s.yaml")
    got = [(c.compile, c.compile_mode, c.inductor_options) for c in suite.cases]
    assert got == [(False, "default", {}),
                   (True, "default", {}), (True, "default", {"coordinate_descent_tuning": True}),
                   (True, "reduce-overhead", {}), (True, "reduce-overhead", {"coordinate_descent_tuning": True})]
    assert suite.duplicates == 3  # the eager cases the mode and option axes would have repeated
    with pytest.raises(ConfigError, match=r"cases\[0\].*compile-mode max-autotune.*--compile"):
        parse_suite({"cases": [{"model": "gpt2", "flavor": "tiny", "strategy": "single", "batch_size": 2,
                                "compile_mode": "max-autotune"}]}, tmp_path / "s.yaml")
    with pytest.raises(ConfigError, match=r"cases\[0\]\.compile_mode.*fast"):
        parse_suite({"cases": [{"model": "gpt2", "flavor": "tiny", "strategy": "single", "batch_size": 2,
                                "compile": True, "compile_mode": "fast"}]}, tmp_path / "s.yaml")


def test_sgd_is_fused_on_cuda_and_foreach_elsewhere():
    spec = get_model("resnet50", "tiny")
    p = [torch.nn.Parameter(torch.zeros(3))]
    cpu = make_optimizer(p, spec, RunConfig(), torch.device("cpu"))
    assert cpu.defaults["foreach"] is True and not cpu.defaults["fused"]
    # the flags only (the step itself needs a GPU): what a CUDA run builds
    cuda = make_optimizer(p, spec, RunConfig(), torch.device("cuda"))
    assert cuda.defaults["fused"] is True and not cuda.defaults["foreach"]


def _cli(*args) -> tuple[int, str, str]:
    """``dlscale ARGS`` in this process (tests/helpers_cli.py; its workers are real torchrun
    processes): (exit code, stdout, stderr)."""
    p = helpers_cli.dlscale(*args)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.slow  # imports torch._inductor.config to check the option's name: seconds
def test_cli_bad_compile_options_exit_2_and_store_nothing(tmp_path):
    store = tmp_path / "store"
    for extra, named in ((["--compile-mode", "reduce-overhead"], "--compile"),
                         (["--compile", "--inductor-option", "no_such_setting=1"], "no_such_setting"),
                         (["--compile", "--inductor-option", "coordinate_descent_tuning"], "KEY=VALUE")):
        rc, _, err = _cli("run", "--model", "gpt2", "--flavor", "tiny", "--strategy", "single", "--device", "cpu",
                          "--batch-size", "2", "--store", str(store), *extra)
        assert rc == 2, err
        assert named in err  # the option or value, or the form it must take
        assert len(err.strip().splitlines()) == 1

    assert not list(store.glob("*.jsonl")) if store.exists() else True


@pytest.mark.slow
def test_compiled_run_with_mode_and_option_on_cpu(tmp_path, single_in_process):
    """A real compiled run: the mode and the option reach torch.compile (an unknown option would
    fail there), the record keeps them, and the losses match the eager run's.

    Both runs train in this process, one after the other (conftest.py single_in_process: the same
    `dlscale run`, worker ``train`` and record, without a torchrun agent and a worker to import
    torch for the compiled run). Inductor writes scalar C++ here (cpp.vec_isa_ok off): the ~25
    kernels of tiny GPT-2's forward, backward and eval graphs then compile in ~1.3 s each instead
    of ~2.5 s with the vector headers on a cold cache. The graph capture, lowering, C++ build and
    the compiled step are the same path."""
    import torch._dynamo
    import torch._inductor.config

    common = ["run", "--model", "gpt2", "--flavor", "tiny", "--strategy", "single", "--device", "cpu",
              "--batch-size", "2", "--precision", "fp32", "--warmup", "2", "--steps", "2", "--repeats", "1",
              "--no-monitor", "--store", str(tmp_path / "store"), "--json"]
    try:  # scalar C++, read from the config, not the env; config.patch restores it
        with single_in_process(), torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
            compiled = helpers_cli.dlscale(*common, "--compile", "--compile-mode", "reduce-overhead",
                                           "--inductor-option", "coordinate_descent_tuning=true")
            eager = helpers_cli.dlscale(*common)
    finally:
        torch._dynamo.reset()  # the compiled graphs are not kept for the tests after this one
    rc, out, err = compiled.returncode, compiled.stdout, compiled.stderr
    assert rc == 0, err[-2000:]
    rec = json.loads(out[out.index("{"):])
    assert rec["status"] == "ok"
    assert rec["config"]["compile_mode"] == "reduce-overhead"
    assert rec["config"]["inductor_options"] == {"coordinate_descent_tuning": True}
    assert "--compile-mode reduce-overhead --inductor-option coordinate_descent_tuning=true" in rec["command"]
    rc, out, err = eager.returncode, eager.stdout, eager.stderr
    assert rc == 0, err[-2000:]
    eager = json.loads(out[out.index("{"):])
    got, want = rec["repeats"][0], eager["repeats"][0]
    assert got["warmup_losses"] == pytest.approx(want["warmup_losses"], rel=1e-4)
    assert got["loss_last"] == pytest.approx(want["loss_last"], rel=1e-4)
