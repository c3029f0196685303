#!/bin/sh
# Flower's tasks page at 1600x900 (docs/images/flower-tasks.png) after `merlin demo --submit`
# (a failed verification, its fix, an escalation), on a Redis server, a worker and a
# MERLIN_HOME of its own, all removed at the end. Needs redis-server, bubblewrap and
# Debian's chromium. Usage: scripts/flower_screenshot.sh [out.png]
set -eu
out=$(realpath -m "${1:-docs/images/flower-tasks.png}")
tmp=$(mktemp -d)
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
redis_port=$(port)
flower_port=$(port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" >/dev/null &
pids=$!
trap 'kill $pids 2>/dev/null || true; wait; rm -rf "$tmp"' EXIT
export MERLIN_HOME="$tmp/home" MERLIN_BROKER_URL="redis://127.0.0.1:$redis_port/0" TMPDIR="$tmp"
sleep 1
merlin flower --port "$flower_port" >"$tmp/flower.log" 2>&1 &
pids="$pids $!"
merlin worker --concurrency 2 >"$tmp/worker.log" 2>&1 &
pids="$pids $!"
sleep 3  # Flower listens before the job's first task
merlin demo --submit >"$tmp/demo.log" 2>&1 || { cat "$tmp/demo.log"; exit 1; }
sleep 2  # the finalize task's events
# --no-sandbox: Chromium's own sandbox refuses to run as root (a container, CI).
chromium --headless --no-sandbox --hide-scrollbars --virtual-time-budget=5000 \
  --window-size=1600,900 --screenshot="$out" "http://127.0.0.1:$flower_port/tasks" 2>/dev/null
