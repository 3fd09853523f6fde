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
                      torch.cuda.use_mem_pool(pool), with the library's default pool (growable,
                      capacity: the device's total memory) or one of --pool-bytes, on a region
                      of --region (growable or classic). After the run it gives every tensor
                      back (the MemPool is deleted, PyTorch's cache emptied) and trims the pool.
  devarena-direct     the same with the library as PyTorch's allocator itself
                      (torch.cuda.memory.change_current_allocator): every tensor of every thread
                      comes from the pool and goes back to it when freed, no cache in between.
  devarena-oom        the same with a pool of --oom-bytes (below the model's need): must raise
                      torch.OutOfMemoryError, which the child catches; the process must not
                      crash, and the pool must serve allocations afterwards.

Device memory is measured with cuMemGetInfo (torch.cuda.mem_get_info) in each child, around the
run: every child first runs one training step under PyTorch's own allocator and empties its
cache, so that CUDA modules, cuDNN and cuBLAS handles and workspaces exist before the first
reading, and the readings see the run's memory only.

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
  * footprint (growable region), for both devarena cases: the device memory the pool holds
    after the run, per cuMemGetInfo, is at most 1.1 x the pool's peak bytes in use + one chunk,
    and so is the pool's own peak of mapped bytes; every allocation of the run comes back; and
    then trim() returns the device to within one chunk of its free memory before the run
    (before the pool existed, in the MemPool case).
  * devarena-direct holds less device memory than PyTorch's own allocator in native-a (both
    measured the same way). Under a MemPool, PyTorch's caching allocator decides the segments
    and the pool holds them, so that case is reported beside it, not checked against it.

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
            "mapped",
            "peak_mapped",
            "chunk",
            "maps",
            "unmaps",
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


def warm_up(torch, torchvision, device, batch, single_thread):
    """One training step, then everything it made given back: CUDA modules, cuDNN and cuBLAS
    handles and workspaces exist before anything is measured. `single_thread` runs backward on
    the calling thread, as the MemPool case does (its cuBLAS handle and workspace are then the
    calling thread's)."""
    off = getattr(torch.autograd, "set_multithreading_enabled", None)
    ctx = off(False) if (single_thread and off is not None) else contextlib.nullcontext()
    with ctx:
        model, opt, _ = train(torch, torchvision, device, 1, batch, ["warm-up"])
    del model, opt
    gc.collect()
    torch.cuda.synchronize()
    try:
        torch.cuda.empty_cache()
    except RuntimeError:  # an allocator that keeps no cache
        pass


def free_bytes(torch, device):
    """Free device memory per cuMemGetInfo, once the device is idle."""
    torch.cuda.synchronize(device)
    return torch.cuda.mem_get_info(device)[0]


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


def load_lib(path):
    lib = ctypes.CDLL(path)  # the same handle PyTorch opened: the same pools
    lib.devarena_torch_stats.restype = ctypes.c_int
    lib.devarena_torch_report.restype = ctypes.c_int64
    lib.devarena_torch_trim.restype = ctypes.c_int64
    lib.devarena_torch_trim.argtypes = [ctypes.c_int, ctypes.c_uint64]
    return lib


def where(stats, model, opt, result):
    """How many parameters, gradients and momentum buffers lie inside the pool's region."""
    lo, hi = stats["base"], stats["base"] + stats["capacity"]
    inside = lambda t: t is not None and lo <= t.data_ptr() < hi  # noqa: E731
    params = list(model.parameters())
    bufs = [opt.state[p].get("momentum_buffer") for p in params]
    result["params"] = [sum(inside(p) for p in params), len(params)]
    result["grads"] = [sum(inside(p.grad) for p in params), len(params)]
    result["momentum"] = [sum(inside(b) for b in bufs), len(bufs)]


def trim_and_measure(torch, lib, device, result):
    """Trims the pool (everything given back before) and reads what is left."""
    torch.cuda.synchronize()
    result["stats_released"] = pool_stats(lib, device.index)
    result["trimmed"] = int(lib.devarena_torch_trim(ctypes.c_int(device.index), ctypes.c_uint64(0)))
    result["stats_trimmed"] = pool_stats(lib, device.index)
    result["free_after_trim"] = free_bytes(torch, device)


def child(args):
    import torch
    import torchvision

    allocator = None
    if args.child != "native":
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            args.lib, "devarena_torch_alloc", "devarena_torch_free"
        )
    if args.child == "devarena-direct":
        # First of all: PyTorch swaps its allocator only while nothing has used it.
        torch.cuda.memory.change_current_allocator(allocator)
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
        warm_up(torch, torchvision, device, args.batch, single_thread=False)
        torch.cuda.reset_peak_memory_stats(device)
        result["free_before"] = free_bytes(torch, device)
        # What PyTorch's cache still holds (cuBLAS workspaces): held all along.
        result["held_before"] = torch.cuda.memory_reserved(device)
        model, opt, losses = train(torch, torchvision, device, args.steps, args.batch, phase)
        result["free_after"] = free_bytes(torch, device)
        result["max_reserved"] = torch.cuda.max_memory_reserved(device)
        result["max_allocated"] = torch.cuda.max_memory_allocated(device)
        result["losses"] = losses
        result["digest"] = param_digest(torch, model)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0

    lib = load_lib(args.lib)

    if args.child == "devarena-direct":
        # The pool is PyTorch's allocator: made by the warm-up, which gives everything back but
        # cuBLAS's workspaces; trimmed, it holds their chunks only.
        warm_up(torch, torchvision, device, args.batch, single_thread=False)
        lib.devarena_torch_trim(ctypes.c_int(args.device), ctypes.c_uint64(0))
        before = pool_stats(lib, args.device)
        result["stats_before"] = before
        result["free_before"] = free_bytes(torch, device)
        result["held_before"] = before["mapped"] if before else 0
        model, opt, losses = train(torch, torchvision, device, args.steps, args.batch, phase)
        result["free_after"] = free_bytes(torch, device)
        stats = pool_stats(lib, args.device)
        result["stats"] = stats
        result["losses"] = losses
        result["digest"] = param_digest(torch, model)
        if stats is not None:
            where(stats, model, opt, result)
        del model, opt
        gc.collect()
        trim_and_measure(torch, lib, device, result)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0

    # The MemPool cases. The pool is made at the first allocation routed to it: after this.
    warm_up(torch, torchvision, device, args.batch, single_thread=args.child == "devarena")
    result["free_before"] = free_bytes(torch, device)
    result["held_before"] = 0
    pool = torch.cuda.MemPool(allocator.allocator())

    if args.child == "devarena":
        with torch.cuda.use_mem_pool(pool), all_threads_to_pool(torch, pool, args.device) as routed:
            model, opt, losses = train(torch, torchvision, device, args.steps, args.batch, phase)
        result["free_after"] = free_bytes(torch, device)
        stats = pool_stats(lib, args.device)
        result["routed_backward"] = routed
        result["losses"] = losses
        result["digest"] = param_digest(torch, model)
        result["stats"] = stats
        if stats is not None:
            where(stats, model, opt, result)
        print("devarena's live allocations after training: the segments PyTorch's caching allocator "
              "keeps for the MemPool (and any workspace it made there)", file=sys.stderr, flush=True)
        lib.devarena_torch_report(ctypes.c_int(args.device))
        # Everything back: the tensors, then the MemPool (deleting it empties its part of
        # PyTorch's cache), then PyTorch's cache; then the pool gives its free chunks back.
        del model, opt
        gc.collect()
        torch.cuda.synchronize()
        del pool
        gc.collect()
        torch.cuda.empty_cache()
        trim_and_measure(torch, lib, device, result)
        if result["stats_released"] and result["stats_released"]["live"] > 0:
            print("devarena's live allocations after everything was given back:", file=sys.stderr, flush=True)
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


def run_case(args, case, child_mode, pool_bytes=None, region=None):
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
    env.pop("DEVARENA_REGION", None)
    if region is not None:
        env["DEVARENA_REGION"] = region
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
    settings = [f"{k}={v}" for k, v in (("DEVARENA_POOL_BYTES", pool_bytes), ("DEVARENA_REGION", region)) if v]
    print(f"--- {case}: {' '.join(cmd[1:])}" + (f" ({', '.join(settings)})" if settings else ""))
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
    dev, err_d = run_case(args, "devarena", "devarena", args.pool_bytes, args.region)
    direct, err_x = run_case(args, "devarena-direct", "devarena-direct", args.pool_bytes, args.region)
    oom, err_o = run_case(args, "devarena-oom", "devarena-oom", args.oom_bytes)
    print()

    for name, err in (("native-a", err_a), ("native-b", err_b), ("devarena", err_d),
                      ("devarena-direct", err_x), ("devarena-oom", err_o)):
        check(err is None, f"{name} ran to completion" + (f" ({err})" if err else ""))

    spread = None
    if native_a and native_b:
        la, lb = native_a["losses"], native_b["losses"]
        spread = max(abs(a - b) for a, b in zip(la, lb))
    for name, run in (("devarena", dev), ("devarena-direct", direct)):
        if native_a and native_b and run:
            same_losses(check, name, native_a, native_b, run, spread, args)
    if dev:
        routed = dev.get("routed_backward")
        how = (" + backward on the calling thread (autograd multithreading off)" if routed
               else " only: backward temporaries and gradients used PyTorch's own allocator")
        print(f"routing (devarena): use_mem_pool (main thread){how}")
        placement(check, "devarena", dev, grads=routed)
    if direct:
        print("routing (devarena-direct): the pool is PyTorch's allocator "
              "(torch.cuda.memory.change_current_allocator): every tensor of every thread")
        placement(check, "devarena-direct", direct, grads=True)
    print()
    footprint(check, native_a, dev, direct, args)

    if oom:
        print()
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


def same_losses(check, name, native_a, native_b, run, spread, args):
    """The losses and the trained parameters of `run` against PyTorch's own allocator."""
    la, lb, ld = native_a["losses"], native_b["losses"], run["losses"]
    print(f"{'step':>4}  {'native-a':>22}  {'native-b':>22}  {name:>22}  {'|' + name + ' - native-a|':>26}")
    for i, (a, b, d) in enumerate(zip(la, lb, ld)):
        print(f"{i:>4}  {a!r:>22}  {b!r:>22}  {d!r:>22}  {abs(d - a):>26.3e}")
    diff = max(abs(a - d) for a, d in zip(la, ld))
    print(f"max |native-a - native-b| = {spread!r}; max |{name} - native-a| = {diff!r}")
    same_len = len(la) == len(ld) == args.steps
    if spread == 0.0:
        check(same_len and ld == la, f"losses under {name} equal PyTorch's allocator bitwise over {len(ld)} steps "
                                     f"(max abs difference {diff!r})")
        check(run["digest"] == native_a["digest"],
              f"{name}: parameters after {args.steps} steps are bitwise equal (sha256 {run['digest'][:16]}…)")
    else:
        tol = 10 * spread
        check(same_len and diff <= tol,
              f"losses under {name} within {tol:.3e} of PyTorch's allocator (max abs difference {diff!r}); "
              f"exact equality cannot hold: PyTorch's own two runs differ by {spread!r}")


def placement(check, name, run, grads):
    """The pool's counters, and where the trained tensors live."""
    st = run.get("stats")
    check(st is not None, f"{name}: the run created a pool on the device")
    if not st:
        return
    gib = lambda b: b / (1 << 30)  # noqa: E731
    print(f"{name} pool: base {st['base']:#x}, capacity {gib(st['capacity']):.2f} GiB, peak in use "
          f"{gib(st['peak']):.3f} GiB, {st['allocations']} allocations, {st['frees']} frees, "
          f"{st['failures']} failures, {st['live']} live")
    check(st["allocations"] > 0 and st["failures"] == 0 and 0 < st["peak"] <= st["capacity"],
          f"{name}: pool counters: allocations made, none failed, peak within the capacity")
    p, g, m = run["params"], run["grads"], run["momentum"]
    check(p[0] == p[1] and m[0] == m[1], f"{name}: parameters ({p[0]}/{p[1]}) and momentum buffers "
                                         f"({m[0]}/{m[1]}) lie inside devarena's region")
    if grads:
        check(g[0] == g[1], f"{name}: gradients ({g[0]}/{g[1]}) lie inside devarena's region")
    else:
        print(f"note gradients inside devarena's region: {g[0]}/{g[1]} (backward not routed)")


def held(run):
    """Device memory the allocator under test holds after the run: the free memory it took
    during the run (cuMemGetInfo before - after, the device idle) plus what it held already at
    the first reading (by its own count: PyTorch's reserved bytes, the pool's mapped bytes)."""
    return run["free_before"] - run["free_after"] + run["held_before"]


def footprint(check, native, dev, direct, args):
    """The device memory table and checks: the pool next to PyTorch's own allocator."""
    gib = lambda b: b / (1 << 30)  # noqa: E731
    print("device memory held after the run (cuMemGetInfo: free before the run - free after it, the device "
          "idle, + what the allocator held at the first reading); every case warmed up first:")
    if native:
        print(f"  {'PyTorch caching allocator (native-a)':<44} {gib(held(native)):7.3f} GiB   "
              f"peak reserved {gib(native['max_reserved']):.3f} GiB, peak allocated "
              f"{gib(native['max_allocated']):.3f} GiB")
    runs = [(n, r) for n, r in (("devarena under a MemPool", dev), ("devarena as PyTorch's allocator", direct))
            if r and r.get("stats")]
    for label, run in runs:
        st = run["stats"]
        print(f"  {label:<44} {gib(held(run)):7.3f} GiB   pool: peak in use {gib(st['peak']):.3f} GiB, "
              f"{gib(st['mapped']):.3f} GiB mapped (peak {gib(st['peak_mapped']):.3f}), chunks of "
              f"{st['chunk'] >> 20} MiB, {st['maps']} maps, {st['unmaps']} unmaps")
    if (args.region or "growable") != "growable":
        print("note a classic region holds its whole capacity: the footprint checks apply to growable ones")
        return
    for label, run in runs:
        name = run["case"]
        st = run["stats"]
        chunk, peak = st["chunk"], st["peak"]
        bound = 1.1 * peak + chunk
        h = held(run)
        check(h <= bound, f"{name}: the device memory the pool holds ({gib(h):.3f} GiB per cuMemGetInfo) is at "
                          f"most 1.1 x its peak in use + one chunk ({gib(bound):.3f} GiB)")
        check(st["peak_mapped"] <= bound, f"{name}: the pool's peak of mapped bytes ({gib(st['peak_mapped']):.3f} "
                                          f"GiB) is at most 1.1 x its peak in use + one chunk ({gib(bound):.3f} GiB)")
        if native and name == "devarena-direct":
            check(h < held(native), f"{name}: devarena holds less device memory ({gib(h):.3f} GiB) than PyTorch's "
                                    f"own allocator in the same run ({gib(held(native)):.3f} GiB)")
        elif native:
            print(f"note {name}: under a MemPool PyTorch's caching allocator decides the segments and the pool holds "
                  f"them ({gib(h):.3f} GiB against {gib(held(native)):.3f} GiB): devarena can match its footprint "
                  "there, not go below it")
        rel = run.get("stats_released")
        live_before = (run.get("stats_before") or {}).get("live", 0)
        check(rel is not None and rel["live"] == live_before,
              f"{name}: after the run every allocation of the run came back to the pool"
              + (f" ({rel['live']} live, {live_before} before the run)" if rel else ""))
        gap = run["free_after_trim"] - run["free_before"]
        trimmed = run.get("stats_trimmed") or {}
        print(f"  {name} trim: {run['trimmed']} bytes given back; {gib(trimmed.get('mapped', 0)):.3f} GiB stay "
              f"mapped; free after trim - free at the first reading = {gap / (1 << 20):+.1f} MiB")
        before = ("before the pool" if name == "devarena"
                  else "before the run (the pool holding what it held then)")
        check(run["trimmed"] >= 0 and abs(gap) <= chunk,
              f"{name}: after the run trim() returns the device to within one chunk ({chunk >> 20} MiB) of its "
              f"memory {before} ({gap / (1 << 20):+.1f} MiB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib", help="path to libtorch_allocator.so")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--pool-bytes", default=None,
                    help="DEVARENA_POOL_BYTES of the devarena case (default: unset, the library's default)")
    ap.add_argument("--region", choices=["growable", "classic"], default=None,
                    help="DEVARENA_REGION of the devarena case (default: unset, growable)")
    ap.add_argument("--oom-bytes", default="64M", help="DEVARENA_POOL_BYTES of the out-of-memory case")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per case")
    ap.add_argument("--child", choices=["native", "devarena", "devarena-direct", "devarena-oom"],
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lib = os.path.abspath(args.lib)
    if args.child:
        return child(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
