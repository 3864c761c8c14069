//! The manual, pmcheck(1), generated from the clap definitions so that it never drifts from
//! `--help`.

use std::collections::BTreeSet;
use std::io::{self, Write};

use clap::CommandFactory;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, roman};

use crate::cli::Cli;
use crate::exit::Exit;

/// pmcheck(1): the top-level page, then every command with its options, then exit status,
/// environment, files and examples.
pub fn man(out: &mut dyn Write) -> io::Result<()> {
    let cli = Cli::command();
    let page = Man::new(cli.clone());
    page.render_title(out)?;
    page.render_name_section(out)?;
    page.render_synopsis_section(out)?;
    page.render_description_section(out)?;

    commands(&cli, out)?;
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for exit in Exit::ALL {
        roff.control("TP", [])
            .text([bold(exit.code().to_string())])
            .text([roman(exit.meaning())]);
    }
    roff.control("SH", ["SIGNALS"])
        .text([bold("serve"), roman(" stops gracefully on SIGTERM and SIGINT, re-reads the certificate, key, CA and the drain record at once on SIGHUP (it also notices changes by itself within a second; Puppet Server's listener is read at start only, and a SIGHUP says when webserver.conf names another: restart to move the probe), and ignores SIGUSR1 and SIGUSR2.")])
        .control("SH", ["ENVIRONMENT"])
        .text([roman("Every option also reads an environment variable, so a systemd EnvironmentFile configures the daemon; a flag beats its variable. RUST_LOG sets the log level (default info). NOTIFY_SOCKET, WATCHDOG_USEC, LISTEN_FDS and LISTEN_PID are read as systemd sets them.")]);
    // Every option's variable and long name, from the clap definitions, so the list cannot
    // drift from the options; sorted by variable.
    let environment: BTreeSet<(String, String)> = (cli.get_subcommands())
        .flat_map(clap::Command::get_arguments)
        .filter_map(|arg| {
            let var = arg.get_env()?.to_string_lossy().into_owned();
            Some((var, arg.get_long()?.to_owned()))
        })
        .collect();
    for (var, option) in environment {
        roff.control("TP", [])
            .text([bold(var)])
            .text([roman(format!("--{option}"))]);
    }
    roff.control("SH", ["FILES"])
        .text([bold("/var/lib/pmcheck/drain"), roman(": the drain record (JSON: its holders, each with kind, by, since, until, what, checked, forced; one written by hand: reason, by, since, until). Only a regular file of at most 8 KiB counts; anything else there (a symlink, FIFO, device, directory) makes the daemon answer 503 UNKNOWN until it is removed.")])
        .control("PP", [])
        .text([bold("/var/lib/pmcheck/roll"), roman(": a rolling restart's mark (pmcheck roll begin): drains nothing; no other roll begins while it is there and has not lapsed.")])
        .control("PP", [])
        .text([bold("/var/lib/pmcheck/ramp"), roman(": when the slow start under way began, so that a restarted daemon resumes it.")])
        .control("PP", [])
        .text([bold("/etc/default/pmcheck"), roman(" ("), bold("/etc/sysconfig/pmcheck"), roman(" on RPM systems): the daemon's settings, read by pmcheck.service (EnvironmentFile=); not read by commands run in a shell.")])
        .control("PP", [])
        .text([bold("/etc/puppetlabs/puppet/puppet.conf"), roman(", "), bold("/etc/puppet/puppet.conf"), roman(": where the certname, hostcert, hostprivkey, localcacert and serverport come from.")])
        .control("PP", [])
        .text([bold("/etc/puppetlabs/puppetserver/conf.d"), roman(", "), bold("/etc/puppet/puppetserver/conf.d"), roman(": Puppet Server's webserver.conf (where it listens) and puppetserver.conf (jruby-puppet.multithreaded).")])
        .control("SH", ["EXAMPLES"])
        .text([roman("Take the node out of HAProxy's pool for an hour, check, put it back:")])
        .control("PP", [])
        .control("nf", [])
        .text([roman("sudo pmcheck drain --reason \"upgrading puppetserver\" --for 1h\npmcheck status\nsudo pmcheck undrain")])
        .control("fi", [])
        .control("PP", [])
        .text([roman("Drain and return once every load balancer has taken the node out and no agent is connected, so that Puppet Server can be stopped:")])
        .control("PP", [])
        .control("nf", [])
        .text([roman("sudo pmcheck drain --reason \"kernel update\" --wait && sudo systemctl stop puppetserver")])
        .control("fi", [])
        .control("PP", [])
        .text([roman("Restart Puppet Server without failing an agent run: drain, wait, restart, wait until it compiles, undrain, wait (the node stays drained if anything fails):")])
        .control("PP", [])
        .control("nf", [])
        .text([roman("sudo pmcheck cycle --reason \"puppetserver restart\" -- systemctl restart puppetserver")])
        .control("fi", [])
        .control("PP", [])
        .text([roman("Read this page from a build without the package: pmcheck generate man | man -l -")])
        .control("PP", [])
        .text([roman("HAProxy backend: mode tcp, option httpchk, server compile01 compile01:8140 check port 9200 inter 2s rise 3 fall 3.")]);
    roff.to_writer(out)?;
    page.render_version_section(out)
}

/// Every command with its options, each in its own subsection.
fn commands(cli: &clap::Command, out: &mut dyn Write) -> io::Result<()> {
    Roff::new().control("SH", ["COMMANDS"]).to_writer(out)?;
    for sub in cli.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("pmcheck {}", sub.get_name());
        let mut roff = Roff::new();
        roff.control("SS", [name.as_str()]);
        if let Some(about) = sub.get_long_about().or(sub.get_about()) {
            roff.text([roman(about.to_string())]);
        }
        roff.to_writer(out)?;
        // clap_mangen renders options under an OPTIONS heading of their own; here they belong
        // to the command's subsection.
        let mut options = Vec::new();
        Man::new(sub.clone()).render_options_section(&mut options)?;
        let options = String::from_utf8_lossy(&options);
        for line in options.lines().filter(|l| !l.starts_with(".SH")) {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}
