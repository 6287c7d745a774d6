//! Which data directory each member runs on: a member whose data directory was lost must not
//! come back under its old id.
//!
//! Raft's safety rests on a voter remembering its vote and its log. A member restarted under
//! its id on an empty (or another) data directory has forgotten both: it may vote a second time
//! in a term it already voted in, so two leaders of one term become possible, and an entry a
//! majority had acknowledged may then be overwritten. So every data directory holds a random
//! id of its own (`DATA/data-id`, written on its first start), each member sends it in the
//! handshake (under the MAC), and each member records, on the first authenticated handshake
//! with a node, the data id that node presented (`DATA/peer-data-ids`, synced before the
//! connection is accepted). A later handshake of that node with another data id is refused on
//! both sides, naming the fix: a member whose data is lost rejoins under a new id
//! (docs/operations.md, "Replacing a failed member").
//!
//! What this does not catch: a data directory copied or restored from a backup keeps its data
//! id with older state, and a node that no member has completed a handshake with is trusted on
//! first sight.

use super::NodeId;
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Mutex;

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
    known: Mutex<BTreeMap<NodeId, DataId>>,
    /// Where the known ids are kept (`None`: in memory only, for tests).
    path: Option<PathBuf>,
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
    /// Identities kept in memory only.
    pub fn in_memory(own: DataId) -> Self {
        Identities {
            own,
            known: Mutex::new(BTreeMap::new()),
            path: None,
        }
    }

    /// This member's identities from its data directory: its data id (created from `fresh`
    /// if the directory has none yet) and the peers' recorded ones.
    pub fn load(data_dir: &std::path::Path, fresh: DataId) -> io::Result<Self> {
        let own_path = data_dir.join(DATA_ID_FILE);
        let own = match std::fs::read_to_string(&own_path) {
            Ok(text) => parse_id(text.trim()).ok_or_else(|| {
                invalid(format!(
                    "{} should hold this data directory's id (32 hex digits), not {:?}: \
                     restore it from the member's other copy, or start the member under a new \
                     id on an empty data directory (docs/operations.md, \"Replacing a failed \
                     member\")",
                    own_path.display(),
                    text.trim()
                ))
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let id = fresh.max(1);
                crate::member::write_record(data_dir, DATA_ID_FILE, format_args!("{id:032x}"))?;
                id
            }
            Err(e) => return Err(e),
        };
        let path = data_dir.join(PEERS_FILE);
        let mut known = BTreeMap::new();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
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
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(Identities {
            own,
            known: Mutex::new(known),
            path: Some(path),
        })
    }

    /// This member's data id, as sent in the handshake.
    pub fn own(&self) -> DataId {
        self.own
    }

    /// The data id recorded for `node`, if any.
    pub fn recorded(&self, node: NodeId) -> Option<DataId> {
        self.lock().get(&node).copied()
    }

    /// Accepts `node`'s data id if it is the one recorded for it, or records it (durably,
    /// before answering) if none is. Call only once the peer proved the cluster secret: an
    /// unauthenticated hello must not fix what a node's id is.
    pub fn admit(&self, node: NodeId, presented: DataId) -> Result<(), Mismatch> {
        let mut known = self.lock();
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
        known.insert(node, presented);
        // Written while the lock is held, so records reach the file in the order they were
        // made; it happens once per peer (blocking the runtime for one small synced write).
        if let Some(path) = &self.path {
            let text: String = known
                .iter()
                .map(|(n, id)| format!("{n} {id:032x}\n"))
                .collect();
            let dir = path.parent().unwrap_or(std::path::Path::new("."));
            if let Err(e) = crate::member::write_record(dir, PEERS_FILE, text.trim_end()) {
                known.remove(&node);
                return Err(Mismatch::NotRecorded(format!(
                    "cannot record node {node}'s data id in {}: {e}",
                    path.display()
                )));
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, DataId>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn parse_id(text: &str) -> Option<DataId> {
    (text.len() == 32)
        .then(|| DataId::from_str_radix(text, 16).ok())
        .flatten()
        .filter(|id| *id != 0)
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_recorded_on_first_sight_and_held_to_it_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let ids = Identities::load(dir.path(), 7).unwrap();
        assert_eq!(ids.own(), 7);
        assert_eq!(ids.admit(2, 20), Ok(()));
        assert_eq!(ids.admit(3, 30), Ok(()));
        assert_eq!(ids.admit(2, 20), Ok(()));
        assert_eq!(
            ids.admit(2, 21),
            Err(Mismatch::Changed {
                recorded: 20,
                presented: 21
            })
        );
        // Restarted: the directory keeps its own id (the fresh one offered is ignored) and
        // the peers' ids.
        let again = Identities::load(dir.path(), 8).unwrap();
        assert_eq!(again.own(), 7);
        assert_eq!(again.recorded(2), Some(20));
        assert_eq!(again.recorded(3), Some(30));
        assert!(matches!(again.admit(3, 31), Err(Mismatch::Changed { .. })));
        // A new directory gets a new id.
        let other = tempfile::tempdir().unwrap();
        assert_eq!(Identities::load(other.path(), 9).unwrap().own(), 9);
    }

    #[test]
    fn damaged_records_are_refused_naming_the_file_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DATA_ID_FILE), "not hex\n").unwrap();
        let e = Identities::load(dir.path(), 1).unwrap_err().to_string();
        assert!(e.contains(DATA_ID_FILE) && e.contains("new id"), "{e}");
        std::fs::write(dir.path().join(DATA_ID_FILE), format!("{:032x}\n", 5)).unwrap();
        std::fs::write(dir.path().join(PEERS_FILE), "2 zz\n").unwrap();
        let e = Identities::load(dir.path(), 1).unwrap_err().to_string();
        assert!(e.contains(PEERS_FILE) && e.contains("2 zz"), "{e}");
    }
}
