#!/usr/bin/env python3
"""Does, step by step, what a vLLM engine does while it starts, and prints one
line per step ("STEP name ok|FAIL seconds detail"): interface discovery,
psutil, a CUDA matmul, CPU kernels, a CUDA graph, a Triton kernel,
torch.compile (with its compile workers), numba, /dev/shm, a spawned child
that uses CUDA, and NCCL plus Gloo (one rank). Needs python3 with PyTorch
(CUDA), Triton, numba and psutil. Usage: probe.py PORT (a free loopback port
for torch.distributed)."""
import socket
import sys
import time


def step(name, fn):
    start = time.time()
    try:
        detail = str(fn())[:160]
        verdict = "ok"
    except BaseException as e:  # a step's failure is its result
        detail = f"{type(e).__name__}: {str(e)[:600]!r}"
        verdict = "FAIL"
    print(f"STEP {name} {verdict} {time.time() - start:.1f}s {detail}", flush=True)


def interfaces():
    return [name for _, name in socket.if_nameindex()]


def psutil_interfaces():
    import psutil
    return sorted(psutil.net_if_addrs())


def psutil_memory():
    import psutil
    return psutil.virtual_memory().total


def cuda_matmul():
    import torch
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    return float((x @ x).float().sum().item())


def cpu_kernels():
    import torch
    a = torch.randn(256, 256)
    conv = torch.nn.functional.conv2d(torch.randn(1, 3, 64, 64), torch.randn(8, 3, 3, 3))
    return (a @ a).sum().item(), conv.sum().item()


def cuda_graph():
    import torch
    x = torch.zeros(1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2 + 1  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2 + 1
    x.fill_(3)
    graph.replay()
    torch.cuda.synchronize()
    return y[0].item()


def triton_kernel():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    x = torch.ones(4096, device="cuda")
    out = torch.empty_like(x)
    add[(4,)](x, x, out, 4096, BLOCK=1024)
    torch.cuda.synchronize()
    return out.sum().item()


def compiled():
    import torch
    f = torch.compile(lambda a: torch.sin(a) * 2 + torch.cos(a))
    return f(torch.randn(4096, device="cuda")).sum().item()


def numba_jit():
    from numba import njit

    @njit
    def total(n):
        t = 0
        for i in range(n):
            t += i
        return t
    return total(1000)


def dev_shm():
    from multiprocessing import shared_memory
    m = shared_memory.SharedMemory(create=True, size=64 << 20)
    m.buf[0] = 7
    value = m.buf[0]
    m.close()
    m.unlink()
    return value


def child(queue):
    import torch
    queue.put(float(torch.ones(8, device="cuda").sum().item()))


def spawned_cuda_child():
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    proc.join(180)
    return queue.get(timeout=5), proc.exitcode


def nccl_and_gloo(port):
    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    gloo = dist.new_group(backend="gloo")
    c = torch.ones(4)
    dist.all_reduce(c, group=gloo)
    dist.destroy_process_group()
    return t.sum().item(), c.sum().item()


if __name__ == "__main__":
    port = int(sys.argv[1])
    step("if_nameindex", interfaces)
    step("psutil_net_if_addrs", psutil_interfaces)
    step("psutil_virtual_memory", psutil_memory)
    step("cuda_matmul", cuda_matmul)
    step("cpu_matmul_conv", cpu_kernels)
    step("cuda_graph", cuda_graph)
    step("triton_jit", triton_kernel)
    step("torch_compile", compiled)
    step("numba_njit", numba_jit)
    step("dev_shm", dev_shm)
    step("spawn_cuda_child", spawned_cuda_child)
    step("nccl_gloo", lambda: nccl_and_gloo(port))
    print("DONE", flush=True)
