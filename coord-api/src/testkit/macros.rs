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

/// The list of conformance cases: `area::case`. Adding a case here adds it to
/// every backend's run.
#[doc(hidden)]
#[macro_export]
macro_rules! __coord_cases {
    ($($mode:tt)+) => {
        $crate::__coord_expand! {[$($mode)+]
            kv::kv_put_then_get_reports_metadata,
            kv::kv_overwrite_bumps_version_and_mod_revision,
            kv::kv_each_write_advances_revision_by_one,
            kv::kv_get_missing_key_is_empty,
            kv::kv_get_prefix_returns_keys_in_order,
            kv::kv_keys_are_ordered_as_bytes,
            kv::kv_get_prefix_with_limit_reports_more,
            kv::kv_get_sorts_by_revision_or_key_before_the_limit,
            kv::kv_get_filters_by_create_and_mod_revision,
            kv::kv_get_at_past_revision_sees_old_value,
            kv::kv_get_at_revision_outside_lifetime_is_empty,
            kv::kv_get_at_future_revision_fails,
            kv::kv_put_returns_previous_value,
            kv::kv_delete_key_removes_it,
            kv::kv_delete_missing_key_changes_nothing,
            kv::kv_delete_prefix_is_one_revision,
            kv::kv_recreated_key_starts_over,
            kv::kv_empty_value_is_stored,
            kv::kv_empty_key_is_invalid,
            kv::kv_oversized_value_is_invalid,
            kv::kv_put_with_unknown_lease_fails,
            kv::kv_negative_revision_is_invalid,
            txn::txn_value_compare_picks_the_branch,
            txn::txn_value_compare_operators,
            txn::txn_value_compare_on_missing_key_fails,
            txn::txn_version_zero_means_absent,
            txn::txn_create_revision_compare,
            txn::txn_mod_revision_compare_is_a_cas,
            txn::txn_lease_compare,
            txn::txn_all_compares_must_hold,
            txn::txn_writes_share_one_revision,
            txn::txn_without_writes_keeps_revision,
            txn::txn_reads_see_earlier_writes_of_the_branch,
            txn::txn_duplicate_key_is_invalid,
            txn::txn_with_unknown_lease_applies_nothing,
            txn::txn_delete_prefix_in_branch,
            txn::txn_put_with_lease_attaches,
            txn::txn_prefix_compare_covers_every_key,
            lease::lease_grant_returns_id_and_ttl,
            lease::lease_grant_raises_ttl_to_minimum,
            lease::lease_grant_invalid_ttl_is_refused,
            lease::lease_calls_do_not_advance_revision,
            lease::lease_time_to_live_reports_keys,
            lease::lease_time_to_live_of_dead_lease_is_not_found,
            lease::lease_revoke_deletes_keys_in_one_revision,
            lease::lease_revoke_unknown_is_not_found,
            lease::lease_expiry_deletes_keys,
            lease::lease_expiry_emits_delete_events,
            lease::lease_keep_alive_extends_the_lease,
            lease::lease_keep_alive_on_revoked_lease_is_not_found,
            lease::lease_keep_alive_after_expiry_is_not_found,
            lease::lease_put_without_lease_detaches_key,
            lease::lease_put_moves_key_between_leases,
            lease::lease_survives_deletion_of_its_keys,
            watch::watch_sees_puts_and_deletes,
            watch::watch_range_is_respected,
            watch::watch_from_past_replays_history,
            watch::watch_batches_whole_revisions,
            watch::watch_is_ordered_unique_and_complete,
            watch::watch_prev_kv_is_attached,
            watch::watch_without_prev_kv_has_none,
            watch::watch_prefix_delete_is_one_batch,
            watch::watch_put_event_carries_lease,
            watch::watch_progress_notify_reports_revision,
            watch::watch_answers_progress_requests,
            watch::watch_progress_answer_loses_no_history,
            watch::watch_progress_request_on_an_ended_watch_is_refused,
            watch::watch_concurrent_watchers_agree,
            watch::watch_from_compacted_revision_fails,
            watch::watch_from_compact_revision_works,
            watch::watch_from_past_overtaken_by_compaction_is_all_or_nothing,
            watch::watch_prev_kv_is_dropped_below_the_compaction_point,
            watch::watch_empty_key_is_invalid,
            watch::watch_from_future_revision_waits,
            compact::compact_discards_older_revisions,
            compact::compact_keeps_current_values,
            compact::compact_twice_fails,
            compact::compact_future_revision_fails,
            compact::compact_preserves_history_after_the_point,
            election::election_uncontested_campaign_wins,
            election::election_leader_without_candidates_is_no_leader,
            election::election_queue_order_is_creation_order,
            election::election_resign_is_idempotent,
            election::election_proclaim_updates_value,
            election::election_proclaim_by_non_leader_fails,
            election::election_cancelled_campaign_leaves_no_key,
            election::election_candidate_lease_death_is_an_error,
            election::election_campaign_with_dead_lease_fails,
            election::election_leader_expiry_hands_over,
            election::election_recampaign_with_same_lease_rejoins,
            election::election_invalid_name_is_refused,
            election::election_token_fences_writes,
            election::election_observe_follows_leaders,
            election::election_observe_waits_for_a_first_leader,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __coord_expand {
    ([all] $($area:ident :: $case:ident ),* $(,)?) => {
        &[$(
            $crate::testkit::Case {
                name: stringify!($case),
                run: |cx| ::std::boxed::Box::pin($crate::testkit::$area::$case(cx)),
            }
        ),*]
    };
    ([tests $harness:expr] $($area:ident :: $case:ident ),* $(,)?) => {
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
                                run: |cx| ::std::boxed::Box::pin($crate::testkit::$area::$case(cx)),
                    });
                }
            )*
        }
    };
}
