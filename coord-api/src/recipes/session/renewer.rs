//! The renewal loop: one renewal per period, the deadline moved by each acknowledgement,
//! re-sends and backoff after failures.

use super::*;

/// The planted bug that trusts renewal replies alone (see [`crate::hooks::planted`]).
pub(super) fn ignores_deadline() -> bool {
    crate::hooks::planted::enabled(crate::hooks::planted::Bug::StepDownOnRenewalReply)
}

/// What one renewal came to.
pub(super) enum Attempt {
    /// Acknowledged; it was sent at `sent`.
    Renewed { sent: Instant },
    /// Not acknowledged (no answer in time, a dead channel, an unreachable store); the lease
    /// may still live. `unanswered` when it was abandoned for want of an answer: the channel
    /// it went on is left, and the re-send goes at once, elsewhere.
    Failed { error: Error, unanswered: bool },
    /// The session ended (its lease gone, its deadline passed) or was cancelled.
    Ended(Option<Error>),
}

/// The renewal loop's state: the channel, the period, the backoff after failures.
pub(super) struct Renewer {
    inner: Arc<Inner>,
    /// The session's deadline, which only the renewer moves: its own copy spares it a read
    /// of the session's state (a lock in an allocation of its own) at every wake-up.
    deadline: Instant,
    channel: Option<Box<dyn KeepAlive>>,
    every: Duration,
    /// Out of line, and reset only after failures: a renewal that goes well need not touch
    /// it (a thousand sessions' renewers are each a cold line of memory per field spread).
    backoff: Box<Backoff>,
    /// Whether the backoff moved since the last renewal answered.
    backing_off: bool,
    metrics: crate::metrics::record::Renewals,
}

impl Renewer {
    pub(super) fn new(inner: Arc<Inner>, every: Duration) -> Self {
        let seed = retry::seed(&[&inner.lease.0.to_le_bytes()]);
        Renewer {
            deadline: inner.state().deadline,
            inner,
            channel: None,
            every,
            // After a failed renewal, try again sooner than the regular cadence.
            backoff: Box::new(Backoff::renewal(every, seed)),
            backing_off: false,
            metrics: crate::metrics::record::Renewals::register(),
        }
    }

    /// How long a renewal (or the opening of its channel) may wait for its answer: half a
    /// renewal period. A live store answers in milliseconds; one that takes longer is sick, and
    /// the renewal goes again elsewhere with time to spare (see the module docs).
    pub(super) fn answer_within(&self) -> Duration {
        self.every / 2
    }

    pub(super) fn expired(&self, when: &str) -> Attempt {
        tracing::warn!("session expired: no renewal acknowledged before the deadline ({when})");
        self.inner.end(SessionEnd::Expired);
        Attempt::Ended(None)
    }

    /// Sends one renewal and waits for its answer, at most half a renewal period (or until
    /// the deadline, if sooner and `bounded`): a later answer comes from a sick member, and
    /// the renewal goes again at once, on a fresh channel.
    ///
    /// `timer` is the caller's, kept for the renewer's life: a thousand sessions renew a
    /// thousand times a TTL, and a fresh timer (and cancellation waiter) registered and torn
    /// down for each renewal were 4% of a thousand-host simulation's work. It is left set to
    /// when the answer was due, which is when the next renewal is (see `run`). Cancellation is
    /// the caller's: it drops this future where it waits.
    ///
    /// `now`, when given, is the clock read just before: the send's instant if nothing
    /// waits between (a channel to open does), saving a reading of the clock per renewal.
    pub(super) async fn renew(
        &mut self,
        mut timer: Pin<&mut Sleep>,
        bounded: bool,
        mut now: Option<Instant>,
    ) -> Attempt {
        let deadline = self.deadline;
        let deadline_counts = bounded && !ignores_deadline();
        if self.channel.is_none() {
            // Opening sends a renewal (etcd's stream opens with one), and gets a renewal's
            // time: one opened on a connection that died without a reset would otherwise hold
            // the session to its deadline, or to the backend's request timeout.
            let opening = now.take().unwrap_or_else(clock::now);
            let open_by = if deadline_counts {
                (opening + self.answer_within()).min(deadline)
            } else {
                opening + self.answer_within()
            };
            timer.as_mut().reset(open_by);
            let opened = tokio::select! {
                biased;
                _ = timer.as_mut() => {
                    if deadline_counts && Instant::now() >= deadline {
                        return self.expired("opening a channel");
                    }
                    tracing::debug!(waited_ms = (open_by - opening).as_millis() as u64, "keep-alive channel not opened in time; abandoned");
                    return Attempt::Failed {
                        error: Error::Unavailable {
                            backend: self.inner.store.backend(),
                            operation: "keep-alive",
                            source: format!("no channel opened within {:?}", open_by - opening).into(),
                        },
                        unanswered: true,
                    };
                }
                c = self.inner.store.keep_alive(self.inner.lease) => c,
            };
            match opened {
                Ok(c) => self.channel = Some(c),
                Err(e @ Error::LeaseNotFound { .. }) => {
                    tracing::warn!("session lost: the store reports the lease gone");
                    self.inner.end(SessionEnd::LeaseLost);
                    return Attempt::Ended(Some(e));
                }
                Err(e) => {
                    tracing::debug!(
                        error = &e as &dyn std::error::Error,
                        "could not open a keep-alive channel"
                    );
                    return Attempt::Failed {
                        error: e,
                        unanswered: false,
                    };
                }
            }
        }
        // Measured before sending: the server cannot expire the lease earlier than TTL after
        // this instant.
        let sent = now.unwrap_or_else(clock::now);
        let answer_by = if deadline_counts {
            (sent + self.answer_within()).min(deadline)
        } else {
            sent + self.answer_within()
        };
        let ch = self.channel.as_mut().expect("opened above");
        // One timer: `answer_by` is the deadline when that comes first.
        timer.as_mut().reset(answer_by);
        let result = tokio::select! {
            biased;
            _ = timer.as_mut() => {
                if deadline_counts && Instant::now() >= deadline {
                    return self.expired("a renewal was outstanding");
                }
                // A late answer on this channel could be mistaken for the next renewal's:
                // drop it, and renew on a fresh one.
                self.channel = None;
                tracing::debug!(waited_ms = (answer_by - sent).as_millis() as u64, "renewal not answered in time; abandoned");
                return Attempt::Failed {
                    error: Error::Unavailable {
                        backend: self.inner.store.backend(),
                        operation: "keep-alive",
                        source: format!("no answer within {:?}", answer_by - sent).into(),
                    },
                    unanswered: true,
                };
            }
            r = ch.renew() => r,
        };
        match result {
            Ok(ttl) => {
                // The renewal is acknowledged and not yet published: let other tasks run here
                // when a simulation explores schedules.
                crate::hooks::explore::point().await;
                let now = clock::now();
                let from = if crate::hooks::planted::enabled(
                    crate::hooks::planted::Bug::SessionDeadlineFromReply,
                ) {
                    now
                } else {
                    sent
                };
                // Unannounced to the state's receivers (see `Inner::state`).
                self.deadline = self.deadline.max(from + ttl - self.inner.margin(ttl));
                let deadline = self.deadline;
                self.inner.state.send_if_modified(|s| {
                    s.deadline = deadline;
                    s.last_renewal = Some(now);
                    false
                });
                self.inner.renewed.notify_waiters();
                tracing::trace!(ttl_ms = ttl.as_millis() as u64, "renewed");
                self.metrics.renewed(now - sent);
                Attempt::Renewed { sent }
            }
            Err(e @ Error::LeaseNotFound { .. }) => {
                tracing::warn!("session lost: the store reports the lease gone");
                self.inner.end(SessionEnd::LeaseLost);
                Attempt::Ended(Some(e))
            }
            Err(e @ Error::StreamClosed { .. })
                if crate::hooks::planted::enabled(
                    crate::hooks::planted::Bug::RegrantOnClosedStream,
                ) =>
            {
                self.inner.end(SessionEnd::LeaseLost);
                Attempt::Ended(Some(e))
            }
            Err(e) => {
                // The channel died (or the store is unreachable): the lease may still live,
                // so re-open on the same lease and keep trying until the deadline.
                tracing::debug!(
                    error = &e as &dyn std::error::Error,
                    "renewal failed; re-opening the channel"
                );
                self.channel = None;
                Attempt::Failed {
                    error: e,
                    unanswered: false,
                }
            }
        }
    }

    /// Renews from `next` on, every period after the last send, until the lease is gone or
    /// the deadline passes. Stopped by being dropped where it waits
    /// ([`Task::spawn_abortable`]): a cancelled renewer has nothing else to do.
    pub(super) async fn run(mut self, mut next: Instant) {
        // An ask to renew now made while a renewal is outstanding stays set, and is answered
        // by the next one.
        let timer = sleep_until(next);
        tokio::pin!(timer);
        loop {
            let deadline = (!ignores_deadline()).then_some(self.deadline);
            // One timer, at the renewal or the deadline, whichever comes first. After a
            // renewal answered in time it is already set there, and left alone: a reset to
            // the same instant still works out the wheel's tick for it.
            let wake = deadline.map_or(next, |d| d.min(next));
            if timer.deadline() != wake {
                timer.as_mut().reset(wake);
            }
            tokio::select! {
                biased;
                () = poll_fn(|cx| self.inner.poll_asked(cx)) => {}
                _ = timer.as_mut() => {}
            }
            let now = clock::now();
            if deadline.is_some_and(|d| now >= d) {
                self.expired("waiting to renew");
                return;
            }
            match self.renew(timer.as_mut(), true, Some(now)).await {
                Attempt::Renewed { sent } => {
                    if std::mem::take(&mut self.backing_off) {
                        self.backoff.reset();
                    }
                    next = sent + self.every;
                }
                Attempt::Failed { unanswered, .. } => {
                    self.metrics.failed();
                    // The first renewal left unanswered goes again at once, on a fresh channel
                    // (another member, for a backend that has several): waiting would spend
                    // the margin the deadline keeps for it. After that, back off.
                    next = if unanswered && !self.backing_off {
                        Instant::now()
                    } else {
                        Instant::now() + self.backoff.next_delay()
                    };
                    self.backing_off = true;
                }
                Attempt::Ended(_) => return,
            }
        }
    }
}
