#!/usr/bin/env bash
# Build a Debian base image from Debian packages only (no image registry needed) and
# import it into podman as localhost/merlin-base:<suite>.
#
# The base stands in for python:3.11-slim: Debian bookworm's python3 is 3.11, and a
# venv at /opt/venv on PATH gives `python` and `pip` as the slim image does (Debian's own
# python3 refuses `pip install` outside a venv: PEP 668, "externally-managed-environment").
#
# Usage: tests/container/build_base.sh [suite]      (default: the host's VERSION_CODENAME)
# Env:   MIRROR (default http://deb.debian.org/debian), SECURITY_MIRROR,
#        WORKDIR (default /var/tmp/merlin-podman), FORCE=1 to rebuild an existing image.
set -euo pipefail

. /etc/os-release
SUITE=${1:-${VERSION_CODENAME:-bookworm}}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
WORKDIR=${WORKDIR:-/var/tmp/merlin-podman}
IMAGE=localhost/merlin-base:${SUITE}

if podman image exists "$IMAGE" && [ "${FORCE:-0}" != 1 ]; then
    echo "$IMAGE exists (FORCE=1 rebuilds it)"
    exit 0
fi

command -v mmdebstrap >/dev/null || { echo "needs: apt-get install mmdebstrap podman" >&2; exit 1; }
mkdir -p "$WORKDIR"
TARBALL=$WORKDIR/merlin-base-$SUITE.tar

start=$(date +%s)
# Check-Valid-Until off: mirrors that serve a dated snapshot (as on these machines) carry
# expired Release files for -updates and -security. It stays in the image, so the
# Dockerfile's own `apt-get update` works too.
mmdebstrap \
    --variant=minbase \
    --include=python3,python3-venv,git,bubblewrap,ca-certificates \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
    --customize-hook='chroot "$1" /opt/venv/bin/pip --version' \
    "$SUITE" "$TARBALL" \
    "deb $MIRROR $SUITE main" \
    "deb $MIRROR $SUITE-updates main" \
    "deb $SECURITY_MIRROR $SUITE-security main"

podman import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "mmdebstrap minbase $SUITE + python3 python3-venv git bubblewrap ca-certificates" \
    "$TARBALL" "$IMAGE"
rm -f "$TARBALL"
echo "built $IMAGE in $(( $(date +%s) - start ))s"
podman run --rm "$IMAGE" sh -c 'python --version; pip --version; git --version; bwrap --version'
