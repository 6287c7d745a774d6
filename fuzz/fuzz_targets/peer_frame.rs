//! Arbitrary bytes from a peer connection (after the handshake): the frame reader must never
//! panic or read past its size cap, reading the bytes as they trickle in must give exactly
//! what reading them at once gives, every frame read re-encodes to the bytes it came from, and
//! a body that decodes as a peer request or response re-encodes to a message that decodes to
//! the same encoding (`quorate::raft::rpc::decode`, bounded, errors instead of panics).
#![no_main]

use libfuzzer_sys::fuzz_target;
use quorate::peer::frame::{read_frame, Frame, FrameError, PREFIX};
use quorate::raft::rpc::{decode, encode, PeerRequest, PeerResponse};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};

/// A small cap, so the fuzzer reaches it quickly.
const MAX: u32 = 512;

/// Hands out at most `step` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.step.min(buf.remaining()).min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        buf.put_slice(head);
        self.data = rest;
        Poll::Ready(Ok(()))
    }
}

/// Every frame until the first error, and that error (`Closed` at a clean end).
fn frames(data: &[u8], step: usize) -> (Vec<Frame>, String) {
    thread_local! {
        static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
    }
    RT.with(|rt| {
        rt.block_on(async {
            let mut r = Trickle { data, step };
            let mut out = Vec::new();
            loop {
                match read_frame(&mut r, MAX, Duration::from_secs(1)).await {
                    Ok(f) => out.push(f),
                    Err(e) => {
                        assert!(!matches!(e, FrameError::Idle(_)), "a reader never waits");
                        return (out, e.to_string());
                    }
                }
            }
        })
    })
}

/// A body that decodes re-encodes to a message that decodes to the same encoding.
fn round_trip<T: serde::Serialize + for<'de> serde::Deserialize<'de>>(body: &[u8]) {
    if let Ok(v) = decode::<T>(body) {
        let once = encode(&v);
        let again: T = decode(&once).expect("an encoded message decodes");
        assert_eq!(once, encode(&again));
    }
}

fuzz_target!(|data: &[u8]| {
    let (whole, end) = frames(data, usize::MAX);
    let step = 1 + data.first().map_or(0, |b| usize::from(*b) % 13);
    assert_eq!((whole.clone(), end), frames(data, step));

    let mut encoded = Vec::new();
    for f in &whole {
        assert!(
            PREFIX + f.body.len() <= MAX as usize,
            "a frame over the cap"
        );
        f.encode_into(&mut encoded);
        round_trip::<PeerRequest>(&f.body);
        round_trip::<PeerResponse>(&f.body);
    }
    assert!(
        data.starts_with(&encoded),
        "frames re-encode to their bytes"
    );
});
