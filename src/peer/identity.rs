//! Which data directory each member runs on: a member whose data directory was lost must not
//! come back under its old id.
//!
//! Raft's safety rests on a voter remembering its vote and its log. A member restarted under
//! its id on an empty (or another) data directory has forgotten both: it may vote a second time
//! in a term it already voted in, so two leaders of one term become possible, and an entry a
//! majority had acknowledged may then be overwritten. So every data directory holds a random
//! id of its own (`DATA/data-id`, written when the directory has no log yet: on its first
//! start, or after its log was deleted, which forgets the votes as surely as a new directory
//! does; a log without the id is refused at start), each member sends it in the
//! handshake (under the MAC), and each member records, on the first authenticated handshake
//! with a node, the data id that node presented (`DATA/peer-data-ids`, synced before the
//! connection is accepted). A later handshake of that node with another data id is refused on
//! both sides, naming the fix: a member whose data is lost rejoins under a new id
//! (docs/operations.md, "Replacing a failed member").
//!
//! What this does not catch: a data directory copied or restored from a backup keeps its data
//! id with older state, and a node that no member has completed a handshake with is trusted on
//! first sight. The refusal a member receives (one byte after the peer checked its proof) is
//! not itself authenticated: it is logged as the peer's word.

use super::NodeId;
use crate::member::{blocking_io, read_record, write_record};
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// A data directory's id: 128 random bits, written on its first start. 0 is "none".
pub type DataId = u128;

/// The file of a data directory that holds its data id.
pub const DATA_ID_FILE: &str = "data-id";
/// The file of a data directory that holds every peer's data id as first seen.
pub const PEERS_FILE: &str = "peer-data-ids";

/// This member's data id and what it knows of its peers'.
#[derive(Debug)]
pub struct Identities {
    own: DataId,
    /// An async lock: a new record is written (and synced) while it is held, so records
    /// reach the file in the order they were made, and no runtime thread waits on it. The
    /// write holds it (an owned guard): a handshake that times out drops its `admit`, not the
    /// write, which records the id in memory too once it is on disk.
    known: Arc<tokio::sync::Mutex<BTreeMap<NodeId, DataId>>>,
    /// The data directory the known ids are kept in (`None`: in memory only, for tests).
    dir: Option<PathBuf>,
    /// Write on the runtime, not the blocking pool (the simulation: see
    /// `Hooks::io_on_runtime`).
    io_on_runtime: bool,
}

/// Why a peer's data id was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The peer presented another data id than the one recorded for it.
    Changed { recorded: DataId, presented: DataId },
    /// The record could not be written (the peer is refused until it can).
    NotRecorded(String),
}

impl Identities {
    /// Identities kept in memory only (for the handshake's tests).
    #[cfg(test)]
    pub fn in_memory(own: DataId) -> Self {
        Identities {
            own,
            known: Arc::new(tokio::sync::Mutex::new(BTreeMap::new())),
            dir: None,
            io_on_runtime: false,
        }
    }

    /// This member's identities from its data directory, before its log is opened: its data
    /// id, and the peers' recorded ones. A directory without a log ([`holds_log`]) gets a new data
    /// id from `fresh`, whatever id it held: its log, and the votes in it, are gone. A log
    /// without a data id is refused: the member could not prove it is the one that wrote it.
    ///
    /// `volatile_log`: the member runs its WAL without fsync, its writes held in memory (the
    /// test-only `--unsafe-no-fsync`), so an empty segment after a crash is what that mode
    /// does, not a loss to guard against: only a missing `wal/` counts then, as it did
    /// before segments were looked at (the durability tests' negative control restarts such
    /// a cluster after kill -9 to show what it forgot).
    pub fn load(
        data_dir: &std::path::Path,
        fresh: DataId,
        io_on_runtime: bool,
        volatile_log: bool,
    ) -> io::Result<Self> {
        let own_path = data_dir.join(DATA_ID_FILE);
        let has_log = if volatile_log {
            data_dir.join("wal").exists()
        } else {
            holds_log(data_dir)?
        };
        let own = match read_record(data_dir, DATA_ID_FILE)? {
            Some(text) if has_log => parse_id(&text).ok_or_else(|| {
                invalid(format!(
                    "{} should hold this data directory's id (32 hex digits), not {text:?}: \
                     restore it from a copy of this directory, or start the member under a new \
                     id on an empty data directory (docs/operations.md, \"Replacing a failed \
                     member\")",
                    own_path.display(),
                ))
            })?,
            None if has_log => {
                return Err(invalid(format!(
                    "the data directory {} holds a log but no {DATA_ID_FILE}, which its peers \
                     know it by: restore the file from a copy of this directory, or start the \
                     member under a new id on an empty data directory (docs/operations.md, \
                     \"Replacing a failed member\")",
                    data_dir.display()
                )))
            }
            _ => {
                let id = fresh.max(1);
                write_record(data_dir, DATA_ID_FILE, format_args!("{id:032x}"))?;
                id
            }
        };
        let path = data_dir.join(PEERS_FILE);
        let mut known = BTreeMap::new();
        if let Some(text) = read_record(data_dir, PEERS_FILE)? {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let entry = line.split_once(' ').and_then(|(node, id)| {
                    Some((node.trim().parse::<NodeId>().ok()?, parse_id(id.trim())?))
                });
                let (node, id) = entry.ok_or_else(|| {
                    invalid(format!(
                        "{} has a line {line:?} that is not `NODE-ID DATA-ID` (a number, \
                         32 hex digits): mend or remove that line (a node without a line \
                         is trusted on its next handshake)",
                        path.display()
                    ))
                })?;
                known.insert(node, id);
            }
        }
        Ok(Identities {
            own,
            known: Arc::new(tokio::sync::Mutex::new(known)),
            dir: Some(data_dir.to_path_buf()),
            io_on_runtime,
        })
    }

    /// This member's data id, as sent in the handshake.
    pub fn own(&self) -> DataId {
        self.own
    }

    /// The data id recorded for `node`, if any.
    pub async fn recorded(&self, node: NodeId) -> Option<DataId> {
        self.known.lock().await.get(&node).copied()
    }

    /// Accepts `node`'s data id if it is the one recorded for it, or records it (durably,
    /// before answering) if none is. Call only once the peer proved the cluster secret: an
    /// unauthenticated hello must not fix what a node's id is.
    pub async fn admit(&self, node: NodeId, presented: DataId) -> Result<(), Mismatch> {
        if presented == 0 {
            return Err(Mismatch::NotRecorded(format!(
                "node {node} presented no data directory id"
            )));
        }
        let mut known = Arc::clone(&self.known).lock_owned().await;
        match known.get(&node) {
            Some(&recorded) if recorded == presented => return Ok(()),
            Some(&recorded) => {
                return Err(Mismatch::Changed {
                    recorded,
                    presented,
                })
            }
            None => {}
        }
        let Some(dir) = &self.dir else {
            known.insert(node, presented);
            return Ok(());
        };
        // Once per peer: every record, synced, before the connection is accepted.
        let text: String = known
            .iter()
            .chain([(&node, &presented)])
            .map(|(n, id)| format!("{n} {id:032x}\n"))
            .collect();
        let at = dir.clone();
        let written = blocking_io(self.io_on_runtime, move || {
            write_record(&at, PEERS_FILE, text.trim_end())?;
            known.insert(node, presented);
            Ok(())
        })
        .await;
        written.map_err(|e| {
            Mismatch::NotRecorded(format!(
                "cannot record node {node}'s data id in {}: {e}",
                dir.join(PEERS_FILE).display()
            ))
        })
    }
}

fn parse_id(text: &str) -> Option<DataId> {
    (text.len() == 32)
        .then(|| DataId::from_str_radix(text, 16).ok())
        .flatten()
        .filter(|id| *id != 0)
}

/// Whether the data directory holds a log: a segment of the WAL (`wal/wal-*.log`) with bytes
/// in it. A `wal/` directory whose segments are gone or empty has lost its votes as surely
/// as one that is gone (a log file deleted or truncated by hand, or lost by the file
/// system): a member is then a new directory to its peers. The WAL's segment is empty only
/// until its first append, so a member that stopped before it had anything to remember,
/// and had already met its peers, is refused by them too: it rejoins under a new id.
fn holds_log(data_dir: &std::path::Path) -> io::Result<bool> {
    let dir = match std::fs::read_dir(data_dir.join("wal")) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for entry in dir {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("wal-") && name.ends_with(".log") && entry.metadata()?.len() > 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_node_is_recorded_on_first_sight_and_held_to_it_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let ids = Identities::load(dir.path(), 7, false, false).unwrap();
        // The log the member then opens and writes.
        write_log(dir.path());
        assert_eq!(ids.own(), 7);
        assert_eq!(ids.admit(2, 20).await, Ok(()));
        assert_eq!(ids.admit(3, 30).await, Ok(()));
        assert_eq!(ids.admit(2, 20).await, Ok(()));
        assert_eq!(
            ids.admit(2, 21).await,
            Err(Mismatch::Changed {
                recorded: 20,
                presented: 21
            })
        );
        assert!(matches!(
            ids.admit(4, 0).await,
            Err(Mismatch::NotRecorded(_))
        ));
        // Restarted: the directory keeps its own id (the fresh one offered is ignored) and
        // the peers' ids.
        let again = Identities::load(dir.path(), 8, false, false).unwrap();
        assert_eq!(again.own(), 7);
        assert_eq!(again.recorded(2).await, Some(20));
        assert_eq!(again.recorded(3).await, Some(30));
        assert_eq!(again.recorded(4).await, None);
        assert!(matches!(
            again.admit(3, 31).await,
            Err(Mismatch::Changed { .. })
        ));
        // Its log deleted: the votes are gone, so the directory is a new one to its peers.
        // So too with `wal/` kept and its segment emptied or gone (an audit found a member
        // starting under its old data id then, and its peers taking it back).
        let segment = dir.path().join("wal").join(crate::wal::SEGMENT_NAME);
        let forgets: [(&str, &dyn Fn()); 3] = [
            ("segment emptied", &|| {
                std::fs::write(&segment, b"").unwrap()
            }),
            ("segment gone", &|| std::fs::remove_file(&segment).unwrap()),
            ("wal/ gone", &|| {
                std::fs::remove_dir_all(dir.path().join("wal")).unwrap()
            }),
        ];
        let mut own = 7;
        for (fresh, (how, forget)) in (9..).zip(forgets) {
            write_log(dir.path());
            assert_eq!(
                Identities::load(dir.path(), 8, false, false).unwrap().own(),
                own
            );
            forget();
            let wiped = Identities::load(dir.path(), fresh, false, false).unwrap();
            assert_eq!(wiped.own(), fresh, "{how}: the old data id kept");
            own = fresh;
        }
        // Without fsync (`--unsafe-no-fsync`) a segment is empty after every crash: only a
        // missing `wal/` counts.
        write_log(dir.path());
        std::fs::write(&segment, b"").unwrap();
        assert_eq!(
            Identities::load(dir.path(), 20, false, true).unwrap().own(),
            own
        );
        // A new directory gets a new id.
        let other = tempfile::tempdir().unwrap();
        assert_eq!(
            Identities::load(other.path(), 10, false, false)
                .unwrap()
                .own(),
            10
        );
    }

    /// A WAL segment with a record's worth of bytes in it.
    fn write_log(data_dir: &std::path::Path) {
        let wal = data_dir.join("wal");
        std::fs::create_dir_all(&wal).unwrap();
        std::fs::write(wal.join(crate::wal::SEGMENT_NAME), [1u8; 33]).unwrap();
    }

    #[test]
    fn damaged_or_missing_records_are_refused_naming_the_file_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        write_log(dir.path());
        let e = Identities::load(dir.path(), 1, false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains(DATA_ID_FILE) && e.contains("new id"), "{e}");
        std::fs::write(dir.path().join(DATA_ID_FILE), "not hex\n").unwrap();
        let e = Identities::load(dir.path(), 1, false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains(DATA_ID_FILE) && e.contains("new id"), "{e}");
        std::fs::write(dir.path().join(DATA_ID_FILE), format!("{:032x}\n", 5)).unwrap();
        std::fs::write(dir.path().join(PEERS_FILE), "2 zz\n").unwrap();
        let e = Identities::load(dir.path(), 1, false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains(PEERS_FILE) && e.contains("2 zz"), "{e}");
    }
}
