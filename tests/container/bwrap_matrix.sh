#!/usr/bin/env bash
# Which container security settings let bubblewrap run inside the worker image, as its
# `merlin` user. For each setting: merlin's own start-up probe (sandbox_problem: no
# --proc) and the shape of merlin's real sandbox (bwrap_arguments: --proc, --dev,
# --tmpfs, --cap-drop ALL). Prints one line per setting; exit 0.
#
#   tests/container/bwrap_matrix.sh [IMAGE]            (default localhost/merlin-flow:latest)
# Env: DOCKER_SECCOMP=path/to/moby's default.json adds rows with Docker's default profile;
#      every deploy/*seccomp*.json in the checkout is tried too.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
. "$HERE/podman-env.sh"
IMAGE=${1:-localhost/merlin-flow:latest}

PROBE='bwrap --unshare-all --die-with-parent --ro-bind / / true'
REAL="bwrap --die-with-parent --new-session --unshare-all --cap-drop ALL --ro-bind /usr /usr \
 --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --ro-bind /etc /etc \
 --ro-bind /dev/null /etc/shadow --ro-bind /opt /opt --proc /proc --dev /dev --tmpfs /tmp \
 --chdir /tmp --clearenv --setenv PATH /opt/venv/bin:/usr/bin python -c pass"

row() {
    local name=$1; shift
    local out probe real
    out=$(podman run --rm "$@" "$IMAGE" sh -c "$PROBE >/dev/null 2>&1 && echo probe-ok || echo probe-FAIL; $REAL 2>&1 && echo real-ok" 2>&1)
    probe=$(echo "$out" | grep -o 'probe-[A-Za-z]*' | head -1)
    real=$(echo "$out" | grep -q real-ok && echo real-ok || echo "real-FAIL: $(echo "$out" | grep -v probe- | tail -1)")
    printf '%-62s %-11s %s\n' "$name" "${probe:-error}" "$real"
}

echo "podman $(podman version --format '{{.Client.Version}}'), runtime $(podman info --format '{{.Host.OCIRuntime.Name}}'), kernel $(uname -r), image $IMAGE"
printf '%-62s %-11s %s\n' "setting" "probe" "real sandbox"
row "(podman defaults)"
row "seccomp=unconfined" --security-opt seccomp=unconfined
row "apparmor=unconfined" --security-opt apparmor=unconfined
row "cap-add SYS_ADMIN" --cap-add SYS_ADMIN
row "unmask=/proc/kcore:/proc/keys:/proc/timer_list (part)" --security-opt unmask=/proc/kcore:/proc/keys:/proc/timer_list
row "unmask=/proc/*" --security-opt unmask=/proc/*
row "systempaths=unconfined" --security-opt systempaths=unconfined
row "unmask=ALL" --security-opt unmask=ALL
row "unmask=/proc/* cap-drop=ALL no-new-privileges read-only" --security-opt unmask=/proc/* --cap-drop ALL --security-opt no-new-privileges --read-only
row "unmask=/proc/* in a user namespace (uidmap 0:100000:65536)" --security-opt unmask=/proc/* --uidmap 0:100000:65536 --gidmap 0:100000:65536
row "--privileged" --privileged
if [ -n "${DOCKER_SECCOMP:-}" ]; then
    row "Docker default seccomp" --security-opt seccomp="$DOCKER_SECCOMP"
    row "Docker default seccomp + unmask=/proc/*" --security-opt seccomp="$DOCKER_SECCOMP" --security-opt unmask=/proc/*
    # The fewest syscalls to add to Docker's profile for bwrap (each one left out fails).
    for add in "clone unshare mount umount2 pivot_root" "clone unshare mount umount2" "clone unshare mount pivot_root" "unshare mount umount2 pivot_root" "clone mount umount2 pivot_root"; do
        python3 - "$DOCKER_SECCOMP" "$WORKDIR/seccomp-try.json" $add <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
profile["syscalls"].append({"names": sys.argv[3:], "action": "SCMP_ACT_ALLOW"})
json.dump(profile, open(sys.argv[2], "w"))
PY
        row "Docker seccomp +[$add] + unmask=/proc/*" --security-opt seccomp="$WORKDIR/seccomp-try.json" --security-opt unmask=/proc/*
    done
fi
for profile in "$ROOT"/deploy/*seccomp*.json "$ROOT"/deploy/*/*seccomp*.json; do
    [ -f "$profile" ] || continue
    rel=${profile#"$ROOT/"}
    row "seccomp=$rel" --security-opt seccomp="$profile"
    row "seccomp=$rel + unmask=/proc/*" --security-opt seccomp="$profile" --security-opt unmask=/proc/*
done
