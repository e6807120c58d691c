#!/usr/bin/env python3
"""The scaling model of docs/DISTRIBUTED.md: predicted data-parallel efficiency from a measured
compute time and the ring-allreduce cost model

    T_allreduce(N, M, k buckets) = 2 (N-1) k alpha + 2 (N-1)/N x M / beta

(each of the k bucket allreduces pays 2(N-1) latency steps; every rank sends and receives
2(N-1)/N of the bytes). Efficiency of a step of compute time T_c (weak scaling: fixed batch per
rank):

    no overlap:               E = T_c / (T_c + T_allreduce)
    overlap with the backward: E = T_c / (T_c + max(T_allreduce - h min(T_allreduce, f_b T_c), T_last bucket))

where f_b = 2/3 is the backward's share of the step (buckets reduce while earlier layers still
differentiate; the last bucket cannot hide) and h the fraction of the overlappable allreduce that
overlap actually hides: 1 when communication has a core (or a NIC's offload) of its own, measured
on this machine as h = (step reduced after the backward - step overlapped) / allreduce, which is
negative when the communication thread slows the compute down.

    /usr/bin/python3 bench/distributed_scaling_model.py [--measured bench_distributed.json]

With --measured (the `json` line bench_distributed.py prints) the encoder's compute time is
T_c = (2 ranks x 1 thread step) - (its allreduce), and h is taken from its 4 MB-bucket overlap
run; otherwise the figures below are used.
"""
from __future__ import annotations

import argparse
import json
import math

NETWORKS = {
    # name: (alpha seconds per latency step, beta bytes/second per link)
    "100 Gb/s (InfiniBand/RoCE, 5 us)": (5e-6, 12.0e9),
    "25 Gb/s Ethernet (TCP, 30 us)": (30e-6, 3.0e9),
}
RANKS = (8, 64, 512)
BACKWARD_SHARE = 2.0 / 3.0


def allreduce_s(n: int, nbytes: float, buckets: int, alpha: float, beta: float) -> float:
    return 2 * (n - 1) * buckets * alpha + 2 * (n - 1) / n * nbytes / beta


def efficiency(tc: float, n: int, nbytes: float, bucket_bytes: float, alpha: float, beta: float, overlap: bool,
               hidden: float = 1.0):
    k = max(1, math.ceil(nbytes / bucket_bytes))
    t = allreduce_s(n, nbytes, k, alpha, beta)
    if not overlap:
        return tc / (tc + t)
    last = allreduce_s(n, min(nbytes, bucket_bytes), 1, alpha, beta)
    return tc / (tc + max(t - hidden * min(t, BACKWARD_SHARE * tc), last))


def table(name: str, params: float, tc: float, tensors: int, measured_hidden: float) -> str:
    nbytes = 4.0 * params
    rows = [f"**{name}**: {params / 1e6:,.1f} M parameters, {nbytes / 1e6:,.1f} MB of fp32 gradients, "
            f"compute {tc * 1e3:,.1f} ms per step per rank, {tensors} gradient tensors", "",
            "| network | scheme | " + " | ".join(f"{n} ranks" for n in RANKS) + " |",
            "|---|---|" + "---|" * len(RANKS)]
    schemes = [("one call per tensor, no overlap", nbytes / tensors, False, 1.0),
               ("25 MB buckets, no overlap", 25 * 2**20, False, 1.0),
               ("25 MB buckets, overlapped, a core for communication (h = 1)", 25 * 2**20, True, 1.0),
               ("4 MB buckets, overlapped, a core for communication (h = 1)", 4 * 2**20, True, 1.0),
               (f"4 MB buckets, overlapped as measured on 2 shared cores (h = {measured_hidden:.2f})", 4 * 2**20, True,
                measured_hidden)]
    for net, (alpha, beta) in NETWORKS.items():
        for label, bucket, overlap, hidden in schemes:
            cells = [f"{100 * efficiency(tc, n, nbytes, bucket, alpha, beta, overlap, hidden):.1f}%" for n in RANKS]
            rows.append(f"| {net} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measured", help="the json printed by bench_distributed.py (a file)")
    p.add_argument("--encoder-compute-ms", type=float, default=166.0)
    p.add_argument("--hidden", type=float, default=1.0, help="h: the fraction of the allreduce overlap hides")
    a = p.parse_args(argv)
    params, tc, hidden = 5_289_986, a.encoder_compute_ms / 1e3, a.hidden
    if a.measured:
        with open(a.measured) as f:
            m = json.load(f)
        params, tc = m["params"], m["step_2x1_s"] - m["allreduce_s"]
        o = m["overlap"]["4.0"]
        hidden = (o["step_blocking_s"] - o["step_overlap_s"]) / m["allreduce_4mb_s"]
    print(table("BERT-style encoder (batch 4 x seq 128 per rank, 1 CPU thread)", params, tc, 70, hidden))
    print()
    # 1B parameters (24 layers of about 16 tensors each: ~400 tensors), 8 x 512 tokens per rank:
    # 6 x P x tokens FLOP per step.
    flops = 6 * 1e9 * 8 * 512
    print(table("1B-parameter model on a CPU rank (100 GFLOP/s achieved)", 1e9, flops / 100e9, 400, hidden))
    print()
    print(table("1B-parameter model on a GPU-class rank (100 TFLOP/s achieved)", 1e9, flops / 100e12, 400, hidden))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
