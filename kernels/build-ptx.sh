#!/usr/bin/env bash
# Regenerates the committed PTX from the CUDA C sources. Not part of the build: the crate embeds
# the PTX text, so building it needs no CUDA toolkit. Needs nvcc 13.0 on PATH (the GPU machine
# has it; on a machine without the toolkit, `pip install nvidia-cuda-nvcc==13.0.* nvidia-nvvm==13.0.*
# nvidia-cuda-runtime==13.0.* nvidia-cuda-crt==13.0.*` into a folder and put its nvidia/cu13/bin on
# PATH). PTX ISA 9.0 (CUDA 13.0) matches driver 580 and newer.
#
#   kernels/build-ptx.sh          # from anywhere
set -euo pipefail
cd "$(dirname "$0")"
nvcc --version | tail -1
# Portable kernels: compute_75 PTX, JIT-compiled by the driver for the GPU at hand.
for k in verify pipeline; do
  [ -f "cuda/$k.cu" ] || continue
  nvcc -ptx -arch=compute_75 -O3 "cuda/$k.cu" -o "ptx/$k.ptx"
done
# Hopper-only: the bulk tensor copy needs sm_90.
nvcc -ptx -arch=compute_90 -O3 cuda/tma.cu -o ptx/tma.ptx
# Validate every PTX file with the assembler for the target GPU.
for f in ptx/*.ptx; do ptxas -arch=sm_90 "$f" -o /dev/null && echo "ptxas ok: $f"; done
