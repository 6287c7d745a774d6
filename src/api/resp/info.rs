//! The replies that let Redis tools talk to quorate: `HELLO`, `INFO`, `CONFIG GET`.
//!
//! redis-cli and redis-benchmark ask for these on connecting and stop or warn when they get
//! an error, so each answers as a Redis 7.0 server would, with quorate's own numbers where it
//! has them.

use super::frame::{Frame, Protocol};
use crate::service::Service;
use bytes::Bytes;

/// The Redis version quorate reports, for tools that check one.
pub const REDIS_VERSION: &str = "7.0.0";

/// `HELLO [2|3]`: field, value pairs (a map in RESP3, a flat array in RESP2), `proto` the
/// protocol the connection speaks from now on. `version` is the Redis version quorate
/// reports (as `INFO`'s `redis_version`: clients read it to know what the server speaks),
/// and `quorate_version`, after Redis's fields, is quorate's own.
pub fn hello(proto: Protocol) -> Frame {
    let field = |name: &'static str, value| (Frame::bulk(name), value);
    Frame::Map(vec![
        field("server", Frame::bulk("quorate")),
        field("version", Frame::bulk(REDIS_VERSION)),
        field("proto", Frame::Integer(proto.version())),
        field("mode", Frame::bulk("standalone")),
        field("role", Frame::bulk("master")),
        field("modules", Frame::Array(vec![])),
        field("quorate_version", Frame::bulk(env!("CARGO_PKG_VERSION"))),
    ])
}

/// `CONFIG GET param ...`: `save` and `appendonly` (what redis-benchmark asks), nothing else.
pub fn config_get(params: &[Bytes]) -> Frame {
    let mut out = Vec::new();
    for p in params {
        let value = if p.eq_ignore_ascii_case(b"save") {
            ""
        } else if p.eq_ignore_ascii_case(b"appendonly") {
            "no"
        } else {
            continue;
        };
        out.push((Frame::bulk(p.to_ascii_lowercase()), Frame::bulk(value)));
    }
    Frame::Map(out)
}

/// `INFO [section ...]`: the `server`, `clients` and `keyspace` sections (all of them when no
/// section, `all`, `default` or `everything` is asked; unknown sections are empty, as in Redis).
pub fn info(service: &Service, sections: &[Bytes]) -> Frame {
    let wants = |name: &str| {
        sections.is_empty()
            || sections.iter().any(|s| {
                s.eq_ignore_ascii_case(name.as_bytes())
                    || [&b"all"[..], b"default", b"everything"]
                        .iter()
                        .any(|all| s.eq_ignore_ascii_case(all))
            })
    };
    let status = service.status();
    let config = service.config();
    let mut parts = Vec::new();
    if wants("server") {
        parts.push(format!(
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nquorate_version:{}\r\nredis_mode:standalone\r\n\
             shards:{}\r\nlimits:{}\r\ninline_limits:{}\r\n",
            status.version,
            config.shards,
            status.limits.join(","),
            if status.inline_allowed { "allowed" } else { "refused" },
        ));
    }
    if wants("clients") {
        let connected = service
            .metrics()
            .connections
            .with_label_values(&["resp"])
            .get();
        parts.push(format!(
            "# Clients\r\nconnected_clients:{connected}\r\nmaxclients:{}\r\n",
            config.max_connections
        ));
    }
    if wants("keyspace") {
        parts.push(format!(
            "# Keyspace\r\nkeys:{}\r\nmax_keys:{}\r\ndb0:keys={},expires=0,avg_ttl=0\r\n",
            status.keys, status.max_keys, status.keys
        ));
    }
    Frame::bulk(parts.join("\r\n"))
}

/// One command as `COMMAND` describes it: name, arity (negative: at least that many
/// arguments, the name included), flags, and the first key's position, the last's (negative:
/// from the end) and the step between keys; 0, 0, 0 for a command without keys.
pub struct CommandSpec {
    pub name: &'static str,
    pub arity: i64,
    pub flags: &'static [&'static str],
    pub keys: (i64, i64, i64),
}

/// Every command quorate answers, for `COMMAND`: Redis Cluster clients (redis-py's
/// `RedisCluster`, go-redis) look a command up here to find the key they route it by.
/// `QR.CHECK`'s keys move (an optional `ID request-id` first, then limit, key, cost
/// triples): `movablekeys`, with the plain form's positions (2, then every third) for
/// clients that read only those, and `COMMAND GETKEYS` for the exact ones.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "cl.throttle",
        arity: -5,
        flags: &["write"],
        keys: (1, 1, 1),
    },
    CommandSpec {
        name: "qr.check",
        arity: -4,
        flags: &["write", "movablekeys"],
        keys: (2, -2, 3),
    },
    CommandSpec {
        name: "qr.peek",
        arity: 3,
        flags: &["readonly"],
        keys: (2, 2, 1),
    },
    CommandSpec {
        name: "qr.routes",
        arity: 1,
        flags: &["readonly"],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "cluster",
        arity: -2,
        flags: &["readonly"],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "ping",
        arity: -1,
        flags: &["fast"],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "echo",
        arity: 2,
        flags: &["fast"],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "quit",
        arity: -1,
        flags: &["fast"],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "select",
        arity: 2,
        flags: &["fast"],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "client",
        arity: -2,
        flags: &[],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "hello",
        arity: -1,
        flags: &["fast"],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "command",
        arity: -1,
        flags: &[],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "config",
        arity: -2,
        flags: &[],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "info",
        arity: -1,
        flags: &[],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "readonly",
        arity: 1,
        flags: &["fast"],
        keys: (0, 0, 0),
    },
    CommandSpec {
        name: "readwrite",
        arity: 1,
        flags: &["fast"],
        keys: (0, 0, 0),
    },
];

/// A command's entry as Redis 6 gives it: name, arity, flags, first key, last key, step,
/// ACL categories (none: quorate has no ACLs). Seven elements, not Redis 7's ten (tips, key
/// specs, subcommands): clients read the key positions from the first six, and redis-py's
/// RESP3 parser needs the seventh.
fn command_entry(c: &CommandSpec) -> Frame {
    Frame::Array(vec![
        Frame::bulk(c.name),
        Frame::Integer(c.arity),
        Frame::Array(c.flags.iter().map(|f| Frame::simple(f)).collect()),
        Frame::Integer(c.keys.0),
        Frame::Integer(c.keys.1),
        Frame::Integer(c.keys.2),
        Frame::Array(vec![]),
    ])
}

/// `COMMAND` (`names` empty: every command) and `COMMAND INFO name ...` (nil for a name
/// quorate does not know).
pub fn command_info(names: &[Bytes]) -> Frame {
    if names.is_empty() {
        return Frame::Array(COMMANDS.iter().map(command_entry).collect());
    }
    Frame::Array(
        names
            .iter()
            .map(|n| {
                COMMANDS
                    .iter()
                    .find(|c| c.name.as_bytes().eq_ignore_ascii_case(n))
                    .map_or(Frame::Null, command_entry)
            })
            .collect(),
    )
}

/// `COMMAND LIST`.
pub fn command_names() -> Frame {
    Frame::Array(COMMANDS.iter().map(|c| Frame::bulk(c.name)).collect())
}

/// `COMMAND GETKEYS command [arg ...]`: the keys the command would check, in order.
pub fn command_getkeys(args: &[Bytes]) -> Frame {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_ref()).collect();
    match super::command::parse(&args) {
        Ok(super::command::Command::Check { request, .. }) => Frame::Array(
            request
                .items
                .into_iter()
                .map(|i| Frame::bulk(i.key))
                .collect(),
        ),
        Ok(_) => Frame::err("The command has no key arguments"),
        Err(_) => Frame::err("Invalid arguments specified for command"),
    }
}

/// `QR.ROUTES`: where keys live, so that a client can send each key to its shard's leader
/// and save the hop through a node that would forward it. An array of four (five under
/// `slots` sharding):
/// 1. this node's id (0 on a single node);
/// 2. the shard count (keys go to `jump(fnv1a(storage key), shards)`, or by hash slot under
///    `slots` sharding: `crate::shard::route`);
/// 3. per shard, `[leader, term]`: the leader's node id as this node knows it (nil when it
///    knows none, and on a single node) and its term, so a client asking several nodes can
///    keep the newest (nil at term 0 from a node that knows it was removed from the shard);
/// 4. the named limits' storage-key prefixes, flat: `name, prefix, name, prefix...` (a named
///    limit's storage key is its prefix and the key; an inline limit's is built from its
///    parameters, as `crate::service::resolve` does);
/// 5. only under `slots` sharding: `slots` (a client that knows only four elements then
///    refuses the answer and sends everything to its first node, rather than misroute).
///
/// A stale answer costs only speed: every node forwards what it does not lead.
pub fn routes(service: &Service) -> Frame {
    // Node ids and terms are u64; a RESP integer is i64. An id beyond it (never chosen in
    // practice) is not routed to: nil, or an error for the node's own.
    let int = |n: u64| i64::try_from(n).ok().map(Frame::Integer);
    let (node, shards) = match service.cluster() {
        Some(c) => (
            match int(c.node_id()) {
                Some(Frame::Integer(id)) => id,
                _ => return Frame::err("this node's id does not fit a RESP integer"),
            },
            c.leaders()
                .into_iter()
                .map(|(leader, term)| {
                    Frame::Array(vec![
                        leader.and_then(int).unwrap_or(Frame::Null),
                        int(term).unwrap_or(Frame::Integer(i64::MAX)),
                    ])
                })
                .collect(),
        ),
        None => (
            0,
            (0..service.shard_count())
                .map(|_| Frame::Array(vec![Frame::Null, Frame::Integer(0)]))
                .collect::<Vec<_>>(),
        ),
    };
    let policies = service.policies();
    let mut prefixes = Vec::with_capacity(policies.options.len() * 2);
    for (name, options) in &policies.options {
        prefixes.push(Frame::bulk(name.clone()));
        prefixes.push(Frame::bulk(options.key_prefix.clone()));
    }
    let mut reply = vec![
        Frame::Integer(node),
        Frame::Integer(shards.len() as i64),
        Frame::Array(shards),
        Frame::Array(prefixes),
    ];
    if service.sharding() != crate::shard::route::Sharding::Hash {
        reply.push(Frame::bulk(service.sharding().name()));
    }
    Frame::Array(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_get_answers_what_redis_benchmark_asks_and_nothing_else() {
        let params = [
            Bytes::from_static(b"SAVE"),
            Bytes::from_static(b"maxmemory"),
            Bytes::from_static(b"appendonly"),
        ];
        assert_eq!(
            config_get(&params),
            Frame::Map(vec![
                (Frame::bulk("save"), Frame::bulk("")),
                (Frame::bulk("appendonly"), Frame::bulk("no")),
            ])
        );
        assert_eq!(config_get(&[Bytes::from_static(b"x")]), Frame::Map(vec![]));
    }

    #[test]
    fn hello_names_the_protocol_it_switches_to() {
        for proto in [Protocol::Resp2, Protocol::Resp3] {
            let Frame::Map(fields) = hello(proto) else {
                panic!("not a map")
            };
            let value = |name: &str| {
                fields
                    .iter()
                    .find(|(f, _)| *f == Frame::bulk(name.to_string()))
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(value("proto"), Some(Frame::Integer(proto.version())));
            assert_eq!(value("server"), Some(Frame::bulk("quorate")));
        }
    }
}
