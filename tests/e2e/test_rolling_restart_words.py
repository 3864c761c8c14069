"""The shipped playbook's words (packaging/ansible/rolling-restart.yml), without a stack: a real
`ansible-playbook` over two local masters whose `pmcheck` is a stand-in. It hands `roll` to the
real pmcheck (which refuses a reason it would not take), answers `status` with a master UP in one
load balancer, and fails every `cycle` (exit 3), so that the play stops on the first master and
prints its advice.

The audit of the roll: a multi-line pmcheck_command made a reason pmcheck refuses (the play
never began), and a path with a space or a quote broke the commands the play advises.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys

import pytest

import e2e_stack as st
from conftest import unavailable

STAND_IN = """#!{python}
import json, subprocess, sys
args = sys.argv[1:]
with open({calls!r}, "a") as calls:
    calls.write(json.dumps(args) + "\\n")
if args[0] == "roll":
    sys.exit(subprocess.run([{real!r}, *args]).returncode)
if args[0] == "status":
    seen = dict(health="UP", transition=None, weight=100, node="lb1", backend="bk", server="m")
    poller = dict(proof="key", states=[dict(last_ms_ago=5, seen=seen)])
    progress = dict(in_rotation=True, undrain=dict(pending=[]))
    print(json.dumps(dict(verdict="OK", reason="stand-in", pollers=[poller], progress=progress)))
    sys.exit(0)
sys.exit(3)
"""


@pytest.mark.ci_on("debian12")
def test_a_multi_line_command_rolls_and_the_advice_is_quoted(pmcheck_bin, testdir):
    if shutil.which("ansible-playbook") is None:
        unavailable("ansible-playbook is missing (Debian's package ansible-core; scripts/e2e installs it)")
    calls = testdir / "calls.jsonl"
    stand_in = testdir / "pmcheck stand-in"
    stand_in.write_text(STAND_IN.format(python=sys.executable, calls=str(calls), real=pmcheck_bin))
    stand_in.chmod(0o755)
    command = "set -e\n" + "".join(f"echo 'step {i}'\n" for i in range(40))
    hosts = {}
    for name in ["a", "b"]:
        state = testdir / f"state of {name}'s pmcheck"
        state.mkdir()
        hosts[name] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "pmcheck_bin": str(stand_in),
            "pmcheck_url": "http://127.0.0.1:9/",
            "pmcheck_state_dir": str(state),
            "pmcheck_command": command,
        }
    roll = st.ansible.ansible_roll(hosts, testdir / "ansible", timeout=300)
    assert roll.code != 0, roll.describe()
    said = [json.loads(line) for line in calls.read_text().splitlines()]
    cycles = [args for args in said if args[0] == "cycle"]
    assert len(cycles) == 1, f"one cycle, on a: {said}\n{roll.describe()}"
    reasons = [args[args.index("--reason") + 1] for args in said if "--reason" in args]
    assert len(reasons) == 5, said  # the marks on a and b, each renewed once, and the cycle
    for reason in reasons:
        assert "\n" not in reason and 0 < len(reason) <= 256, reason
    assert cycles[0][-1] == command, "the command itself runs as written"

    # The advice, each command in backquotes, is what a shell splits back into its argv.
    advice = re.findall(r"`([^`]*)`", roll.failed["a"])
    state = hosts["a"]["pmcheck_state_dir"]
    assert [shlex.split(c) for c in advice] == [
        [str(stand_in), "status", "--url", "http://127.0.0.1:9/"],
        [str(stand_in), "undrain", "--state-dir", state],
    ], roll.failed["a"]
