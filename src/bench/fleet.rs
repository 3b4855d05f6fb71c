//! Who holds the connections: this process's event-loop threads
//! ([`LocalFleet`]), or `--procs` child processes ([`ChildFleet`]) that each run a
//! local fleet and talk to the parent over their stdin/stdout, one JSON object
//! (or command word) per line.
//!
//! It owns threads, child processes and that line protocol. It must not decide
//! the run's timeline or format reports: the driver (`driver.rs`) moves phases
//! through the [`Fleet`] trait and reads counters and results from it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::BenchError;
use super::client::{ClientLoop, Control, Live, Plan, phase};
use super::report::{self, Counters, RawResult};

/// What the driver needs from whoever holds the connections.
pub trait Fleet {
    /// Counters summed over every loop (or child), as of a moment ago.
    fn live(&self) -> Counters;
    /// Moves every loop to phase `p` (see [`phase`]).
    fn set_phase(&mut self, p: u8) -> Result<(), BenchError>;
    /// A child that ended before it was told to, with what it said; `None` if fine.
    fn broken(&self) -> Option<String>;
    /// After [`phase::CLOSE`]: waits for the loops and returns their merged result.
    fn finish(self: Box<Self>) -> Result<RawResult, BenchError>;
}

/// Event-loop threads in this process.
pub struct LocalFleet {
    ctl: Arc<Control>,
    lives: Vec<Arc<Live>>,
    threads: Vec<JoinHandle<std::io::Result<RawResult>>>,
    rss_before_kb: u64,
    rss_loaded_kb: u64,
}

impl LocalFleet {
    pub fn start(plan: Plan) -> Result<LocalFleet, BenchError> {
        let rss_before_kb = report::proc_status_kb("VmRSS");
        let plan = Arc::new(plan);
        let ctl = Arc::new(Control::default());
        let mut lives = Vec::new();
        let mut loops = Vec::new();
        for id in 0..plan.threads.max(1) {
            let live = Arc::new(Live::default());
            loops.push(ClientLoop::new(
                id,
                Arc::clone(&plan),
                Arc::clone(&ctl),
                Arc::clone(&live),
            )?);
            lives.push(live);
        }
        let mut threads = Vec::new();
        for (id, l) in loops.into_iter().enumerate() {
            threads.push(
                std::thread::Builder::new()
                    .name(format!("bench-loop-{id}"))
                    .spawn(move || l.run())?,
            );
        }
        Ok(LocalFleet {
            ctl,
            lives,
            threads,
            rss_before_kb,
            rss_loaded_kb: 0,
        })
    }
}

impl Fleet for LocalFleet {
    fn live(&self) -> Counters {
        let mut total = Counters::default();
        for l in &self.lives {
            total.add(&l.load());
        }
        total
    }

    fn set_phase(&mut self, p: u8) -> Result<(), BenchError> {
        if p == phase::LOAD {
            self.rss_loaded_kb = report::proc_status_kb("VmRSS");
        }
        self.ctl.set_phase(p);
        Ok(())
    }

    fn broken(&self) -> Option<String> {
        (self.ctl.phase() < phase::CLOSE && self.threads.iter().any(|t| t.is_finished()))
            .then(|| "an event loop stopped early".to_string())
    }

    fn finish(self: Box<Self>) -> Result<RawResult, BenchError> {
        let mut total = RawResult::default();
        for t in self.threads {
            let r = t
                .join()
                .map_err(|_| BenchError::Loop("an event loop panicked".into()))?
                .map_err(|e| BenchError::Loop(e.to_string()))?;
            total.merge(&r);
        }
        total.cpu_secs = report::self_cpu_secs();
        total.max_rss_kb = report::proc_status_kb("VmHWM");
        total.rss_before_kb = self.rss_before_kb;
        total.rss_loaded_kb = self.rss_loaded_kb;
        total.processes = 1;
        Ok(total)
    }
}

/// One line a child prints on stdout.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ChildLine {
    Live(Counters),
    Result(Box<RawResult>),
}

#[derive(Default)]
struct ChildView {
    live: Counters,
    result: Option<RawResult>,
    ended: bool,
    /// Lines that were not protocol (a panic message, say), for the error.
    noise: Vec<String>,
}

/// `--procs` child processes, each running `throng bench ... --child-index i`.
pub struct ChildFleet {
    children: Vec<Child>,
    stdins: Vec<ChildStdin>,
    views: Arc<Mutex<Vec<ChildView>>>,
    readers: Vec<JoinHandle<()>>,
    closing: bool,
}

impl ChildFleet {
    /// Spawns one child per argument list (arguments after `throng bench`).
    /// `secrets`: environment variables for every child (a token), kept out of
    /// their command lines, which anyone on the machine can read.
    pub fn spawn(
        arg_lists: Vec<Vec<String>>,
        secrets: &[(&str, &str)],
    ) -> Result<ChildFleet, BenchError> {
        let exe = std::env::current_exe()?;
        let views = Arc::new(Mutex::new(
            (0..arg_lists.len())
                .map(|_| ChildView::default())
                .collect::<Vec<_>>(),
        ));
        let mut fleet = ChildFleet {
            children: Vec::new(),
            stdins: Vec::new(),
            views,
            readers: Vec::new(),
            closing: false,
        };
        for (i, args) in arg_lists.into_iter().enumerate() {
            let mut child = Command::new(&exe)
                .arg("bench")
                .args(&args)
                .envs(secrets.iter().copied())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err(BenchError::Child {
                    index: i,
                    reason: "no pipes to the child".into(),
                });
            };
            let views = Arc::clone(&fleet.views);
            fleet.readers.push(
                std::thread::Builder::new()
                    .name(format!("bench-child-{i}"))
                    .spawn(move || read_child(i, stdout, &views))?,
            );
            fleet.children.push(child);
            fleet.stdins.push(stdin);
        }
        Ok(fleet)
    }
}

fn read_child(i: usize, stdout: std::process::ChildStdout, views: &Mutex<Vec<ChildView>>) {
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let parsed = serde_json::from_str::<ChildLine>(&line);
        let Ok(mut v) = views.lock() else { return };
        let Some(view) = v.get_mut(i) else { return };
        match parsed {
            Ok(ChildLine::Live(c)) => view.live = c,
            Ok(ChildLine::Result(r)) => view.result = Some(*r),
            Err(_) => view.noise.push(line),
        }
    }
    if let Ok(mut v) = views.lock()
        && let Some(view) = v.get_mut(i)
    {
        view.ended = true;
    }
}

impl Fleet for ChildFleet {
    fn live(&self) -> Counters {
        let mut total = Counters::default();
        if let Ok(v) = self.views.lock() {
            for view in v.iter() {
                total.add(&view.live);
            }
        }
        total
    }

    fn set_phase(&mut self, p: u8) -> Result<(), BenchError> {
        let word = match p {
            phase::LOAD => "load",
            phase::DRAIN => "drain",
            _ => "close",
        };
        if p >= phase::CLOSE {
            self.closing = true;
        }
        for (index, stdin) in self.stdins.iter_mut().enumerate() {
            writeln!(stdin, "{word}")
                .and_then(|()| stdin.flush())
                .map_err(|e| BenchError::Child {
                    index,
                    reason: format!("cannot send '{word}': {e}"),
                })?;
        }
        Ok(())
    }

    fn broken(&self) -> Option<String> {
        let v = self.views.lock().ok()?;
        v.iter().enumerate().find_map(|(i, view)| {
            (view.ended && view.result.is_none() && !self.closing)
                .then(|| format!("child {i} ended early {}", view.noise.join(" | ")))
        })
    }

    fn finish(mut self: Box<Self>) -> Result<RawResult, BenchError> {
        for r in std::mem::take(&mut self.readers) {
            let _ = r.join();
        }
        self.stdins.clear();
        let deadline = Instant::now() + Duration::from_secs(10);
        for (index, child) in self.children.iter_mut().enumerate() {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Ok(None) | Err(_) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(BenchError::Child {
                            index,
                            reason: "did not exit after its result".into(),
                        });
                    }
                }
            }
        }
        let mut total = RawResult::default();
        let views = self
            .views
            .lock()
            .map_err(|_| BenchError::Loop("child reader panicked".into()))?;
        for (index, view) in views.iter().enumerate() {
            match &view.result {
                Some(r) => total.merge(r),
                None => {
                    return Err(BenchError::Child {
                        index,
                        reason: format!("no result {}", view.noise.join(" | ")),
                    });
                }
            }
        }
        Ok(total)
    }
}

impl Drop for ChildFleet {
    fn drop(&mut self) {
        // On an early error, do not leave children holding sockets.
        for child in &mut self.children {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A child's side: runs a local fleet, reports counters every 200 ms, obeys
/// `load` / `drain` / `close` from stdin, and prints its result last.
pub fn run_child(plan: Plan) -> Result<(), BenchError> {
    let mut fleet: Box<dyn Fleet> = Box::new(LocalFleet::start(plan)?);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::Builder::new()
        .name("bench-stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line.trim().to_string()).is_err() {
                    return;
                }
            }
            // The parent is gone: close down.
            let _ = tx.send("close".into());
        })?;
    let started = Instant::now();
    let mut at_load_start = Counters::default();
    let mut at_load_end = None;
    let mut load_t0: Option<Instant> = None;
    let mut load_secs = 0.0;
    let mut connect_secs = 0.0;
    let stdout = std::io::stdout();
    loop {
        let live = fleet.live();
        let line = serde_json::to_string(&ChildLine::Live(live)).unwrap_or_default();
        {
            let mut out = stdout.lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        let word = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(w) => w,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(_) => "close".into(),
        };
        match word.as_str() {
            "load" => {
                connect_secs = started.elapsed().as_secs_f64();
                at_load_start = fleet.live();
                load_t0 = Some(Instant::now());
                fleet.set_phase(phase::LOAD)?;
            }
            "drain" => {
                at_load_end = Some(fleet.live());
                load_secs = load_t0.map_or(0.0, |t| t.elapsed().as_secs_f64());
                fleet.set_phase(phase::DRAIN)?;
            }
            "close" => {
                let end = at_load_end.unwrap_or_else(|| fleet.live());
                fleet.set_phase(phase::CLOSE)?;
                let mut raw = fleet.finish()?;
                raw.at_load_start = at_load_start;
                raw.at_load_end = end;
                raw.load_secs = load_secs;
                raw.connect_secs = connect_secs;
                let line = serde_json::to_string(&ChildLine::Result(Box::new(raw)))
                    .map_err(|e| BenchError::Loop(e.to_string()))?;
                let mut out = stdout.lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
                return Ok(());
            }
            _ => {}
        }
    }
}
