//! The write-ahead log: round trips, torn and corrupt tails, bounds, and group commit.
//!
//! Durability across a real process crash is in `tests/wal_crash.rs`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use quorate::wal::{Record, Wal, WalOptions, SEGMENT_NAME};

/// Frame (8) + group (8) + kind (1) bytes around each record's bytes, and the sync mark
/// (33 bytes) that begins each write: every append here is a write of its own.
const OVERHEAD: u64 = 17 + MARK;

/// A sync mark's framed length.
const MARK: u64 = 33;

fn rec(group: u64, kind: u8, bytes: &[u8]) -> Record {
    Record {
        group,
        kind,
        bytes: bytes.to_vec(),
    }
}

fn sample() -> Vec<Record> {
    vec![
        rec(1, 0, b"first entry"),
        rec(2, 1, b""),
        rec(u64::MAX, 255, &[0xAB; 300]),
        rec(1, 2, b"last entry"),
    ]
}

fn segment(dir: &Path) -> std::path::PathBuf {
    dir.join(SEGMENT_NAME)
}

fn file_len(dir: &Path) -> u64 {
    std::fs::metadata(segment(dir)).unwrap().len()
}

fn encoded_len(records: &[Record]) -> u64 {
    records
        .iter()
        .map(|r| OVERHEAD + r.bytes.len() as u64)
        .sum()
}

async fn append_all(wal: &Wal, records: &[Record]) {
    for r in records {
        wal.append(r.group, r.kind, &r.bytes).await.unwrap();
    }
}

/// Writes `records` into a fresh log in `dir` and closes it: the records, each a write of its
/// own, then the closing write of a sync mark alone.
async fn write_log(dir: &Path, records: &[Record]) {
    let (wal, found) = Wal::open(dir).unwrap();
    assert!(found.is_empty());
    append_all(&wal, records).await;
    drop(wal);
    assert_eq!(file_len(dir), encoded_len(records) + MARK);
}

fn unsynced() -> WalOptions {
    WalOptions {
        sync: false,
        ..WalOptions::default()
    }
}

#[tokio::test]
async fn appended_records_come_back_in_order_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), &sample()).await;
    let (_wal, found) = Wal::open(dir.path()).unwrap();
    assert_eq!(found, sample());
}

#[tokio::test]
async fn appends_after_a_reopen_follow_the_recovered_records() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), &sample()[..2]).await;
    let (wal, found) = Wal::open(dir.path()).unwrap();
    assert_eq!(found, sample()[..2]);
    append_all(&wal, &sample()[2..]).await;
    drop(wal);
    let (_wal, found) = Wal::open(dir.path()).unwrap();
    assert_eq!(found, sample());
}

/// Damages a closed log, then checks that opening it returns `intact` records, cuts the file to
/// exactly their length (and the closing mark's after them, if `sealed`), and that a new
/// append lands cleanly after them.
async fn assert_recovers_prefix(dir: &Path, intact: usize, sealed: bool) {
    let expected = &sample()[..intact];
    let (wal, found) = Wal::open(dir).unwrap();
    assert_eq!(found, expected);
    let len = encoded_len(expected) + if sealed { MARK } else { 0 };
    assert_eq!(file_len(dir), len, "tail not truncated");
    wal.append(9, 9, b"after recovery").await.unwrap();
    drop(wal);
    let (_wal, found) = Wal::open(dir).unwrap();
    let mut want = expected.to_vec();
    want.push(rec(9, 9, b"after recovery"));
    assert_eq!(found, want);
}

#[tokio::test]
async fn a_log_cut_inside_its_last_payload_keeps_the_records_before_it() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), &sample()).await;
    let cut = encoded_len(&sample()) - 3;
    OpenOptions::new()
        .write(true)
        .open(segment(dir.path()))
        .unwrap()
        .set_len(cut)
        .unwrap();
    assert_recovers_prefix(dir.path(), 3, false).await;
}

#[tokio::test]
async fn a_log_cut_inside_a_header_keeps_the_records_before_it() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), &sample()).await;
    let cut = encoded_len(&sample()[..3]) + 5;
    OpenOptions::new()
        .write(true)
        .open(segment(dir.path()))
        .unwrap()
        .set_len(cut)
        .unwrap();
    assert_recovers_prefix(dir.path(), 3, false).await;
}

#[tokio::test]
async fn garbage_after_the_last_record_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), &sample()).await;
    let mut file = OpenOptions::new()
        .append(true)
        .open(segment(dir.path()))
        .unwrap();
    file.write_all(b"\x13\x00\x00\x00garbage that is not a record")
        .unwrap();
    drop(file);
    assert_recovers_prefix(dir.path(), 4, true).await;
}

#[tokio::test]
async fn a_zero_filled_tail_is_truncated_not_read_as_empty_records() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), &sample()).await;
    let file = OpenOptions::new()
        .write(true)
        .open(segment(dir.path()))
        .unwrap();
    file.set_len(file_len(dir.path()) + 4096).unwrap();
    drop(file);
    assert_recovers_prefix(dir.path(), 4, true).await;
}

/// Copies the open log's segment elsewhere, as a crash at this moment would leave it.
fn crash_copy(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(segment(dir), segment(copy.path())).unwrap();
    copy
}

#[tokio::test]
async fn the_segment_is_zero_filled_ahead_so_syncs_leave_its_size_alone() {
    let dir = tempfile::tempdir().unwrap();
    let chunk = 4096;
    let options = WalOptions {
        preallocate_bytes: chunk,
        ..WalOptions::default()
    };
    let (wal, _) = Wal::open_with(dir.path(), options.clone()).unwrap();
    wal.append(1, 0, b"first").await.unwrap();
    assert_eq!(file_len(dir.path()), chunk, "room not zero-filled ahead");
    // Appends within the room change no size; one that crosses it extends by whole chunks.
    let mut written = vec![rec(1, 0, b"first")];
    for i in 0..100u8 {
        let r = rec(2, i, &[i; 200]);
        wal.append(r.group, r.kind, &r.bytes).await.unwrap();
        written.push(r);
        let (len, logical) = (file_len(dir.path()), encoded_len(&written));
        assert!(
            len > logical && len % chunk == 0,
            "{len} for {logical} bytes"
        );
    }
    // A crash now leaves records then zeros: every acknowledged record comes back, the
    // zeros are cut, and appends go on right after the last record.
    let copy = crash_copy(dir.path());
    let (reopened, found) = Wal::open_with(copy.path(), options.clone()).unwrap();
    assert_eq!(found, written);
    assert_eq!(file_len(copy.path()), encoded_len(&written));
    reopened.append(3, 3, b"after the crash").await.unwrap();
    drop(reopened);
    let (_again, found) = Wal::open_with(copy.path(), options).unwrap();
    assert_eq!(found.len(), written.len() + 1);
    assert_eq!(found.last(), Some(&rec(3, 3, b"after the crash")));
    // A clean close trims the room: the file ends at its closing mark.
    drop(wal);
    assert_eq!(file_len(dir.path()), encoded_len(&written) + MARK);
}

#[tokio::test]
async fn without_preallocation_each_append_grows_the_file() {
    // The control for the test above: the size-change-per-sync it avoids is real here.
    let dir = tempfile::tempdir().unwrap();
    let options = WalOptions {
        preallocate_bytes: 0,
        ..WalOptions::default()
    };
    let (wal, _) = Wal::open_with(dir.path(), options).unwrap();
    append_all(&wal, &sample()).await;
    assert_eq!(file_len(dir.path()), encoded_len(&sample()));
}

/// A record damaged after it was synced (a later write's mark says so) is not a torn tail:
/// the log is refused, with the offsets, and nothing is cut. Before sync marks, the log was
/// cut there and the fourth record, acknowledged, silently lost.
#[tokio::test]
async fn a_flipped_byte_in_a_synced_record_refuses_the_log_and_cuts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), &sample()).await;
    let mut bytes = std::fs::read(segment(dir.path())).unwrap();
    let third = encoded_len(&sample()[..2]);
    // In the third record's payload; then in its write's sync mark.
    for (at, bad) in [(third + MARK + 17 + 100, third + MARK), (third + 20, third)] {
        let mut damaged = bytes.clone();
        damaged[at as usize] ^= 0x01;
        std::fs::write(segment(dir.path()), &damaged).unwrap();
        let err = Wal::open(dir.path())
            .err()
            .expect("a damaged synced log opened");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        let message = err.to_string();
        assert!(
            message.contains(&format!("record at byte {bad} is damaged"))
                && message.contains("replace the node"),
            "{message}"
        );
        assert_eq!(
            std::fs::read(segment(dir.path())).unwrap(),
            damaged,
            "the log was changed"
        );
    }
    // With the closing mark damaged too, the marks after the record no longer lead to the
    // log's end (the search past damage finds no proof), but the mark right after its write
    // still says it was synced: refused all the same.
    let mut twice = bytes.clone();
    twice[(third + MARK + 17 + 100) as usize] ^= 0x01;
    let closing = twice.len() - 3;
    twice[closing] ^= 0x01;
    std::fs::write(segment(dir.path()), &twice).unwrap();
    assert!(
        Wal::open(dir.path()).is_err(),
        "a damaged synced record cut as torn when the closing mark is damaged too"
    );
    assert_eq!(std::fs::read(segment(dir.path())).unwrap(), twice);
    // The first write's mark too: a segment begins with a write.
    bytes[3] ^= 0x40;
    std::fs::write(segment(dir.path()), &bytes).unwrap();
    assert!(
        Wal::open(dir.path()).is_err(),
        "a damaged first mark was cut as torn"
    );
}

/// Damage that takes a write's mark with it (a block of zeros, or of another file's bytes)
/// cannot be followed through mark by mark; an intact mark after it that says the log was
/// synced past it still refuses the log, and nothing is cut. Before, such damage was cut as a
/// torn tail: 4 KiB of zeros in a synced log dropped every write after them, 512 at its
/// start the whole log. In the last write of a log that did not close, the same zeros are a
/// torn tail still.
#[tokio::test]
async fn a_block_of_zeros_or_noise_over_synced_writes_refuses_the_log_and_cuts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Record> = (0..200u64)
        .map(|i| rec(i % 3, 1, &[i as u8; 100]))
        .collect();
    write_log(dir.path(), &records).await;
    let bytes = std::fs::read(segment(dir.path())).unwrap();
    let middle = bytes.len() / 2;
    let last_write = encoded_len(&records[..199]) as usize;
    let closing = bytes.len() - MARK as usize;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut noise = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    };
    // (from, to, noise rather than zeros)
    let cases = [
        (middle, middle + 4096, false),
        (0, 512, false),
        (middle, middle + 4096, true),
        // The last write, all of it: only the closing mark says it was synced.
        (last_write, closing, false),
    ];
    for (from, to, noisy) in cases {
        let mut damaged = bytes.clone();
        for b in &mut damaged[from..to] {
            *b = if noisy { noise() } else { 0 };
        }
        std::fs::write(segment(dir.path()), &damaged).unwrap();
        let err = Wal::open(dir.path())
            .err()
            .unwrap_or_else(|| panic!("bytes {from}..{to} damaged, the log opened"));
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("replace the node"), "{err}");
        assert_eq!(
            std::fs::read(segment(dir.path())).unwrap(),
            damaged,
            "the log was changed"
        );
    }

    // A crash: no mark after the last write says it was synced.
    let crashed = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(crashed.path()).unwrap();
    append_all(&wal, &records).await;
    let copy = crash_copy(crashed.path());
    drop(wal);
    let mut torn = std::fs::read(segment(copy.path())).unwrap();
    torn[last_write + 10..last_write + 60].fill(0);
    std::fs::write(segment(copy.path()), &torn).unwrap();
    let (_wal, found) = Wal::open(copy.path()).unwrap();
    assert_eq!(found, records[..199]);
    assert_eq!(file_len(copy.path()), last_write as u64);
}

/// The same flip in the last write of a log that did not close (a crash: nothing after that
/// write says it was synced) is a torn tail: the log ends before that write. After a clean
/// close, the closing mark says it was: refused.
#[tokio::test]
async fn a_flipped_byte_in_the_last_write_ends_the_log_before_it_unless_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(dir.path()).unwrap();
    append_all(&wal, &sample()).await;
    let copy = crash_copy(dir.path());
    drop(wal);
    let inside_fourth = (encoded_len(&sample()[..3]) + MARK + 17 + 3) as usize;
    for (at, closed) in [(copy.path(), false), (dir.path(), true)] {
        let mut bytes = std::fs::read(segment(at)).unwrap();
        bytes[inside_fourth] ^= 0x01;
        std::fs::write(segment(at), &bytes).unwrap();
        if closed {
            assert!(
                Wal::open(at).is_err(),
                "a damaged last write of a closed log was cut"
            );
        } else {
            assert_recovers_prefix(at, 3, false).await;
        }
    }
}

#[tokio::test]
async fn a_length_over_the_maximum_is_a_corrupt_tail_not_an_allocation() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), &sample()).await;
    let mut file = OpenOptions::new()
        .append(true)
        .open(segment(dir.path()))
        .unwrap();
    // Claims a 4 GiB payload: refused by the bound before any buffer is sized from it.
    file.write_all(&[0xFF; 64]).unwrap();
    drop(file);
    assert_recovers_prefix(dir.path(), 4, true).await;
}

#[tokio::test]
async fn an_empty_file_opens_as_an_empty_log() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(segment(dir.path()), b"").unwrap();
    let (wal, found) = Wal::open(dir.path()).unwrap();
    assert!(found.is_empty());
    wal.append(1, 1, b"x").await.unwrap();
    drop(wal);
    assert_eq!(Wal::open(dir.path()).unwrap().1, vec![rec(1, 1, b"x")]);
}

#[tokio::test]
async fn a_missing_directory_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("node-1").join("wal");
    let (wal, found) = Wal::open(&nested).unwrap();
    assert!(found.is_empty());
    assert_eq!(wal.path(), segment(&nested));
    wal.append(1, 1, b"x").await.unwrap();
    drop(wal);
    assert_eq!(Wal::open(&nested).unwrap().1, vec![rec(1, 1, b"x")]);
}

#[tokio::test]
async fn a_path_that_is_a_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    assert!(Wal::open(&file).is_err());
}

#[tokio::test]
async fn an_oversized_append_is_refused_and_the_log_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let options = WalOptions {
        max_record_bytes: 1024,
        queue_bytes: 4096,
        ..WalOptions::default()
    };
    let (wal, _) = Wal::open_with(dir.path(), options.clone()).unwrap();
    let fits = vec![7u8; 1024 - 9];
    let too_big = vec![7u8; 1024 - 8];
    let err = wal.append(1, 1, &too_big).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    wal.append(1, 1, &fits).await.unwrap();
    drop(wal);
    let (_wal, found) = Wal::open_with(dir.path(), options).unwrap();
    assert_eq!(found, vec![rec(1, 1, &fits)]);
}

#[test]
fn options_that_could_never_accept_a_record_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = [
        WalOptions {
            max_record_bytes: 4,
            ..WalOptions::default()
        },
        WalOptions {
            max_record_bytes: 1 << 20,
            queue_bytes: 1 << 19,
            ..WalOptions::default()
        },
        WalOptions {
            queue_records: 0,
            ..WalOptions::default()
        },
    ];
    for options in bad {
        let err = Wal::open_with(dir.path(), options).err().unwrap();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_appenders_share_fsyncs() {
    const APPENDERS: u64 = 64;
    const EACH: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(dir.path()).unwrap();
    let wal = Arc::new(wal);
    let mut tasks = Vec::new();
    for group in 0..APPENDERS {
        let wal = Arc::clone(&wal);
        tasks.push(tokio::spawn(async move {
            for n in 0..EACH {
                wal.append(group, 0, &n.to_le_bytes()).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (appends, syncs) = wal.stats();
    println!(
        "64 appenders: {appends} appends, {syncs} fsyncs, {:.3} fsyncs per append",
        syncs as f64 / appends as f64
    );
    assert_eq!(appends, APPENDERS * EACH);
    assert!(syncs < appends / 4, "{syncs} syncs for {appends} appends");
    drop(wal);

    let (_wal, found) = Wal::open(dir.path()).unwrap();
    assert_eq!(found.len() as u64, APPENDERS * EACH);
    for group in 0..APPENDERS {
        let numbers: Vec<u64> = found
            .iter()
            .filter(|r| r.group == group)
            .map(|r| u64::from_le_bytes(r.bytes.as_slice().try_into().unwrap()))
            .collect();
        assert_eq!(numbers, (0..EACH).collect::<Vec<_>>(), "group {group}");
    }
}

#[tokio::test]
async fn one_appender_at_a_time_costs_one_fsync_per_append() {
    // The control for the test above: without concurrency there is nothing to share.
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(dir.path()).unwrap();
    append_all(&wal, &sample()).await;
    assert_eq!(wal.stats(), (4, 4));
}

#[tokio::test]
async fn with_sync_off_no_fsync_is_issued() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open_with(dir.path(), unsynced()).unwrap();
    append_all(&wal, &sample()).await;
    assert_eq!(wal.stats(), (4, 0));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

fn records() -> impl Strategy<Value = Vec<Record>> {
    let record = (
        0u64..4,
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(group, kind, bytes)| Record { group, kind, bytes });
    prop::collection::vec(record, 0..24)
}

/// Writes `records` unsynced (durability is not the property here; speed is welcome).
fn write_unsynced(dir: &Path, records: &[Record]) {
    runtime().block_on(async {
        let (wal, _) = Wal::open_with(dir, unsynced()).unwrap();
        append_all(&wal, records).await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_sequence_of_records_survives_a_round_trip(records in records()) {
        let dir = tempfile::tempdir().unwrap();
        write_unsynced(dir.path(), &records);
        let (_wal, found) = Wal::open(dir.path()).unwrap();
        prop_assert_eq!(found, records);
    }

    #[test]
    fn a_log_cut_anywhere_yields_exactly_the_records_that_fit(
        records in records(),
        cut_fraction in 0.0f64..=1.0,
    ) {
        let dir = tempfile::tempdir().unwrap();
        write_unsynced(dir.path(), &records);
        let total = file_len(dir.path());
        let cut = ((total as f64) * cut_fraction) as u64;
        OpenOptions::new().write(true).open(segment(dir.path())).unwrap().set_len(cut).unwrap();

        let fit = (0..=records.len())
            .rev()
            .find(|&n| encoded_len(&records[..n]) <= cut)
            .unwrap_or(0);
        let (_wal, found) = Wal::open(dir.path()).unwrap();
        prop_assert_eq!(&found[..], &records[..fit]);
        prop_assert_eq!(file_len(dir.path()), encoded_len(&records[..fit]));
    }

    /// Synced appends (a write each), then a clean close (a write of a closing mark alone): a
    /// flipped byte in any record's write refuses the log and leaves it as it was; in the
    /// closing mark, every record comes back.
    #[test]
    fn a_flipped_byte_in_a_synced_log_is_refused_unless_in_its_closing_mark(
        records in records().prop_filter("needs a record", |r| !r.is_empty()),
        at_fraction in 0.0f64..1.0,
        mask in 1u8..=255,
    ) {
        let dir = tempfile::tempdir().unwrap();
        runtime().block_on(async {
            let (wal, _) = Wal::open(dir.path()).unwrap();
            append_all(&wal, &records).await;
        });
        let mut bytes = std::fs::read(segment(dir.path())).unwrap();
        let at = ((bytes.len() as f64) * at_fraction) as usize;
        bytes[at] ^= mask;
        std::fs::write(segment(dir.path()), &bytes).unwrap();
        let write = (0..records.len())
            .find(|&n| encoded_len(&records[..=n]) > at as u64)
            .unwrap_or(records.len());
        let opened = Wal::open(dir.path());
        if write < records.len() {
            prop_assert!(opened.is_err(), "write {} of {} damaged, opened", write, records.len());
            prop_assert_eq!(std::fs::read(segment(dir.path())).unwrap(), bytes);
        } else {
            let (_wal, found) = opened.unwrap();
            prop_assert_eq!(&found[..], &records[..]);
        }
    }

    #[test]
    fn a_flipped_byte_anywhere_yields_a_prefix_that_ends_before_it(
        records in records().prop_filter("needs a byte", |r| !r.is_empty()),
        at_fraction in 0.0f64..1.0,
        mask in 1u8..=255,
    ) {
        let dir = tempfile::tempdir().unwrap();
        write_unsynced(dir.path(), &records);
        let mut bytes = std::fs::read(segment(dir.path())).unwrap();
        let at = ((bytes.len() as f64) * at_fraction) as usize;
        bytes[at] ^= mask;
        std::fs::write(segment(dir.path()), &bytes).unwrap();

        let damaged = (0..records.len())
            .find(|&n| encoded_len(&records[..=n]) > at as u64)
            .unwrap_or(records.len());
        let (_wal, found) = Wal::open(dir.path()).unwrap();
        prop_assert_eq!(&found[..], &records[..damaged]);
    }
}

#[tokio::test]
async fn unsynced_submissions_are_written_in_order_and_made_durable_by_the_next_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(dir.path()).unwrap();
    let records = sample();
    for r in &records[..3] {
        let mut batch = wal.batch();
        batch.push(r.group, r.kind, &r.bytes).unwrap();
        wal.reserve(batch).await.unwrap().submit_unsynced();
    }
    for _ in 0..400 {
        if wal.stats().0 == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(wal.stats(), (3, 0), "written, and no sync of their own");
    let last = &records[3];
    wal.append(last.group, last.kind, &last.bytes)
        .await
        .unwrap();
    assert_eq!(wal.stats(), (4, 1));
    drop(wal);
    let (_wal, found) = Wal::open(dir.path()).unwrap();
    assert_eq!(found, records);
}

/// Whether the file system under `dir` takes an aligned `O_DIRECT` write (some network and
/// FUSE file systems, and tmpfs before Linux 6.6, refuse it).
#[cfg(target_os = "linux")]
fn takes_o_direct(dir: &Path) -> bool {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let probe = dir.join("o-direct-probe");
    let mut buf = vec![0u8; 8192];
    let at = buf.as_ptr().align_offset(4096);
    let taken = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .and_then(|f| f.write_all_at(&buf[at..at + 4096], 0))
        .is_ok();
    buf.clear();
    let _ = std::fs::remove_file(&probe);
    taken
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn direct_io_appends_of_any_size_read_back_as_the_page_cache_writes_them() {
    // O_DIRECT writes whole 4 KiB blocks: each append rewrites the partial block at the log's
    // end and pads with zeros. Sizes around and across block boundaries, a crash copy, a
    // reopen at an unaligned end (the tail block read back), and more appends after it.
    let sizes = [
        0usize,
        1,
        100,
        4096 - 17,
        4096 - 16,
        4096,
        5000,
        8192 + 3,
        12_000,
        7,
    ];
    let records: Vec<Record> = (0..60)
        .map(|i| {
            rec(
                i as u64,
                (i % 7) as u8,
                &vec![i as u8; sizes[i % sizes.len()]],
            )
        })
        .collect();
    let chunk = 64 << 10; // zero-filled room crossed several times
    let options = |direct_io| WalOptions {
        direct_io,
        preallocate_bytes: chunk,
        ..WalOptions::default()
    };
    // Under the build's target directory: on the repository's disk, not a tmpfs `$TMPDIR`
    // (the negative control in scripts/negative-controls needs the O_DIRECT path taken).
    let direct = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let paged = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (wal, _) = Wal::open_with(direct.path(), options(true)).unwrap();
    let (control, _) = Wal::open_with(paged.path(), options(false)).unwrap();
    append_all(&wal, &records[..40]).await;
    append_all(&control, &records[..40]).await;
    if takes_o_direct(direct.path()) {
        assert_eq!(
            wal.direct_writes(),
            40,
            "appends did not go through O_DIRECT"
        );
    } else {
        // Refused: the log falls back to the page cache by itself.
        assert_eq!(wal.direct_writes(), 0);
        println!("this file system refuses O_DIRECT: the page-cache fallback was tested");
    }
    assert_eq!(control.direct_writes(), 0, "direct_io: false used O_DIRECT");
    // The same bytes up to the last record, whichever way they were written.
    let logical = encoded_len(&records[..40]) as usize;
    let bytes = |dir: &Path| std::fs::read(segment(dir)).unwrap()[..logical].to_vec();
    assert!(
        bytes(direct.path()) == bytes(paged.path()),
        "the logs' bytes differ"
    );
    // A crash now: every record back, appends go on from the unaligned end.
    let copy = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::copy(segment(direct.path()), segment(copy.path())).unwrap();
    let (reopened, found) = Wal::open_with(copy.path(), options(true)).unwrap();
    assert_eq!(found, records[..40]);
    append_all(&reopened, &records[40..]).await;
    if takes_o_direct(copy.path()) {
        assert_eq!(reopened.direct_writes(), 20);
    }
    drop(reopened);
    let (_again, found) = Wal::open_with(copy.path(), options(true)).unwrap();
    assert_eq!(found, records);
    // And a clean close trims the room as before.
    drop(wal);
    assert_eq!(file_len(direct.path()), logical as u64 + MARK);
}
