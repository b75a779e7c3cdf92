//! libstdc++'s `std::sort` (GCC 12, `bits/stl_algo.h`: introsort with a median-of-three
//! pivot, a heap sort past the depth limit, then an insertion sort of runs of 16), step for
//! step, so that a comparison that is not a strict weak order gives the order llama.cpp built
//! by GCC gets. llama.cpp's locally typical sampler sorts by `a < b` on f32 scores that are
//! all NaN when a candidate has probability 0 (a `-inf` logit: grammar, `logit_bias`,
//! `ignore_eos`, top-n-σ), and then every comparison is false: the result is the
//! permutation this algorithm makes of the input, which any other sort would not reproduce.

/// libstdc++'s `_S_threshold`.
const THRESHOLD: usize = 16;

/// Sorts `v` by `less` exactly as libstdc++'s `std::sort(v.begin(), v.end(), less)` does.
pub fn sort_by<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    let n = v.len();
    if n > 1 {
        let depth = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
        introsort_loop(v, 0, n, depth, less);
        final_insertion_sort(v, 0, n, less);
    }
}

fn introsort_loop<T: Copy>(
    v: &mut [T],
    first: usize,
    mut last: usize,
    mut depth: usize,
    less: &impl Fn(&T, &T) -> bool,
) {
    while last - first > THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[first..last], less);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(v, first, last, less);
        introsort_loop(v, cut, last, depth, less);
        last = cut;
    }
}

/// `__unguarded_partition_pivot`: the median of `first + 1`, the middle and `last - 1`
/// moved to `first`, then the unguarded partition of `first + 1 .. last` around it.
fn partition_pivot<T: Copy>(
    v: &mut [T],
    first: usize,
    last: usize,
    less: &impl Fn(&T, &T) -> bool,
) -> usize {
    let mid = first + (last - first) / 2;
    let (a, b, c) = (first + 1, mid, last - 1);
    let pick = if less(&v[a], &v[b]) {
        if less(&v[b], &v[c]) {
            b
        } else if less(&v[a], &v[c]) {
            c
        } else {
            a
        }
    } else if less(&v[a], &v[c]) {
        a
    } else if less(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(first, pick);
    let (mut lo, mut hi) = (first + 1, last);
    loop {
        while less(&v[lo], &v[first]) {
            lo += 1;
        }
        hi -= 1;
        while less(&v[first], &v[hi]) {
            hi -= 1;
        }
        if lo >= hi {
            return lo;
        }
        v.swap(lo, hi);
        lo += 1;
    }
}

/// `__final_insertion_sort`: a guarded insertion sort of the first 16, an unguarded one
/// of the rest.
fn final_insertion_sort<T: Copy>(
    v: &mut [T],
    first: usize,
    last: usize,
    less: &impl Fn(&T, &T) -> bool,
) {
    if last - first > THRESHOLD {
        insertion_sort(v, first, first + THRESHOLD, less);
        for i in first + THRESHOLD..last {
            linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, first, last, less);
    }
}

fn insertion_sort<T: Copy>(v: &mut [T], first: usize, last: usize, less: &impl Fn(&T, &T) -> bool) {
    for i in first + 1..last {
        if less(&v[i], &v[first]) {
            let x = v[i];
            v.copy_within(first..i, first + 1);
            v[first] = x;
        } else {
            linear_insert(v, i, less);
        }
    }
}

/// `__unguarded_linear_insert`: moves `v[i]` back while it is less than its predecessor.
fn linear_insert<T: Copy>(v: &mut [T], mut i: usize, less: &impl Fn(&T, &T) -> bool) {
    let x = v[i];
    while less(&x, &v[i - 1]) {
        v[i] = v[i - 1];
        i -= 1;
    }
    v[i] = x;
}

/// `__partial_sort(first, last, last)`: `__make_heap` then `__sort_heap`.
fn heap_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    let len = v.len();
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let x = v[parent];
        adjust_heap(v, parent, len, x, less);
        if parent == 0 {
            break;
        }
        parent -= 1;
    }
    let mut last = len;
    while last > 1 {
        last -= 1;
        let x = v[last];
        v[last] = v[0];
        adjust_heap(v, 0, last, x, less);
    }
}

/// `__adjust_heap` with its `__push_heap`: sifts the hole at `hole` down to a leaf, then
/// `x` up from there.
fn adjust_heap<T: Copy>(
    v: &mut [T],
    mut hole: usize,
    len: usize,
    x: T,
    less: &impl Fn(&T, &T) -> bool,
) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len.is_multiple_of(2) && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    let mut parent = hole.wrapping_sub(1) / 2;
    while hole > top && less(&v[parent], &x) {
        v[hole] = v[parent];
        hole = parent;
        parent = hole.wrapping_sub(1) / 2;
    }
    v[hole] = x;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strict weak order: the result is sorted, and a permutation of the input.
    #[test]
    fn sorts_like_a_sort() {
        let mut s = 0x1234_5678_u32;
        for n in [0usize, 1, 2, 5, 16, 17, 100, 1000, 5000] {
            let v: Vec<u32> = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 17;
                    s ^= s << 5;
                    s % 50
                })
                .collect();
            let mut got = v.clone();
            sort_by(&mut got, &|a, b| a < b);
            let mut want = v.clone();
            want.sort();
            assert_eq!(got, want, "n {n}");
        }
    }

    /// Every comparison false (llama.cpp's typical sampler with NaN scores): the permutation
    /// libstdc++ makes, as GCC 12's `std::sort` printed it (a C++ program sorting the indices
    /// 0..n with a comparator that always returns false). The same program on random
    /// scores with NaNs (n from 2 to 49152) agreed with this module on every case tried.
    #[test]
    fn all_false_gives_libstdcxx_s_permutation() {
        let perm = |n: usize| {
            let mut v: Vec<usize> = (0..n).collect();
            sort_by(&mut v, &|_, _| false);
            v
        };
        assert_eq!(perm(5), vec![0, 1, 2, 3, 4]);
        assert_eq!(
            perm(20),
            vec![10, 19, 18, 17, 16, 15, 14, 13, 12, 11, 0, 9, 8, 7, 6, 5, 4, 3, 2, 1]
        );
        let want40: Vec<usize> = [30, 21, 22, 23, 24, 25, 26, 27, 28, 29, 20]
            .into_iter()
            .chain(31..40)
            .chain([10])
            .chain(1..10)
            .chain([0])
            .chain(11..20)
            .collect();
        assert_eq!(perm(40), want40);
    }
}
