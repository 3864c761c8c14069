"""Real-stack helpers for pmcheck's end-to-end suite (tests/e2e) and for scripts/demo.

Everything here drives real programs: Puppet Server (java, as user puppet), HAProxy (foreground,
with an admin socket), xinetd (foreground), Prometheus, real Puppet agents and the pmcheck
binary. All traffic stays on loopback. Every process is started in its own session so that it
(and anything it forked) can be stopped by its PID / process group id, never by name.

One module per component; this package re-exports what the tests and scripts/demo use:

    proc          processes, waits, ports, the environment, Debian packages, a sampler thread
    clients       HTTP, HTTPS and raw TCP clients
    pki           Puppet identities: the host's settings, a test's CA signing with openssl
    puppetserver  the Puppet Server driver (the host's, or a compile master of its own), Tuning
    ctl           a Puppet Server JVM started, checked and stopped by its pidfile
    pmcheck       the binary under test and its daemons
    haproxy       HAProxy and its admin socket; the shipped config rendered for loopback
    xinetd        xinetd and the shipped service file
    prometheus    Prometheus and its HTTP API
    agents        real `puppet agent` runs and loops
    ansible       the shipped Ansible rolling restart, run over a fleet's masters
    fleet         two compile masters behind one HAProxy (the fleet tests, scripts/soak), its watchers
    stubs         stand-ins for pmcheck's check and agent ports
    versions      the Debian release and its components' versions (Debian 12 or 13)
"""

from .agents import ENVIRONMENTS, AgentLoop, AgentRunRecord, agent_run, slow_environment
from .ansible import PLAYBOOK, Roll, ansible_roll, local_hosts
from .clients import Reply, TLSReply, http_request, https_request, raw_http, tls_context
from .fleet import (
    ADMIN_CERTNAME,
    COMPILE_SECONDS,
    Cycle,
    Fleet,
    Flush,
    HAProxyWatch,
    NodeWatch,
    Said,
    compile_in_flight,
    errors_of,
    others_take_agents,
    plain_tcp_check,
    rss_mib,
    run_cycle,
    run_times,
    serving,
    sessions_ended,
    start_agent_loops,
)
from .haproxy import (
    HAProxy,
    is_down_503,
    is_up_checked,
    release_of,
    render_haproxy,
    status_check,
    summary,
    view,
)
from .pki import Identity, PuppetSettings, ca_sign, puppet_settings
from .pmcheck import Pmcheck, PmcheckServe
from .proc import (
    LB_KEY,
    LB_KEY_PLACEHOLDER,
    LOOPBACK,
    Sampler,
    StackError,
    clean_env,
    free_port,
    install_packages,
    lb_key_file,
    missing_packages,
    port_accepts,
    stop_pid,
    stop_strays,
    tail,
    wait_until,
)
from .prometheus import Prometheus
from .puppetserver import (
    LB_NAME,
    PUPPET_PORT,
    PUPPETSERVER_JAR,
    PuppetServer,
    Tuning,
    master_tuning,
    session_tuning,
)
from .stubs import AgentLineStub, HttpStatusStub
from .versions import Stack, stack
from .xinetd import Xinetd, ensure_system_user, render_xinetd, xinetd_attrs

__all__ = [
    "ADMIN_CERTNAME",
    "COMPILE_SECONDS",
    "ENVIRONMENTS",
    "LB_NAME",
    "LB_KEY",
    "LB_KEY_PLACEHOLDER",
    "LOOPBACK",
    "PLAYBOOK",
    "PUPPETSERVER_JAR",
    "PUPPET_PORT",
    "AgentLineStub",
    "AgentLoop",
    "AgentRunRecord",
    "Cycle",
    "Fleet",
    "Flush",
    "HAProxy",
    "HAProxyWatch",
    "HttpStatusStub",
    "Identity",
    "NodeWatch",
    "Pmcheck",
    "PmcheckServe",
    "Prometheus",
    "PuppetServer",
    "PuppetSettings",
    "Reply",
    "Roll",
    "Said",
    "Sampler",
    "Stack",
    "StackError",
    "TLSReply",
    "Tuning",
    "Xinetd",
    "agent_run",
    "ansible_roll",
    "local_hosts",
    "ca_sign",
    "clean_env",
    "compile_in_flight",
    "ensure_system_user",
    "errors_of",
    "free_port",
    "http_request",
    "https_request",
    "install_packages",
    "lb_key_file",
    "is_down_503",
    "is_up_checked",
    "master_tuning",
    "missing_packages",
    "others_take_agents",
    "plain_tcp_check",
    "port_accepts",
    "puppet_settings",
    "raw_http",
    "release_of",
    "render_haproxy",
    "render_xinetd",
    "rss_mib",
    "run_cycle",
    "run_times",
    "serving",
    "session_tuning",
    "sessions_ended",
    "slow_environment",
    "stack",
    "start_agent_loops",
    "status_check",
    "stop_pid",
    "stop_strays",
    "summary",
    "tail",
    "tls_context",
    "view",
    "wait_until",
    "xinetd_attrs",
]
