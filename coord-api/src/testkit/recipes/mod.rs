//! The recipes' promises, each a named case, written once and run on every backend: the
//! recipes (`Session`, `HostSession`, `HostRegistration`, `ClusterWatcher`, `Election`,
//! `ElectionPool`, `Candidate`, `Mutex`, `Semaphore`) on the backend's store, under the faults
//! its [`Fixture`] can make (streams closed, a client cut off, requests delayed). A third-party backend runs them
//! as coord's own do, with one line:
//!
//! ```text
//! coord_api::recipe_tests!(run); // run: fn(coord_api::testkit::recipes::Case)
//! ```
//!
//! which expands to one `#[test]` per case; `run` builds the runtime (virtual time for a
//! simulator, real time for a live store) and a [`Fixture`], and runs the case on it. Each
//! case's name says what it checks. Not API-stable.

#![allow(missing_docs)]

pub mod candidate;
pub mod election;
pub mod fixture;
pub mod handles;
pub mod host;
pub mod in_flight;
pub mod mutex;
pub mod pool;
pub mod registration;
pub mod release;
pub mod semaphore;
pub mod session;
mod support;
#[cfg(feature = "serde")]
pub mod typed;
pub mod watcher;

pub use fixture::{Client, Control, Fixture, InNamespace};

/// A case, as the generated tests hand it to a backend's runner.
pub type Case =
    for<'a> fn(&'a dyn Fixture) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;

/// One `#[test]` per recipe case, each handed to `$run: fn(Case)`; see the module docs.
#[macro_export]
macro_rules! recipe_tests {
    ($run:ident) => {
        $crate::recipe_tests!(@ $run;
            session::session_renews_and_outlives_its_ttl,
            session::session_renewals_wake_no_waiter_of_its_end,
            session::session_done_fires_at_the_local_deadline_when_cut_off,
            session::session_ends_a_clock_margin_before_its_lease_expires,
            session::session_survives_a_grant_answered_late,
            session::session_reports_a_revoked_lease,
            registration::registration_heals_after_a_stream_close_on_the_same_lease,
            registration::registration_heals_after_an_external_revoke,
            registration::registration_stop_removes_the_key_immediately,
            registration::registration_crash_leaves_the_key_for_one_ttl,
            registration::registration_stop_during_a_heal_leaves_no_phantom_key,
            registration::registration_stopped_while_its_heal_is_granted_writes_nothing,
            registration::registration_updates_metadata_in_place,
            registration::registration_puts_back_a_key_deleted_under_its_live_lease,
            registration::registration_is_not_registered_while_its_key_is_put_back,
            registration::registration_whose_key_another_lease_takes_is_not_registered,
            registration::registration_heal_leaves_a_key_another_lease_holds,
            watcher::watcher_is_gap_free_from_the_snapshot,
            watcher::watcher_survives_compaction_without_losing_a_net_change,
            watcher::watcher_stream_ends_when_stopped_or_dropped,
            watcher::watcher_starts_on_more_hosts_than_its_buffer,
            watcher::watcher_stops_while_its_consumer_reads_nothing,
            watcher::watcher_stops_while_a_relist_waits_for_its_consumer,
            watcher::watcher_view_already_holds_each_event_it_emits,
            watcher::watcher_view_already_holds_each_event_of_a_relist,
            watcher::watcher_views_tell_what_changed_between_them,
            election::campaign_cancelled_by_a_timeout_says_so_and_leaves_no_key,
            election::a_campaign_won_late_in_its_sessions_ttl_asks_for_a_renewal_at_once,
            election::a_crashed_leaders_successor_wins_within_one_ttl,
            election::no_phantom_leadership_when_the_candidates_lease_dies_while_waiting,
            election::a_resign_after_a_rejoin_leaves_the_newer_leadership_standing,
            election::a_campaign_dropped_before_its_turn_leaves_the_earlier_ones_cleanup_alone,
            election::a_resign_does_not_wait_for_a_newer_campaign_of_its_session_to_lead,
            election::a_newer_campaign_that_resigns_leaves_the_key_to_the_older_leadership,
            election::try_campaign_never_blocks,
            election::try_campaign_dropped_mid_write_leaves_no_key,
            election::leadership_is_lost_at_the_deadline_when_cut_off,
            election::leadership_is_lost_when_its_key_is_deleted_and_fencing_stops_its_writes,
            election::observe_and_leader_follow_the_election,
            pool::pool_stop_drops_every_leadership_at_once,
            pool::pool_evicts_a_dead_session_before_the_next_campaign,
            pool::pool_stop_with_a_campaign_in_flight_leaves_no_key,
            election::a_deposed_leaders_write_is_fenced_out_and_ends_its_leadership,
            host::a_host_session_shares_one_lease_and_heals_it,
            host::a_registration_spawned_while_cut_off_registers_when_the_store_answers,
            host::a_registration_with_revoke_on_drop_removes_its_key_when_dropped,
            host::a_registration_started_over_its_own_key_writes_its_metadata,
            host::a_failed_stops_retried_removal_spares_the_next_registration,
            host::a_registration_on_a_host_session_refuses_a_ttl_of_its_own,
            host::a_host_session_reports_its_lease_as_it_changes,
            handles::every_handle_dropped_leaves_what_the_table_says,
            candidate::a_candidate_hands_over_only_once_its_work_stopped,
            candidate::a_candidate_whose_campaigns_fail_says_so,
            candidate::a_term_says_how_it_ended,
            candidate::a_cut_off_candidate_stops_its_work_before_anyone_else_leads,
            candidate::a_candidate_stopped_while_cut_off_reports_its_key_left,
            candidate::a_candidate_stopped_resting_after_a_failed_resignation_resigns,
            candidate::a_candidate_rests_between_terms_and_counts_them,
            candidate::a_candidate_stops_saying_it_leads_the_instant_its_term_ends,
            semaphore::semaphore_refuses_a_user_passing_another_count,
            mutex::mutex_excludes_and_hands_over_in_queue_order,
            mutex::mutex_guard_dropped_unlocks,
            mutex::mutex_try_behind_its_own_waiter_leaves_the_key_to_it,
            mutex::mutex_holder_whose_key_is_deleted_is_fenced_out,
            mutex::mutex_leave_after_a_dropped_lock_leaves_no_key,
            release::an_unlock_that_returned_ok_left_no_key,
            release::a_release_that_returned_ok_left_no_key,
            release::a_resign_that_returned_ok_left_no_key,
            release::a_resign_after_a_failed_newer_campaign_left_no_key,
            release::a_candidate_stop_that_returned_ok_left_no_key,
            in_flight::a_leave_outlasts_a_held_campaign_write,
            in_flight::a_leave_outlasts_a_campaign_write_of_unknown_outcome,
            in_flight::a_resign_of_unknown_outcome_leaves_a_newer_campaigns_key,
            in_flight::an_update_of_unknown_outcome_leaves_the_newer_metadata,
            in_flight::a_semaphore_leave_outlasts_a_held_acquire,
            in_flight::a_pool_stop_outlasts_a_held_campaign_write,
            in_flight::a_candidate_stop_outlasts_its_held_campaign_write,
            in_flight::a_resign_outlasts_a_held_proclamation,
            in_flight::a_registration_stop_outlasts_a_held_update,
            semaphore::semaphore_admits_n_and_hands_over_in_queue_order,
            semaphore::semaphore_permit_dropped_releases,
            semaphore::semaphore_try_behind_its_own_waiter_leaves_the_key_to_it,
            semaphore::semaphore_holder_whose_key_is_deleted_is_fenced_out,
            semaphore::semaphore_without_permits_is_refused_and_writes_nothing,
            semaphore::semaphore_release_wakes_only_the_waiter_next_in_line,
        );
    };
    (@ $run:ident; $($module:ident :: $case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $run(|fx| ::std::boxed::Box::pin($crate::testkit::recipes::$module::$case(fx)));
            }
        )*
    };
}

/// The typed-metadata cases (feature `serde`), as [`recipe_tests!`] does the others.
#[cfg(feature = "serde")]
#[macro_export]
macro_rules! typed_recipe_tests {
    ($run:ident) => {
        $crate::recipe_tests!(@ $run;
            typed::typed_watcher_decodes_and_keeps_undecodable_hosts,
            typed::typed_metadata_that_cannot_be_encoded_is_refused,
        );
    };
}
