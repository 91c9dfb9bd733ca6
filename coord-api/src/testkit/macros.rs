//! The case list, kept in one place, and the macro that turns it into tests.

/// Expands to a module `conformance` with one `#[test]` per conformance case, each running
/// its case on the given harness (an expression evaluated afresh for every test, with the
/// enclosing module's items in scope).
///
/// ```text
/// coord_api::conformance_tests!(MyHarness::default());
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::__coord_cases! { tests $harness }
    };
}

/// The list of conformance cases: `area::case: isolation`. Adding a case here adds it to
/// every backend's run.
#[doc(hidden)]
#[macro_export]
macro_rules! __coord_cases {
    ($($mode:tt)+) => {
        $crate::__coord_expand! {[$($mode)+]
            kv::kv_put_then_get_reports_metadata: Shared,
            kv::kv_overwrite_bumps_version_and_mod_revision: Shared,
            kv::kv_each_write_advances_revision_by_one: Exclusive,
            kv::kv_get_missing_key_is_empty: Shared,
            kv::kv_get_prefix_returns_keys_in_order: Shared,
            kv::kv_keys_are_ordered_as_bytes: Shared,
            kv::kv_get_prefix_with_limit_reports_more: Shared,
            kv::kv_get_at_past_revision_sees_old_value: Shared,
            kv::kv_get_at_revision_outside_lifetime_is_empty: Shared,
            kv::kv_get_at_future_revision_fails: Shared,
            kv::kv_put_returns_previous_value: Shared,
            kv::kv_delete_key_removes_it: Shared,
            kv::kv_delete_missing_key_changes_nothing: Exclusive,
            kv::kv_delete_prefix_is_one_revision: Exclusive,
            kv::kv_recreated_key_starts_over: Shared,
            kv::kv_empty_value_is_stored: Shared,
            kv::kv_empty_key_is_invalid: Shared,
            kv::kv_oversized_value_is_invalid: Shared,
            kv::kv_put_with_unknown_lease_fails: Shared,
            kv::kv_negative_revision_is_invalid: Shared,
            txn::txn_value_compare_picks_the_branch: Shared,
            txn::txn_value_compare_operators: Shared,
            txn::txn_value_compare_on_missing_key_fails: Shared,
            txn::txn_version_zero_means_absent: Shared,
            txn::txn_create_revision_compare: Shared,
            txn::txn_mod_revision_compare_is_a_cas: Shared,
            txn::txn_lease_compare: Shared,
            txn::txn_all_compares_must_hold: Shared,
            txn::txn_writes_share_one_revision: Exclusive,
            txn::txn_without_writes_keeps_revision: Exclusive,
            txn::txn_reads_see_earlier_writes_of_the_branch: Shared,
            txn::txn_duplicate_key_is_invalid: Shared,
            txn::txn_with_unknown_lease_applies_nothing: Shared,
            txn::txn_delete_prefix_in_branch: Shared,
            txn::txn_put_with_lease_attaches: Shared,
            txn::txn_prefix_compare_covers_every_key: Shared,
            lease::lease_grant_returns_id_and_ttl: Shared,
            lease::lease_grant_raises_ttl_to_minimum: Shared,
            lease::lease_grant_invalid_ttl_is_refused: Shared,
            lease::lease_calls_do_not_advance_revision: Exclusive,
            lease::lease_time_to_live_reports_keys: Shared,
            lease::lease_time_to_live_of_dead_lease_is_not_found: Shared,
            lease::lease_revoke_deletes_keys_in_one_revision: Exclusive,
            lease::lease_revoke_unknown_is_not_found: Shared,
            lease::lease_expiry_deletes_keys: Shared,
            lease::lease_expiry_emits_delete_events: Shared,
            lease::lease_keep_alive_extends_the_lease: Shared,
            lease::lease_keep_alive_on_revoked_lease_is_not_found: Shared,
            lease::lease_keep_alive_after_expiry_is_not_found: Shared,
            lease::lease_put_without_lease_detaches_key: Shared,
            lease::lease_put_moves_key_between_leases: Shared,
            lease::lease_survives_deletion_of_its_keys: Shared,
            watch::watch_sees_puts_and_deletes: Shared,
            watch::watch_range_is_respected: Shared,
            watch::watch_from_past_replays_history: Shared,
            watch::watch_batches_whole_revisions: Shared,
            watch::watch_is_ordered_unique_and_complete: Shared,
            watch::watch_prev_kv_is_attached: Shared,
            watch::watch_without_prev_kv_has_none: Shared,
            watch::watch_prefix_delete_is_one_batch: Shared,
            watch::watch_put_event_carries_lease: Shared,
            watch::watch_progress_notify_reports_revision: Shared,
            watch::watch_concurrent_watchers_agree: Shared,
            watch::watch_from_compacted_revision_fails: Exclusive,
            watch::watch_from_compact_revision_works: Exclusive,
            watch::watch_from_past_overtaken_by_compaction_is_all_or_nothing: Exclusive,
            watch::watch_prev_kv_is_dropped_below_the_compaction_point: Exclusive,
            watch::watch_empty_key_is_invalid: Shared,
            watch::watch_from_future_revision_waits: Exclusive,
            compact::compact_discards_older_revisions: Exclusive,
            compact::compact_keeps_current_values: Exclusive,
            compact::compact_twice_fails: Exclusive,
            compact::compact_future_revision_fails: Exclusive,
            compact::compact_preserves_history_after_the_point: Exclusive,
            election::election_uncontested_campaign_wins: Shared,
            election::election_leader_without_candidates_is_no_leader: Shared,
            election::election_queue_order_is_creation_order: Shared,
            election::election_resign_is_idempotent: Shared,
            election::election_proclaim_updates_value: Shared,
            election::election_proclaim_by_non_leader_fails: Shared,
            election::election_cancelled_campaign_leaves_no_key: Shared,
            election::election_candidate_lease_death_is_an_error: Shared,
            election::election_campaign_with_dead_lease_fails: Shared,
            election::election_leader_expiry_hands_over: Shared,
            election::election_recampaign_with_same_lease_rejoins: Shared,
            election::election_invalid_name_is_refused: Shared,
            election::election_token_fences_writes: Shared,
            election::election_observe_follows_leaders: Shared,
            election::election_observe_waits_for_a_first_leader: Shared,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __coord_expand {
    ([all] $($area:ident :: $case:ident : $iso:ident),* $(,)?) => {
        &[$(
            $crate::testkit::Case {
                name: stringify!($case),
                isolation: $crate::testkit::Isolation::$iso,
                run: |cx| ::std::boxed::Box::pin($crate::testkit::$area::$case(cx)),
            }
        ),*]
    };
    ([tests $harness:expr] $($area:ident :: $case:ident : $iso:ident),* $(,)?) => {
        /// The conformance suite, one test per case.
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $case() {
                    let harness = $harness;
                    $crate::testkit::run_case(&harness, &$crate::testkit::Case {
                        name: stringify!($case),
                        isolation: $crate::testkit::Isolation::$iso,
                        run: |cx| ::std::boxed::Box::pin($crate::testkit::$area::$case(cx)),
                    });
                }
            )*
        }
    };
}
