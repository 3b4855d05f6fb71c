//! The `throng` command line: parses flags, sets up logging, and maps errors to
//! exit codes. Everything it runs lives in the library.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use throng::config::{self, ServeArgs, ServeConfig};
use throng::os;
use throng::server;
use throng::stats;

#[derive(Debug, Parser)]
#[command(
    name = "throng",
    version,
    about = "Hold huge numbers of real-time connections (WebSocket), and prove it",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server (echo at ws://HOST/echo, channels at ws://HOST/ws/CHANNEL)
    Serve(ServeArgs),
    /// Publish one message through the HTTP API and print its seq
    Pub(PubArgs),
    /// Load-generate against any WebSocket server (echo, idle, push, chat)
    Bench(throng::bench::BenchArgs),
    /// Check the OS limits for N connections, print the fixes; --apply sets what it can
    /// (exit status 1 while something still stops N connections)
    Tune(throng::tune::TuneArgs),
}

#[derive(Debug, clap::Args)]
struct PubArgs {
    /// Channel to publish to
    channel: String,
    /// The message; `-` or nothing reads it from standard input
    message: Option<String>,
    /// The server's HTTP address
    #[arg(long, env = "THRONG_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Bearer key, when the server runs with --api-key. A secret: on the command
    /// line `ps` shows it to every local user, so prefer THRONG_API_KEY
    #[arg(
        long,
        env = "THRONG_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// Send as a binary message (default: text)
    #[arg(long)]
    binary: bool,
    /// Seconds to wait for the server
    #[arg(long, default_value = "10", value_name = "SECONDS")]
    timeout: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode> {
    let args: Vec<String> = std::env::args().collect();
    let mut cmd = Cli::command();
    if let Some(path) = config::config_path_from(&args) {
        cmd = config::apply_config_file(cmd, &path)?;
    }
    let matches = cmd.get_matches_from(&args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Serve(serve_args) => {
            let config = serve_args.into_config()?;
            if config.workers > 1 && !throng::workers::is_worker() {
                supervise(&config)?;
            } else {
                serve(config)?;
            }
        }
        Command::Pub(args) => publish(args)?,
        Command::Bench(args) => throng::bench::run(args)?,
        Command::Tune(args) => {
            if !throng::tune::run(&args)? {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn publish(args: PubArgs) -> Result<()> {
    use std::io::Read;
    throng::rules::validate_channel_name(&args.channel)
        .with_context(|| format!("bad channel name '{}'", args.channel))?;
    let body = match args.message.as_deref() {
        None | Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read the message from standard input")?;
            buf
        }
        Some(text) => text.as_bytes().to_vec(),
    };
    let url = throng::client::HttpUrl::parse(&args.url)?;
    let content_type = if args.binary {
        "application/octet-stream"
    } else {
        "text/plain; charset=utf-8"
    };
    let auth = args.api_key.as_ref().map(|k| format!("Bearer {k}"));
    let mut headers = vec![("Content-Type", content_type)];
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth.as_str()));
    }
    let response = throng::client::request(
        &url,
        "POST",
        &format!("/api/publish/{}", args.channel),
        &headers,
        &body,
        Duration::from_secs(args.timeout),
    )?;
    let parsed: Option<serde_json::Value> = serde_json::from_slice(&response.body).ok();
    if response.status != 200 {
        let reason = parsed
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(|e| e.as_str())
            .map(String::from)
            .unwrap_or_else(|| String::from_utf8_lossy(&response.body).into_owned());
        anyhow::bail!("server answered {}: {reason}", response.status);
    }
    let seq = parsed
        .as_ref()
        .and_then(|v| v.get("seq"))
        .and_then(|s| s.as_u64())
        .context("server's answer has no seq")?;
    println!("{seq}");
    Ok(())
}

/// `--workers N`: this process runs N serving processes and keeps them running.
fn supervise(config: &ServeConfig) -> Result<()> {
    if config.broker == config::BrokerSpec::Memory {
        anyhow::bail!(
            "--workers {} needs --broker redis://host:port: workers fan out to each other through the broker, and the memory broker is one process's",
            config.workers
        );
    }
    if !config.reuse_port {
        // The workers share the ports with each other, so each skips this check.
        server::check_ports_free(&config.listen)?;
    }
    // Port 0 is picked here, once, so that every worker listens on the same port.
    let reserved = throng::workers::reserve_ports(&config.listen)?;
    let limit = os::raise_open_files_limit().context("cannot read the open-files limit")?;
    let per_worker = limit.connection_ceiling(config.listen.len() * config.threads);
    tracing::info!(
        "{} workers on {}, joined through Redis: at most ~{} connections each, ~{} in all",
        config.workers,
        listen_ranges(&reserved.addrs).join(", "),
        os::thousands(per_worker),
        os::thousands(per_worker * config.workers as u64)
    );
    warn_if_limited(config.max_conns, per_worker, config.workers);
    throng::workers::supervise(
        config.workers,
        config.drain_timeout,
        &reserved.addrs,
        || announce_listening(&reserved.addrs),
    )?;
    Ok(())
}

fn serve(mut config: ServeConfig) -> Result<()> {
    if throng::workers::is_worker() {
        // Its master checked that no other process holds the ports; the other
        // workers hold them too.
        config.reuse_port = true;
        if let Some(listen) = throng::workers::inherited_listen()? {
            config.listen = listen;
        }
    }
    let limit = os::raise_open_files_limit().context("cannot read the open-files limit")?;
    let listeners = config.listen.len() * config.threads;
    let stats_interval = config.stats_interval;
    let summary = limits_summary(&config);
    let threads = config.threads;
    // Handlers go in before the listeners exist, so a signal that arrives as soon
    // as the port answers still drains instead of killing the process.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
    .context("cannot install signal handlers")?;
    // Before any loop or thread reads a timer.
    throng::timing::set_test_time_scale(config.test_time_scale)?;
    if config.test_time_scale != 1.0 {
        tracing::warn!(
            "testing only: the server's timers run at {} of their time (--test-time-scale)",
            config.test_time_scale
        );
    }
    let handle = server::start(config.clone()).context("cannot start the server")?;

    for range in listen_ranges(handle.local_addrs()) {
        tracing::info!("listening on {range}");
    }
    if !throng::workers::is_worker() {
        // The master of --workers says it once for all of them.
        announce_listening(handle.local_addrs());
    }
    let broker = handle.broker();
    tracing::info!(threads, "I/O threads: {threads}; broker: {broker}");
    if let Some(index) = std::env::var_os(throng::workers::WORKER_ENV) {
        tracing::info!(
            "worker {}, pid {}",
            index.to_string_lossy(),
            std::process::id()
        );
    }
    tracing::info!("limits: {summary}");
    if config.api_key.is_none() {
        tracing::info!("publish API: no --api-key set, accepting loopback peers only");
    }
    match &config.token_secret {
        Some(secret) => {
            tracing::info!("subscribing needs an HS256 token (--token-secret); echo does not");
            if secret.len() < 32 {
                tracing::warn!(
                    "--token-secret is {} bytes: HS256 wants at least 32 random bytes",
                    secret.len()
                );
            }
        }
        None => tracing::info!("subscriptions: no --token-secret set, anyone may subscribe"),
    }
    if !config.trusted_proxies.is_empty() {
        let proxies: Vec<String> = config
            .trusted_proxies
            .iter()
            .map(|p| p.to_string())
            .collect();
        tracing::info!(
            "X-Forwarded-For believed from: {} (the client it names is who publishes and counts per IP)",
            proxies.join(", ")
        );
    }
    if !config.allowed_origins.is_empty() {
        tracing::info!(
            "browser pages allowed from: {}",
            config.allowed_origins.join(", ")
        );
    }
    tracing::info!(
        "open-files limit {}: at most ~{} connections in this process",
        limit.soft,
        os::thousands(limit.connection_ceiling(listeners))
    );
    if limit.soft < limit.hard {
        tracing::warn!(
            "could not raise the open-files soft limit to the hard limit {}",
            limit.hard
        );
    }
    if !throng::workers::is_worker() {
        warn_if_limited(config.max_conns, limit.connection_ceiling(listeners), 1);
    }

    match &config.tls {
        Some(files) => tracing::info!(
            "TLS on every listener (wss://, https://): {} (SIGHUP reads it again)",
            files.cert.display()
        ),
        None => tracing::info!("TLS: off (--tls-cert, --tls-key)"),
    }
    let stopper = handle.stopper();
    let certificates = handle.tls();
    let drain = config.drain_timeout;
    std::thread::Builder::new()
        .name("throng-signals".into())
        .spawn(move || {
            let mut seen = 0;
            for signal in signals.forever() {
                if signal == signal_hook::consts::SIGHUP {
                    reload_certificates(certificates.as_deref());
                    continue;
                }
                seen += 1;
                if seen == 1 {
                    tracing::info!(
                        signal,
                        "shutting down: closing clients with 1001, draining for up to {drain:?}"
                    );
                    stopper.stop();
                } else {
                    tracing::warn!("second signal: exiting now");
                    std::process::exit(1);
                }
            }
        })
        .context("cannot start the signal thread")?;

    if !stats_interval.is_zero() {
        print_stats_until_shutdown(&handle, stats_interval);
    }
    handle.join().context("server stopped with an error")?;
    tracing::info!("stopped");
    Ok(())
}

/// The one line on stdout a program that started this server reads to learn
/// the addresses it is bound to (port 0 resolved): `listening on ADDR[ ADDR…]`.
fn announce_listening(addrs: &[std::net::SocketAddr]) {
    let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    println!("listening on {}", addrs.join(" "));
}

/// SIGHUP: new TLS handshakes use the certificate and key as the files now
/// hold them; open connections keep theirs. A bad file keeps the old pair.
fn reload_certificates(certificates: Option<&throng::tls::config::Certificates>) {
    match certificates.map(|c| c.reload()) {
        None => tracing::info!("SIGHUP: no --tls-cert to reload; ignored"),
        Some(Ok(())) => tracing::info!("SIGHUP: TLS certificate and key reloaded"),
        Some(Err(e)) => tracing::warn!(
            error = %e,
            "SIGHUP: TLS reload failed; new handshakes keep the previous certificate"
        ),
    }
}

/// One line pointing to `throng tune` when `--max-conns` (per process) is more than
/// the open-files limit lets each of `processes` hold.
fn warn_if_limited(max_conns: Option<usize>, ceiling: u64, processes: usize) {
    if let Some(max) = max_conns.map(|m| m as u64)
        && max > ceiling
    {
        tracing::warn!(
            "--max-conns {} is more than the open-files limit lets a process hold (~{}): {}",
            os::thousands(max),
            os::thousands(ceiling),
            throng::tune::hint(max * processes as u64)
        );
    }
}

fn print_stats_until_shutdown(handle: &server::ServerHandle, interval: Duration) {
    let mut before = handle.stats().snapshot();
    let mut since = Instant::now();
    let mut next = since + interval;
    while !handle.is_shutting_down() {
        std::thread::sleep(Duration::from_millis(100).min(interval));
        if Instant::now() < next {
            continue;
        }
        let now = handle.stats().snapshot();
        let block = stats::format_block(&now, &before, since.elapsed().as_secs_f64());
        println!("{block}");
        before = now;
        since = Instant::now();
        next = since + interval;
    }
}

fn limits_summary(c: &ServeConfig) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "none".into());
    format!(
        "max-message-size {} B, max-queue {} B, max-conns {}, max-conns-per-ip {}, ping-interval {:?}, idle-timeout {:?}, handshake-timeout {:?}",
        c.max_message_size,
        c.max_queue,
        opt(c.max_conns.map(|v| v.to_string())),
        opt(c.max_conns_per_ip.map(|v| v.to_string())),
        c.ping_interval,
        c.idle_timeout,
        c.handshake_timeout
    )
}

/// Collapses consecutive ports on one IP into `ip:first-last (N listeners)`.
fn listen_ranges(addrs: &[std::net::SocketAddr]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < addrs.len() {
        let start = addrs[i];
        let mut j = i;
        while j + 1 < addrs.len()
            && addrs[j + 1].ip() == start.ip()
            && addrs[j + 1].port() == addrs[j].port().wrapping_add(1)
        {
            j += 1;
        }
        if j == i {
            out.push(start.to_string());
        } else {
            out.push(format!(
                "{}-{} ({} listeners)",
                start,
                addrs[j].port(),
                j - i + 1
            ));
        }
        i = j + 1;
    }
    out
}
