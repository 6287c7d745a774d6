//! The mutual proof of the cluster secret that opens every peer connection (the message flow
//! is in the [module docs](super)).
//!
//! Messages have fixed sizes, so nothing a peer sends before it is authenticated decides how
//! much is read or allocated; the magic is checked on its own first, so a stranger speaking
//! another protocol is closed after four bytes. The caller bounds the whole exchange with
//! [`PeerConfig::handshake_timeout`].

use super::identity::{DataId, Mismatch};
use super::{NodeId, PeerConfig};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Opens every handshake: "quorate peer".
pub const MAGIC: [u8; 4] = *b"QRPR";
/// The peer protocol version; both sides must speak the same one. 7: the client's proof
/// carries the connection it last took from the server ([`Knock`]); 6: a connection carries
/// calls both ways, and an acceptor may answer that it dials back ([`Opened::DialBack`]);
/// 5: snapshots the log format
/// 5, and a membership change's refusal (`raft::rpc::ChangeError`); 4: hellos carry the
/// sender's data id ([`super::identity`]), and snapshots the log format 4; 3: refunds carry their
/// admission's request id, and snapshots the log format 3 (`member::LOG_FORMAT`), which
/// version 2 cannot decode; 2: log entries carry their parts' shard times (`Batch::later`),
/// which version 1 cannot decode.
pub const VERSION: u16 = 7;
/// Set in the version a member sends when its cluster places keys by hash slot (`sharding =
/// "slots"`): members placing keys differently would decide one key in two groups, so they
/// must not talk.
pub const SLOTS_BIT: u16 = 0x4000;
/// Bytes of a nonce and of a MAC.
pub const NONCE: usize = 32;
const MAC: usize = 32;
/// Bytes of a data id.
const DATA_ID: usize = 16;
/// magic, version, id, data id, nonce.
const CLIENT_HELLO: usize = 4 + 2 + 8 + DATA_ID + NONCE;
/// magic, version, id, data id, nonce, MAC.
const SERVER_HELLO: usize = CLIENT_HELLO + MAC;
/// The server's last message: the client's proof was accepted.
const ACCEPTED: u8 = 1;
/// The server's last message instead: the proof was good, but the server knows the client's
/// node id with another data directory.
const DATA_REFUSED: u8 = 2;
/// The server's last message instead: the proof was good, and the server (the pair's lower
/// id) dials the client back for the pair's one connection; this one closes.
const DIAL_BACK: u8 = 3;

/// What a knock says about the connections the knocking node took from the one it knocks
/// on: which one it took last, by its [`conn_id`], or that it holds none it can vouch for.
/// The knocked-on node keeps a connection the knocker has not taken yet (it crossed the
/// knock) and replaces one it has (the knocker lost it).
pub type Knock = u64;
/// The knocker's word that whatever the knocked-on node holds is stale (an earlier dial back
/// never arrived).
pub const KNOCK_STALE: Knock = u64::MAX;

/// A connection's id, the same on both ends: the first 8 bytes of its dialer's nonce.
pub fn conn_id(nonce_c: &[u8; NONCE]) -> u64 {
    u64::from_be_bytes(nonce_c[..8].try_into().expect("8 bytes"))
}

/// An accepted handshake, on the acceptor's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shook {
    /// The dialer's node id.
    pub from: NodeId,
    pub opened: Opened,
    /// The connection's [`conn_id`].
    pub conn: u64,
    /// The dialer's [`Knock`] (meaningful when `opened` is [`Opened::DialBack`]).
    pub seen: Knock,
}

/// How an accepted handshake leaves the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// It carries frames from now on.
    Ready,
    /// It closes: the acceptor dials the dialer back (a node pair's connection is dialed by
    /// its lower id, [module docs](super)).
    DialBack,
}

const SERVER_LABEL: &[u8] = b"quorate-server";
const CLIENT_LABEL: &[u8] = b"quorate-client";

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("the peer does not speak the quorate peer protocol (bad magic)")]
    BadMagic,
    #[error("the peer speaks protocol version {0}, this node {VERSION}")]
    Version(u16),
    #[error(
        "the peer places keys by {peer} sharding and this node by {this}: every member of a \
         cluster needs the same --sharding (the one its data directory records)"
    )]
    Sharding {
        peer: &'static str,
        this: &'static str,
    },
    #[error("the peer closed the connection during the handshake")]
    Closed,
    #[error("node id {0} may not connect here (it is this node's own id or not a member)")]
    IdRefused(NodeId),
    #[error("reached node {got}, expected node {expected}")]
    WrongPeer { expected: NodeId, got: NodeId },
    #[error("the peer's proof of the cluster secret is wrong")]
    BadMac,
    #[error(
        "node {node} came back with another data directory (data id {presented:032x}; this \
         member knows it with {recorded:032x}): a member that lost its data has forgotten its \
         Raft votes and log, so it may not rejoin under its old id. Remove node {node} from \
         the cluster and start the replacement under a new id (docs/operations.md, \
         \"Replacing a failed member\")"
    )]
    DataChanged {
        node: NodeId,
        recorded: DataId,
        presented: DataId,
    },
    #[error(
        "node {0} refused this member, saying it knows this member's id with another data \
         directory. A member that lost its data may not rejoin under its old id: have node \
         {0}'s cluster remove this id and start this member under a new id \
         (docs/operations.md, \"Replacing a failed member\")"
    )]
    DataRefused(NodeId),
    #[error("{0}")]
    NotRecorded(String),
    #[error("handshake I/O: {0}")]
    Io(io::Error),
}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            HandshakeError::Closed
        } else {
            HandshakeError::Io(e)
        }
    }
}

type HmacSha256 = Hmac<Sha256>;

/// Who speaks in a handshake: a node id and its data id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Party {
    pub id: NodeId,
    pub data: DataId,
}

/// HMAC(secret, label | version | first | second | client | client data | server | server
/// data | tail); `version` as sent, its sharding mark included, so the mark cannot be
/// rewritten on the way, nor can the data ids. `tail`: the client's [`Knock`] in its proof,
/// nothing in the server's.
#[allow(clippy::too_many_arguments)]
fn keyed(
    secret: &[u8],
    label: &[u8],
    version: u16,
    first: &[u8; NONCE],
    second: &[u8; NONCE],
    client: Party,
    server: Party,
    tail: &[u8],
) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(label);
    m.update(&version.to_be_bytes());
    m.update(first);
    m.update(second);
    m.update(&client.id.to_be_bytes());
    m.update(&client.data.to_be_bytes());
    m.update(&server.id.to_be_bytes());
    m.update(&server.data.to_be_bytes());
    m.update(tail);
    m
}

/// The server's proof (`version`: the version both sides sent).
pub fn server_mac(
    secret: &[u8],
    version: u16,
    nonce_c: &[u8; NONCE],
    nonce_s: &[u8; NONCE],
    client: Party,
    server: Party,
) -> [u8; MAC] {
    keyed(
        secret,
        SERVER_LABEL,
        version,
        nonce_c,
        nonce_s,
        client,
        server,
        &[],
    )
    .finalize()
    .into_bytes()
    .into()
}

/// The client's proof (`version`: the version both sides sent), over its [`Knock`] too.
pub fn client_mac(
    secret: &[u8],
    version: u16,
    nonce_c: &[u8; NONCE],
    nonce_s: &[u8; NONCE],
    client: Party,
    server: Party,
    seen: Knock,
) -> [u8; MAC] {
    keyed(
        secret,
        CLIENT_LABEL,
        version,
        nonce_s,
        nonce_c,
        client,
        server,
        &seen.to_be_bytes(),
    )
    .finalize()
    .into_bytes()
    .into()
}

/// Reads a hello: the magic alone first (a stranger is turned away after four bytes), then the
/// rest. Returns (version, sender, nonce) and leaves the remaining bytes in `rest`.
async fn read_hello<S: AsyncRead + Unpin>(
    s: &mut S,
    rest: &mut [u8],
) -> Result<(u16, Party, [u8; NONCE]), HandshakeError> {
    let mut magic = [0u8; 4];
    s.read_exact(&mut magic).await?;
    if magic != MAGIC {
        return Err(HandshakeError::BadMagic);
    }
    let mut head = [0u8; CLIENT_HELLO - 4];
    s.read_exact(&mut head).await?;
    s.read_exact(rest).await?;
    let version = u16::from_be_bytes([head[0], head[1]]);
    let id = NodeId::from_be_bytes(head[2..10].try_into().expect("8 bytes"));
    let data = DataId::from_be_bytes(head[10..10 + DATA_ID].try_into().expect("16 bytes"));
    let nonce = head[10 + DATA_ID..].try_into().expect("32 bytes");
    Ok((version, Party { id, data }, nonce))
}

/// The version this node sends and requires: [`VERSION`], marked with its sharding.
fn wire_version(cfg: &PeerConfig) -> u16 {
    if cfg.slot_sharding {
        VERSION | SLOTS_BIT
    } else {
        VERSION
    }
}

/// Refuses a peer whose version differs from this node's, saying whether the protocol or
/// only the sharding differs.
fn check_version(cfg: &PeerConfig, version: u16) -> Result<(), HandshakeError> {
    let ours = wire_version(cfg);
    if version == ours {
        return Ok(());
    }
    let name = |v: u16| if v & SLOTS_BIT != 0 { "slots" } else { "hash" };
    Err(if version & !SLOTS_BIT == VERSION {
        HandshakeError::Sharding {
            peer: name(version),
            this: name(ours),
        }
    } else {
        HandshakeError::Version(version & !SLOTS_BIT)
    })
}

/// This node as it presents itself: its id and its data directory's id (0 without one).
fn me(cfg: &PeerConfig) -> Party {
    Party {
        id: cfg.node_id,
        data: cfg.identities.as_ref().map_or(0, |i| i.own()),
    }
}

/// Accepts an authenticated peer's data id ([`super::identity::Identities::admit`]); a node
/// without identities accepts any.
async fn admit(cfg: &PeerConfig, peer: Party) -> Result<(), HandshakeError> {
    let Some(ids) = &cfg.identities else {
        return Ok(());
    };
    ids.admit(peer.id, peer.data).await.map_err(|m| match m {
        Mismatch::Changed {
            recorded,
            presented,
        } => HandshakeError::DataChanged {
            node: peer.id,
            recorded,
            presented,
        },
        Mismatch::NotRecorded(why) => HandshakeError::NotRecorded(why),
    })
}

fn hello(cfg: &PeerConfig, nonce: &[u8; NONCE]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SERVER_HELLO);
    m.extend_from_slice(&MAGIC);
    m.extend_from_slice(&wire_version(cfg).to_be_bytes());
    let me = me(cfg);
    m.extend_from_slice(&me.id.to_be_bytes());
    m.extend_from_slice(&me.data.to_be_bytes());
    m.extend_from_slice(nonce);
    m
}

/// The dialer's side: proves the secret to node `expected` and checks its proof and data id.
/// `seen` is what a knock says ([`Knock`]); a dialer that does not knock sends anything (0).
pub async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    cfg: &PeerConfig,
    expected: NodeId,
    nonce_c: [u8; NONCE],
    seen: Knock,
) -> Result<Opened, HandshakeError> {
    s.write_all(&hello(cfg, &nonce_c)).await?;
    s.flush().await?;
    let mut their_mac = [0u8; MAC];
    let (version, server, nonce_s) = read_hello(s, &mut their_mac).await?;
    check_version(cfg, version)?;
    if server.id != expected {
        return Err(HandshakeError::WrongPeer {
            expected,
            got: server.id,
        });
    }
    keyed(
        &cfg.secret,
        SERVER_LABEL,
        version,
        &nonce_c,
        &nonce_s,
        me(cfg),
        server,
        &[],
    )
    .verify_slice(&their_mac)
    .map_err(|_| HandshakeError::BadMac)?;
    // Authenticated: now its data id may be recorded, or found changed (then close).
    admit(cfg, server).await?;
    let mut proof = [0u8; MAC + 8];
    proof[..MAC].copy_from_slice(&client_mac(
        &cfg.secret,
        version,
        &nonce_c,
        &nonce_s,
        me(cfg),
        server,
        seen,
    ));
    proof[MAC..].copy_from_slice(&seen.to_be_bytes());
    s.write_all(&proof).await?;
    s.flush().await?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).await?;
    match ack[0] {
        ACCEPTED => Ok(Opened::Ready),
        DIAL_BACK => Ok(Opened::DialBack),
        DATA_REFUSED => Err(HandshakeError::DataRefused(server.id)),
        _ => Err(HandshakeError::BadMagic),
    }
}

/// The acceptor's side: checks the dialer's id, proof and data id; returns the dialer's id,
/// its knock, and whether the connection goes on or closes for `dial_back` (asked with the
/// authenticated dialer's id: whether this node dials it back instead).
pub async fn server<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    cfg: &PeerConfig,
    nonce_s: [u8; NONCE],
    dial_back: impl FnOnce(NodeId) -> bool,
) -> Result<Shook, HandshakeError> {
    let (version, client, nonce_c) = read_hello(s, &mut []).await?;
    check_version(cfg, version)?;
    if !cfg.accepts(client.id) {
        return Err(HandshakeError::IdRefused(client.id));
    }
    let mut reply = hello(cfg, &nonce_s);
    reply.extend_from_slice(&server_mac(
        &cfg.secret,
        version,
        &nonce_c,
        &nonce_s,
        client,
        me(cfg),
    ));
    s.write_all(&reply).await?;
    s.flush().await?;
    let mut proof = [0u8; MAC + 8];
    s.read_exact(&mut proof).await?;
    let seen = Knock::from_be_bytes(proof[MAC..].try_into().expect("8 bytes"));
    // Constant time: verify_slice compares without an early exit.
    keyed(
        &cfg.secret,
        CLIENT_LABEL,
        version,
        &nonce_s,
        &nonce_c,
        client,
        me(cfg),
        &proof[MAC..],
    )
    .verify_slice(&proof[..MAC])
    .map_err(|_| HandshakeError::BadMac)?;
    // Authenticated: now its data id may be recorded, or found changed (then say so, so that
    // the refused member's log names the fix, and close).
    if let Err(e) = admit(cfg, client).await {
        if matches!(e, HandshakeError::DataChanged { .. }) {
            // Best effort: the refusal (and its log line) stands whether or not it arrives.
            let _ = s.write_all(&[DATA_REFUSED]).await;
            let _ = s.flush().await;
        }
        return Err(e);
    }
    let (opened, ack) = if dial_back(client.id) {
        (Opened::DialBack, DIAL_BACK)
    } else {
        (Opened::Ready, ACCEPTED)
    };
    s.write_all(&[ack]).await?;
    s.flush().await?;
    Ok(Shook {
        from: client.id,
        opened,
        conn: conn_id(&nonce_c),
        seen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn cfg(id: NodeId, secret: &[u8]) -> PeerConfig {
        PeerConfig::new(id, secret.to_vec())
    }

    async fn run(
        c: PeerConfig,
        expected: NodeId,
        s: PeerConfig,
    ) -> (Result<(), HandshakeError>, Result<NodeId, HandshakeError>) {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let client = async move {
            let r = client(&mut a, &c, expected, [1; NONCE], 0).await;
            drop(a);
            assert!(!matches!(r, Ok(Opened::DialBack)));
            r.map(|_| ())
        };
        let server = async move {
            let r = server(&mut b, &s, [2; NONCE], |_| false)
                .await
                .map(|s| s.from);
            drop(b);
            r
        };
        tokio::join!(client, server)
    }

    #[tokio::test]
    async fn nodes_sharing_the_secret_authenticate_each_other() {
        let (c, s) = run(cfg(1, SECRET), 2, cfg(2, SECRET)).await;
        c.unwrap();
        assert_eq!(s.unwrap(), 1);
    }

    #[tokio::test]
    async fn the_acceptor_can_answer_that_it_dials_back() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let (two, one) = (cfg(2, SECRET), cfg(1, SECRET));
        let (c, s) = tokio::join!(
            client(&mut a, &two, 1, [1; NONCE], 42),
            server(&mut b, &one, [2; NONCE], |from| from == 2)
        );
        assert_eq!(c.unwrap(), Opened::DialBack);
        // With the knock, and the connection's id as the dialer knows it.
        let shook = Shook {
            from: 2,
            opened: Opened::DialBack,
            conn: conn_id(&[1; NONCE]),
            seen: 42,
        };
        assert_eq!(s.unwrap(), shook);
    }

    #[tokio::test]
    async fn a_different_secret_fails_on_both_sides() {
        let (c, s) = run(cfg(1, b"another secret of sixteen+"), 2, cfg(2, SECRET)).await;
        assert!(matches!(c, Err(HandshakeError::BadMac)), "{c:?}");
        assert!(matches!(s, Err(HandshakeError::Closed)), "{s:?}");
    }

    #[tokio::test]
    async fn members_that_place_keys_differently_refuse_each_other() {
        let slots = |id| PeerConfig {
            slot_sharding: true,
            ..cfg(id, SECRET)
        };
        let (c, s) = run(slots(1), 2, slots(2)).await;
        c.unwrap();
        assert_eq!(s.unwrap(), 1);
        // A slots member dialing a hash member: the server refuses, naming both.
        let (c, s) = run(slots(1), 2, cfg(2, SECRET)).await;
        let e = s.unwrap_err();
        assert!(
            matches!(
                e,
                HandshakeError::Sharding {
                    peer: "slots",
                    this: "hash"
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("--sharding"), "{e}");
        assert!(matches!(c, Err(HandshakeError::Closed)), "{c:?}");
        // And the other way round.
        let (c, s) = run(cfg(1, SECRET), 2, slots(2)).await;
        assert!(
            matches!(
                s,
                Err(HandshakeError::Sharding {
                    peer: "hash",
                    this: "slots"
                })
            ),
            "{s:?}"
        );
        assert!(matches!(c, Err(HandshakeError::Closed)), "{c:?}");
    }

    #[tokio::test]
    async fn a_server_that_is_not_the_node_dialed_is_rejected() {
        let (c, _) = run(cfg(1, SECRET), 3, cfg(2, SECRET)).await;
        assert!(
            matches!(
                c,
                Err(HandshakeError::WrongPeer {
                    expected: 3,
                    got: 2
                })
            ),
            "{c:?}"
        );
    }

    #[tokio::test]
    async fn a_client_claiming_the_servers_own_id_or_a_non_member_id_is_refused() {
        let (c, s) = run(cfg(2, SECRET), 2, cfg(2, SECRET)).await;
        assert!(matches!(s, Err(HandshakeError::IdRefused(2))), "{s:?}");
        assert!(matches!(c, Err(HandshakeError::Closed)), "{c:?}");

        let mut members = cfg(2, SECRET);
        members.members = Some(Arc::from(vec![1, 2, 3]));
        let (_, s) = run(cfg(4, SECRET), 2, members.clone()).await;
        assert!(matches!(s, Err(HandshakeError::IdRefused(4))), "{s:?}");
        let (c, s) = run(cfg(3, SECRET), 2, members).await;
        c.unwrap();
        assert_eq!(s.unwrap(), 3);
    }

    #[tokio::test]
    async fn a_proof_recorded_from_one_session_does_not_open_another() {
        // The client's proof is bound to the server's nonce: replaying it with a new nonce
        // fails.
        let s_cfg = cfg(2, SECRET);
        let party = |id| Party { id, data: 0 };
        let old = client_mac(
            SECRET,
            VERSION,
            &[1; NONCE],
            &[2; NONCE],
            party(1),
            party(2),
            0,
        );
        let (mut a, mut b) = tokio::io::duplex(4096);
        let attacker = async move {
            a.write_all(&hello(&cfg(1, SECRET), &[1; NONCE]))
                .await
                .unwrap();
            let mut reply = [0u8; SERVER_HELLO];
            a.read_exact(&mut reply).await.unwrap();
            a.write_all(&old).await.unwrap();
            a.write_all(&0u64.to_be_bytes()).await.unwrap();
            let mut ack = [0u8; 1];
            a.read_exact(&mut ack).await
        };
        let (ack, s) = tokio::join!(attacker, async move {
            let r = server(&mut b, &s_cfg, [3; NONCE], |_| false)
                .await
                .map(|s| s.from);
            drop(b);
            r
        });
        assert!(matches!(s, Err(HandshakeError::BadMac)), "{s:?}");
        assert!(ack.is_err());
    }

    #[tokio::test]
    async fn a_knock_rewritten_on_the_way_fails_the_proof() {
        // The knock is under the client's MAC: an attacker on the path cannot turn a knock
        // into one that closes the connection the knocker just took.
        let (mut a, mut b) = tokio::io::duplex(4096);
        let party = |id| Party { id, data: 0 };
        let attacker = async move {
            a.write_all(&hello(&cfg(2, SECRET), &[1; NONCE]))
                .await
                .unwrap();
            let mut reply = [0u8; SERVER_HELLO];
            a.read_exact(&mut reply).await.unwrap();
            let nonce_s: [u8; NONCE] = reply[CLIENT_HELLO - NONCE..CLIENT_HELLO]
                .try_into()
                .unwrap();
            let mac = client_mac(
                SECRET,
                VERSION,
                &[1; NONCE],
                &nonce_s,
                party(2),
                party(1),
                7,
            );
            a.write_all(&mac).await.unwrap();
            a.write_all(&8u64.to_be_bytes()).await.unwrap();
            let mut ack = [0u8; 1];
            a.read_exact(&mut ack).await
        };
        let (ack, s) = tokio::join!(attacker, async move {
            let r = server(&mut b, &cfg(1, SECRET), [3; NONCE], |_| true).await;
            drop(b);
            r
        });
        assert!(matches!(s, Err(HandshakeError::BadMac)), "{s:?}");
        assert!(ack.is_err());
    }

    fn with_data(id: NodeId, data: u128) -> (PeerConfig, Arc<super::super::identity::Identities>) {
        let ids = Arc::new(super::super::identity::Identities::in_memory(data));
        let mut c = cfg(id, SECRET);
        c.identities = Some(ids.clone());
        (c, ids)
    }

    #[tokio::test]
    async fn a_node_back_with_another_data_directory_is_refused_on_both_sides() {
        let (one, one_ids) = with_data(1, 0x11);
        let (two, two_ids) = with_data(2, 0x22);
        // First sight: each side records the other's data id.
        let (c, s) = run(one.clone(), 2, two.clone()).await;
        c.unwrap();
        assert_eq!(s.unwrap(), 1);
        assert_eq!(one_ids.recorded(2).await, Some(0x22));
        assert_eq!(two_ids.recorded(1).await, Some(0x11));
        // The same directories again: accepted.
        let (c, s) = run(one.clone(), 2, two.clone()).await;
        c.unwrap();
        s.unwrap();
        // Node 1 back on a new data directory, dialing: node 2 refuses it, and says why.
        let (wiped, _) = with_data(1, 0x12);
        let node_1_changed = |e: &HandshakeError| {
            matches!(
                e,
                HandshakeError::DataChanged {
                    node: 1,
                    recorded: 0x11,
                    presented: 0x12
                }
            )
        };
        let (c, s) = run(wiped.clone(), 2, two.clone()).await;
        let e = s.unwrap_err();
        assert!(node_1_changed(&e), "{e:?}");
        let e = c.unwrap_err();
        assert!(matches!(e, HandshakeError::DataRefused(2)), "{e:?}");
        assert!(e.to_string().contains("new id"), "{e}");
        // Node 2 dialing the wiped node 1: it refuses to go on, before sending its proof.
        let (c, s) = run(two, 1, wiped).await;
        let e = c.unwrap_err();
        assert!(node_1_changed(&e), "{e:?}");
        assert!(e.to_string().contains("new id"), "{e}");
        assert!(matches!(s, Err(HandshakeError::Closed)), "{s:?}");
        // The record did not move.
        assert_eq!(two_ids.recorded(1).await, Some(0x11));
    }

    #[tokio::test]
    async fn an_unauthenticated_hello_records_no_data_id() {
        let stranger = |id| {
            let (mut c, _) = with_data(id, 0x99);
            c.secret = Arc::from(&b"not the cluster secret, 32 bytes"[..]);
            c
        };
        // A stranger dialing a member, and a member dialing a stranger at a peer's address.
        let (two, ids) = with_data(2, 0x22);
        let (c, s) = run(stranger(1), 2, two.clone()).await;
        assert!(c.is_err() && s.is_err(), "{c:?} {s:?}");
        let (c, s) = run(two, 3, stranger(3)).await;
        assert!(c.is_err() && s.is_err(), "{c:?} {s:?}");
        assert_eq!(ids.recorded(1).await, None);
        assert_eq!(ids.recorded(3).await, None);
    }

    #[tokio::test]
    async fn another_protocol_is_turned_away_after_the_magic() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        a.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let s = server(&mut b, &cfg(2, SECRET), [2; NONCE], |_| false).await;
        assert!(matches!(s, Err(HandshakeError::BadMagic)), "{s:?}");
    }
}
