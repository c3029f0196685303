#!/usr/bin/env bash
# Run deploy/compose.yaml for real with podman, on images built from Debian packages,
# and put two jobs through it: the bundled demo (3 steps, scripted models, a tier
# escalation, two steps side by side) and a probe whose exit command checks that it runs
# in bubblewrap inside the verify worker's container. Then tear everything down.
#
#   tests/container/run_stack.sh                      # as root
#   COMPOSE_TOOL=docker-compose tests/container/run_stack.sh
#   KEEP=1 tests/container/run_stack.sh               # leave the stack running
#   EXTRA_COMPOSE=tests/container/compose.hardened.yaml tests/container/run_stack.sh
#
# Needs: Debian bookworm (or the suite of the host), root, Debian's package mirror and
# PyPI; no image registry. Installs podman, runc, mmdebstrap, podman-compose and
# docker-compose with apt when they are missing. README.md here says what each compose
# tool can and cannot do with podman 4.3, and lists every deviation from the shipped files.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
T0=$(date +%s)
say() { printf '\n=== [%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

COMPOSE_TOOL=${COMPOSE_TOOL:-podman-compose}
case $COMPOSE_TOOL in podman-compose|docker-compose) ;; *)
    echo "COMPOSE_TOOL is podman-compose or docker-compose" >&2; exit 2 ;; esac

need=()
for tool in podman runc mmdebstrap podman-compose docker-compose; do
    command -v "$tool" >/dev/null || need+=("$tool")
done
if [ ${#need[@]} -gt 0 ]; then
    say "apt-get install ${need[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${need[@]}" uidmap slirp4netns netavark aardvark-dns
fi

. "$HERE/podman-env.sh"
PROJECT=${PROJECT:-merlinpodman}
SOCK=$WORKDIR/podman.sock
export MERLIN_REPOS=$WORKDIR/repos
export MERLIN_FLOWER_BASIC_AUTH=${MERLIN_FLOWER_BASIC_AUTH:-admin:$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export MERLIN_UI_TOKEN=${MERLIN_UI_TOKEN:-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}
# Not the compose default `merlin`: merlin redacts the database password from all it
# stores, and a password that is also a word merlin writes (its branch names
# merlin/<job>, worker names, /home/merlin) corrupts those: every job then fails with
# "the job branch [REDACTED]/<job> was moved by someone else". See README.md.
export POSTGRES_PASSWORD=${POSTGRES_PASSWORD:-pw$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')}

files=(-f "$HERE/compose.podman.yaml")
# The worker roles' bubblewrap options, unless the shipped file has its own.
if ! grep -Eq 'systempaths=unconfined|unmask=' "$ROOT/deploy/compose.yaml"; then
    files+=(-f "$HERE/compose.bwrap.yaml")
fi
for extra in ${EXTRA_COMPOSE:-}; do files+=(-f "$(realpath "$extra")"); done

if [ "$COMPOSE_TOOL" = podman-compose ]; then
    # podman-compose 1.0.3 resolves the file's relative paths (./repos, ./merlin.toml)
    # against the compose file, but hands `seccomp=./x.json` to podman, which resolves it
    # against the current directory: run from deploy/.
    DC=(podman-compose -p "$PROJECT" -f compose.yaml "${files[@]}")
    # It prints the merged file and every podman command: kept in a log.
    dc() { (cd "$ROOT/deploy" && "${DC[@]}" "$@") >>"$WORKDIR/podman-compose.log" 2>&1 \
        || { tail -30 "$WORKDIR/podman-compose.log"; return 1; }; }
    : >"$WORKDIR/podman-compose.log"
else
    export DOCKER_HOST=unix://$SOCK
    # podman 4.3's Docker API takes `seccomp=` as a path, docker-compose sends the
    # profile's content, as Docker's API wants: "opening seccomp profile failed: open
    # {...}: file name too long" (podman issue #27710). A copy without the seccomp
    # option, read with deploy/ as the project directory; podman's default profile
    # allows what bubblewrap needs.
    python3 - "$ROOT/deploy/compose.yaml" "$WORKDIR/compose.no-seccomp.yaml" <<'PY'
import sys
import yaml
spec = yaml.safe_load(open(sys.argv[1]))
for name, service in spec.get("services", {}).items():
    opts = service.get("security_opt")
    if opts:
        kept = [o for o in opts if not o.replace(":", "=", 1).startswith("seccomp=")]
        if kept != opts:
            print(f"{name}: dropped {sorted(set(opts) - set(kept))}")
        service["security_opt"] = kept
spec = {k: v for k, v in spec.items() if not k.startswith("x-")}
yaml.safe_dump(spec, open(sys.argv[2], "w"), sort_keys=False)
PY
    DC=(docker-compose -p "$PROJECT" --project-directory "$ROOT/deploy"
        -f "$WORKDIR/compose.no-seccomp.yaml" "${files[@]}")
    dc() { "${DC[@]}" "$@"; }
fi
exec_llm() { podman exec "${PROJECT}_llm_1" "$@"; }

pids=()
cleanup() {
    local rc=$?
    if [ "${KEEP:-0}" = 1 ]; then
        echo "KEEP=1: stack left running. To stop it:"
        echo "  COMPOSE_TOOL=$COMPOSE_TOOL KEEP=0 $0 --down-only  # or by hand:"
        echo "  kill ${pids[*]}   # podman system service (docker-compose), healthcheck runner"
        return
    fi
    say "cleanup"
    dc down -v >/dev/null 2>&1 || true
    podman network rm -f "${PROJECT}_default" >/dev/null 2>&1 || true
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$MERLIN_REPOS" "$SOCK"
    echo "exit code $rc after $(( $(date +%s) - T0 ))s"
}
if [ "${1:-}" = --down-only ]; then
    [ "$COMPOSE_TOOL" = docker-compose ] && { podman system service --time=0 "unix://$SOCK" & pids+=($!); sleep 2; }
    trap cleanup EXIT
    exit 0
fi
trap cleanup EXIT

say "images (skipped when built: FORCE=1 rebuilds)"
"$HERE/build_images.sh"

say "clean slate"
dc down -v >/dev/null 2>&1 || true
podman network rm -f "${PROJECT}_default" >/dev/null 2>&1 || true
rm -rf "$MERLIN_REPOS" "$SOCK"
install -d -o 1000 -g 1000 "$MERLIN_REPOS"   # the image's `merlin` user is uid 1000

if [ "$COMPOSE_TOOL" = docker-compose ]; then
    say "podman's Docker API on $SOCK"
    podman system service --time=0 "unix://$SOCK" >"$WORKDIR/service.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.2; done
fi

# podman schedules healthchecks with systemd timers; with no systemd (PID 1 here is not
# systemd) they never run and every container stays "starting", so compose's
# `condition: service_healthy` would wait forever. Run each at its own interval instead.
say "healthcheck runner"
(
    declare -A last every
    while :; do
        now=$(date +%s)
        for id in $(podman ps -q --filter "label=com.docker.compose.project=$PROJECT"); do
            if [ -z "${every[$id]:-}" ]; then
                ns=$(podman inspect "$id" --format '{{if .Config.Healthcheck}}{{json .Config.Healthcheck.Interval}}{{end}}' 2>/dev/null || true)
                case $ns in ''|*[!0-9]*) ns=0 ;; esac
                every[$id]=$(( ns / 1000000000 )); last[$id]=0
            fi
            [ "${every[$id]}" -gt 0 ] || continue
            if [ $(( now - ${last[$id]} )) -ge "${every[$id]}" ]; then
                podman healthcheck run "$id" >/dev/null 2>&1 || true
                last[$id]=$now
            fi
        done
        sleep 2
    done
) &
pids+=($!)

wait_for() {  # wait_for SERVICE healthy|exited0
    local c=${PROJECT}_$1_1 s
    for _ in $(seq 150); do
        case $2 in
            healthy) s=$(podman inspect "$c" --format '{{.State.Health.Status}}' 2>/dev/null || true)
                     [ "$s" = healthy ] && return 0 ;;
            exited0) s=$(podman inspect "$c" --format '{{.State.Status}} {{.State.ExitCode}}' 2>/dev/null || true)
                     [ "$s" = "exited 0" ] && return 0
                     case $s in exited*) echo "$c: $s" >&2; podman logs "$c" >&2; return 1 ;; esac ;;
        esac
        sleep 1
    done
    echo "$c: not $2 after 150 s" >&2; podman logs --tail 40 "$c" >&2; return 1
}

if [ "$COMPOSE_TOOL" = docker-compose ]; then
    say "docker-compose up -d (depends_on conditions as compose.yaml says)"
    dc up -d --no-build
else
    # podman-compose 1.0.3 ignores depends_on conditions (it starts every service one
    # second after the previous one): the same order, in stages, waiting as compose.yaml says.
    say "podman-compose up, in the order of compose.yaml's depends_on conditions"
    dc up -d --no-build --no-deps redis postgres
    wait_for redis healthy; wait_for postgres healthy
    dc up -d --no-build --no-deps migrate
    wait_for migrate exited0
    dc up -d --no-build --no-deps llm verify flower ui
fi
podman ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}  {{.Status}}'

say "waiting for both worker roles"
for svc in llm verify; do
    for i in $(seq 120); do
        podman logs "${PROJECT}_${svc}_1" 2>&1 | grep -q ' ready\.' && break
        [ "$i" = 120 ] && { podman logs --tail 40 "${PROJECT}_${svc}_1"; exit 1; }
        sleep 1
    done
done
podman logs "${PROJECT}_migrate_1"
for svc in llm verify; do
    podman inspect "${PROJECT}_${svc}_1" --format "$svc: started {{.State.StartedAt}}"
done
podman inspect "${PROJECT}_migrate_1" --format 'migrate: finished {{.State.FinishedAt}}, exit {{.State.ExitCode}}'
podman exec "${PROJECT}_verify_1" sh -c \
    'grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status | tr "\n" " "; echo "masked /proc paths: $(awk "\$5 ~ /^\/proc\// {n++} END {print n+0}" /proc/self/mountinfo)"'
exec_llm merlin doctor || true

# Both jobs' repositories live on the shared volume, made by the workers' user.
say "repositories in /repos"
exec_llm sh -ec '
    g() { git -c user.name=test -c user.email=test@localhost "$@"; }
    cp -r /app/examples/demo/project /repos/calc
    cd /repos/calc && git init -q -b main && g add -A && g commit -q -m "calc: mean() and its tests"'
cp -r "$HERE/probe" "$MERLIN_REPOS/probe-job" && chown -R 1000:1000 "$MERLIN_REPOS/probe-job"
exec_llm sh -ec '
    g() { git -c user.name=test -c user.email=test@localhost "$@"; }
    mkdir /repos/probe && cd /repos/probe && cp /repos/probe-job/probe_sandbox.py . && git init -q -b main
    g add -A && g commit -q -m "the sandbox probe"'

say "merlin submit: the demo TaskList, and the sandbox probe"
demo=$(exec_llm merlin submit /app/examples/demo/tasklist.yaml --repo /repos/calc \
    --config /app/examples/demo/merlin.toml | tail -1)
probe=$(exec_llm merlin submit /repos/probe-job/tasklist.yaml --repo /repos/probe \
    --config /repos/probe-job/merlin.toml | tail -1)
echo "demo job: $demo   probe job: $probe"

status_of() { exec_llm merlin status "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])'; }
for job in "$demo" "$probe"; do
    for i in $(seq 300); do
        s=$(status_of "$job")
        case $s in completed|failed|cancelled|partially_completed|budget_exceeded|parked) break ;; esac
        sleep 2
    done
    say "merlin status $job: $s"
    exec_llm merlin status "$job"
done

say "the probe's exit command output (run by the verify worker, in bwrap)"
exec_llm merlin logs "$probe" --step probe | sed -n '/\$ python probe_sandbox.py/,$p'
say "the demo's job branch"
exec_llm git -C /repos/calc log --oneline "merlin/$demo"
exec_llm git -C /repos/calc diff --stat main "merlin/$demo"
say "healthchecks (podman healthcheck run; the compose tools may have mangled CMD forms)"
for svc in redis postgres llm verify flower ui; do
    printf '%-9s' "$svc"; podman healthcheck run "${PROJECT}_${svc}_1" >/dev/null 2>&1 && echo healthy || echo unhealthy
done
for svc in llm verify; do
    printf '%-9s' "$svc"
    podman exec "${PROJECT}_${svc}_1" python -c "$(python3 -c '
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
test = spec["services"]["llm"].get("healthcheck", {}).get("test") or ["CMD", "true"]
print(test[3] if test[:3] == ["CMD", "python", "-c"] else "pass")' "$ROOT/deploy/compose.yaml")" \
        && echo "its healthcheck script, run as written: exit 0" || echo "its healthcheck script, run as written: FAILED"
done

ok=1
[ "$(status_of "$demo")" = completed ] || ok=0
[ "$(status_of "$probe")" = completed ] || ok=0
if [ $ok = 1 ]; then say "PASS: both jobs completed ($COMPOSE_TOOL)"; else
    say "FAIL: a job did not complete"; podman logs --tail 60 "${PROJECT}_verify_1"; exit 1; fi
