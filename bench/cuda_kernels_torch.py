"""PyTorch on the shapes of bench/cuda_kernels.cc, same lines and units, for ratios measured in the
same run on the same card (scripts/gpu_check.sh). Median of 20 timed calls after 3 warm-ups,
timed with CUDA events; inputs random.   python3 bench/cuda_kernels_torch.py"""
import torch


def median_ms(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def report(name, ms, work, unit):
    """work: FLOPs (unit TFLOP/s) or bytes (unit GB/s)."""
    per_second = work / (ms * 1e-3)
    print(f"{name:<34} {ms:9.3f} ms  {per_second / (1e12 if unit[0] == 'T' else 1e9):9.1f} {unit}")


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__})")
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    report(f"gemm bf16 {n}^3", median_ms(lambda: a @ b), 2.0 * n**3, "TFLOP/s")
    a32, b32 = (torch.randn(4096, 4096, device="cuda") for _ in range(2))
    report("gemm fp32 4096^3 (no TF32)", median_ms(lambda: a32 @ b32), 2.0 * 4096**3, "TFLOP/s")
    elems = 256 << 20
    x, y = torch.randn(elems, device="cuda"), torch.empty(elems, device="cuda")
    report("copy d2d fp32", median_ms(lambda: y.copy_(x)), 2.0 * x.nbytes, "GB/s")
    report("add fp32 (same shapes)", median_ms(lambda: torch.add(x, y)), 3.0 * x.nbytes, "GB/s")
    row = torch.randn(1024, device="cuda")
    m2 = x.view(-1, 1024)
    report("add fp32 (bias row broadcast)", median_ms(lambda: m2 + row), 2.0 * x.nbytes, "GB/s")
    for dt, tag in ((torch.float32, " fp32"), (torch.bfloat16, " bf16")):
        rows = 16384
        h = torch.randn(rows, 768, device="cuda", dtype=dt, requires_grad=True)
        w = torch.randn(768, device="cuda", dtype=dt, requires_grad=True)
        bias = torch.randn(768, device="cuda", dtype=dt, requires_grad=True)
        ln = lambda: torch.nn.functional.layer_norm(h, (768,), w, bias)
        with torch.no_grad():
            report("layernorm fwd [16384, 768]" + tag, median_ms(ln), 2.0 * h.nbytes, "GB/s")
        out = ln()
        g = torch.randn_like(out)
        report("layernorm bwd [16384, 768]" + tag,
               median_ms(lambda: torch.autograd.grad(out, (h, w, bias), g, retain_graph=True)), 3.0 * h.nbytes, "GB/s")
        tokens = 4096
        logits = torch.randn(tokens, 50257, device="cuda", dtype=dt)
        report("softmax [4096, 50257]" + tag, median_ms(lambda: torch.softmax(logits, -1)), 2.0 * logits.nbytes, "GB/s")
    for dt, tag in ((torch.float32, " fp32"), (torch.bfloat16, " bf16")):
        x = torch.randn(32, 512, 12, 64, device="cuda", dtype=dt)
        report("transpose [32,512,12,64] 0213" + tag, median_ms(lambda: x.permute(0, 2, 1, 3).contiguous()),
               2.0 * x.nbytes, "GB/s")
        y = x.permute(0, 2, 1, 3).contiguous()
        report("transpose [32,12,512,64] 0132" + tag, median_ms(lambda: y.permute(0, 1, 3, 2).contiguous()),
               2.0 * y.nbytes, "GB/s")
        vocab, d, tokens = 30522, 768, 16384
        table = torch.randn(vocab, d, device="cuda", dtype=dt)
        ids = torch.randint(0, vocab, (tokens,), device="cuda")
        ids[torch.rand(tokens, device="cuda") < 0.25] = 0  # a quarter padding
        rows = table.index_select(0, ids)
        report("gather [30522,768] x 16384" + tag, median_ms(lambda: table.index_select(0, ids)), 2.0 * rows.nbytes,
               "GB/s")
        report("gather grad [30522,768] x 16384" + tag,
               median_ms(lambda: torch.ops.aten.embedding_dense_backward(rows, ids, vocab, -1, False)),
               rows.nbytes + table.nbytes, "GB/s")


if __name__ == "__main__":
    main()
