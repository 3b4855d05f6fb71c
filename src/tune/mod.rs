//! `throng tune`: what N connections need from this machine's operating system.
//!
//! It owns reading the limits that decide how many connections one machine holds
//! (this process's open-files limits, a few `/proc/sys` values, `MemAvailable`),
//! judging each against what N connections need from the per-socket figures measured
//! on this machine (docs/TUNE.md), printing the exact commands that fix what is too
//! low, and, with `--apply` only, writing the `/proc/sys` values that are too low.
//! It must not touch anything else: it writes no file under `/etc` (it prints what
//! to put there), leaves every open-files limit as it found it, and changes nothing
//! in how `serve` or `bench` run. All reading and writing goes through [`System`],
//! so tests can feed it a made-up machine.
//!
//! The pieces, in the order a run uses them:
//! - `system`: what this machine has, read from the OS ([`System`], [`Machine`]);
//! - `plan`: what N connections need, judged against it ([`check`], [`Report`]);
//! - `apply`: `--apply`, writing the sysctls that are too low ([`apply`]);
//! - `render`: the report as text ([`render`]).
//!
//! This module is the command itself: its flags, [`tune`] and [`run`], and the two
//! helpers `serve` and `bench` call ([`hint`], [`ephemeral_ports`]). It sits below
//! `bench` and imports nothing from it: [`Transport`] is tune's own.

mod apply;
mod plan;
mod render;
mod system;
#[cfg(test)]
mod tests;

use std::io;

pub use apply::apply;
pub use plan::Outcome;
pub use plan::{
    Fixes, IO_URING_BYTES_PER_CONN, Item, KERNEL_BYTES_PER_SOCKET, Memory, Plan, Ports, Report,
    TCP_PAGES_PER_BUSY_SOCKET, Transport, Verdict, Want, check,
};
pub use render::render;
pub use system::{Host, Machine, System};

/// `throng tune` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct TuneArgs {
    /// Connections this machine should hold
    #[arg(long, value_name = "N", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub conns: u64,
    /// Write the /proc/sys values that are too low (until reboot) and say what could
    /// not be set
    #[arg(long)]
    pub apply: bool,
    /// throng bench runs on this machine too (over loopback): count its sockets,
    /// descriptors and memory as well
    #[arg(long)]
    pub loopback: bool,
    /// What the connections are, for throng's memory per connection
    #[arg(long, value_enum, default_value = "ws")]
    pub transport: Transport,
    /// Print one JSON object instead of the text
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: cannot make sense of {text:?}")]
    Parse { path: String, text: String },
    #[error("cannot read the open-files limit")]
    Limit(#[source] io::Error),
}

/// The line `serve` and `bench` print when a limit will stop them.
pub fn hint(conns: u64) -> String {
    format!("`throng tune --conns {conns}` says what to raise, or how to spread the connections")
}

/// Ports one source address can use towards one server port (`ip_local_port_range`).
pub fn ephemeral_ports() -> Option<u64> {
    let [low, high] = system::numbers(&Host, &system::proc_path(system::PORT_RANGE)).ok()?;
    (high >= low).then(|| high - low + 1)
}

/// Reads `sys`, judges it, and with `apply` sets what it can and judges again.
pub fn tune(sys: &mut impl System, want: Want, apply_fixes: bool) -> Result<Report, TuneError> {
    let report = check(&Machine::read(sys)?, want);
    if !apply_fixes {
        return Ok(report);
    }
    let applied = apply(sys, &report);
    let mut after = check(&Machine::read(sys)?, want);
    after.applied = applied;
    // What was set now must still go into /etc/sysctl.d to outlive a reboot.
    after.fixes.sysctl_conf = report.fixes.sysctl_conf;
    Ok(after)
}

/// Runs `throng tune`: prints the report; `Ok(true)` when nothing stops N connections.
pub fn run(args: &TuneArgs) -> Result<bool, TuneError> {
    let want = Want {
        conns: args.conns,
        loopback: args.loopback,
        transport: args.transport,
    };
    let report = tune(&mut Host, want, args.apply)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", render(&report, args.apply));
    }
    Ok(report.ok)
}
