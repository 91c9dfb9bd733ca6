//! The recipe cases and what a backend provides to run them; see `cases.rs`.

pub(crate) mod cases;
pub(crate) mod fixture;

/// A case, as the generated tests hand it to a backend's runner.
pub(crate) type Case = for<'a> fn(
    &'a dyn fixture::Fixture,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;

/// One `#[test]` per recipe case, each handed to `$run: fn(Case)`.
macro_rules! recipe_tests {
    ($run:ident) => {
        $crate::recipes::recipe_tests!(@ $run;
            session_renews_and_outlives_its_ttl,
            session_done_fires_at_the_local_deadline_when_cut_off,
            session_survives_a_grant_answered_late,
            session_reports_a_revoked_lease,
            registration_heals_after_a_stream_close_on_the_same_lease,
            registration_heals_after_an_external_revoke,
            registration_stop_removes_the_key_immediately,
            registration_crash_leaves_the_key_for_one_ttl,
            registration_stop_during_a_heal_leaves_no_phantom_key,
            registration_updates_metadata_in_place,
            registration_puts_back_a_key_deleted_under_its_live_lease,
            watcher_is_gap_free_from_the_snapshot,
            watcher_survives_compaction_without_losing_a_net_change,
            watcher_stream_ends_when_stopped_or_dropped,
            watcher_starts_on_more_hosts_than_its_buffer,
            watcher_view_already_holds_each_event_it_emits,
            watcher_view_already_holds_each_event_of_a_relist,
            campaign_cancelled_by_a_timeout_says_so_and_leaves_no_key,
            a_crashed_leaders_successor_wins_within_one_ttl,
            no_phantom_leadership_when_the_candidates_lease_dies_while_waiting,
            try_campaign_never_blocks,
            leadership_is_lost_at_the_deadline_when_cut_off,
            leadership_is_lost_when_its_key_is_deleted_and_fencing_stops_its_writes,
            observe_and_leader_follow_the_election,
            pool_stop_drops_every_leadership_at_once,
            pool_evicts_a_dead_session_before_the_next_campaign,
            a_deposed_leaders_write_is_fenced_out_and_ends_its_leadership,
            a_host_session_shares_one_lease_and_heals_it,
            a_registration_spawned_while_cut_off_registers_when_the_store_answers,
            a_registration_with_revoke_on_drop_removes_its_key_when_dropped,
            a_candidate_hands_over_only_once_its_work_stopped,
            a_cut_off_candidate_stops_its_work_before_anyone_else_leads,
            a_candidate_rests_between_terms_and_counts_them,
        );
    };
    (@ $run:ident; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $run(|fx| Box::pin(recipes::cases::$case(fx)));
            }
        )*
    };
}
pub(crate) use recipe_tests;
