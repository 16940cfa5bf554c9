#!/usr/bin/env bash
# Makes a Python environment with guidance (the peer the llama.cpp bench compares against,
# issue #13) that runs on qrun's own llama-cpp-python build, so both tools drive the same
# llama.cpp library: guidance 0.3.1 and llama-cpp-python's pure-Python dependencies are
# installed from PyPI, and the llama_cpp package of qrun's environment is made importable
# through a .pth file (no second 15-50 min build). Used only by the bench:
#   scripts/guidance-venv.sh            # -> .venv-guidance
#   QRUN_BENCH_GUIDANCE_PYTHON=.venv-guidance/bin/python .venv/bin/python -m bench --backend llamacpp
# Usage: scripts/guidance-venv.sh [QRUN_PYTHON] [TARGET]   (defaults: .venv/bin/python, .venv-guidance)
set -euo pipefail
QRUN_PY=${1:-.venv/bin/python}
TARGET=${2:-.venv-guidance}
# pip prints a warning per package for a find-links folder some machines configure and do
# not have; only those lines are dropped.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
llama=$("$QRUN_PY" -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))') || {
    echo "llama-cpp-python is not installed in $QRUN_PY: run 'make llamacpp' first" >&2; exit 1; }
python_version=$("$QRUN_PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
"$QRUN_PY" -m venv "$TARGET"
"$TARGET/bin/python" -m pip install --quiet "guidance==0.3.1" numpy diskcache jinja2 typing_extensions
links="$(cd "$TARGET" && pwd)/qrun-llama-cpp"
mkdir -p "$links"
ln -sfn "$llama" "$links/llama_cpp"
echo "$links" > "$TARGET/lib/python$python_version/site-packages/qrun-llama-cpp.pth"
"$TARGET/bin/python" -c 'import guidance, llama_cpp; print("guidance", guidance.__version__, "on llama_cpp", llama_cpp.__version__)'
