"""PyTorch's side of the GPU training benchmark: the networks of bench/cuda_training_models.py
trained on the GPU with torch.optim.AdamW (fused), eager and torch.compile'd, bf16 autocast for
GPT-2 as onnxtrain's bf16 artifacts; one line per model and mode in bench/cuda_training.cc's
format, for ratios measured in the same run on the same card (scripts/gpu_check.sh
--training-bench). Median step of STEPS after 3 warm-ups (torch.compile's compilation in them).

    python3 bench/cuda_training_torch.py [--steps 5] [--no-compile]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_training_models as spec_models  # noqa: E402


def time_steps(model, x, target, lr, bf16, steps):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    times, loss = [], None
    for s in range(steps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if s >= 3:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3, float(loss)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as onnxtrain computes it (no TF32)
    torch.backends.cudnn.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__})", flush=True)
    for spec in spec_models.SPECS:
        torch.manual_seed(0)
        model, x, target = spec_models.build(spec.name, torch.Generator().manual_seed(0))
        model, x, target = model.cuda(), x.cuda(), target.cuda()
        modes = [("eager", model)] if args.no_compile else [("eager", model), ("compile", torch.compile(model))]
        for mode, m in modes:
            try:
                ms, loss = time_steps(m, x, target, spec.lr, spec.mixed_precision == "bf16", args.steps)
                print(f"{spec.name:<9} torch-{mode:<7}step {ms:9.2f} ms  {target.numel() / (ms / 1e3):10.1f} examples/s  "
                      f"(loss {loss:.4f}, median of {args.steps})", flush=True)
            except Exception as e:  # one model's failure must not hide the others' figures
                print(f"{spec.name:<9} torch-{mode:<7}failed: {type(e).__name__}: {e}", flush=True)
        del model, modes
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
