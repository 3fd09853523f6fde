#!/usr/bin/env bash
# Lays out the PyTorch tests in .gpu/torch/: the allocator library (a cdylib, which the shared
# stage script does not copy: it copies executables only) and the Python scripts that drive it.
#
#   ../shared/gpu/stage --features cuda     # first: it recreates .gpu/ from scratch
#   bash tests/torch/stage-torch.sh         # then this
#
# On the GPU machine, from the project root:
#   python3 .gpu/torch/resnet_devarena.py .gpu/torch/libtorch_allocator.so
#   python3 .gpu/torch/resnet_graph_devarena.py .gpu/torch/libtorch_allocator.so
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
# A no-op when the stage script already built it.
cargo build --release -p devarena --features cuda --example torch_allocator
mkdir -p .gpu/torch
cp target/release/examples/libtorch_allocator.so .gpu/torch/
cp tests/torch/resnet_devarena.py tests/torch/resnet_graph_devarena.py .gpu/torch/
ls -l .gpu/torch
echo "on the GPU machine: python3 .gpu/torch/resnet_devarena.py .gpu/torch/libtorch_allocator.so"
echo "                    python3 .gpu/torch/resnet_graph_devarena.py .gpu/torch/libtorch_allocator.so"
