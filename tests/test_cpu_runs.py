"""A run without a GPU: what its report says about the CPU's time.

- capture-problem says the run had no GPU (run.json) instead of how to fix CUPTI;
- the steps table shows where the training thread spent each step, not GPU busy and GPU idle;
- cpu-half-precision: autocast to a 16-bit type the CPU has no instructions for (its flags), with a
  saving from the trace's own op times and the matmul timing `gpuadvise profile` records;
- cpu-oversubscribed: more intra-op threads, or DataLoader workers, than the rank's cores;
- the harness's side: the CPU's flags from /proc/cpuinfo, the matmul timing (no RNG draw, no autocast
  fact of its own), the autocast's `enabled`.
Every rule's own positive and negative fixture is run by test_rules.py; these are the near misses."""

from __future__ import annotations

import copy

import pytest

from gpuadvise.analyzer.report.markdown import render as markdown
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.builder import GEMM, TraceBuilder
from gpuadvise.fixtures.runjson import run_json
from gpuadvise.rules import cpu_half_precision as half
from gpuadvise.rules import cpu_oversubscribed as over

CUPTI_WORDS = ("CUPTI", "LD_LIBRARY_PATH", "SYS_ADMIN", "ProfilerActivity")


def _report(load_built, builder: TraceBuilder, facts: dict | None):
    return analyze_model(load_built(builder), facts)


def _found(report, topic: str):
    return [f for f in report.findings if f.topic == topic]


def _cpu_loop(steps: int = 4) -> TraceBuilder:
    """Each step: a 1 ms wait for a batch that runs a 0.5 ms collate op, 3 ms inside ops, 2 ms of Python."""
    b = TraceBuilder(device=None)
    for _ in range(steps):
        with b.step():
            with b.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", cat="user_annotation"):
                b.idle(499)
                b.cpu("aten::stack", 500)  # its 1 µs close comes from b.op
            b.cpu("aten::addmm", 2_000)
            b.idle(2_000)
            b.cpu("aten::mm", 500)
    return b


def _no_gpu_facts() -> dict:
    facts = run_json(cuda_available=False)
    facts["environment"]["machine"]["torch"] = {"version": "2.13.0+cpu", "build": "cpu"}
    return facts


# -- capture-problem -------------------------------------------------------------------------------------
def test_a_run_that_had_no_gpu_is_told_so_not_how_to_fix_cupti(load_built):
    [f] = _found(_report(load_built, _cpu_loop(), _no_gpu_facts()), "capture-problem")
    assert f.message.startswith("This run had no GPU (run.json: torch 2.13.0+cpu is a CPU-only build)")
    assert "findings here are about the CPU's time" in f.message
    assert not any(w in f.recommendation for w in CUPTI_WORDS), f.recommendation
    assert f.severity == "info"


def test_a_gpu_the_run_left_unused_is_named_without_cupti(load_built):
    [f] = _found(_report(load_built, _cpu_loop(), run_json(cuda_available=True)), "capture-problem")
    assert "The process had a GPU (NVIDIA A100-SXM4-80GB) (run.json), but the recorded steps put no work on it" in f.message
    assert "`model.to('cuda')`" in f.advice
    assert not any(w in f.recommendation for w in CUPTI_WORDS)


def test_a_trace_alone_cannot_tell_a_cpu_run_from_a_lost_timeline(load_built):
    [f] = _found(_report(load_built, _cpu_loop(), None), "capture-problem")
    assert "this looks like a CPU-only run" in f.message
    assert "CUPTI" in f.fix  # without run.json a GPU timeline may have been lost: how to capture one stays


# -- the steps table -------------------------------------------------------------------------------------
def test_a_cpu_runs_steps_show_the_cpus_time_not_gpu_idle(load_built):
    report = _report(load_built, _cpu_loop(), _no_gpu_facts())
    steps = report.figures.cpu_steps
    assert [(s.ms, s.in_ops_ms, s.loader_wait_ms, s.collective_wait_ms, s.outside_ops_ms) for s in steps] == \
        [(5.5, 3.0, 0.5, 0.0, 2.0)] * 4
    text = markdown([report])
    assert "| Step | Time (ms) | In ops | DataLoader wait | Collective wait | Outside ops |" in text
    assert "| #0 | 5.50 | 3.00 | 0.50 | 0.00 | 2.00 |" in text
    steps_section = text.split("## Steps", 1)[1].split("\n## ", 1)[0]
    assert "GPU idle" not in steps_section and "GPU busy" not in steps_section


def test_a_gpu_runs_steps_keep_the_gpu_columns(load_built):
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            b.kernel(GEMM, 500)
            b.idle(200)
    b.finish()
    report = _report(load_built, b, run_json())
    assert report.figures.cpu_steps == []
    assert "| GPU busy | Compute | Comm | Memcpy | DataLoader | Sync wait | GPU idle |" in markdown([report])


# -- cpu-half-precision -------------------------------------------------------------------------------------
def _half_facts(**change) -> dict:
    facts = copy.deepcopy(half.RULE.positive().facts)
    entry = facts["autocast"][0]
    for k, v in change.items():
        if k == "flags":
            facts["environment"]["machine"]["cpu"]["flags"] = v
        elif k == "timed":
            if v is None:
                facts["environment"]["machine"]["cpu"].pop("matmul")
        else:
            entry[k] = v
    return facts


def test_the_saving_is_the_casts_and_the_matmuls_float32_speed(load_built):
    [f] = _found(_report(load_built, half.RULE.positive(), _half_facts()), "cpu-half-precision")
    # the fixture's step: 6 casts of 0.3 + 0.2 ms (1.5 ms), 3 addmm of 2 ms and an mm of 1.5 ms (7.5 ms), and
    # the matmul 20× as long in float16 (1.2 ms against 0.06 ms): 1.5 + 7.5 × (1 − 1/20) = 8.625 ms saved
    n = f.evidence.numbers
    assert (n["casts_ms_per_step"], n["matmuls_ms_per_step"], n["matmul_slower_x"]) == (1.5, 7.5, 20.0)
    assert f.impact.est_step_saving_pct == pytest.approx(100 * 8.625 / n["median_step_ms"], abs=0.05)
    assert "train.py:40 with `enabled=False`" in f.advice
    assert "dtype=torch.float16, enabled=use_amp" in f.fix  # the type the script asked for
    assert "Trainer" not in f.fix and "Lightning" not in f.fix  # a plain script


def test_without_the_matmul_timing_only_the_casts_are_predicted(load_built):
    [f] = _found(_report(load_built, half.RULE.positive(), _half_facts(timed=None)), "cpu-half-precision")
    assert f.impact.est_step_saving_pct == pytest.approx(100 * 1.5 / f.evidence.numbers["median_step_ms"], abs=0.05)
    assert "not predicted" in f.impact.basis


@pytest.mark.parametrize("why", ["disabled", "a bf16 cpu", "on the gpu", "no casts in the steps", "no flags"])
def test_autocast_that_costs_the_cpu_nothing_is_not_a_finding(load_built, why):
    b = half._cpu_autocast_loop(casts=why != "no casts in the steps")
    facts = {"disabled": _half_facts(enabled=False), "a bf16 cpu": _half_facts(dtype="torch.bfloat16"),
             "on the gpu": _half_facts(device_type="cuda"), "no casts in the steps": _half_facts(),
             "no flags": _half_facts(flags=None)}[why]
    assert not _found(_report(load_built, b, facts), "cpu-half-precision")


def test_a_gpu_run_gets_no_cpu_precision_advice(load_built):
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            with b.op("aten::linear"):
                b.cpu(half.CAST, 300)
                b.kernel(GEMM, 2_000)
    b.finish()
    assert not _found(_report(load_built, b, _half_facts()), "cpu-half-precision")


# -- cpu-oversubscribed -------------------------------------------------------------------------------------
def test_two_ranks_on_two_cores_with_two_threads_each(load_built):
    facts = over._facts(threads=2, usable=2, workers=0, ranks=2)
    [f] = _found(_report(load_built, over._cpu_loop(multi=False), facts), "cpu-oversubscribed")
    assert "each rank's share of the cores is 1 (2 usable, 2 ranks on this node: 1 per rank)" in f.message
    assert "4 threads take turns on 2 cores" in f.message
    assert "`torch.set_num_threads(1)`" in f.advice and "per rank" in f.advice
    assert f.impact.est_step_saving_pct == 0.0 and f.impact.basis.startswith("not predicted")


def test_workers_beyond_the_free_cores_are_named_with_the_count_that_fits(load_built):
    facts = over._facts(threads=2, usable=2, workers=4)
    facts["capture"] = {"loader": {"build_ms_per_batch": 1.2, "num_workers": 4}}  # what the loader probe measured
    [f] = _found(_report(load_built, over._cpu_loop(multi=True), facts), "cpu-oversubscribed")
    assert "runs 4 worker processes, but the process has 2 cores (2 usable), 1 of them free" in f.message
    # the fixture's step: 6 ms, one batch: the workers build 1.2 ms of it, a fifth of one core's time
    assert "the step uses one every 6.00 ms: the workers together are busy 20.0 % of one core's time" in f.message
    assert f.advice.startswith("Use num_workers=1 for this loader")
    assert f.evidence.sources == ["train.py:30"]


@pytest.mark.parametrize("why", ["loader ran in the process", "gpu run"])
def test_workers_the_steps_did_not_use_or_a_gpu_run_are_not_a_finding(load_built, why):
    facts = over._facts(threads=1, usable=2, workers=4)
    if why == "gpu run":
        b = TraceBuilder()
        for _ in range(3):
            with b.step():
                b.cpu(over.MULTI, 200, cat="user_annotation")
                b.kernel(GEMM, 2_000)
        b.finish()
    else:
        b = over._cpu_loop(multi=False)
    assert not _found(_report(load_built, b, facts), "cpu-oversubscribed")


# -- what the harness records -------------------------------------------------------------------------------------
def test_the_cpus_16_bit_flags_are_read_from_cpuinfo(tmp_path):
    from gpuadvise.doctor import probe

    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                   "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile avx512_fp16 amx_fp16\n\nprocessor\t: 1\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd fphp asimdhp bf16 sve\n")
    assert probe._cpu_model(str(x86)) == {"model": "Intel(R) Xeon(R) Platinum 8480+",
                                          "flags": ["amx_bf16", "amx_fp16", "amx_tile", "avx2", "avx512_bf16",
                                                    "avx512_fp16", "avx512f"]}
    assert probe._cpu_model(str(arm))["flags"] == ["asimdhp", "bf16", "fphp", "sve"]
    assert probe._cpu_model(str(tmp_path / "missing"))["flags"] is None


def test_the_matmul_timing_draws_no_random_number_and_builds_no_autocast(monkeypatch):
    """It runs inside the script's process (at the window's end, maybe inside the script's own autocast): the
    script's random numbers and its autocast record (every torch.autocast built is one) stay as they were."""
    torch = pytest.importorskip("torch")
    from gpuadvise.harness.facts import general

    before = torch.get_rng_state()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the script's context, around the step boundary

        def built(*a, **k):
            raise AssertionError("the timing built a torch.autocast: the script's record would count it")

        monkeypatch.setattr(torch, "autocast", built)
        timed = general.cpu_matmul(torch, ["bfloat16"])
    assert set(timed["ms"]) == {"float32", "bfloat16"} and all(v > 0 for v in timed["ms"].values())
    assert torch.equal(torch.get_rng_state(), before)
