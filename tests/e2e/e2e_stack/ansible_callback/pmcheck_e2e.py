"""An Ansible stdout callback for the e2e suite (e2e_stack/ansible.py): one JSON line per task result,
with its task, its host and what the module returned. Debian's ansible-core 2.14 has no `json`
callback of its own (it moved to the ansible.posix collection)."""

import json

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "pmcheck_e2e"

    def _line(self, status, result):
        line = {"status": status, "task": result._task.get_name(), "host": result._host.get_name()}
        self._display.display(json.dumps({**line, "result": result._result}, default=str))

    def v2_runner_on_ok(self, result):
        self._line("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._line("failed", result)

    def v2_runner_on_unreachable(self, result):
        self._line("unreachable", result)

    def v2_runner_on_skipped(self, result):
        self._line("skipped", result)
