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
# The sdist is patched before the build (scripts/patches/, each patch says why):
#   llamacpp-q4_1-sgemm.patch  a batched (tiled) matrix kernel for Q4_1 weights, the shipped
#                              SmolLM2 GGUF's type, which ggml's CPU backend otherwise runs row
#                              by row (issue #37; docs/internals.md §10).
# Skips the build when that version is installed from a build of the same key (below). pip's
# wheel cache is not used: its key is the sdist alone, so a wheel built with other CMAKE_ARGS or
# patches would be reused silently. The wheel is kept in a cache of its own instead
# (~/.cache/qrun/wheels, or $QRUN_WHEEL_CACHE), under a key made of everything that shapes the
# build: the version, the caller's CMAKE_ARGS, this script and its patches, the Python and the
# machine; a fresh clone on the same machine (CI's) installs it in seconds, and its SHA-256,
# written beside it, is checked before it is installed.
# Usage: scripts/install-llamacpp.sh PYTHON   (default: .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
# pip prints a warning per package for a find-links folder some machines configure and do
# not have; only those lines are dropped.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
VERSION=0.3.36
PATCHES=("$(dirname "$0")"/patches/llamacpp-*.patch)
key_source="$VERSION ${CMAKE_ARGS:-} $(cat "$0" "${PATCHES[@]}" | sha256sum | cut -c1-64) $("$PY" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())') $(uname -m)"
key=$(printf '%s' "$key_source" | sha256sum | cut -c1-16)
# The key of the build installed, written beside the bindings when it was installed: another
# build of the same version (unpatched, or with other CMAKE_ARGS) is replaced.
installed_key() {
    "$PY" -c 'import importlib.util, pathlib; s = importlib.util.find_spec("llama_cpp"); print((pathlib.Path(s.origin).parent / "QRUN_BUILD_KEY").read_text().strip())' 2>/dev/null || true
}
if "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama_cpp_python') != '$VERSION')" 2>/dev/null \
        && [ "$(installed_key)" = "$key" ]; then
    echo "llama-cpp-python $VERSION is already installed (build $key)"
    exit 0
fi
cache=${QRUN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qrun/wheels}/llama-cpp-python-$VERSION-$key
if [ -f "$cache/SHA256SUMS" ] && (cd "$cache" && sha256sum --check --status SHA256SUMS); then
    echo "installing llama-cpp-python $VERSION from the wheel built before ($cache)"
    "$PY" -m pip uninstall --quiet --yes llama-cpp-python 2>/dev/null || true
    "$PY" -m pip install --quiet "$cache"/*.whl
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo 'set(LLAMA_BUILD_COMMON OFF)' > "$work/llama-no-common.cmake"
    # CMAKE_ARGS from the caller come last, so they win (e.g. -DGGML_NATIVE=ON, -DGGML_CUDA=ON).
    export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$work/llama-no-common.cmake ${CMAKE_ARGS:-}"
    export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
    echo "building llama-cpp-python $VERSION from source ($CMAKE_BUILD_PARALLEL_LEVEL jobs): $CMAKE_ARGS"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: --dest "$work/sdist" "llama-cpp-python==$VERSION"
    tar xzf "$work/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$work"
    src="$work/llama_cpp_python-$VERSION"
    for patch in "${PATCHES[@]}"; do
        echo "applying $(basename "$patch")"
        patch --quiet --directory "$src" --strip 1 --forward < "$patch"
    done
    "$PY" -m pip wheel --quiet --no-deps --no-cache-dir --wheel-dir "$work/wheel" "$src"
    "$PY" -m pip uninstall --quiet --yes llama-cpp-python 2>/dev/null || true
    "$PY" -m pip install --quiet "$work"/wheel/*.whl
    # Kept only once it installed; moved into place whole (a rename), so a build stopped
    # half-way leaves nothing that looks complete.
    (cd "$work/wheel" && sha256sum -- *.whl > SHA256SUMS)
    mkdir -p "$(dirname "$cache")"
    rm -rf "$cache.partial" && cp -r "$work/wheel" "$cache.partial" && rm -rf "$cache" && mv "$cache.partial" "$cache"
fi
"$PY" -c 'import llama_cpp, pathlib, sys; (pathlib.Path(llama_cpp.__file__).parent / "QRUN_BUILD_KEY").write_text(sys.argv[1] + "\n")' "$key"
"$PY" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())'
