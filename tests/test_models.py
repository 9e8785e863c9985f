"""Model zoo: exact architectures (parameter counts), FLOPs, synthetic batches, tiny training."""
from __future__ import annotations

import math

import pytest
import torch

from dlscale import ConfigError
from dlscale.models import count_parameters, get_model, model_names

CPU = torch.device("cpu")
MODELS = ("resnet50", "bert-base", "gpt2", "gpt2-vpad")


def _meta_params(name: str, flavor: str = "full") -> int:
    spec = get_model(name, flavor)
    with torch.device("meta"):
        model = spec.build()
    return count_parameters(model)


def test_registry_lists_models():
    assert set(MODELS) <= set(model_names())


def test_unknown_model_names_choices():
    with pytest.raises(ConfigError) as err:
        get_model("nope")
    msg = str(err.value)
    assert "nope" in msg
    for name in MODELS:
        assert name in msg


def test_unknown_flavor():
    with pytest.raises(ConfigError, match="tiny"):
        get_model("gpt2", "huge")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("resnet50", 25_557_032),  # torchvision resnet50
        ("bert-base", 110_106_428),  # HF BertForPreTraining(bert-base-uncased)
        ("gpt2", 124_439_808),  # HF GPT2LMHeadModel / nanoGPT gpt2
        ("gpt2-vpad", 124_439_808 + (50_304 - 50_257) * 768),
    ],
)
def test_full_parameter_counts(name, expected):
    assert _meta_params(name) == expected


def test_gpt2_vpad_numbers():
    spec = get_model("gpt2-vpad")
    assert spec.extra["padded_vocab"] == 50_304 and 50_304 % 64 == 0
    assert _meta_params("gpt2-vpad") == 124_475_904


def test_tied_weights_and_structure():
    with torch.device("meta"):
        gpt = get_model("gpt2").build()
        bert = get_model("bert-base").build()
    assert gpt.lm_head.weight is gpt.wte.weight
    assert bert.decoder.weight is bert.word_emb.weight
    for model, spec_name in ((gpt, "gpt2"), (bert, "bert-base")):
        spec = get_model(spec_name)
        blocks = spec.blocks(model)
        assert len(blocks) == spec.extra["n_layers"] == 12
        assert spec.extra["hidden"] == 768 and spec.extra["n_heads"] == 12
        b = blocks[0]
        assert tuple(b.attn.qkv.weight.shape) == (3 * 768, 768)
        assert tuple(b.attn.proj.weight.shape) == (768, 768)
        assert tuple(b.mlp.fc.weight.shape) == (3072, 768)
        assert tuple(b.mlp.proj.weight.shape) == (768, 3072)
    resnet_spec = get_model("resnet50")
    with torch.device("meta"):
        resnet = resnet_spec.build()
    assert len(resnet_spec.blocks(resnet)) == 3 + 4 + 6 + 3
    assert resnet_spec.channels_last and resnet_spec.optimizer == "sgd"


def test_tie_weights_after_to_empty():
    spec = get_model("gpt2", "tiny")
    with torch.device("meta"):
        model = spec.build()
    model.to_empty(device=CPU)  # meta -> cpu makes new Parameters: the tie must be redone
    model.tie_weights()
    model.init_weights()
    assert model.lm_head.weight is model.wte.weight
    loss = model(*spec.make_batch(2, CPU, torch.Generator().manual_seed(0)))
    assert torch.isfinite(loss)


# ---------------------------------------------------------------- FLOPs


def test_gpt2_flops():
    n = 124_439_808 - 1024 * 768
    assert n == 123_653_376
    expected = 6 * n * 1024 + 12 * 12 * 768 * 1024**2
    for name in ("gpt2", "gpt2-vpad"):  # vpad reports the same useful work
        spec = get_model(name)
        assert spec.extra["flops_params"] == n
        assert spec.flops_per_sample == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(875.69e9, rel=1e-4)


def test_bert_flops():
    n = 110_106_428 - 512 * 768 - 2 * 768
    assert n == 109_711_676
    expected = 6 * n * 128 + 12 * 12 * 768 * 128**2
    spec = get_model("bert-base")
    assert spec.extra["flops_params"] == n
    assert spec.flops_per_sample == pytest.approx(expected, rel=1e-12)


def _resnet_forward_flops(layers, base, classes, size) -> int:
    """Analytic conv + fc forward FLOPs (2 per multiply-add) of a v1.5 bottleneck ResNet."""

    def conv(cin, cout, k, hout):
        return 2 * cin * cout * k * k * hout * hout

    h = size // 2  # 7x7/2 stem conv
    total = conv(3, base, 7, h)
    h //= 2  # 3x3/2 max pool
    cin = base
    for i, n in enumerate(layers):
        width = base * 2**i
        for j in range(n):
            stride = 2 if (i > 0 and j == 0) else 1
            hout = h // stride
            total += conv(cin, width, 1, h)  # 1x1 reduce, at the input resolution
            total += conv(width, width, 3, hout)  # 3x3 carries the stride
            total += conv(width, 4 * width, 1, hout)  # 1x1 expand
            if j == 0:
                total += conv(cin, 4 * width, 1, hout)  # downsample
            cin, h = 4 * width, hout
    return total + 2 * cin * classes


def test_resnet_flops():
    fwd = _resnet_forward_flops((3, 4, 6, 3), 64, 1000, 224)
    assert fwd == pytest.approx(8.18e9, rel=1e-3)  # ~4.09 GMACs
    spec = get_model("resnet50")
    assert spec.flops_per_sample == 3 * fwd
    tiny = get_model("resnet50", "tiny")
    assert tiny.flops_per_sample == 3 * _resnet_forward_flops((1, 1, 1, 1), 8, 10, 32)


# ---------------------------------------------------------------- batches and training


@pytest.mark.parametrize("name", MODELS)
def test_make_batch_deterministic(name):
    spec = get_model(name, "tiny")
    a = spec.make_batch(4, CPU, torch.Generator().manual_seed(123))
    b = spec.make_batch(4, CPU, torch.Generator().manual_seed(123))
    c = spec.make_batch(4, CPU, torch.Generator().manual_seed(124))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.device == CPU and torch.equal(x, y)
    assert not all(torch.equal(x, z) for x, z in zip(a, c))
    for x in a:
        assert x.shape[0] == 4


def test_full_batch_shapes_and_ranges():
    g = torch.Generator().manual_seed(0)
    idx, tgt = get_model("gpt2-vpad").make_batch(2, CPU, g)
    assert idx.shape == tgt.shape == (2, 1024) and idx.dtype == torch.long
    assert int(tgt.max()) < 50_257 and int(idx.max()) < 50_257
    ids, types, mlm, nsp = get_model("bert-base").make_batch(2, CPU, g)
    assert ids.shape == types.shape == mlm.shape == (2, 128)
    assert types[:, :64].eq(0).all() and types[:, 64:].eq(1).all()
    frac = float(mlm.ne(-100).float().mean())
    assert 0.12 < frac < 0.18
    assert int(mlm.max()) < 30_522 and set(nsp.tolist()) <= {0, 1}
    x, y = get_model("resnet50").make_batch(2, CPU, g)
    assert x.shape == (2, 3, 224, 224) and x.is_contiguous(memory_format=torch.channels_last)
    assert y.shape == (2,) and int(y.max()) < 1000


@pytest.mark.parametrize("name", MODELS)
def test_tiny_trains(name):
    torch.manual_seed(0)
    spec = get_model(name, "tiny")
    model = spec.build()
    assert count_parameters(model) < 500_000
    batch = spec.make_batch(4, CPU, torch.Generator().manual_seed(0))
    if spec.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        loss = model(*batch)
        assert loss.dim() == 0 and torch.isfinite(loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", ["bert-base", "gpt2"])
def test_forward_is_embed_blocks_head(name):
    spec = get_model(name, "tiny")
    torch.manual_seed(0)
    model = spec.build().eval()  # no dropout: deterministic
    batch = spec.make_batch(2, CPU, torch.Generator().manual_seed(1))
    k = spec.extra["n_embed_args"]
    h = model.embed(*batch[:k])
    for block in spec.blocks(model):
        h = block(h)
    torch.testing.assert_close(model.head(h, *batch[k:]), model(*batch))


def test_resnet_forward_is_embed_blocks_head():
    spec = get_model("resnet50", "tiny")
    torch.manual_seed(0)
    model = spec.build().eval()
    x, y = spec.make_batch(2, CPU, torch.Generator().manual_seed(1))
    h = model.embed(x)
    for block in spec.blocks(model):
        h = block(h)
    torch.testing.assert_close(model.head(h, y), model(x, y))


def test_gpt2_init_scaled_residuals():
    spec = get_model("gpt2", "tiny")
    torch.manual_seed(0)
    model = spec.build()
    std = model.blocks[0].mlp.proj.weight.std().item()
    assert std == pytest.approx(0.02 / math.sqrt(2 * 2), rel=0.1)
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("with_bias", [False, True])
def test_vocab_logits_padding_keeps_loss_and_gradients(with_bias):
    """The padded (aligned) vocabulary projection gives the loss and gradients of the plain one."""
    import torch.nn.functional as F

    from dlscale.models._layers import vocab_logits

    g = torch.Generator().manual_seed(0)
    V, H, N = 501, 16, 40  # 501 rows: padded to 512 with multiple=64
    x = torch.randn(N, H, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (N,), generator=g)
    grads = []
    for multiple in (1, 64):
        w = torch.randn(V, H, generator=g.manual_seed(1), dtype=torch.float64).requires_grad_()
        b = torch.randn(V, generator=g.manual_seed(2), dtype=torch.float64).requires_grad_() if with_bias else None
        xi = x.clone().requires_grad_()
        logits = vocab_logits(xi, w, b, multiple=multiple)
        assert logits.shape == (N, V if multiple == 1 else 512)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        grads.append((loss.detach(), w.grad, xi.grad, b.grad if with_bias else None))
    (l1, w1, x1, b1), (l2, w2, x2, b2) = grads
    assert torch.allclose(l1, l2, rtol=1e-12, atol=0)
    assert torch.allclose(w1, w2, rtol=1e-12, atol=1e-15) and torch.allclose(x1, x2, rtol=1e-12, atol=1e-15)
    if with_bias:
        assert torch.allclose(b1, b2, rtol=1e-12, atol=1e-15)
