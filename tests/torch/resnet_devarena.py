#!/usr/bin/env python3
"""ResNet-18 training steps on devarena's pool, through PyTorch's pluggable allocator.

    python3 tests/torch/resnet_devarena.py path/to/libtorch_allocator.so [--steps 5] [--batch 32]

The shared library is `cargo build --release -p devarena --features cuda --example
torch_allocator` (target/release/examples/libtorch_allocator.so). Each case runs in a fresh
process, because the library reads DEVARENA_POOL_BYTES once per process:

  native-a, native-b  torchvision resnet18(weights=None), seeded, forward + backward + SGD step
                      for --steps steps under PyTorch's own caching allocator (twice: the
                      second run measures PyTorch's own run-to-run spread, which must be 0 for
                      a bitwise comparison to mean anything).
  devarena            the same under torch.cuda.MemPool(CUDAPluggableAllocator(lib)) and
                      torch.cuda.use_mem_pool(pool), with a pool of --pool-bytes.
  devarena-oom        the same with a pool of --oom-bytes (below the model's need): must raise
                      torch.OutOfMemoryError, which the child catches; the process must not
                      crash, and the pool must serve allocations afterwards.

Checks (one PASS/FAIL line each; exit status 1 on any FAIL):
  * the devarena losses equal the native ones. Both sides run the same kernels on the same
    data in the same order (cudnn.deterministic, no cudnn.benchmark, deterministic algorithms,
    CUBLAS_WORKSPACE_CONFIG=:4096:8, TF32 off), and an allocator only decides where tensors
    live, so the losses are expected to be bitwise equal. If PyTorch's two native runs differ
    from each other, bitwise equality cannot hold for reasons outside the allocator; the
    tolerance is then 10x that native spread, and the line says so.
  * the parameters after the last step are bitwise equal (sha256 of their bytes).
  * parameters, gradients and SGD momentum buffers lie inside the pool's region.
  * the pool's counters: allocations made, none failed, peak within the capacity.
  * the small cap raises torch.OutOfMemoryError (not a crash), the pool counted the failure,
    and a later allocation from the pool still works.

use_mem_pool routes the allocations of the calling thread only; PyTorch runs backward on an
autograd worker thread. When torch._C._cuda_beginAllocateToPool exists (it does in 2.8 … 2.11),
the devarena case also routes every thread's allocations on the device to the pool for the
duration of the run, so backward's gradients and temporaries come from devarena too; the
output says which routing was used.

Without a CUDA device (or without torch) it prints `skipped: no CUDA device` and exits 0,
unless DEVARENA_REQUIRE_GPU=1, where it fails.
"""

import argparse
import contextlib
import ctypes
import gc
import hashlib
import json
import os
import subprocess
import sys

RESULT_TAG = "RESULT "


# ---------------------------------------------------------------------------------------------
# The child: one training run in this process.


class Stats(ctypes.Structure):
    """devarena_torch_stats' struct (repr(C), ten u64)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "base",
            "capacity",
            "in_use",
            "peak",
            "allocations",
            "frees",
            "failures",
            "live",
            "largest_free",
            "pending",
        )
    ]


def pool_stats(lib, device):
    out = Stats()
    rc = lib.devarena_torch_stats(ctypes.c_int(device), ctypes.byref(out))
    if rc != 0:
        return None
    return {name: int(getattr(out, name)) for name, _ in Stats._fields_}


@contextlib.contextmanager
def all_threads_to_pool(torch, pool, device):
    """Makes backward allocate from `pool` too. `use_mem_pool` routes the calling thread only,
    and autograd runs a CUDA backward on a worker thread of its own; with multithreading off,
    backward runs on the calling thread, inside `use_mem_pool`. Yields whether it could."""
    off = getattr(torch.autograd, "set_multithreading_enabled", None)
    if off is None:
        yield False
        return
    with off(False):
        yield True


def train(torch, torchvision, device, steps, batch, phase):
    """Seeded resnet18 training steps; returns (model, optimizer, losses)."""
    import torch.nn.functional as F

    phase[0] = "building the model"
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    gen = torch.Generator().manual_seed(1234)
    x_cpu = torch.randn(batch, 3, 224, 224, generator=gen)
    y_cpu = torch.randint(0, 1000, (batch,), generator=gen)
    phase[0] = "moving the model to the device"
    model = model.to(device)
    x = x_cpu.to(device)
    y = y_cpu.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        phase[0] = f"forward, step {step}"
        loss = F.cross_entropy(model(x), y)
        phase[0] = f"backward, step {step}"
        loss.backward()
        phase[0] = f"optimizer, step {step}"
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return model, opt, losses


def param_digest(torch, model):
    """sha256 over every parameter's bytes (bitwise identity of the trained weights)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        words = p.detach().contiguous().view(-1).view(torch.int32).cpu()
        try:
            h.update(words.numpy().tobytes())
        except (RuntimeError, TypeError):  # no numpy: the words as text (slower, same identity)
            h.update(repr(words.tolist()).encode())
    return h.hexdigest()


def child(args):
    import torch
    import torchvision

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    result = {"case": args.child, "torch": torch.__version__, "device": torch.cuda.get_device_name(device)}
    phase = ["start"]

    if args.child == "native":
        model, opt, losses = train(torch, torchvision, device, args.steps, args.batch, phase)
        result["losses"] = losses
        result["digest"] = param_digest(torch, model)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0

    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        args.lib, "devarena_torch_alloc", "devarena_torch_free"
    )
    pool = torch.cuda.MemPool(allocator.allocator())
    lib = ctypes.CDLL(args.lib)  # the same handle PyTorch opened: the same pools
    lib.devarena_torch_stats.restype = ctypes.c_int
    lib.devarena_torch_report.restype = ctypes.c_int64

    if args.child == "devarena":
        with torch.cuda.use_mem_pool(pool), all_threads_to_pool(torch, pool, args.device) as routed:
            model, opt, losses = train(torch, torchvision, device, args.steps, args.batch, phase)
        stats = pool_stats(lib, args.device)
        result["routed_backward"] = routed
        result["losses"] = losses
        result["digest"] = param_digest(torch, model)
        result["stats"] = stats
        if stats is not None:
            lo, hi = stats["base"], stats["base"] + stats["capacity"]
            inside = lambda t: t is not None and lo <= t.data_ptr() < hi  # noqa: E731
            params = list(model.parameters())
            result["params"] = [sum(inside(p) for p in params), len(params)]
            result["grads"] = [sum(inside(p.grad) for p in params), len(params)]
            bufs = [opt.state[p].get("momentum_buffer") for p in params]
            result["momentum"] = [sum(inside(b) for b in bufs), len(bufs)]
        print("devarena's live allocations after training: the segments PyTorch's caching allocator "
              "keeps for the MemPool (and any workspace it made there)", file=sys.stderr, flush=True)
        lib.devarena_torch_report(ctypes.c_int(args.device))
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0

    # devarena-oom
    result["oom"] = False
    try:
        with torch.cuda.use_mem_pool(pool), all_threads_to_pool(torch, pool, args.device) as routed:
            train(torch, torchvision, device, args.steps, args.batch, phase)
    except torch.OutOfMemoryError as e:
        result["oom"] = True
        result["phase"] = phase[0]
        result["message"] = str(e).strip().splitlines()[0][:400]
    gc.collect()
    torch.cuda.synchronize()
    result["stats_after_oom"] = pool_stats(lib, args.device)
    # The pool still works: a small tensor from it, filled and summed on the device.
    with torch.cuda.use_mem_pool(pool):
        t = torch.ones(4096, device=device)
        result["after_oom_sum"] = t.sum().item()
        stats = pool_stats(lib, args.device)
        result["after_oom_inside"] = (
            stats is not None and stats["base"] <= t.data_ptr() < stats["base"] + stats["capacity"]
        )
    del t
    print("devarena's pool after the out-of-memory error:", file=sys.stderr, flush=True)
    lib.devarena_torch_report(ctypes.c_int(args.device))
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: runs the cases and checks them.


def skip_or_fail(why):
    if os.environ.get("DEVARENA_REQUIRE_GPU") == "1":
        print(f"FAIL DEVARENA_REQUIRE_GPU=1 but no CUDA device is usable: {why}")
        return 1
    print(f"skipped: no CUDA device ({why})")
    return 0


def run_case(args, case, child_mode, pool_bytes=None):
    env = dict(os.environ)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONHASHSEED"] = "0"
    env["DEVARENA_VERBOSE"] = "1"
    env.pop("DEVARENA_POOL_BYTES", None)
    # Same caching-allocator settings in every case (expandable segments cannot serve a MemPool).
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    if pool_bytes is not None:
        env["DEVARENA_POOL_BYTES"] = pool_bytes
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        args.lib,
        "--child",
        child_mode,
        "--steps",
        str(args.steps),
        "--batch",
        str(args.batch),
        "--device",
        str(args.device),
    ]
    print(f"--- {case}: {' '.join(cmd[1:])}" + (f" (DEVARENA_POOL_BYTES={pool_bytes})" if pool_bytes else ""))
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"    [{case}] timed out after {args.timeout} s")
        return None, f"timed out after {args.timeout} s"
    for line in proc.stderr.splitlines():
        print(f"    [{case}] {line}")
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
        else:
            print(f"    [{case}] {line}")
    if proc.returncode != 0:
        return None, f"exit status {proc.returncode}" + (" (killed by a signal)" if proc.returncode < 0 else "")
    if result is None:
        return None, "no RESULT line"
    return result, None


def parent(args):
    if not os.path.isfile(args.lib):
        print(f"FAIL the allocator library {args.lib} does not exist (build it with `cargo build "
              "--release -p devarena --features cuda --example torch_allocator`)")
        return 1
    try:
        import torch
    except ImportError as e:
        return skip_or_fail(f"torch is not importable: {e}")
    if not torch.cuda.is_available() or torch.cuda.device_count() <= args.device:
        return skip_or_fail("torch.cuda.is_available() is False or the device is missing")
    print(f"resnet18 on devarena's pool: {args.steps} steps, batch {args.batch}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(args.device)}")

    failures = []

    def check(ok, line):
        print(("PASS " if ok else "FAIL ") + line)
        if not ok:
            failures.append(line)

    native_a, err_a = run_case(args, "native-a", "native")
    native_b, err_b = run_case(args, "native-b", "native")
    dev, err_d = run_case(args, "devarena", "devarena", args.pool_bytes)
    oom, err_o = run_case(args, "devarena-oom", "devarena-oom", args.oom_bytes)
    print()

    for name, err in (("native-a", err_a), ("native-b", err_b), ("devarena", err_d), ("devarena-oom", err_o)):
        check(err is None, f"{name} ran to completion" + (f" ({err})" if err else ""))

    if native_a and native_b and dev:
        la, lb, ld = native_a["losses"], native_b["losses"], dev["losses"]
        print(f"{'step':>4}  {'native-a':>22}  {'native-b':>22}  {'devarena':>22}  {'|devarena - native-a|':>22}")
        for i, (a, b, d) in enumerate(zip(la, lb, ld)):
            print(f"{i:>4}  {a!r:>22}  {b!r:>22}  {d!r:>22}  {abs(d - a):>22.3e}")
        spread = max(abs(a - b) for a, b in zip(la, lb))
        diff = max(abs(a - d) for a, d in zip(la, ld))
        print(f"max |native-a - native-b| = {spread!r}; max |devarena - native-a| = {diff!r}")
        same_len = len(la) == len(ld) == args.steps
        if spread == 0.0:
            check(same_len and ld == la, f"losses under devarena equal PyTorch's allocator bitwise over {len(ld)} steps "
                                         f"(max abs difference {diff!r})")
            check(dev["digest"] == native_a["digest"],
                  f"parameters after {args.steps} steps are bitwise equal (sha256 {dev['digest'][:16]}…)")
        else:
            tol = 10 * spread
            check(same_len and diff <= tol,
                  f"losses under devarena within {tol:.3e} of PyTorch's allocator (max abs difference {diff!r}); "
                  f"exact equality cannot hold: PyTorch's own two runs differ by {spread!r}")
        routed = dev.get("routed_backward")
        how = (" + backward on the calling thread (autograd multithreading off)" if routed
               else " only: backward temporaries and gradients used PyTorch's own allocator")
        print(f"routing: use_mem_pool (main thread){how}")
        st = dev.get("stats")
        check(st is not None, "the devarena run created a pool on the device")
        if st:
            gib = lambda b: b / (1 << 30)  # noqa: E731
            print(f"pool: base {st['base']:#x}, capacity {gib(st['capacity']):.2f} GiB, peak {gib(st['peak']):.3f} GiB, "
                  f"{st['allocations']} allocations, {st['frees']} frees, {st['failures']} failures, {st['live']} live")
            check(st["allocations"] > 0 and st["failures"] == 0 and 0 < st["peak"] <= st["capacity"],
                  "pool counters: allocations made, none failed, peak within the capacity")
            p, g, m = dev["params"], dev["grads"], dev["momentum"]
            check(p[0] == p[1] and m[0] == m[1], f"parameters ({p[0]}/{p[1]}) and momentum buffers ({m[0]}/{m[1]}) "
                                               "lie inside devarena's region")
            if routed:
                check(g[0] == g[1], f"gradients ({g[0]}/{g[1]}) lie inside devarena's region")
            else:
                print(f"note gradients inside devarena's region: {g[0]}/{g[1]} (backward not routed)")

    if oom:
        check(oom["oom"], f"a pool of {args.oom_bytes} raises torch.OutOfMemoryError"
                          + (f" during {oom.get('phase')}: {oom.get('message')}" if oom["oom"] else " (it did not)"))
        st = oom.get("stats_after_oom")
        check(st is not None and st["failures"] > 0,
              "the pool counted the failed allocation" + (f" ({st['failures']} failures, capacity {st['capacity']} bytes)" if st else ""))
        check(oom.get("after_oom_sum") == 4096.0 and oom.get("after_oom_inside"),
              "after the out-of-memory error the pool still serves a tensor (sum of 4096 ones = "
              f"{oom.get('after_oom_sum')}, inside the region: {oom.get('after_oom_inside')})")

    print()
    if failures:
        print(f"RESULT: FAIL ({len(failures)} failed)")
        return 1
    print("RESULT: PASS")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib", help="path to libtorch_allocator.so")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--pool-bytes", default="8G", help="DEVARENA_POOL_BYTES of the devarena case")
    ap.add_argument("--oom-bytes", default="64M", help="DEVARENA_POOL_BYTES of the out-of-memory case")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per case")
    ap.add_argument("--child", choices=["native", "devarena", "devarena-oom"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lib = os.path.abspath(args.lib)
    if args.child:
        return child(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
