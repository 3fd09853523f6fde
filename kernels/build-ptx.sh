#!/usr/bin/env bash
# Regenerates the committed PTX from the CUDA C sources. Building the crate does not need this
# (the PTX is committed and embedded with include_str!); run it after editing kernels/cuda/*.cu.
#
#   kernels/build-ptx.sh            # needs nvcc 13.0 on PATH, or in /opt/cuda13
#
# Without a CUDA toolkit, nvcc comes from PyPI: `pip install --target /opt/cuda13
# nvidia-cuda-nvcc==13.0.* nvidia-nvvm==13.0.* nvidia-cuda-runtime==13.0.* nvidia-cuda-crt==13.0.*`
# (nvcc -ptx needs no GPU). PTX ISA 9.0 (CUDA 13.0) matches driver 580 and newer.
#
# compute_75 PTX is JIT-compiled by the driver for any GPU from Turing (sm_75) on, including
# Hopper (sm_90). The flags keep every floating-point operation an exact IEEE-754
# round-to-nearest operation, so the kernels compute the same bits as the host reference:
#   -fmad=false        no contraction of a*b+c into a fused multiply-add
#   -prec-div=true     IEEE division     -prec-sqrt=true   IEEE square root
#   -ftz=false         keep denormals    (and no --use_fast_math)
# The bulk-tensor (TMA) kernel is Hopper-only: compute_90. Every file is validated with ptxas.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v nvcc >/dev/null && [ -x /opt/cuda13/nvidia/cu13/bin/nvcc ]; then
  export PATH=/opt/cuda13/nvidia/cu13/bin:$PATH
fi
mkdir -p "$here/ptx"
flags=(-std=c++17 -fmad=false -prec-div=true -prec-sqrt=true -ftz=false)
for name in pipeline verify; do
  nvcc -ptx -arch=compute_75 "${flags[@]}" -o "$here/ptx/$name.ptx" "$here/cuda/$name.cu"
  for sm in sm_75 sm_90; do
    ptxas -arch=$sm -o /dev/null "$here/ptx/$name.ptx"
  done
  echo "wrote kernels/ptx/$name.ptx ($(nvcc --version | tail -1))"
done
nvcc -ptx -arch=compute_90 "${flags[@]}" -o "$here/ptx/tma.ptx" "$here/cuda/tma.cu"
ptxas -arch=sm_90 -o /dev/null "$here/ptx/tma.ptx"
echo "wrote kernels/ptx/tma.ptx ($(nvcc --version | tail -1))"
