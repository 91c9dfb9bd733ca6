//! Differential test: generated operation sequences run on `SimStore` and on a real etcd must
//! give the same responses and the same watch events.
//!
//! Each sequence runs on a fresh `SimStore` and, under its own key prefix, on one etcd that all
//! sequences share (a fresh etcd per sequence would cost a second each). Results are compared
//! after normalising what legitimately differs: revisions are taken relative to the revision
//! each side started the sequence at, lease ids become the order in which they were granted,
//! and error messages are reduced to their condition and fields. Leases use long TTLs so no
//! expiry races the sequence, and every lease is revoked when the sequence ends, so nothing of
//! one sequence moves the revision during the next.
//!
//! `PROPTEST_CASES` sets the number of sequences (default 200), `COORD_DIFF_SEED` the seed
//! they are drawn from (printed; fresh each run otherwise). A divergence fails with the
//! shrunk, minimal sequence and both sides' outcomes.

#[path = "differential/sequences.rs"]
mod sequences;

use sequences::{cases, seed};

#[test]
fn sim_and_etcd_agree_on_generated_sequences() {
    let seed = seed();
    println!(
        "differential seed {seed} (replay: COORD_DIFF_SEED={seed} cargo test -p coord-tests --test differential_etcd)"
    );
    let covered = sequences::sim_and_etcd_agree(cases(200), sequences::rng(seed), 500)
        .unwrap_or_else(|e| panic!("{e}"));
    let (txns, prefix_txns) = (covered.transactions, covered.prefix_transactions);
    println!(
        "differential: {} sequences, {} operations ({txns} transactions, {prefix_txns} with a prefix compare), no divergence",
        covered.sequences, covered.operations
    );
    // The generator's promise: prefix compares are no rarity (counted over the shrinking runs
    // too, which only ever drop operations).
    assert!(
        prefix_txns * 5 >= txns,
        "only {prefix_txns} of {txns} transactions compared over a prefix"
    );
}
