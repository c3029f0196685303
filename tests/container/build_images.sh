#!/usr/bin/env bash
# Build every image the compose stack needs, from Debian packages and PyPI only:
#   localhost/merlin-base:<suite>      tests/container/build_base.sh (mmdebstrap)
#   localhost/merlin-redis:<suite>     stand-in for redis:7-alpine
#   localhost/merlin-postgres:<suite>  stand-in for postgres:16-alpine
#   localhost/merlin-flow:latest       deploy/Dockerfile on the Debian base
# Env: FORCE=1 rebuilds images that exist; CONTAINERS_CONF as set by podman-env.sh.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
. "$HERE/podman-env.sh"
SUITE=${SUITE:-$(. /etc/os-release; echo "${VERSION_CODENAME:-bookworm}")}
BASE=localhost/merlin-base:$SUITE

"$HERE/build_base.sh" "$SUITE"

exists() { podman image exists "$1" && [ "${FORCE:-0}" != 1 ]; }

for svc in redis postgres; do
    img=localhost/merlin-$svc:$SUITE
    if exists "$img"; then echo "$img exists"; continue; fi
    podman build --build-arg BASE="$BASE" -f "$HERE/images/$svc.Containerfile" \
        -t "$img" "$HERE/images"
done

img=localhost/merlin-flow:latest
if exists "$img"; then echo "$img exists"; exit 0; fi

# deploy/Dockerfile as shipped, on the Debian base: with `ARG BASE` before FROM a build
# arg does it; otherwise a copy in $WORKDIR with the FROM line replaced (reported).
dockerfile=$ROOT/deploy/Dockerfile
if grep -Eq '^ARG +BASE' "$dockerfile" && grep -Eq '^FROM +\$\{?BASE' "$dockerfile"; then
    echo "deploy/Dockerfile takes ARG BASE: building it as shipped"
else
    echo "deploy/Dockerfile has no ARG BASE: building a copy with its FROM line replaced:"
    grep -n '^FROM' "$dockerfile"
    sed "0,/^FROM .*/s||FROM $BASE|" "$dockerfile" > "$WORKDIR/Dockerfile.debian-base"
    diff "$dockerfile" "$WORKDIR/Dockerfile.debian-base" || true
    dockerfile=$WORKDIR/Dockerfile.debian-base
fi

# pip inside the build: the same CA bundle and index as pip on this host (here a TLS
# proxy's CA is in the host's bundle, which pip's own certifi lacks). Mounted for the
# build's RUN steps only: nothing of it is left in the image.
pipconf=$WORKDIR/pip.conf
host_cert=${PIP_CERT:-$(pip config get global.cert 2>/dev/null || true)}
host_index=${PIP_INDEX_URL:-$(pip config get global.index-url 2>/dev/null || true)}
mounts=()
{
    echo "[global]"
    if [ -n "$host_cert" ] && [ -f "$host_cert" ]; then
        echo "cert = /run/host-ca-bundle.crt"
        mounts+=(-v "$host_cert:/run/host-ca-bundle.crt:ro")
    fi
    [ -n "$host_index" ] && echo "index-url = $host_index"
} > "$pipconf"
mounts+=(-v "$pipconf:/etc/pip.conf:ro")
echo "pip.conf for the build:"; cat "$pipconf"

podman build --build-arg BASE="$BASE" "${mounts[@]}" \
    -f "$dockerfile" -t "$img" "$ROOT"
