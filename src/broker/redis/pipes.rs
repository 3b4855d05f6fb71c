//! A publish lane's own connections to each master of a Redis Cluster, and one
//! run's commands sent to all of them at once: every master's share goes out in
//! one write, then each master's replies are read, so a run waits for one round
//! trip whatever the number of masters. Which master serves a slot comes from
//! `CLUSTER SLOTS` (`cluster::Topology`), read again after a connection failed
//! or a slot moved. A command that reached the wrong master (`MOVED`, `ASK`)
//! or one without the script loaded (`NOSCRIPT`) ran nothing: its caller runs
//! it again through the cluster client, which follows the cluster and loads
//! scripts. It must not know what the commands mean.

use std::collections::HashMap;

use ::redis::{Cmd, Connection, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::cluster::{Seeds, Topology};
use super::connection::{REDIS_TIMEOUT, is_wire_failure};

#[derive(Default)]
pub(super) struct ClusterPipes {
    topology: Option<Topology>,
    /// Connections by master (`host:port`).
    links: HashMap<String, Connection>,
}

/// Whether a command with this error ran nothing and may be run again through
/// the cluster client: the slot is elsewhere, or moving, or the script is not
/// on that master yet.
pub(super) fn run_again(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::NoScript
                | ServerErrorKind::ClusterDown
        )
    )
}

/// An error of this client's own, for a command it did not send.
fn not_sent(why: String) -> RedisError {
    RedisError::from((ErrorKind::Client, "not sent", why))
}

impl ClusterPipes {
    /// Runs `commands` (each with the slot its keys are in); each gets its own
    /// reply, in order. A master that could not be reached fails its own
    /// commands only.
    pub(super) fn run(
        &mut self,
        seeds: &Seeds,
        commands: &[(u16, Cmd)],
    ) -> Vec<RedisResult<Value>> {
        if self.topology.is_none() {
            match Topology::read(seeds, REDIS_TIMEOUT) {
                Ok(topology) => self.topology = Some(topology),
                Err(e) => {
                    let why = format!("no cluster topology: {e}");
                    return commands
                        .iter()
                        .map(|_| Err(not_sent(why.clone())))
                        .collect();
                }
            }
        }
        let mut replies: Vec<Option<RedisResult<Value>>> = commands.iter().map(|_| None).collect();
        // Each master's commands, in the order given.
        let mut shares: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, (slot, _)) in commands.iter().enumerate() {
            let master = self.topology.as_ref().and_then(|t| t.master_of(*slot));
            let Some(master) = master else {
                replies[i] = Some(Err(not_sent(format!("slot {slot} has no master"))));
                continue;
            };
            match shares.iter_mut().find(|(m, _)| m == master) {
                Some((_, share)) => share.push(i),
                None => shares.push((master.to_string(), vec![i])),
            }
        }
        let mut sent = Vec::with_capacity(shares.len());
        for (master, share) in shares {
            let mut packed = Vec::new();
            for &i in &share {
                packed.extend_from_slice(&commands[i].1.get_packed_command());
            }
            let written = self
                .link(seeds, &master)
                .and_then(|con| con.send_packed_command(&packed));
            match written {
                Ok(()) => sent.push((master, share)),
                Err(e) => self.fail(&master, &share, e, &mut replies),
            }
        }
        for (master, share) in sent {
            for (n, &i) in share.iter().enumerate() {
                let Some(con) = self.links.get_mut(&master) else {
                    break;
                };
                match con.recv_response().and_then(Value::extract_error) {
                    Ok(value) => replies[i] = Some(Ok(value)),
                    Err(e) if is_wire_failure(&e) => {
                        self.fail(&master, &share[n..], e, &mut replies);
                        break;
                    }
                    Err(e) => {
                        if run_again(&e) {
                            self.topology = None;
                        }
                        replies[i] = Some(Err(e));
                    }
                }
            }
        }
        replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(not_sent("no reply".into()))))
            .collect()
    }

    /// The connection to `master`, made when there is none.
    fn link(&mut self, seeds: &Seeds, master: &str) -> RedisResult<&mut Connection> {
        if !self.links.contains_key(master) {
            let con = ::redis::Client::open(seeds.url(master))?
                .get_connection_with_timeout(REDIS_TIMEOUT)?;
            con.set_read_timeout(Some(REDIS_TIMEOUT))?;
            con.set_write_timeout(Some(REDIS_TIMEOUT))?;
            self.links.insert(master.to_string(), con);
        }
        self.links
            .get_mut(master)
            .ok_or_else(|| not_sent(format!("no connection to {master}")))
    }

    /// `master`'s connection failed: its commands `share` get the error, the
    /// connection goes, and the topology is read again before the next run.
    fn fail(
        &mut self,
        master: &str,
        share: &[usize],
        e: RedisError,
        replies: &mut [Option<RedisResult<Value>>],
    ) {
        self.links.remove(master);
        self.topology = None;
        for &i in share {
            replies[i] = Some(Err(e.clone()));
        }
    }
}
