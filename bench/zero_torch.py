#!/usr/bin/python3
"""PyTorch's side of bench/zero.py: DDP (and FSDP where it runs) on the CPU with gloo.

    /usr/bin/python3 bench/zero_torch.py --mode ddp|fsdp --np 2 --steps 8 --layers 8
        --d-model 512 --vocab 16384 --seq 128 --batch 4

Debian's python3-torch (1.13, CPU). The model is GPT-2 as weft trains it (llm.c's
layout: tied wte, wpe, pre-norm blocks of qkv, attention projection, 4C MLP with GELU
(tanh), final layernorm), the same sizes, AdamW, one thread per rank, the global batch
split over the ranks as weft splits it. Prints one JSON line from rank 0: the median
step time over the steps after the first, the last loss, and rank 0's memory by kind
(parameters, gradients, AdamW state: the bytes of the tensors each holds; DDP's bucket
buffers are views of the gradients since gradient_as_bucket_view=True). Torch exposes
no measure of the communication backward did not hide, so there is no comm_ms. On
failure rank 0 prints {"error": "..."}: Debian 12's torch 1.13 cannot even import its
FSDP under Python 3.11 (a dataclass with a mutable default in torch.distributed._shard),
so only DDP runs here.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import GPT  # noqa: E402  (GPT-2 as weft defines it)
from zero import run_args  # noqa: E402  (bench/zero.py: the shared run arguments)


def tensor_bytes(ts):
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def worker(rank, a, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.np)
    out = None
    try:
        out = train(rank, a)
    except Exception as e:  # FSDP on a CPU-only 1.13, for one: say so, do not hang
        out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    if rank == 0:
        print(json.dumps(out), flush=True)
    os._exit(0)  # a failed collective may leave gloo threads that would block exit


def train(rank, a):
    torch.manual_seed(1234)
    model = GPT(a.layers, 8, a.d_model, a.seq, a.vocab)
    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, gradient_as_bucket_view=True)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
    g = torch.Generator().manual_seed(rank)
    B = a.batch // a.np
    times, loss = [], None
    for _ in range(a.steps):
        idx = torch.randint(0, a.vocab, (B, a.seq), generator=g)
        tgt = torch.randint(0, a.vocab, (B, a.seq), generator=g)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    params = list(model.parameters())
    optim = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"mode": a.mode, "step_ms": statistics.median(times[1:]), "loss": loss.item(),
            "param_bytes": tensor_bytes(params),
            "grad_bytes": tensor_bytes(p.grad for p in params),
            "optim_bytes": tensor_bytes(v for v in optim if v.numel() > 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("ddp", "fsdp"), default="ddp")
    run_args(ap)
    ap.add_argument("--port", type=int, default=29791)
    a = ap.parse_args()
    mp.start_processes(worker, args=(a, a.port), nprocs=a.np, start_method="fork")


if __name__ == "__main__":
    sys.exit(main())
