"""The FLOP formulas (analyzer/measure/efficiency/flops.py) against hand counts and PyTorch's own schemas, and the count
of a recorded trace against torch.utils.flop_counter.FlopCounterMode on the same step."""

from __future__ import annotations

import math

import pytest

from gpuadvise.analyzer.measure.efficiency import flops
from gpuadvise.analyzer.model.flopops import SIGNATURES

torch = pytest.importorskip("torch")


def _schema_args(name: str) -> list[str]:
    packet = getattr(torch.ops.aten, name.split("::")[1])
    overload = packet.default if "default" in packet.overloads() else getattr(packet, packet.overloads()[0])
    return [a.name for a in overload._schema.arguments]


@pytest.mark.parametrize("name", [n for n in SIGNATURES if n.startswith("aten::") and n != "aten::einsum"])
def test_each_signature_points_at_the_argument_its_formula_reads(name):
    sig = SIGNATURES[name]
    try:
        args = _schema_args(name)
    except (AttributeError, RuntimeError):
        pytest.skip(f"{name} is not in this torch build")
    at = {"stride": ("stride",), "padding": ("padding",), "dilation": ("dilation",), "groups": ("groups",),
          "output_padding": ("output_padding",), "output_mask": ("output_mask",)}
    if sig.family == "conv":
        want = ["grad_output", "input", "weight"] if sig.backward else [("input", "self"), "weight"]
        for i, expected in zip(sig.tensors, want):
            assert args[i] in ((expected,) if isinstance(expected, str) else expected)
        for field, names in at.items():
            index = getattr(sig, field)
            if index is not None:
                assert args[index] in names, (field, args)
        if not isinstance(sig.transposed, bool):
            assert args[sig.transposed] == "transposed"
    elif sig.family == "attention":
        first = sig.grad_out + 1 if sig.backward else 0
        assert args[first:first + 3] == ["query", "key", "value"]
        if sig.backward:
            assert args[sig.grad_out].startswith("grad_out")
        assert args[sig.causal] == ("custom_mask_type" if sig.mask_type else "is_causal")
    else:
        operands = [args[i] for i in sig.tensors]
        assert operands[0] in ("self", "mat1", "batch1", "input") and operands[1] in ("mat2", "batch2", "other", "weight")


def test_conv_counts_by_hand():
    # 3×3 stride 2 pad 1 on 16×16: 8×8 outputs; 2 images · 64 positions · 8 out · 3 in · 9 taps · 2
    assert flops.conv_flops([2, 3, 16, 16], [8, 3, 3, 3], stride=[2, 2], padding=[1, 1], dilation=[1, 1]) == 2 * 2 * 64 * 8 * 3 * 9
    # dilation 2, no padding: 16 - 2·2 = 12 outputs a side
    assert flops.conv_flops([1, 4, 16, 16], [4, 4, 3, 3], stride=1, padding=0, dilation=2) == 2 * 144 * 4 * 4 * 9
    # transposed: every input position meets the whole kernel
    assert flops.conv_flops([2, 8, 8, 8], [8, 4, 2, 2], transposed=True) == 2 * 2 * 64 * 8 * 4 * 4
    # a depthwise conv's weight is [C, 1, k, k]: one input channel per output channel
    depthwise = flops.conv_flops([1, 32, 10, 10], [32, 1, 3, 3], stride=1, padding=1)
    assert depthwise == 2 * 100 * 32 * 9
    # its backward costs the forward once per gradient, groups or not (FlopCounterMode counts 32× here)
    assert flops.conv_backward_flops([1, 32, 10, 10], [1, 32, 10, 10], [32, 1, 3, 3], False, 32, (True, True, False)) == 2 * depthwise
    assert flops.conv_backward_flops([1, 32, 10, 10], [1, 32, 10, 10], [32, 1, 3, 3], False, 32, (False, True, False)) == depthwise


def test_conv_op_reads_padding_same_and_the_output_mask():
    same = flops.op_flops("aten::conv2d", [[1, 4, 9, 9], [6, 4, 3, 3], [6], [], [], [], []],
                          ["", "", "", "[1, 1]", "same", "[1, 1]", "1"])
    assert same.flops == 2 * 81 * 6 * 4 * 9
    backward = flops.op_flops("aten::convolution_backward",
                              [[2, 8, 8, 8], [2, 3, 16, 16], [8, 3, 3, 3], [], [], [], [], [], [], [], []],
                              ["", "", "", "[8]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[False, True, True]"])
    assert backward.flops == 2 * 2 * 64 * 8 * 3 * 9  # the weight's gradient only: the input needs none


def test_a_convolution_without_its_recorded_stride_is_not_counted():
    """Older PyTorch recorded shapes but no Concrete Inputs: the output's size is unknown, not the default's
    (a 7×7 stride-2 stem counted at stride 1 would be 3.8× too many)."""
    dims = [[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []]
    assert math.isnan(flops.op_flops("aten::cudnn_convolution", dims, []).flops)
    assert math.isnan(flops.op_flops("aten::conv2d", dims[:7], None).flops)


def test_causal_attention_counts_the_unmasked_scores():
    # square: 1 + 2 + … + S of S² scores
    assert flops.causal_fraction(16, 16) == pytest.approx(16 * 17 / 2 / 256)
    # top left, more keys than queries: query i sees i + 1 keys
    assert flops.causal_fraction(4, 8) == pytest.approx((1 + 2 + 3 + 4) / 32)
    # bottom right (flash-attn): the last query sees all 8
    assert flops.causal_fraction(4, 8, bottom_right=True) == pytest.approx((5 + 6 + 7 + 8) / 32)
    q = [2, 4, 128, 64]
    whole = 2 * 2 * 4 * 128 * 128 * (64 + 64)
    count = flops.attention_flops(q, q, q, causal=True)
    assert count.whole == whole and count.flops == pytest.approx(whole * 129 / 256) and count.causal is True
    back = flops.attention_backward_flops(q, q, q, causal=False)
    assert back.flops == back.whole == 2 * 2 * 4 * 128 * 128 * (3 * 64 + 2 * 64)


def test_attention_ops_read_their_layout_and_mask():
    bshd = [[2, 128, 8, 64], [2, 256, 2, 64], [2, 256, 2, 32]]  # grouped-query: 8 query heads, 2 kv heads
    fwd = flops.op_flops("aten::_flash_attention_forward", bshd + [[]] * 8,
                         ["", "", "", "", "", "128", "256", "0.", "True", "False", ""])
    assert fwd.whole == 2 * 2 * 8 * 128 * 256 * (64 + 32)
    assert fwd.flops == pytest.approx(fwd.whole * flops.causal_fraction(128, 256))
    eff = flops.op_flops("aten::_efficient_attention_forward", bshd + [[]] * 11,
                         ["", "", "", "", "", "", "", "", "0.", "2", "True", "", "", ""])
    assert eff.causal and eff.flops == pytest.approx(eff.whole * flops.causal_fraction(128, 256, bottom_right=True))
    # no Concrete Inputs (an older trace): whole, and the causal flag unknown
    old = flops.op_flops("aten::_scaled_dot_product_cudnn_attention", [[1, 2, 64, 32]] * 3 + [[]] * 6, None)
    assert old.causal is None and old.flops == old.whole
    # a nested (packed, variable-length) call: not counted
    assert math.isnan(flops.op_flops("aten::_flash_attention_forward", [[300, 8, 64]] * 3, []).flops)


def test_matmul_broadcasts_like_torch():
    assert flops.matmul_flops("aten::matmul", [[5, 3, 4], [4, 6]]) == 2 * 15 * 4 * 6
    assert flops.matmul_flops("aten::matmul", [[3, 4], [2, 5, 4, 6]]) == 2 * 10 * 3 * 4 * 6
    assert flops.matmul_flops("aten::matmul", [[4], [4, 6]]) == 2 * 4 * 6
    assert flops.matmul_flops("aten::linear", [[8, 16, 32], [64, 32], [64]]) == 2 * 128 * 32 * 64
    assert math.isnan(flops.matmul_flops("aten::matmul", [[2, 3, 4], [5, 4, 6]]))  # batches that do not broadcast


# -- the count of a recorded step against FlopCounterMode, on three real models --------------------------
# Each model runs one training step (forward, loss, backward) twice: under torch.profiler with
# record_shapes=True (the trace gpuadvise reads) and under FlopCounterMode (PyTorch's own count).

nn = torch.nn
F = torch.nn.functional


class _Block(nn.Module):  # nanoGPT's Block: pre-norm, causal self-attention through SDPA, a GELU MLP
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class _GPT(nn.Module):
    def __init__(self, vocab=96, block=32, layers=2, heads=4, d=32):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class _BasicBlock(nn.Module):  # torchvision's ResNet BasicBlock
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else None)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.down(x) if self.down is not None else x))


class _ResNet(nn.Module):  # torchvision's ResNet layout, two stages of one block each
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1, self.layer2 = _BasicBlock(8, 8, 1), _BasicBlock(8, 16, 2)
        self.fc = nn.Linear(16, classes)

    def forward(self, x, targets):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = torch.flatten(F.adaptive_avg_pool2d(self.layer2(self.layer1(x)), 1), 1)
        return F.cross_entropy(self.fc(x), targets)


def _llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 96, (2, 24))
    return model, lambda: model(input_ids=ids, labels=ids).loss


def _models():
    torch.manual_seed(0)
    gpt = _GPT()
    idx = torch.randint(0, 96, (2, 32))
    resnet = _ResNet()
    images, labels = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    return {"nanoGPT-style GPT": (gpt, lambda: gpt(idx, idx)),
            "torchvision-style ResNet": (resnet, lambda: resnet(images, labels)),
            "Hugging Face Llama (from a config)": _llama()}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Each model's trace of one step and FlopCounterMode's count of the same step."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    out = {}
    folder = tmp_path_factory.mktemp("flop-models")
    for name, (model, loss) in _models().items():
        with FlopCounterMode(display=False) as counter:
            loss().backward()
        model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            loss().backward()
            prof.step()
        path = folder / f"{len(out)}.json"
        prof.export_chrome_trace(str(path))
        out[name] = (path, counter.get_total_flops(), counter.get_flop_counts()["Global"])
    return out


def test_a_recorded_step_counts_what_flop_counter_mode_counts(recorded):
    from gpuadvise.analyzer.read.loader import load_trace

    for name, (path, oracle, _) in recorded.items():
        ops = flops.counted_ops(load_trace(path, cache=False))
        # FlopCounterMode does not count the CPU flash attention kernel (the GPT's causal SDPA): compared
        # without it here, and against a hand count below
        ours = ops.loc[~ops["name"].str.contains("flash_attention_for_cpu"), "flops"].sum()
        assert oracle > 0 and ours == pytest.approx(oracle, rel=0.01), name
        assert set(ops["pass"]) == {"forward", "backward"}, name


def test_cpu_flash_attention_matches_a_hand_count(recorded):
    from gpuadvise.analyzer.read.loader import load_trace

    path, _, _ = recorded["nanoGPT-style GPT"]
    ops = flops.counted_ops(load_trace(path, cache=False))
    attn = ops[ops["family"] == "attention"]
    # 2 layers; B=2, H=4, T=32, head dim 8: QKᵀ and PV are 2·B·H·T·T·D each; the backward recomputes the
    # scores and makes dV, dP, dQ, dK: five; causal: 1 + 2 + … + 32 of the 32² scores
    causal = (32 * 33 / 2) / 32 ** 2
    product = 2 * 2 * 4 * 32 * 32 * 8  # one T × T × D product over the batch and heads
    forward, backward = 2 * product, 5 * product
    assert len(attn) == 4 and attn["causal"].all()
    assert attn.loc[~attn["backward"], "flops"].sum() == pytest.approx(2 * forward * causal)
    assert attn.loc[attn["backward"], "flops"].sum() == pytest.approx(2 * backward * causal)
    assert attn["whole"].sum() == pytest.approx(2 * (forward + backward))


class _CheckpointedGPT(_GPT):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.reentrant = reentrant

    def forward(self, idx, targets):
        from torch.utils.checkpoint import checkpoint

        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=self.reentrant)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_recomputed_forward_ops_are_hardware_flops_not_model_flops(tmp_path, reentrant):
    """Checkpointing every block runs each block's forward again in the backward: FlopCounterMode counts
    it (what the hardware ran); the model FLOPs are the same step's without checkpointing. (Early stopping,
    which leaves out a block's last ops when nothing needs their outputs, is off: it stopped under
    FlopCounterMode but not under the profiler, and the two runs must do the same work.)"""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.checkpoint import set_checkpoint_early_stop
    from torch.utils.flop_counter import FlopCounterMode
    from gpuadvise.analyzer.read.loader import load_trace

    torch.manual_seed(0)
    plain, checkpointed = _GPT(), _CheckpointedGPT(reentrant)
    checkpointed.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 96, (2, 32))
    counts = {}
    def math():  # attention FlopCounterMode counts
        return torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH)

    for name, model in (("plain", plain), ("checkpointed", checkpointed)):
        with math(), set_checkpoint_early_stop(False), FlopCounterMode(display=False) as counter:
            model(idx, idx).backward()
        counts[name] = counter.get_total_flops()
    with math(), set_checkpoint_early_stop(False), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        checkpointed(idx, idx).backward()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    ops = flops.counted_ops(load_trace(tmp_path / "trace.json", cache=False))
    assert counts["checkpointed"] > counts["plain"] * 1.2
    assert ops["flops"].sum() == pytest.approx(counts["checkpointed"], rel=0.01)
    assert ops.loc[ops["pass"] != "recompute", "flops"].sum() == pytest.approx(counts["plain"], rel=0.01)
    # what is recomputed is the blocks' forward: their matmuls and attention, none of the lm_head's
    recomputed = ops[ops["pass"] == "recompute"]
    forward = ops[ops["pass"] == "forward"]
    assert recomputed["flops"].sum() == pytest.approx(forward["flops"].sum() - 2 * 32 * 32 * 96 * 2, rel=0.01)


def test_a_cpu_run_gets_flops_and_a_rate_and_no_mfu(recorded):
    from gpuadvise.analyzer.report import text
    from gpuadvise.analyzer.run import analyze, resolve_inputs

    path, oracle, _ = recorded["torchvision-style ResNet"]
    reports = analyze(resolve_inputs([str(path)]))
    f = reports[0].figures.flops
    assert f.state == "counted" and f.mfu_pct is None and f.peaks == []
    assert f.model_flops == pytest.approx(oracle, rel=0.01)
    assert f.achieved_tflops == pytest.approx(f.model_flops / (f.step_ms / 1e3) / 1e12, rel=1e-3)
    out = " ".join(text.render(reports).split())
    assert out.count("no MFU") == 1 and "FLOPs: 3.98 MFLOP per step" in out
