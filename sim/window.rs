//! The most admissions in any window of a given length.
//!
//! Why: "10 per second" is a promise about every one-second span, not just the aligned ones.
//! Counting the admitted requests in the worst span shows directly which algorithms keep it
//! (the sliding log, exactly) and which do not (the fixed window, up to twice at a boundary;
//! buckets, up to rate + capacity by design).

/// The largest number of `admitted_times` inside any window `[t, t + period)`, i.e. the most
/// times any two of which are less than `period` apart. Times are expected sorted (the
/// simulator's are); unsorted input is sorted first. A zero `period` contains nothing.
pub fn max_in_any_window(admitted_times: &[u64], period: u64) -> u64 {
    if period == 0 {
        return 0;
    }
    let sorted_copy;
    let times = if admitted_times.windows(2).all(|w| w[0] <= w[1]) {
        admitted_times
    } else {
        let mut v = admitted_times.to_vec();
        v.sort_unstable();
        sorted_copy = v;
        &sorted_copy
    };
    let mut best = 0;
    let mut start = 0;
    for (end, &t) in times.iter().enumerate() {
        // Drop times that are `period` or more before `t`.
        while t - times[start] >= period {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_list_has_zero_in_every_window() {
        assert_eq!(max_in_any_window(&[], 10), 0);
    }

    #[test]
    fn times_exactly_one_period_apart_are_in_different_windows() {
        assert_eq!(max_in_any_window(&[0, 10, 20], 10), 1);
        assert_eq!(max_in_any_window(&[0, 9, 18], 10), 2);
    }

    #[test]
    fn a_boundary_burst_counts_both_sides() {
        let times: Vec<u64> = (0..20).map(|i| 999 + i / 10).collect();
        assert_eq!(max_in_any_window(&times, 1000), 20);
    }

    #[test]
    fn the_worst_window_anywhere_is_found() {
        assert_eq!(max_in_any_window(&[0, 100, 101, 102, 103, 300, 301], 50), 4);
    }

    #[test]
    fn unsorted_input_is_sorted_first() {
        assert_eq!(max_in_any_window(&[103, 0, 101, 102, 100], 50), 4);
    }

    #[test]
    fn a_zero_period_contains_nothing() {
        assert_eq!(max_in_any_window(&[1, 1, 1], 0), 0);
    }

    #[test]
    fn equal_times_share_a_window() {
        assert_eq!(max_in_any_window(&[5; 7], 1), 7);
        assert_eq!(max_in_any_window(&[0, u64::MAX], u64::MAX), 1);
    }
}
