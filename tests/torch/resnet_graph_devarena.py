#!/usr/bin/env python3
"""ResNet-18 training steps replayed from one CUDA graph whose memory is devarena's pool.

    python3 tests/torch/resnet_graph_devarena.py path/to/libtorch_allocator.so [--steps 10]
        [--batch 32] [--warmup 3] [--region growable|classic] [--timeout 420]

The shared library is `cargo build --release -p devarena --features cuda --example
torch_allocator`; `bash tests/torch/stage-torch.sh` lays it out with this script (and
resnet_devarena.py, whose helpers it imports) in .gpu/torch/. Each case runs in a fresh process,
killed after --timeout seconds (what it printed until then is shown):

  eager-a, eager-b  torchvision resnet18(weights=None), seeded; --warmup SGD steps on a side
                    stream, then --steps eager steps (forward, backward, SGD with momentum) on
                    --steps different batches, under PyTorch's own allocator. Twice: the second
                    run measures PyTorch's own run-to-run spread.
  graph-native      the same warm-up, then forward + backward + optimizer step captured once
                    with torch.cuda.graph (PyTorch's own graph pool) and replayed --steps times,
                    each batch copied into the graph's static input first.
  graph-devarena    the same with devarena as the memory: the model, the data, the optimizer
                    state and the warm-up live in a torch.cuda.MemPool of the library
                    (use_mem_pool, backward on the calling thread), and the capture uses a
                    second, empty MemPool of the library as its graph pool
                    (torch.cuda.graph(g, pool=graph_pool.id)), so that PyTorch asks devarena for
                    segments in the middle of the capture, on the capturing stream.

Checks (one PASS/FAIL line each; exit status 1 on any FAIL):
  * every case ran; the capture under devarena was accepted (a refused capture ends the child
    with the exception, devarena's counters and its trace, not a hang).
  * the replayed losses equal the eager ones: bitwise when PyTorch's two eager runs agree
    bitwise and PyTorch's own graph replays equal its eager steps; otherwise within 10 x the
    larger of those two differences (the policy of resnet_devarena.py), and the line says why.
    The parameters after the last step are compared by sha256 when bitwise equality applies.
  * devarena's graph replays equal PyTorch's own graph replays bitwise (same kernels; the
    allocator only decides addresses), reported beside the above.
  * PyTorch asked devarena for segments during the capture, on the capturing stream, and none
    failed; no free was refused; the graph's tensors (gradients, the static loss) and the
    parameters and momentum buffers lie inside devarena's region.
  * after the graph and both MemPools are released, every segment allocated during the capture
    came back to devarena (after the device went idle), and none is live.

Diagnostics: the devarena case runs with DEVARENA_VERBOSE=1 and DEVARENA_TRACE=1: every call
of devarena_torch_alloc / devarena_torch_free is one stderr line (size, device, stream,
address, thread), and the child prints `CAPTURE BEGIN` / `CAPTURE END` markers with the
capture stream's handle around the capture, so the calls made during the capture and their
streams can be read off.

Without a CUDA device (or without torch) it prints `skipped: no CUDA device` and exits 0,
unless DEVARENA_REQUIRE_GPU=1, where it fails.
"""

import argparse
import contextlib
import ctypes
import gc
import json
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet_devarena as base  # noqa: E402  (its Stats struct, library loading, digests)

RESULT_TAG = base.RESULT_TAG


class CaptureStats(ctypes.Structure):
    """devarena_torch_capture_stats' struct (repr(C), six u64)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("allocations", "bytes", "live", "freed", "refused_frees", "failed_waits")
    ]


def capture_stats(lib, device):
    out = CaptureStats()
    rc = lib.devarena_torch_capture_stats(ctypes.c_int(device), ctypes.byref(out))
    if rc != 0:
        return None
    return {name: int(getattr(out, name)) for name, _ in CaptureStats._fields_}


def say(*parts):
    """A diagnostic line on stderr, in order with the library's own lines."""
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The child: one run in this process.


def setup(torch, torchvision, device, args):
    """The seeded model, SGD with momentum, --steps batches on the device, and the static input
    and target (holding batch 0, the warm-up batch)."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).to(device)
    gen = torch.Generator().manual_seed(1234)
    xs = [torch.randn(args.batch, 3, 224, 224, generator=gen).to(device) for _ in range(args.steps + 1)]
    ys = [torch.randint(0, 1000, (args.batch,), generator=gen).to(device) for _ in range(args.steps + 1)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    static_x = xs[0].clone()
    static_y = ys[0].clone()
    return model, opt, xs, ys, static_x, static_y


def step(F, model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def child(args):
    import faulthandler

    if args.timeout > 40:
        # A hang shows where it is before the parent kills the process.
        faulthandler.dump_traceback_later(args.timeout - 20, exit=False)
    import torch
    import torch.nn.functional as F
    import torchvision

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    result = {"case": args.child, "torch": torch.__version__, "device": torch.cuda.get_device_name(device)}
    devarena = args.child == "graph-devarena"
    lib = eager_pool = graph_pool = None
    if devarena:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(args.lib, "devarena_torch_alloc", "devarena_torch_free")
        lib = base.load_lib(args.lib)
        lib.devarena_torch_capture_stats.restype = ctypes.c_int
        eager_pool = torch.cuda.MemPool(allocator.allocator())
        graph_pool = torch.cuda.MemPool(allocator.allocator())

    # Setup and warm-up: in devarena's first MemPool for the devarena case (backward on the
    # calling thread, so that its gradients and momentum buffers are routed there too).
    if devarena:
        off = getattr(torch.autograd, "set_multithreading_enabled", None)
        routing = contextlib.ExitStack()
        routing.enter_context(torch.cuda.use_mem_pool(eager_pool))
        if off is not None:
            routing.enter_context(off(False))
    else:
        routing = contextlib.nullcontext()
    side = torch.cuda.Stream()
    with routing:
        model, opt, xs, ys, static_x, static_y = setup(torch, torchvision, device, args)
        side.wait_stream(torch.cuda.current_stream())
        warmup = []
        with torch.cuda.stream(side):
            for _ in range(args.warmup):
                warmup.append(step(F, model, opt, static_x, static_y).item())
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    result["warmup_losses"] = warmup

    losses = []
    if args.child.startswith("eager"):
        for i in range(1, args.steps + 1):
            static_x.copy_(xs[i])
            static_y.copy_(ys[i])
            losses.append(step(F, model, opt, static_x, static_y).item())
    else:
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        before = capture_stats(lib, args.device) if lib else None
        say(f"CAPTURE BEGIN capture stream {side.cuda_stream:#x}, default stream "
            f"{torch.cuda.default_stream().cuda_stream:#x}, thread {threading.get_ident():#x}")
        try:
            pool_arg = {"pool": graph_pool.id} if devarena else {}
            with torch.cuda.graph(g, stream=side, **pool_arg):
                static_loss = F.cross_entropy(model(static_x), static_y)
                static_loss.backward()
                opt.step()
        except Exception as e:  # the capture was refused: say everything, end cleanly
            say(f"CAPTURE FAILED {type(e).__name__}: {e}")
            result["capture_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400]}"
            if lib:
                result["capture"] = capture_stats(lib, args.device)
                result["stats"] = base.pool_stats(lib, args.device)
                lib.devarena_torch_report(ctypes.c_int(args.device))
            faulthandler.cancel_dump_traceback_later()
            print(RESULT_TAG + json.dumps(result), flush=True)
            return 3
        say("CAPTURE END")
        if lib:
            after = capture_stats(lib, args.device)
            result["capture"] = {k: after[k] - (before or {}).get(k, 0) for k in after}
            say(f"devarena during the capture: {result['capture']}")
        for i in range(1, args.steps + 1):
            static_x.copy_(xs[i])
            static_y.copy_(ys[i])
            g.replay()
            losses.append(static_loss.item())
        torch.cuda.synchronize()
    result["losses"] = losses
    result["digest"] = base.param_digest(torch, model)

    if devarena:
        stats = base.pool_stats(lib, args.device)
        result["stats"] = stats
        lo, hi = stats["base"], stats["base"] + stats["capacity"]
        inside = lambda t: t is not None and lo <= t.data_ptr() < hi  # noqa: E731
        params = list(model.parameters())
        bufs = [opt.state[p].get("momentum_buffer") for p in params]
        result["params"] = [sum(inside(p) for p in params), len(params)]
        result["grads"] = [sum(inside(p.grad) for p in params), len(params)]
        result["momentum"] = [sum(inside(b) for b in bufs), len(bufs)]
        result["static_loss_inside"] = inside(static_loss)
        say("devarena's live allocations with the graph alive:")
        lib.devarena_torch_report(ctypes.c_int(args.device))
        # Everything back: the graph first (PyTorch releases its pool), the tensors, cuBLAS's
        # workspaces, then both MemPools (which empties their part of PyTorch's cache).
        del g, static_loss
        del model, opt, xs, ys, static_x, static_y
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        gc.collect()
        torch.cuda.synchronize()
        del graph_pool, eager_pool
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        result["capture_after_release"] = capture_stats(lib, args.device)
        result["stats_after_release"] = base.pool_stats(lib, args.device)
        if result["stats_after_release"]["live"] > 0:
            say("devarena's live allocations after everything was released:")
            lib.devarena_torch_report(ctypes.c_int(args.device))
    faulthandler.cancel_dump_traceback_later()
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: runs the cases and checks them.


def run_case(args, case):
    env = dict(os.environ)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONHASHSEED"] = "0"
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("DEVARENA_POOL_BYTES", None)
    env.pop("DEVARENA_REGION", None)
    if case == "graph-devarena":
        env["DEVARENA_VERBOSE"] = "1"
        env["DEVARENA_TRACE"] = "1"
        if args.region:
            env["DEVARENA_REGION"] = args.region
    cmd = [sys.executable, os.path.abspath(__file__), args.lib, "--child", case, "--steps", str(args.steps),
           "--batch", str(args.batch), "--warmup", str(args.warmup), "--device", str(args.device),
           "--timeout", str(args.timeout)]
    print(f"--- {case}: {' '.join(cmd[1:])}" + (f" (DEVARENA_REGION={args.region})" if args.region and
                                                  case == "graph-devarena" else ""), flush=True)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        decode = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        stdout, stderr, code = decode(e.stdout), decode(e.stderr), None
    for line in stderr.splitlines():
        print(f"    [{case}] {line}")
    result = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
        else:
            print(f"    [{case}] {line}")
    if code is None:
        return result, f"timed out after {args.timeout} s (killed; its output is above)"
    if code != 0:
        why = f"exit status {code}" + (" (killed by a signal)" if code < 0 else "")
        if result and result.get("capture_error"):
            why += f": the capture was refused: {result['capture_error']}"
        return result, why
    if result is None:
        return None, "no RESULT line"
    return result, None


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if a and b else None


def parent(args):
    if not os.path.isfile(args.lib):
        print(f"FAIL the allocator library {args.lib} does not exist (build it with `cargo build "
              "--release -p devarena --features cuda --example torch_allocator`)")
        return 1
    try:
        import torch
    except ImportError as e:
        return base.skip_or_fail(f"torch is not importable: {e}")
    if not torch.cuda.is_available() or torch.cuda.device_count() <= args.device:
        return base.skip_or_fail("torch.cuda.is_available() is False or the device is missing")
    print(f"resnet18, one CUDA graph of forward + backward + SGD step, replayed {args.steps} times on devarena's "
          f"pool: batch {args.batch}, {args.warmup} warm-up steps, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(args.device)}", flush=True)

    failures = []

    def check(ok, line):
        print(("PASS " if ok else "FAIL ") + line, flush=True)
        if not ok:
            failures.append(line)

    runs = {}
    errors = {}
    for case in ("eager-a", "eager-b", "graph-native", "graph-devarena"):
        runs[case], errors[case] = run_case(args, case)
    print()
    for case, err in errors.items():
        check(err is None, f"{case} ran to completion" + (f" ({err})" if err else ""))

    ea, eb, gn, gd = (runs[c] for c in ("eager-a", "eager-b", "graph-native", "graph-devarena"))
    if gd is not None:
        check(not gd.get("capture_error"), "torch.cuda.graph accepted the capture of forward + backward + SGD step "
                                           "with devarena's MemPool as its graph pool"
              + (f" ({gd['capture_error']})" if gd.get("capture_error") else ""))
    ok = lambda r: r is not None and not r.get("capture_error") and len(r.get("losses", [])) == args.steps  # noqa: E731
    if ok(ea) and ok(eb) and ok(gd):
        spread = max_diff(ea["losses"], eb["losses"])
        native_graph = max_diff(gn["losses"], ea["losses"]) if ok(gn) else None
        print(f"{'step':>4}  {'eager-a':>22}  {'eager-b':>22}  {'graph-native':>22}  {'graph-devarena':>22}")
        for i in range(args.steps):
            row = [ea["losses"][i], eb["losses"][i], gn["losses"][i] if ok(gn) else float("nan"), gd["losses"][i]]
            print(f"{i:>4}  " + "  ".join(f"{v!r:>22}" for v in row))
        diff = max_diff(gd["losses"], ea["losses"])
        print(f"max |eager-a - eager-b| = {spread!r}; max |graph-native - eager-a| = {native_graph!r}; "
              f"max |graph-devarena - eager-a| = {diff!r}")
        reference = max(spread, native_graph if native_graph is not None else 0.0)
        if reference == 0.0:
            check(gd["losses"] == ea["losses"], f"the {args.steps} replayed losses under devarena equal the eager "
                                                f"steps bitwise (max abs difference {diff!r})")
            check(gd["digest"] == ea["digest"], f"parameters after {args.steps} replays equal those after "
                                                f"{args.steps} eager steps bitwise (sha256 {gd['digest'][:16]}…)")
        else:
            tol = 10 * reference
            why = (f"PyTorch's own two eager runs differ by {spread!r}" if spread
                   else f"PyTorch's own graph replays differ from its eager steps by {native_graph!r}")
            check(diff <= tol, f"the {args.steps} replayed losses under devarena are within {tol:.3e} of the eager "
                               f"steps (max abs difference {diff!r}); exact equality cannot hold: {why}")
        if ok(gn):
            same = gd["losses"] == gn["losses"] and gd["digest"] == gn["digest"]
            print(("PASS " if same else "note ") + "devarena's replays equal PyTorch's own graph replays bitwise "
                  f"(losses and parameters){'' if same else ': they differ, max ' + repr(max_diff(gd['losses'], gn['losses']))}")

    if gd is not None and gd.get("capture") is not None:
        cap = gd["capture"]
        print(f"devarena during the capture: {cap['allocations']} segments allocated ({cap['bytes'] / (1 << 20):.1f} MiB) "
              f"on the capturing stream, {cap['refused_frees']} frees refused")
        check(cap["allocations"] > 0, "PyTorch asked devarena for graph-pool segments during the capture, on the "
                                      "capturing stream (see the trace lines between CAPTURE BEGIN and CAPTURE END)")
    if gd is not None and gd.get("stats"):
        st = gd["stats"]
        check(st["failures"] == 0, f"no devarena allocation failed ({st['allocations']} allocations, "
                                   f"{st['failures']} failures)")
    if ok(gd):
        p, g, m = gd["params"], gd["grads"], gd["momentum"]
        check(p[0] == p[1] and g[0] == g[1] and m[0] == m[1] and gd["static_loss_inside"],
              f"the graph's tensors lie inside devarena's region: parameters {p[0]}/{p[1]}, gradients (allocated "
              f"by the capture) {g[0]}/{g[1]}, momentum buffers {m[0]}/{m[1]}, static loss "
              f"{'inside' if gd['static_loss_inside'] else 'outside'}")
        rel, st = gd.get("capture_after_release"), gd.get("stats_after_release")
        if rel is not None and st is not None:
            check(rel["refused_frees"] == 0 and rel["failed_waits"] == 0,
                  f"no free was refused ({rel['refused_frees']} during a capture, {rel['failed_waits']} waits for an "
                  "idle device failed)")
            check(rel["freed"] == rel["allocations"] and rel["live"] == 0,
                  f"after the graph and the MemPools were released, every segment allocated during the capture came "
                  f"back to devarena ({rel['freed']} of {rel['allocations']}, {rel['live']} live)")
            # What else PyTorch may keep in a MemPool (a workspace cache) is PyTorch's business:
            # said, not checked.
            print(("PASS " if st["live"] == 0 else "note ") + "devarena holds no live allocation after everything "
                  f"was released ({st['live']} live; the leak report is above if not)")

    print()
    if failures:
        print(f"RESULT: FAIL ({len(failures)} failed)")
        return 1
    print("RESULT: PASS")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib", help="path to libtorch_allocator.so")
    ap.add_argument("--steps", type=int, default=10, help="replays (and eager steps) compared")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3, help="eager steps before the capture")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--region", choices=["growable", "classic"], default=None,
                    help="DEVARENA_REGION of the devarena case (default: unset, growable)")
    ap.add_argument("--timeout", type=int, default=420, help="seconds per case")
    ap.add_argument("--child", choices=["eager-a", "eager-b", "graph-native", "graph-devarena"],
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lib = os.path.abspath(args.lib)
    if args.child:
        return child(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
