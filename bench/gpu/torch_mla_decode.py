#!/usr/bin/env python3
"""MLA decode: this project's CUDA kernel against a PyTorch absorbed implementation, same run.

Both run on the same device tensors: the kernel through libmla_decode_capi.so (ctypes), the
peer as gather + bmm + softmax + bmm over the paged cache. Shapes are FlashMLA's published
ones: batch 128, mean cached length 4096 / 8192 (fixed, or normal with sd mean/2), h_q 16, 32,
64, 128, s_q 1 and 2, BF16 and FP8 caches (the peer uses the dequantised FP8 cache in BF16).
Prints microseconds, TFLOPS (2 s_q sum(len) h_q (576 + 512)), GB/s (cache + q + out) and the
peer/kernel time ratio, plus the largest output difference between the two.
"""
import argparse
import ctypes
import math
import sys

import torch

KV_LORA, ROPE, DIM, PAGE = 512, 64, 576, 64
FP8_ROW = 656


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.mla_decode_error.restype = ctypes.c_char_p
    lib.mla_decode_plan.restype = ctypes.c_void_p
    lib.mla_decode_plan.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.mla_decode_free.argtypes = [ctypes.c_void_p]
    lib.mla_decode_run.restype = ctypes.c_int
    lib.mla_decode_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_void_p]
    return lib


def make_inputs(batch, s_q, h_q, mean, varlen, fp8, gen):
    dev = "cuda"
    if varlen:
        lengths = torch.normal(float(mean), mean / 2.0, (batch,), generator=gen).round().clamp(s_q, 2 * mean).int()
    else:
        lengths = torch.full((batch,), mean, dtype=torch.int32)
    pages = (lengths + PAGE - 1) // PAGE
    max_pages = int(pages.max())
    total = int(pages.sum())
    perm = torch.randperm(total, generator=gen).int()
    table = torch.zeros(batch, max_pages, dtype=torch.int32)
    start = 0
    for b in range(batch):
        n = int(pages[b])
        table[b, :n] = perm[start:start + n]
        start += n
    latent = torch.randn(total * PAGE, DIM, device=dev, dtype=torch.bfloat16)
    q = torch.randn(batch, s_q, h_q, DIM, device=dev, dtype=torch.bfloat16)
    if fp8:
        c = latent[:, :KV_LORA].float().view(-1, KV_LORA // 128, 128)
        amax = c.abs().amax(-1)
        scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        qv = (c / scale[..., None]).to(torch.float8_e4m3fn)
        raw = torch.cat([qv.view(torch.uint8).view(-1, KV_LORA), scale.contiguous().view(torch.uint8).view(-1, 16),
                         latent[:, KV_LORA:].contiguous().view(torch.uint8).view(-1, ROPE * 2)], dim=1)
        kernel_cache = raw.contiguous().view(total, PAGE, FP8_ROW)
        deq = torch.cat([(qv.float() * scale[..., None]).view(-1, KV_LORA), latent[:, KV_LORA:].float()], dim=1)
        peer_cache = deq.to(torch.bfloat16).view(total, PAGE, DIM)
    else:
        kernel_cache = latent.view(total, PAGE, DIM)
        peer_cache = kernel_cache
    return lengths, table.to(dev), q, kernel_cache, peer_cache


def torch_absorbed(q, cache, table, lengths_dev, max_len, scale):
    batch, s_q, h_q, _ = q.shape
    keys = cache[table.long()].view(batch, -1, DIM)[:, :max_len]   # gather the pages: [b, L, 576]
    scores = torch.bmm(q.view(batch, s_q * h_q, DIM), keys.transpose(1, 2)).float() * scale
    pos = torch.arange(max_len, device=q.device)
    row_i = torch.arange(s_q * h_q, device=q.device) // h_q
    visible = pos[None, None, :] <= (lengths_dev[:, None, None] - s_q + row_i[None, :, None])
    scores.masked_fill_(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.bmm(torch.softmax(scores, dim=-1).to(torch.bfloat16), keys[..., :KV_LORA])
    return out.view(batch, s_q, h_q, KV_LORA), lse


def time_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="path of libmla_decode_capi.so")
    ap.add_argument("--quick", action="store_true", help="mean 4096, fixed lengths only")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    lib = load_lib(args.lib)
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(1234)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'cache':5} {'batch':>5} {'s_q':>3} {'h_q':>3} {'mean':>5} {'lens':5} {'us':>9} {'TFLOPS':>7} {'GB/s':>6}"
          f" {'torch us':>9} {'torch/us':>8} {'max|diff|':>9}")
    scale = 1.0 / math.sqrt(192.0)
    ratios = []
    for fp8 in (False, True):
        for mean in (4096, 8192):
            for varlen in (False, True):
                for s_q in (1, 2):
                    for h_q in (16, 32, 64, 128):
                        if args.quick and (mean != 4096 or varlen):
                            continue
                        batch = 128
                        lengths, table, q, kcache, pcache = make_inputs(batch, s_q, h_q, mean, varlen, fp8, gen)
                        lengths_host = lengths.contiguous()
                        plan = lib.mla_decode_plan(ctypes.c_void_p(lengths_host.data_ptr()), batch, s_q, h_q)
                        if not plan:
                            sys.exit("plan failed: " + lib.mla_decode_error().decode())
                        out = torch.empty(batch, s_q, h_q, KV_LORA, device="cuda", dtype=torch.bfloat16)
                        lse = torch.empty(batch, h_q, s_q, device="cuda", dtype=torch.float32)
                        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

                        def ours():
                            rc = lib.mla_decode_run(plan, q.data_ptr(), kcache.data_ptr(), int(fp8), PAGE,
                                                    table.data_ptr(), table.shape[1], scale, out.data_ptr(),
                                                    lse.data_ptr(), stream)
                            if rc:
                                sys.exit("run failed: " + lib.mla_decode_error().decode())

                        lengths_dev = lengths.cuda()
                        max_len = int(lengths.max())
                        ms = time_ms(ours, args.iters)
                        ref_out, _ = torch_absorbed(q, pcache, table, lengths_dev, max_len, scale)
                        diff = (out.float() - ref_out.float()).abs().max().item()
                        peer_ms = time_ms(lambda: torch_absorbed(q, pcache, table, lengths_dev, max_len, scale),
                                          max(3, args.iters // 4))
                        lib.mla_decode_free(plan)
                        tokens = int(lengths.sum())
                        flops = 2.0 * s_q * tokens * h_q * (DIM + KV_LORA)
                        row_bytes = FP8_ROW if fp8 else DIM * 2
                        nbytes = tokens * row_bytes + batch * s_q * h_q * (DIM + KV_LORA) * 2
                        sec = ms / 1e3
                        ratios.append(peer_ms / ms)
                        print(f"{'fp8' if fp8 else 'bf16':5} {batch:5} {s_q:3} {h_q:3} {mean:5} "
                              f"{'var' if varlen else 'fixed':5} {ms * 1e3:9.1f} {flops / sec / 1e12:7.1f} "
                              f"{nbytes / sec / 1e9:6.0f} {peer_ms * 1e3:9.1f} {peer_ms / ms:8.2f} {diff:9.2e}",
                              flush=True)
                        del q, kcache, pcache, out, lse, ref_out
                        torch.cuda.empty_cache()
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean of torch/kernel time: {geo:.2f}")


if __name__ == "__main__":
    main()
