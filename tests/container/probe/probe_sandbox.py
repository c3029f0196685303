"""Exit 0 only inside merlin's bubblewrap sandbox (run as a step's exit command)."""

import os
import sys
from pathlib import Path

interfaces = [
    line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]
]
checks = {
    "cwd is /workspace": os.getcwd() == "/workspace",
    "own PID namespace (pid < 10)": os.getpid() < 10,
    "no network but lo": interfaces == ["lo"],
    "no MERLIN_HOME": not any(
        Path(p).exists() for p in ("/var/lib/merlin", "/home/merlin/.merlin")
    ),
    "no worker secrets in env": not any(k.startswith("MERLIN_DATABASE") for k in os.environ),
    "root fs read-only": not os.access("/usr", os.W_OK),
}
for name, ok in checks.items():
    print(("ok   " if ok else "FAIL ") + name)
print("pid", os.getpid(), "uid", os.getuid(), "cwd", os.getcwd())
sys.exit(0 if all(checks.values()) else 1)
