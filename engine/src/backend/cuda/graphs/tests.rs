use super::*;
use crate::backend::cuda::launch::attention_inputs;

fn cfg(v: &str) -> GraphConfig {
    GraphConfig::parse(Some(v)).unwrap()
}

#[test]
fn graphs_are_on_by_default_and_the_environment_turns_them_off_or_lists_buckets() {
    assert_eq!(GraphConfig::parse(None).unwrap().buckets, DEFAULT_BUCKETS);
    assert_eq!(cfg("on").buckets, DEFAULT_BUCKETS);
    for off in ["off", "0", "false", "OFF"] {
        assert!(!cfg(off).enabled(), "{off}");
    }
    assert_eq!(cfg("16, 1,4,4").buckets, [1, 4, 16], "sorted, deduplicated");
    assert_eq!(cfg("1").buckets, [1], "a number is a bucket, not a switch");
    let e = GraphConfig::parse(Some("1,x")).unwrap_err();
    assert!(e.contains(GRAPHS_ENV) && e.contains("\"x\""), "{e}");
    assert!(GraphConfig::parse(Some("2,-1")).is_err());
}

#[test]
fn decode_batches_pick_the_smallest_bucket_that_holds_them() {
    let c = GraphConfig::default();
    let picks: Vec<_> = (0..=10).map(|n| c.bucket(n)).collect();
    let want = [None, Some(1), Some(2), Some(4), Some(4)]
        .into_iter()
        .chain([Some(8); 4])
        .chain([None, None]);
    assert_eq!(picks, want.collect::<Vec<_>>());
    assert_eq!(cfg("8,2,4").bucket(3), Some(4), "order does not matter");
    assert_eq!(cfg("off").bucket(1), None);
}

fn decode_seqs(tables: &[Vec<u32>]) -> Vec<SeqRows<'_>> {
    tables
        .iter()
        .enumerate()
        .map(|(i, t)| SeqRows {
            start: i,
            len: 1,
            pos: t.len() * 16 - 1,
            blocks: t,
        })
        .collect()
}

#[test]
fn only_decode_steps_a_bucket_holds_are_replayed_and_the_table_width_is_rounded_up() {
    let c = GraphConfig::default();
    let tables = [vec![1], vec![2, 3, 4, 5, 6], vec![7, 8]];
    let seqs = decode_seqs(&tables);
    assert_eq!(
        c.decode_shape(&seqs, 3),
        Some(StepShape {
            bucket: 4,
            table_width: 8
        })
    );
    let nine: Vec<Vec<u32>> = (0..9).map(|i| vec![i]).collect();
    assert_eq!(
        c.decode_shape(&decode_seqs(&nine), 9),
        None,
        "above 8: eager"
    );
    let mut prefill = seqs.clone();
    prefill[1].len = 4;
    assert_eq!(c.decode_shape(&prefill, 6), None, "a prefill chunk: eager");
    assert_eq!(c.decode_shape(&[], 0), None);
    assert_eq!(
        (table_width(0), table_width(1), table_width(17)),
        (1, 1, 32)
    );
}

#[test]
fn padding_adds_one_row_sequences_without_a_table() {
    let tables = [vec![4], vec![5]];
    let seqs = decode_seqs(&tables);
    let p = padded(&seqs, 4);
    assert_eq!(p.len(), 4);
    assert!(!is_padding(&p[0]) && !is_padding(&p[1]));
    for (j, s) in p[2..].iter().enumerate() {
        assert!(is_padding(s));
        assert_eq!((s.start, s.len, s.pos), (2 + j, 1, 0));
    }
    assert_eq!(padded(&seqs, 2).len(), 2, "a full bucket gets no padding");
    // The attention of a padded batch: padding rows write and read the scratch block only.
    let a = attention_inputs(&p, 77);
    assert_eq!(a.slots, [16 * 4 + 15, 16 * 5 + 15, 77 * 16, 77 * 16]);
    assert_eq!(a.lens, [16, 16, 1, 1]);
}

#[test]
fn staging_keeps_one_copy_of_what_every_layer_repeats() {
    let mut s = Staging::default();
    let a = s.stage(1, &[5, 6]);
    let b = s.stage(2, &[0, 0]);
    assert_eq!((a, b), (0, 2));
    assert_eq!(s.stage(1, &[5, 6]), 0, "same tag, same values: reused");
    assert_eq!(s.stage(1, &[5, 7]), 4, "changed values: appended");
    assert_eq!(s.stage(1, &[5, 7]), 4);
    assert_eq!(s.data, [5, 6, 0, 0, 5, 7]);
    s.clear();
    assert_eq!(s.stage(1, &[9]), 0);
}

#[test]
fn a_thirty_layer_decode_step_stages_within_capacity() {
    // What the backend stages per layer (backend.rs): positions and zero slots for both RoPE
    // calls, then the attention's slots, tables, query rows, lengths and decode tables.
    let tables: Vec<Vec<u32>> = (0..5).map(|i| (0..100 + i).collect()).collect();
    let seqs = decode_seqs(&tables);
    let shape = GraphConfig::default().decode_shape(&seqs, 5).unwrap();
    let p = padded(&seqs, shape.bucket);
    let a = attention_inputs(&p, 999);
    assert_eq!(a.width, shape.table_width);
    let positions: Vec<i32> = p.iter().map(|s| s.pos as i32).collect();
    let zeros = vec![0; p.len()];
    let mut st = Staging::default();
    for _layer in 0..30 {
        for _rope in 0..2 {
            st.stage(1, &positions);
            st.stage(10, &zeros);
        }
        st.stage(2, &a.slots);
        st.stage(3, &a.tables);
        st.stage(4, &a.q_rows);
        st.stage(5, &a.lens);
        st.stage(6, &a.decode_tables);
    }
    let once = 2 * 8 + 8 + 8 * 128 + 8 + 8 + 8 * 128;
    assert_eq!(st.data.len(), once, "each array staged once for all layers");
    assert!(st.data.len() <= staging_capacity(shape.bucket, shape.table_width));
}

#[test]
fn fingerprints_differ_when_a_pointer_or_shape_differs() {
    let f = |ptr: u64, grid: u32| {
        let mut f = Fingerprint::default();
        f.launch("matvec_q4_1", (grid, 1, 1), [ptr, 576]);
        f.finish()
    };
    assert_eq!(f(0x1000, 144), f(0x1000, 144));
    assert_ne!(f(0x1000, 144), f(0x2000, 144));
    assert_ne!(f(0x1000, 144), f(0x1000, 145));
}

#[test]
fn a_shape_is_captured_replayed_recaptured_on_a_mismatch_and_eager_after_a_failure() {
    let s = StepShape {
        bucket: 4,
        table_width: 8,
    };
    let mut g: GraphSet<&str> = GraphSet::default();
    assert_eq!(g.plan(s), Plan::Capture);
    g.insert(s, 11, "graph a");
    assert_eq!(g.plan(s), Plan::Replay);
    assert_eq!(g.replay(s, 11), Some(&"graph a"));
    assert_eq!(g.replay(s, 12), None, "buffers moved: not replayed");
    assert_eq!(g.plan(s), Plan::Capture, "captured again");
    g.insert(s, 12, "graph b");
    assert_eq!(g.replay(s, 12), Some(&"graph b"));
    let wider = StepShape {
        table_width: 16,
        ..s
    };
    assert_eq!(
        g.plan(wider),
        Plan::Capture,
        "a wider table is its own graph"
    );
    assert!(g.fail(wider, "capture failed".into()));
    assert_eq!(g.plan(wider), Plan::Eager);
    assert_eq!(g.plan(s), Plan::Replay, "the other shape is kept");
    assert_eq!(
        g.stats,
        GraphStats {
            replays: 2,
            captures: 2,
            mismatches: 1,
            failures: 1,
            eager: 0
        }
    );
}

#[test]
fn the_least_recently_used_graph_goes_beyond_the_limit() {
    let shape = |w| StepShape {
        bucket: 1,
        table_width: w,
    };
    let mut g: GraphSet<usize> = GraphSet::default();
    for w in 0..MAX_GRAPHS {
        g.insert(shape(w), 0, w);
    }
    assert!(
        g.replay(shape(0), 0).is_some(),
        "0 used again: 1 is now the oldest"
    );
    g.insert(shape(MAX_GRAPHS), 0, MAX_GRAPHS);
    assert_eq!(g.len(), MAX_GRAPHS);
    assert_eq!(g.plan(shape(0)), Plan::Replay);
    assert_eq!(g.plan(shape(1)), Plan::Capture);
}
