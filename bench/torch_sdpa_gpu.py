"""The GPU anchors: PyTorch's scaled_dot_product_attention with its flash backend and its cuDNN
backend, on the shapes of `stria-cuda-bench kernels` (bf16, B*S = 16k tokens, H*D = 2048).

Prints key=value lines in stria-cuda-bench's format. Same FLOP convention: forward 4*B*H*S^2*D,
halved when causal; backward 2.5x; backward time is (forward + backward) minus forward, medians
of CUDA-event timings.

--decode S,...: instead, the anchor of stria-decode-bench: one query token (bf16, batch 1, Hq 32)
against a cache of S tokens with Hkv 8 (GQA 4:1, enable_gqa: each K/V head read once where the
backend takes it), per backend (flash, cuDNN, memory-efficient), median milliseconds, and the
bandwidth of the cache's reads.

--window W (with --decode): also, per length, the token against the window's slice of its cache
(the last W keys, what a PyTorch user passes for a sliding-window layer): the anchor of
stria-decode-bench's decode_window lines, the bandwidth counting the window's keys.

--prefill P,... (with --decode's lengths): the anchor of stria-decode-bench's prefill lines: P new
query tokens against a cache of S tokens and themselves (bf16, batch 1, Hq 32, Hkv 8 expanded to
Hq heads beforehand), causal with the diagonal at the bottom right (torch.nn.attention.bias's
causal_lower_right, which SDPA's flash and memory-efficient backends take), per backend, median
milliseconds and TFLOP/s (4 * P * (S + P / 2) * Hq * D).
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
DECODE_BACKENDS = dict(BACKENDS, efficient=SDPBackend.EFFICIENT_ATTENTION)


def time_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def timed(backends, what, reps, fn):
    """(name, median ms of fn()) under each of SDPA's `backends` that takes the shape; a comment line
    for one that does not."""
    for name, backend in backends.items():
        try:
            with sdpa_kernel(backend):
                ms = time_ms(fn, reps)
        except RuntimeError as e:  # a backend that does not take this shape
            print(f"# {name} {what}: {(str(e).splitlines() or ['?'])[0]}", flush=True)
            continue
        yield name, ms


def decode(lens, reps, window=-1, hq=32, hkv=8, d=128) -> None:
    for s in lens:
        q = torch.randn(1, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        kv = [torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        gbs = 2.0 * s * hkv * d * 2.0
        for name, ms in timed(DECODE_BACKENDS, f"decode S={s}", reps,
                              lambda: F.scaled_dot_product_attention(q, kv[0], kv[1], enable_gqa=True)):
            print(f"impl=torch_{name} decode S={s} Hq={hq} Hkv={hkv} D={d} ms={ms:.4f} kv_GBs={gbs / (ms * 1e6):.1f}",
                  flush=True)
        if window >= 0:
            seen = min(window, s)
            kw, vw = (t[:, :, s - seen:] for t in kv)
            wbytes = 2.0 * seen * hkv * d * 2.0
            for name, ms in timed(DECODE_BACKENDS, f"decode S={s} W={window}", reps,
                                  lambda: F.scaled_dot_product_attention(q, kw, vw, enable_gqa=True)):
                print(f"impl=torch_{name} decode_window S={s} W={window} Hq={hq} Hkv={hkv} D={d} ms={ms:.4f} "
                      f"kv_GBs={wbytes / (ms * 1e6):.1f}", flush=True)
            del kw, vw
        kv.clear()  # the next length's cache in its place
        torch.cuda.empty_cache()


def prefill(lens, chunks, reps, hq=32, hkv=8, d=128) -> None:
    from torch.nn.attention.bias import causal_lower_right

    for p in chunks:
        for s in lens:
            if s > 1 << 17:  # a prefill's chunk against up to 128k cached tokens, as stria-decode-bench
                continue
            q = torch.randn(1, hq, p, d, device="cuda", dtype=torch.bfloat16)
            kv = [torch.randn(1, hkv, s + p, d, device="cuda", dtype=torch.bfloat16)
                  .repeat_interleave(hq // hkv, dim=1) for _ in range(2)]
            mask = causal_lower_right(p, s + p)
            flops = 4.0 * p * (s + p / 2.0) * hq * d
            backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
            for name, ms in timed(backends, f"prefill S={s} P={p}", reps,
                                  lambda: F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask)):
                print(f"impl=torch_{name} prefill S={s} P={p} Hq={hq} Hkv={hkv} D={d} ms={ms:.4f} "
                      f"tflops={flops / (ms * 1e9):.1f}", flush=True)
            kv.clear()
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--backends", default="flash,cudnn",
                    help="of flash, cudnn, efficient, math (heads of 512: efficient and math take them)")
    ap.add_argument("--lens", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--decode", default="", help="cache lengths: time decode instead")
    ap.add_argument("--prefill", default="", help="with --decode: new tokens per prefill, timed after decode")
    ap.add_argument("--window", type=int, default=-1, help="with --decode: also the last W keys of each cache")
    a = ap.parse_args()
    if a.decode:
        lens = [int(x) for x in a.decode.split(",")]
        decode(lens, a.reps, a.window)
        if a.prefill:
            prefill(lens, [int(x) for x in a.prefill.split(",")], min(a.reps, 5))
        return
    known = dict(DECODE_BACKENDS, math=SDPBackend.MATH)
    backends = {name: known[name] for name in a.backends.split(",")}
    for d in map(int, a.dims.split(",")):
        for s in map(int, a.lens.split(",")):
            for causal in (0, 1):
                b, h = max(1, 16384 // s), 2048 // d
                # SDPA takes [B, H, S, D]; transposed views of [B, S, H, D] like ours.
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                           .requires_grad_() for _ in range(3))
                g = torch.randn_like(q)
                flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                for name, backend in backends.items():
                    try:
                        with sdpa_kernel(backend):
                            fwd = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)),
                                          a.reps)

                            def both():
                                # autograd.grad: the gradients are returned, not added into .grad
                                # (which would time an extra read-modify-write of q, k and v).
                                o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                                torch.autograd.grad(o, (q, k, v), g)

                            tot = time_ms(both, a.reps)
                    except RuntimeError as e:  # a backend that does not take this shape
                        print(f"# {name} d={d} s={s} causal={causal}: {(str(e).splitlines() or ['?'])[0]}",
                              flush=True)
                        continue
                    bwd = max(tot - fwd, 1e-6)
                    common = f"dim={d} causal={causal} len={s} batch={b} heads={h}"
                    print(f"impl=torch_{name} dir=fwd {common} ms={fwd:.4f} tflops={flops / fwd * 1e-9:.1f}")
                    print(f"impl=torch_{name} dir=bwd {common} ms={bwd:.4f} tflops={2.5 * flops / bwd * 1e-9:.1f}",
                          flush=True)


if __name__ == "__main__":
    main()
