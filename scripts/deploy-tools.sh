#!/usr/bin/env bash
# Installs the manifest checkers that tests/deploy/test_deploy.py runs, checkov and kubernetes-validate,
# into .venv/deploy-tools: apart from llmtrio's own environment, since checkov pins older
# versions of packages that llmtrio's test tools use. Once; again only when the pins change.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=(checkov==3.3.30 kubernetes-validate==1.37.0)
venv=.venv/deploy-tools
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "${TOOLS[*]}" ]; then
    echo "installing ${TOOLS[*]} into $venv (once)" >&2
    rm -rf "$venv"
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "${TOOLS[@]}"
    echo "${TOOLS[*]}" > "$venv/.installed"
fi
