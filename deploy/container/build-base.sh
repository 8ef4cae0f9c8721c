#!/usr/bin/env bash
# Builds a stand-in for the python:3.11-slim base image from Debian packages, for a machine whose Docker
# engine cannot pull from Docker Hub but whose apt and pip reach their registries (a mirror, a proxy).
#
#   sudo deploy/container/build-base.sh            # tags python:3.11-slim unless it already exists
#   sudo deploy/container/build-base.sh --force    # rebuild it
#
# Debian bookworm's python3 is 3.11, the version the image pins. A virtual environment on PATH stands in
# for the official image's /usr/local python and its pip. Nothing of the host is copied into the base: it is
# the base of every container (the image's and the balancer's).
#
# When pip on this machine is configured with a CA bundle (a TLS-intercepting proxy between it and the index),
# that bundle is copied to deploy/container/build-ca.crt (git-ignored), which only the Dockerfile's build
# stage reads, so `pip install` there trusts the same proxy and no container of the image holds the bundle.
# That copy is refreshed on every call, also when the base exists.
set -euo pipefail

TAG="${BASE_TAG:-python:3.11-slim}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# PIP_CERT, or the `cert` of pip's configuration files (`pip config list` prints each scope's).
cert="${PIP_CERT:-$(python3 -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" | head -n 1)}"
if [[ -n "$cert" && -f "$cert" ]]; then
  install -m 0644 "$cert" "$(dirname "$0")/build-ca.crt"
fi

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
# What a base image does not need: apt's lists and caches, documentation, man pages, locales but C.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
  "$root"/usr/share/info/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} + 2>/dev/null || true

tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  - "$TAG" >/dev/null
docker image inspect "$TAG" --format "{{.RepoTags}} {{.Size}} bytes"
