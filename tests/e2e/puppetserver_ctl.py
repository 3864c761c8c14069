#!/usr/bin/env python3
"""Start, stop or restart one Puppet Server of the e2e suite, by its pidfile, as systemctl would.

    puppetserver_ctl.py start|stop|restart SPEC.json

SPEC.json is written by e2e_stack.PuppetServer (the JVM's command, environment, log, restart
file, pidfile, address and certname). `restart` is what `pmcheck cycle` runs as its COMMAND:
it stops the JVM by the PID in the pidfile (SIGTERM to its process group), starts a new one
detached (its own session, so it outlives this program), writes its PID to the pidfile at once,
and returns when Puppet Server is ready (restart file 1 and `/status/v1/simple` running).
Exit 0 on success, 1 with the reason on stderr otherwise. The work is e2e_stack/ctl.py's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_stack import ctl  # noqa: E402
from e2e_stack.proc import StackError  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop", "restart"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 64
    action, spec = argv[0], json.loads(Path(argv[1]).read_text())
    name = spec["name"]
    try:
        if action in ("stop", "restart"):
            took = ctl.stop(spec)
            print(
                f"puppetserver_ctl: {name}: "
                + ("was not running" if took is None else f"stopped in {took:.1f}s"),
                flush=True,
            )
        if action in ("start", "restart"):
            took, _ = ctl.start(spec)
            pid = ctl.running_pid(spec)
            print(f"puppetserver_ctl: {name}: started (pid {pid}), ready in {took:.1f}s", flush=True)
    except (StackError, TimeoutError, OSError) as e:
        print(f"puppetserver_ctl: {name}: {action} failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
