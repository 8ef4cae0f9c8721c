#!/usr/bin/env bash
# Builds a stand-in for the python:3.11-slim base image from Debian packages, for a machine whose Docker
# engine cannot pull from Docker Hub but whose apt and pip reach their registries (a mirror, a proxy).
#
#   sudo deploy/container/build-base.sh            # tags python:3.11-slim unless it already exists
#   sudo deploy/container/build-base.sh --force    # rebuild it
#
# Debian bookworm's python3 is 3.11, the version the image pins. A virtual environment on PATH stands in
# for the official image's /usr/local python and its pip. When pip on this machine is configured with a CA
# bundle (a TLS-intercepting proxy between it and the index), that bundle is copied in and named by PIP_CERT,
# so `pip install` inside a build trusts the same proxy; nothing else of the host is copied.
set -euo pipefail

TAG="${BASE_TAG:-python:3.11-slim}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if [[ "${1:-}" != "--force" ]] && docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG exists (pass --force to rebuild it)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is not installed (Debian: apt-get install debootstrap)" >&2; exit 1; }

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
# mktemp makes its folder 0700, and that folder becomes the image's /: a non-root user (the image's uid
# 10001) could not reach /bin/sh or anything else.
chmod 0755 "$root"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$root" "$MIRROR" >/dev/null

chroot "$root" python3 -m venv /usr/local/python
# PIP_CERT, or the `cert` of pip's configuration files (`pip config list` prints each scope's).
cert="${PIP_CERT:-$(python3 -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" | head -n 1)}"
cert_env=()
if [[ -n "$cert" && -f "$cert" ]]; then
  install -D -m 0644 "$cert" "$root/usr/local/share/pip/ca-bundle.crt"
  cert_env=(--change "ENV PIP_CERT=/usr/local/share/pip/ca-bundle.crt")
fi
# What a base image does not need: apt's lists and caches, documentation, man pages, locales but C.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
  "$root"/usr/share/info/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} + 2>/dev/null || true

tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  "${cert_env[@]}" \
  --change 'CMD ["python3"]' \
  - "$TAG" >/dev/null
docker image inspect "$TAG" --format "{{.RepoTags}} {{.Size}} bytes"
