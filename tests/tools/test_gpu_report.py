#!/usr/bin/env python3
"""bench/gpu_report.py, which turns the GPU run's results into docs/performance.md's tables and
judges the kernel targets, on lines in the formats stria-cuda-bench and bench/torch_sdpa_gpu.py print
and stria-decode-bench print (some of them cut short, as a time limit leaves them), and on a run
that measured nothing.

Usage: test_gpu_report.py GPU_REPORT_PY
"""
import subprocess
import sys
import tempfile

LINES = """\
== kernels (at 100 s of 570 s)
impl=stria_mma dir=fwd dim=128 causal=1 len=4096 batch=4 heads=16 ms=0.5000 tflops=280.0
impl=stria_mma dir=bwd dim=128 causal=1 len=4096 batch=4 heads=16 ms=1.5000 tflops=190.0
impl=stria_wgmma dir=fwd dim=128 causal=1 len=4096 batch=4 heads=16 ms=0.3000 tflops=450.0
impl=stria_wgmma dir=bwd dim=128 causal=1 len=4096 batch=4 heads=16 ms=1.0000 tflops=300.0
impl=stria_mma_deterministic dir=bwd dim=128 causal=1 len=4096 batch=4 heads=16 ms=0.7500 tflops=400.0
impl=stria_mma dir=fwd dim=128 causal=1 len=8192 batch=2 heads=16 ms=0.5000 tflops=300.0
impl=stria_mma dir=bwd dim=128 causal=1 len=8192 batch=2 heads=16 ms=1.5000 tflops=200.0
impl=stria_mma dir=fwd dim=128 causal=1 len=2048 batch=8 heads=16 ms=0.5000 tflops=100.0
impl=torch_flash dir=fwd dim=128 causal=1 len=2048 batch=8 heads=16 ms=0.4000 tflops=300.0
impl=torch_flash dir=fwd dim=128 causal=1 len=4096 batch=4 heads=16 ms=0.4000 tflops=350.0
impl=torch_flash dir=bwd dim=128 causal=1 len=4096 batch=4 heads=16 ms=1.4000 tflops=250.0
impl=torch_cudnn dir=fwd dim=128 causal=1 len=4096 batch=4 heads=16 ms=0.3000 tflops=480.0
impl=torch_flash dir=fwd dim=128 causal=1 len=8192 batch=2 heads=16 ms=0.4000 tflops=330.0
impl=torch_flash dir=bwd dim=128 causal=1 len=8192 batch=2 heads=16 ms=1.4000 tflops=230.0
# cudnn d=64 s=1024 causal=0: No available kernel
impl=stria_tma dir=fwd dim=128 causal=1 len=8192 batch=2 he
split impl=stria_mma dir=fwd dim=128 causal=1 len=4096 batch=4 heads=16 call_ms=0.5000 loop_ms=0.4800 block_ms=0.6000
split impl=stria_mma dir=bwd dim=128 causal=1 len=4096 batch=4 heads=16 call_ms=1.5000 loop_m
ring kernels=mma dir=fwd layout=contiguous seq=262144 world=8 heads=16 dim=128 latency_ms=900.000 ideal_ms=500.000 \
of_ideal=0.556 vs_contiguous=1.000 analytic_vs_contiguous=1.000 single_gpu_ms=4000.000
ring kernels=mma dir=fwd layout=striped seq=262144 world=8 heads=16 dim=128 latency_ms=510.000 ideal_ms=500.000 \
of_ideal=0.980 vs_contiguous=1.765 analytic_vs_contiguous=1.870 single_gpu_ms=4000.000
hide_threshold kernels=mma dir=fwd step=striped link=nvlink gbs=450 smallest_hiding_len=2048
hide_threshold kernels=mma dir=fwd step=striped link=ib gbs=50 smallest_hiding_len=-1
ring kernels=mma dir=bwd layout=striped seq=262144 world=8 heads=16 dim=128 latency_ms=510.000 of_ideal=0.97
hide_threshold kernels=mma dir=bwd step=striped link=nvlink gbs=4
docs kernels=mma dir=fwd who=plan dist=lognormal seq=32768 world=8 heads=16 dim=128 documents=26 local_len=4224 \
latency_ms=1.500 ideal_ms=1.400 of_ideal=0.933 single_gpu_ms=11.200
docs_idle kernels=mma who=plan seq=32768 world=8 local_len=4224 fwd_ms=0.0100 bwd_ms=0.0200
docs_home kernels=mma dist=lognormal seq=32768 world=8 rank=3 home_begin=1024 local_len=4224 fwd_ms=0.2500 bwd_ms=0.7000
docs_home kernels=mma dist=lognormal seq=32768 world=8 rank=4 home_begin=1024 local_len=4224 fwd_ms=0.2
docs kernels=mma dir=fwd who=plan_home dist=lognormal seq=32768 world=8 heads=16 dim=128 local_len=4224 \
latency_ms=1.450 ideal_ms=1.400 of_ideal=0.966 chain_ms=0.900 slowest_rank_ms=1.450 single_gpu_ms=11.200
docs_step kernels=mma who=plan dist=lognormal seq=32768 world=8 step=0 ranks=8 fwd_ms=0.3000 fwd_mean_ms=0.2800 \
bwd_ms=0.9000 bwd_mean_ms=0.8500 tiles=86 busy_ctas=33 longest_cta=9
docs_step kernels=mma who=striped dist=lognormal seq=32768 world=8 step=0 ranks=8 fwd_ms=0.5000 fwd_mean_ms=0.4000 \
bwd_ms=1.9000 bwd_mean_ms=1.5000 tiles=200 busy_ctas=33 longest_cta=30
docs_step kernels=mma who=plan dist=lognormal seq=32768 world=8 step=1 ranks=8 fwd_ms=0.2000 fwd_mean_ms=0.1
docs kernels=mma dir=fwd who=striped dist=lognormal seq=32768 world=8 heads=16 dim=128 documents=26 local_len=4096 \
latency_ms=3.000 ideal_ms=1.400 of_i
-- NCCL transport at world 1 against the in-process transport (causal, H 16, D 128, bf16)
| tokens | layout | pass | in-process ms | NCCL ms | NCCL / in-process |
|---|---|---|---|---|---|
| 4096 | striped | fwd | 1.000 | 1.100 | 1.100 |
== hide (at 200 s of 570 s)
impl=stria_cuda decode S=131072 Hq=32 Hkv=8 D=128 ms=0.2000 kv_GBs=2684.4
impl=stria_cuda decode_window S=131072 W=4096 Hq=32 Hkv=8 D=128 ms=0.0200 kv_GBs=838.9 wall_ms=0.0300 work_ms=0.0100
impl=torch_cudnn decode_window S=131072 W=4096 Hq=32 Hkv=8 D=128 ms=0.0300 kv_GBs=559.2
impl=torch_flash decode_window S=131072 W=4096 Hq=32 Hkv=8 D=128 ms=0.0400 kv_GBs=419.4
impl=torch_flash decode_window S=1048576 W=4096 Hq=32 Hkv=8 D=128 ms=0.04
impl=torch_flash decode S=131072 Hq=32 Hkv=8 D=128 ms=0.3000 kv_GBs=1789.6
impl=torch_cudnn decode S=131072 Hq=32 Hkv=8 D=128 ms=0.2500 kv_GBs=2147.5
impl=stria_cuda decode_sharded S=1048576 N=8 rank_ms=0.2000 fixed_ms=0.0500 merge_ms=0.0300 modelled_ms=0.2300 ideal_ms=0.2000 \
of_ideal=0.870 merge_share=0.130
impl=stria_cuda decode_sharded S=1048576 N=4 rank_ms=0.4000 fixed_ms=0.0400 merge_ms=0.0200 modelled_ms=0.4200 ideal_ms=0.4000 \
of_ideal=0.952 merge_share=0.048
impl=stria_cuda decode_sharded S=131072 N=8 rank_ms=0.0400 fixed_ms=0.0500 merge_ms=0.0300 modelled_ms=0.0700 ideal_ms=0.0250 \
of_ideal=0.357 merge_share=0.429
impl=stria_cuda decode_sharded S=1048576 N=2 rank_ms=0.8
""".replace("\\\n", "")


def report(script, text):
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(text)
        f.flush()
        return subprocess.run([sys.executable, script, f.name], capture_output=True, text=True, check=True).stdout


def main(script):
    failures = []
    out = report(script, LINES)
    expected = [
        # every family and both anchors on one row; the best family against flash
        "| 128 | yes | 4096 | 280 | 450 | – | 350 | 480 | 579 | 1.29x |",
        "| 128 | yes | 8192 | 300 | – | – | 330 | – | 602 | 0.91x |",
        # the deterministic backward in a column of its own, never the best family (300 / 250)
        "| 128 | yes | 4096 | 190 | 300 | 400 | 250 | – | – | 1.20x |",
        # the bars on their worst shape (2k tokens is below the forward bar's range)
        "| causal forward, D 128, 4k+ tokens: best stria / flash (2 shapes) | >= 1.0x | 0.909 | missed |",
        "| causal backward, D 128, 4k+ tokens: best stria / flash (2 shapes) | >= 0.9x | 0.870 | missed |",
        "| striped ring, N 8, 256k, mma fwd: of ideal | >= 0.95 | 0.980 | met |",
        "| striped ring, N 8, 256k, mma fwd: contiguous / striped | >= 1.75x | 1.765 | met |",
        "| mma | fwd | striped | 8 | 262144 | 510.0 | 500.0 | 0.980 | 1.76x | 1.87x |",
        "| mma | fwd | striped | ib | 50 | none measured |",
        "| 4096 | striped | fwd | 1.000 | 1.100 | 1.100 |",
        # where the call's time goes: the host's latency and the passes around the block kernel
        "| mma | fwd | 4096 | 0.500 | 0.480 | 0.600 | 0.020 | 0.80x |",
        # packed documents: the plan's modelled ring (the striped line is cut short: left out)
        "| mma | fwd | lognormal | 32768 | 8 | plan | 4224 | 1.50 | 1.40 | 0.933 |",
        # and step by step: the slowest rank beside the mean, its tiles, and a block without work
        "| mma | lognormal | 32768 | 8 | 0 | 8 | 0.300 (0.280) | 0.900 (0.850) | 86 | 33 | 9 |",
        "| mma | idle block | 32768 | 8 | – | – | 0.010 | 0.020 | 0 | 0 | 0 |",
        # the plan with each rank's kept documents apart: the model and each rank's overlapped time
        "| mma | fwd | lognormal | 32768 | 8 | plan_home | 4224 | 1.45 | 1.40 | 0.966 |",
        "| mma | lognormal | 32768 | 8 | 3 | 1024 | 4224 | 0.250 | 0.700 |",
        # decode: ours beside torch's backends (the best of them over ours), the modelled shards and their bars
        "| 131072 | 0.200 (2684) | 0.250 (2148) | 0.300 (1790) | 1.25x |",
        # decode under a window: ours beside SDPA on the window's slice (a line cut short: left out)
        "| 131072 | 4096 | 0.020 (839) | 0.030 (559) | 0.040 (419) | 1.50x |",
        # (an older run's lines: the model from the calls' times alone, which the bars then judge)
        "| 1048576 | 8 | 0.230 | 0.200 | 0.870 | 0.130 | – | – | – |",
        "| decode over N ranks, 64k+ cached tokens per rank: of ideal (2 shapes, call times) | >= 0.8 | 0.870 | met |",
        "| decode's merge across ranks at 1M cached tokens: share of the call (call times) | <= 0.10 | 0.130 | missed |",
    ]
    for line in expected:
        if line not in out.splitlines():
            failures.append(f"missing: {line}")
    if ("stria tma" in out or "mma bwd" in out or "| mma | bwd |" in out or "| striped | 4096 |" in out
            or "| 1048576 | 2 |" in out or "| 0.500 (0.400) |" in out or "| 8 | 1 | 8 |" in out
            or "| 4224 | 0.200 |" in out or "| 1048576 | 4096 |" in out):
        failures.append("a line cut short was read")
    # Decode with the kernels' times: the call split into GPU work and host, the merge's parts, and
    # the bars on the model from the kernels' times; a shape whose gate gave up (negative) is left
    # out of that model.
    dev = report(script, """\
impl=stria_cuda decode S=131072 Hq=32 Hkv=8 D=128 ms=0.2000 kv_GBs=2684.4 wall_ms=0.2500 work_ms=0.1500 host_ms=0.0400
impl=stria_cuda decode_fixed N=1 ms=0.0800 wall_ms=0.1000 work_ms=0.0120 host_ms=0.0300
impl=stria_cuda decode_merge N=8 kernel_ms=0.0040 gather_ms=0.0200 (modelled: 20 us + 16512 bytes a rank at 450 GB/s)
impl=stria_cuda decode_sharded S=1048576 N=8 rank_ms=0.2000 fixed_ms=0.9000 merge_ms=0.8000 modelled_ms=1.0000 \
ideal_ms=0.1400 of_ideal=0.140 merge_share=0.800 work_rank_ms=0.1300 work_merge_ms=0.0240 \
work_modelled_ms=0.1540 work_ideal_ms=0.1300 work_of_ideal=0.844 work_merge_share=0.156
impl=stria_cuda decode_sharded S=524288 N=8 rank_ms=0.1500 fixed_ms=0.9000 merge_ms=0.8000 modelled_ms=0.9500 \
ideal_ms=0.0700 of_ideal=0.074 merge_share=0.842 work_rank_ms=-1.0000 work_merge_ms=0.0240 \
work_modelled_ms=-0.9760 work_ideal_ms=0.0700 work_of_ideal=-0.072 work_merge_share=-0.025
""".replace("\\\n", ""))
    for line in (
            "| 131072 | 0.200 | 0.1500 | 0.0400 |",
            "| 1 (fixed) | 0.080 | 0.0120 | 0.0300 |",
            "| 8 | 0.0040 | 0.0200 |",
            "| 1048576 | 8 | 1.000 | 0.140 | 0.140 | 0.800 | 0.154 | 0.844 | 0.156 |",
            "| 524288 | 8 | 0.950 | 0.070 | 0.074 | 0.842 | – | – | – |",
            "| decode over N ranks, 64k+ cached tokens per rank: of ideal (1 shapes, kernel times) | >= 0.8 | 0.844 | met |",
            "| decode's merge across ranks at 1M cached tokens: share of the call (kernel times) | <= 0.10 | 0.156 | "
            "missed |"):
        if line not in dev.splitlines():
            failures.append(f"decode from the kernels' times, missing: {line}\n{dev}")
    empty = report(script, "== build failed: nothing else can run\n")
    if empty.count("| not measured |") != 13 or "decode" in empty:
        failures.append(f"a run that measured nothing: {empty!r}")
    # The bars against cuDNN, on their worst shapes (the best stria column on each, a speed switch's
    # included), and each speed switch beside its family's default.
    cud = report(script, "".join(
        f"impl={i} dir={dr} dim={d} causal={c} len={s} batch=1 heads=16 ms=1 tflops={t}\n" for i, dr, d, c, s, t in (
            ("stria_tma", "fwd", 64, 1, 8192, 400.0), ("torch_cudnn", "fwd", 64, 1, 8192, 426.0),
            ("stria_tma", "fwd", 128, 0, 16384, 615.0), ("torch_cudnn", "fwd", 128, 0, 16384, 665.0),
            ("stria_tma", "fwd", 64, 1, 2048, 245.0), ("stria_tma_rows192", "fwd", 64, 1, 2048, 290.0),
            ("torch_cudnn", "fwd", 64, 1, 2048, 314.0),
            ("stria_tma", "bwd", 128, 1, 4096, 304.0), ("stria_tma_headgroup0", "bwd", 128, 1, 4096, 280.0),
            ("torch_cudnn", "bwd", 128, 1, 4096, 481.0),
            ("stria_tma", "fwd", 256, 1, 4096, 500.0), ("torch_cudnn", "fwd", 256, 1, 4096, 520.0))))
    for line in (
            "| forward, D 64 and 128, causal and not, 8k+ tokens: best stria / cuDNN (2 shapes) | >= 1.0x | 0.925 | "
            "missed |",
            "| forward, D 64 and 128, causal and not, 2k-4k tokens: best stria / cuDNN (1 shapes) | >= 0.9x | 0.924 | "
            "met |",
            "| backward, D 64 and 128, causal and not, 2k-4k tokens: best stria / cuDNN (1 shapes) | >= 0.9x | 0.632 | "
            "missed |",
            "| forward, D 256: best stria / cuDNN (1 shapes) | >= 0.9x | 0.962 | met |",
            "| backward, D 256: best stria / cuDNN (0 shapes) | >= 0.9x | – | not measured |",
            "| tma_rows192 | fwd | 64 | yes | 2048 | 290 | 245 | 1.18x |",
            "| tma_headgroup0 | bwd | 128 | yes | 4096 | 280 | 304 | 0.92x |"):
        if line not in cud.splitlines():
            failures.append(f"cuDNN bars and switches, missing: {line}\n{cud}")
    # Softcap and sinks: columns of their own, judged against their family's plain call on the same
    # shape, never the best family against flash (the sinks line here is faster than the plain one).
    shape = "dim=128 causal=1 len=4096 batch=4 heads=16 ms=1"
    mods = report(script, "".join(f"impl={i} dir=fwd {shape} tflops={t}\n" for i, t in (
        ("stria_tma", 450.0), ("stria_tma_softcap30", 400.0), ("stria_tma_sinks", 500.0), ("torch_flash", 300.0))))
    for line in (
            "| 128 | yes | 4096 | 450 | 500 | 400 | 300 | – | 579 | 1.50x |",
            "| causal forward, D 128, 4k+ tokens: best stria / flash (1 shapes) | >= 1.0x | 1.500 | met |",
            "| softcap 30, causal, D 128: time over the plain call's (1 shapes and passes) | <= 1.10 | 1.125 | missed |",
            "| sinks, causal, D 128: time over the plain call's (1 shapes and passes) | <= 1.10 | 0.900 | met |"):
        if line not in mods.splitlines():
            failures.append(f"score modifications, missing: {line}\n{mods}")
    # The deterministic backward: columns of their own (as the library runs it, and with its dQ
    # pass for comparison), judged against the family's default backward, never against flash.
    det = report(script, "".join(f"impl={i} dir=bwd {shape} tflops={t}\n" for i, t in (
        ("stria_tma", 360.0), ("stria_tma_deterministic", 300.0), ("stria_tma_deterministic_passes", 220.0),
        ("torch_flash", 250.0))))
    for line in (
            "| 128 | yes | 4096 | 360 | 300 | 220 | 250 | – | – | 1.44x |",
            "| deterministic backward, D 128: time over the default's (1 shapes) | <= 1.30 | 1.200 | met |"):
        if line not in det.splitlines():
            failures.append(f"deterministic backward, missing: {line}\n{det}")
    # Heads of 512: torch's other backends (which take them where flash and cuDNN do not) in columns
    # of their own after cuDNN's; no ratio against a flash backend that did not run.
    wide = report(script, "".join(f"impl={i} dir=fwd dim=512 causal=1 len=4096 batch=4 heads=4 ms=1 tflops={t}\n"
                                  for i, t in (("stria_default", 20.0), ("torch_efficient", 60.0),
                                               ("torch_math", 15.0))))
    if "| 512 | yes | 4096 | 20 | – | – | 60 | 15 | – | – |" not in wide.splitlines() or \
            "| torch efficient | torch math |" not in wide:
        failures.append(f"heads of 512 beside torch's other backends, missing:\n{wide}")
    # FlashAttention-3's published figures: a column beside the run's anchors where the paper has the
    # shape (its backward without a causal mask), never in a ratio or a bar.
    fa3 = report(script, "impl=stria_tma dir=bwd dim=128 causal=0 len=4096 batch=4 heads=16 ms=1 tflops=340\n"
                 "impl=stria_tma dir=bwd dim=128 causal=1 len=4096 batch=4 heads=16 ms=1 tflops=300\n")
    for line in ("| 128 | no | 4096 | 340 | – | – | 542 | – |", "| 128 | yes | 4096 | 300 | – | – | – | – |"):
        if line not in fa3.splitlines():
            failures.append(f"FlashAttention-3's column, missing: {line}\n{fa3}")
    # The e4m3 forward: a column of its own, judged against its own bar (900 TFLOP/s at D 128, 16k),
    # never the best 16-bit family against flash.
    big = "dim=128 causal=1 len=16384 batch=1 heads=16 ms=1"
    fp8 = report(script, "".join(f"impl={i} dir=fwd {big} tflops={t}\n" for i, t in (
        ("stria_tma", 600.0), ("stria_fp8", 880.0), ("torch_flash", 500.0))))
    for line in (
            "| 128 | yes | 16384 | 600 | 880 | 500 | – | 616 | 1.20x |",
            "| FP8 (e4m3) forward, D 128, 16k tokens (1 shapes) | >= 900 TFLOP/s | 880.000 | missed |"):
        if line not in fp8.splitlines():
            failures.append(f"FP8, missing: {line}\n{fp8}")
    # Prefill chunks: ours beside SDPA's backends, ms (TFLOP/s), never read as kernel lines.
    pre = report(script, "".join(f"impl={i} prefill S=32768 P=512 Hq=32 Hkv=8 D=128 ms={ms} tflops={t}\n" for i, ms, t in (
        ("stria_cuda", "1.0000", "140.0"), ("torch_flash", "0.8000", "175.0"), ("torch_efficient", "1.6000", "87.5"))))
    for line in ("| 32768 | 512 | 1.000 (140) | 1.600 (88) | 0.800 (175) | 0.80x |",):
        if line not in pre.splitlines():
            failures.append(f"prefill, missing: {line}\n{pre}")
    if "| 128 |" in pre:
        failures.append(f"prefill lines read as kernel lines\n{pre}")
    for f in failures:
        print("FAIL:", f)
    if failures:
        print(out)
    print("gpu_report: " + ("ok" if not failures else f"{len(failures)} checks failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
