#!/usr/bin/env bash
# Regenerates the hashed lock files from pyproject.toml, for CPython 3.11 on linux x86_64 (the image's
# python:3.11-slim, CI and the README's commands): runtime.txt (the dependencies and the [image] extra,
# what the container image installs), then dev.txt (runtime.txt's versions plus the [dev] extra). Run it
# after changing a dependency in pyproject.toml; test_lock.py fails until the locks agree with it.
#
# uv is pinned here, installed into a throwaway venv where it is not already that version. It reads no
# pip configuration, and --no-config keeps any uv.toml out, so no local index, find-links or file URL
# of this machine ends up in the locks: only PyPI's names, versions and sha256 hashes.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
uv=uv
if [ "$(uv --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  tools="$(mktemp -d)"
  trap 'rm -rf "$tools"' EXIT
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install --quiet "uv==$UV_VERSION"
  uv="$tools/venv/bin/uv"
fi

compile=(pip compile pyproject.toml --quiet --no-config --index-url https://pypi.org/simple --generate-hashes
  --python-version 3.11 --python-platform x86_64-unknown-linux-gnu --custom-compile-command "requirements/lock.sh")
"$uv" "${compile[@]}" --extra image --output-file requirements/runtime.txt
# The runtime's versions are the dev environment's too: the tests run what the image ships.
"$uv" "${compile[@]}" --extra image --extra dev --constraint requirements/runtime.txt --output-file requirements/dev.txt
