//! Differential test: generated operation sequences run on `SimStore` and on a real PostgreSQL
//! server through `PostgresStore` must give the same responses and the same watch events, as
//! they must on etcd (`differential_etcd.rs`, where the normalisation is explained). The
//! simulator is itself held to etcd there, so this holds PostgreSQL to etcd's semantics.
//!
//! `PROPTEST_CASES` sets the number of sequences (default 200), `COORD_DIFF_SEED` the seed
//! they are drawn from (printed; fresh each run otherwise).

#[path = "differential/sequences.rs"]
mod sequences;

use sequences::{cases, seed};

#[test]
fn sim_and_postgres_agree_on_generated_sequences() {
    let seed = seed();
    println!(
        "differential seed {seed} (replay: COORD_DIFF_SEED={seed} cargo test -p coord-tests --test differential_postgres)"
    );
    let covered = sequences::sim_and_postgres_agree(cases(200), sequences::rng(seed), 500)
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "differential: {} sequences, {} operations ({} transactions, {} with a prefix compare), no divergence",
        covered.sequences, covered.operations, covered.transactions, covered.prefix_transactions
    );
}
