"""What a durable 4 KiB WAL write costs here, as quorate's WAL makes it: into room that was
zero-filled and synced beforehand (the WAL preallocates, so the file's size does not change
and fdatasync writes the data blocks only; see src/wal/writer.rs, `Writer::extend`).

    python3 scripts/fsync_probe.py DIR N latency   # prints: p50_ms p99_ms N
    python3 scripts/fsync_probe.py DIR N cpu       # prints: cpu_us N

`latency` times each write + fdatasync (the write lands in the page cache: a few us of it).
Not included: the WAL's larger sync after each 1 MiB of new zero-filled room (one in about
250 writes of this size), which also writes the file's new size.
`cpu` is the busy time of CPU 0 per write + fdatasync (all but idle, iowait and steal),
meant to be run pinned to CPU 0 (taskset), where the servers and their WAL threads run.
Used by scripts/bench-cluster.
"""
import os
import statistics
import sys
import time


def cpu0_busy():
    v = [int(x) for x in open("/proc/stat").read().split("\n")[1].split()[1:9]]
    return sum(v) - v[3] - v[4] - v[7]


def main():
    directory, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode not in ("latency", "cpu") or n <= 0:
        sys.exit("usage: fsync_probe.py DIR N latency|cpu")
    path = os.path.join(directory, f"fsync-probe-{mode}")
    block = b"x" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        zeros = b"\0" * (1 << 20)
        for off in range(0, n * len(block), len(zeros)):
            os.pwrite(fd, zeros, off)
        os.fsync(fd)
        lat = []
        b0 = cpu0_busy()
        for i in range(n):
            a = time.perf_counter()
            os.pwrite(fd, block, i * len(block))
            os.fdatasync(fd)
            lat.append(time.perf_counter() - a)
        b1 = cpu0_busy()
    finally:
        os.close(fd)
        os.unlink(path)
    if mode == "latency":
        lat.sort()
        print(f"{statistics.median(lat) * 1e3:.4f} {lat[int(len(lat) * 0.99)] * 1e3:.4f} {n}")
    else:
        print(f"{(b1 - b0) * 1e6 / os.sysconf('SC_CLK_TCK') / n:.1f} {n}")


main()
