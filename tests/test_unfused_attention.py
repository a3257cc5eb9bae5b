"""unfused-attention on GPT-style H100 loops with real kernel names (fixtures/transformer.py): which paths
it reports, why the fused kernel was not used, the fix in the user's words, and a prediction that never
beats the hardware."""

from __future__ import annotations

import pytest

from gpuadvise.analyzer.measure.efficiency import attention, flops
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.transformer import Shape, training_loop
from gpuadvise.rules.unfused_attention import RULE, _fused_times

USER = "train.py(48): forward;train.py(97): train_step"
MHA = ("torch/nn/functional.py(6230): multi_head_attention_forward;torch/nn/modules/activation.py(1368): forward;"
       "train.py(48): forward;train.py(97): train_step")
HF = ("transformers/models/gpt2/modeling_gpt2.py(77): eager_attention_forward;"
      "transformers/models/gpt2/modeling_gpt2.py(310): forward;train.py(97): train_step")


def _report(tmp_path, name, **kw):
    model = load_trace(training_loop(**kw).write(tmp_path / f"{name}.json"), cache=False)
    return model, analyze_model(model, rules=[RULE])


def _only(report):
    found = [f for f in report.findings if f.topic == "unfused-attention"]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize("path,dtype", [("flash", "bf16"), ("cudnn", "bf16"), ("efficient", "fp32")])
def test_fused_backends_are_quiet(tmp_path, path, dtype):
    """A model on SDPA's flash or cuDNN kernels (bf16), or the memory-efficient one (fp32), is right as it is."""
    model, report = _report(tmp_path, path, attention=path, dtype=dtype, stack=USER)
    assert _only(report) is None
    calls = attention.find(model, report.metrics.launches).calls
    assert set(calls["path"]) == {{"cudnn": "cuDNN", "efficient": "memory-efficient"}.get(path, path)}
    assert (calls["bwd_us"] > 0).all()  # its backward kernels found by the nodes' sequence numbers


def test_hand_written_attention_points_at_the_users_line(tmp_path):
    _, report = _report(tmp_path, "hand", attention="hand", stack=USER)
    f = _only(report)
    assert f is not None and f.severity == "high"
    assert f.evidence.sources == ["train.py(48): forward"]
    assert "written out by hand" in f.message
    assert "F.scaled_dot_product_attention(q, k, v, is_causal=True)" in f.fix
    assert "autocast" not in f.fix  # bf16 already
    n = f.evidence.numbers
    assert (n["batch_heads"], n["q_len"], n["k_len"], n["head_dim"], n["dtype"]) == (128, 1024, 1024, 64, "bf16")


def test_fp32_inputs_are_named_and_the_fix_adds_autocast(tmp_path):
    _, report = _report(tmp_path, "hand32", attention="hand", dtype="fp32", stack=USER)
    f = _only(report)
    assert "fp32, and the flash kernel takes fp16/bf16 only" in f.message
    assert "torch.autocast" in f.fix and "bfloat16" in f.fix
    assert f.evidence.numbers["fused_dtype"] == "bf16"


def test_math_fallback_with_a_mask_and_a_wide_head_says_why(tmp_path):
    _, report = _report(tmp_path, "math", attention="math", mask=True, shape=Shape(heads=4, head_dim=512))
    f = _only(report)
    assert "math fallback" in f.message
    assert "explicit `attn_mask`" in f.message
    assert "head dimension 512 is above the flash kernel's 256" in f.message


def test_multihead_attention_asking_for_weights_is_told_need_weights_false(tmp_path):
    _, report = _report(tmp_path, "mha", attention="hand", stack=MHA)
    f = _only(report)
    assert "need_weights=True" in f.message
    assert "need_weights=False" in f.fix and "scaled_dot_product_attention(q" not in f.fix


def test_a_hugging_face_model_is_told_its_attn_implementation(tmp_path):
    _, report = _report(tmp_path, "hf", attention="hand", stack=HF)
    f = _only(report)
    assert 'attn_implementation="sdpa"' in f.fix and 'attn_implementation="sdpa"' in f.advice
    assert f.evidence.sources == ["train.py(97): train_step"]  # the user's frame, not transformers'


def test_the_fused_kernels_never_beat_the_hardware(tmp_path):
    """Each call's predicted fused forward and backward take at least their FLOPs at the dense peak."""
    model, report = _report(tmp_path, "bound", attention="hand")
    a = Analysis(model, report.metrics)
    found = attention.find(model, report.metrics.launches)
    calls, k = found.unfused, found.kernels
    spec = a.device_spec
    head, top, bounded = _fused_times(calls, k, spec, "bf16", RULE.thresholds["fused_efficiency"])
    assert bounded
    peak = spec.peak("bf16") * 1e6  # FLOP per µs
    for i, call in calls.iterrows():
        q = [int(call["batch_heads"]), 1, int(call["q_len"]), int(call["head_dim"])]
        for backward, fn in ((False, flops.attention_flops), (True, flops.attention_backward_flops)):
            mine = (k["call"] == i) & (k["backward"] == backward)
            floor = fn(q, q, q, causal=True).flops / peak
            assert top[mine].sum() >= floor * 0.999
            assert head[mine].sum() >= top[mine].sum()  # the headline is the slower end
            assert head[mine].sum() < k.loc[mine, "gpu_us"].sum()  # and faster than the unfused kernels
    f = _only(report)
    lo, hi = f.impact.range_pct
    assert lo == f.impact.est_step_saving_pct < hi <= f.evidence.numbers["attention_share_pct_of_step"]


def test_without_shapes_only_the_passes_over_the_scores_go(tmp_path):
    _, report = _report(tmp_path, "noshapes", attention="hand", shapes=False)
    f = _only(report)
    assert f is not None and "no shapes recorded" in f.impact.basis
    # what the replay removes is at most the kernels outside the two products
    scores_pct = 100 * f.evidence.numbers["scores_ms_per_step"] * 1e3 / report.metrics.median_step_us
    assert 0 < f.impact.est_step_saving_pct <= scores_pct + 0.1
