#!/usr/bin/env bash
# Builds llama-cpp-python 0.3.36 (the llamacpp backend's optional extra) from its sdist into a
# Python environment: there is no binary wheel for this machine, and a build with everything on
# (llama.cpp's common library with its HTTP client, the multimodal library mtmd) takes 15-50 min
# on 2 cores (issue #13). Only what the bindings load is built: libllama and the ggml libraries
# with the CPU backend. Turned off:
#   LLAVA_BUILD=OFF     tools/mtmd (llava/multimodal), loaded only for image chat formats;
#   LLAMA_BUILD_COMMON  llama.cpp's common library (argument parsing, chat parsers, downloads,
#                       cpp-httplib): the bindings never load it, but their CMakeLists.txt forces
#                       it ON in the cache, so a normal variable set right after llama.cpp's own
#                       project() call (CMake's CMAKE_PROJECT_<name>_INCLUDE hook) hides that;
#   GGML_NATIVE=OFF     no -march=native: ggml then enables SSE4.2/AVX/AVX2/FMA/F16C/BMI2
#                       (x86-64-v3), so the build runs on any AVX2 machine, not only on this CPU.
# Tests, tools, examples and the server are already off when llama.cpp is a subproject.
# Skips the build when that version is installed. pip's wheel cache is not used: its key is the
# sdist alone, so a wheel built with other CMAKE_ARGS would be reused silently. The wheel is
# kept in a cache of its own instead (~/.cache/qrun/wheels, or $QRUN_WHEEL_CACHE), under a key
# made of everything that shapes the build: the version, the caller's CMAKE_ARGS, this script,
# the Python and the machine; a fresh clone on the same machine (CI's) installs it in seconds,
# and its SHA-256, written beside it, is checked before it is installed.
# Usage: scripts/install-llamacpp.sh PYTHON   (default: .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
# pip prints a warning per package for a find-links folder some machines configure and do
# not have; only those lines are dropped.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
VERSION=0.3.36
if "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama_cpp_python') != '$VERSION')" 2>/dev/null; then
    echo "llama-cpp-python $VERSION is already installed"
    exit 0
fi
key_source="$VERSION ${CMAKE_ARGS:-} $(sha256sum "$0" | cut -c1-64) $("$PY" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())') $(uname -m)"
key=$(printf '%s' "$key_source" | sha256sum | cut -c1-16)
cache=${QRUN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qrun/wheels}/llama-cpp-python-$VERSION-$key
if [ -f "$cache/SHA256SUMS" ] && (cd "$cache" && sha256sum --check --status SHA256SUMS); then
    echo "installing llama-cpp-python $VERSION from the wheel built before ($cache)"
    "$PY" -m pip install --quiet "$cache"/*.whl
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo 'set(LLAMA_BUILD_COMMON OFF)' > "$work/llama-no-common.cmake"
    # CMAKE_ARGS from the caller come last, so they win (e.g. -DGGML_NATIVE=ON, -DGGML_CUDA=ON).
    export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$work/llama-no-common.cmake ${CMAKE_ARGS:-}"
    export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
    echo "building llama-cpp-python $VERSION from source ($CMAKE_BUILD_PARALLEL_LEVEL jobs): $CMAKE_ARGS"
    "$PY" -m pip wheel --quiet --no-deps --no-cache-dir --wheel-dir "$work/wheel" "llama-cpp-python==$VERSION"
    "$PY" -m pip install --quiet "$work"/wheel/*.whl
    # Kept only once it installed; moved into place whole (a rename), so a build stopped
    # half-way leaves nothing that looks complete.
    (cd "$work/wheel" && sha256sum -- *.whl > SHA256SUMS)
    mkdir -p "$(dirname "$cache")"
    rm -rf "$cache.partial" && cp -r "$work/wheel" "$cache.partial" && rm -rf "$cache" && mv "$cache.partial" "$cache"
fi
"$PY" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())'
