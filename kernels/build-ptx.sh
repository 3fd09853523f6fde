#!/usr/bin/env bash
# Regenerates the committed PTX from the CUDA C sources. Building the crate does not need this
# (the PTX is committed and embedded with include_str!); run it after editing kernels/cuda/*.cu.
#
#   kernels/build-ptx.sh            # needs nvcc (CUDA 12 or 13) on PATH, or in /opt/cuda13
#
# compute_75 PTX is JIT-compiled by the driver for any GPU from Turing (sm_75) on, including
# Hopper (sm_90). The flags keep every floating-point operation an exact IEEE-754
# round-to-nearest operation, so the kernels compute the same bits as the host reference:
#   -fmad=false        no contraction of a*b+c into a fused multiply-add
#   -prec-div=true     IEEE division     -prec-sqrt=true   IEEE square root
#   -ftz=false         keep denormals    (and no --use_fast_math)
# After writing each file it validates the PTX with ptxas for sm_75 and sm_90.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v nvcc >/dev/null && [ -x /opt/cuda13/nvidia/cu13/bin/nvcc ]; then
  export PATH=/opt/cuda13/nvidia/cu13/bin:$PATH
fi
mkdir -p "$here/ptx"
for name in pipeline; do
  nvcc -ptx -arch=compute_75 -std=c++17 \
    -fmad=false -prec-div=true -prec-sqrt=true -ftz=false \
    -o "$here/ptx/$name.ptx" "$here/cuda/$name.cu"
  for sm in sm_75 sm_90; do
    ptxas -arch=$sm -o /dev/null "$here/ptx/$name.ptx"
  done
  echo "wrote kernels/ptx/$name.ptx ($(nvcc --version | tail -1))"
done
