//! What a test does to a running cluster: kill, restart, pause and resume members, isolate
//! one, replace one, move or kill the raft leader, and its own admin requests.

use super::*;

impl EtcdCluster {
    /// Kills member `i` with SIGKILL and reaps it. Its data stays for [`restart`](Self::restart).
    pub fn kill(&self, i: usize) {
        let mut guard = self.members[i]
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(mut child) = guard.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts a killed member on its old data and ports, and waits until it is ready.
    pub async fn restart(&self, i: usize) -> Result<(), HarnessError> {
        self.kill(i);
        self.spawn(i, false)?;
        self.wait_ready(i, Duration::from_secs(30)).await
    }

    pub(super) fn signal(&self, i: usize, sig: &str) {
        if let Some(pid) = self.pid(i) {
            // `kill -STOP` rather than libc: the workspace forbids unsafe code.
            let _ = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(pid.to_string())
                .status();
        }
    }

    /// Freezes member `i` (SIGSTOP): it keeps its sockets but answers nothing. Returns once
    /// every thread of the process is stopped (up to 2 s): `kill` returns when the signal is
    /// sent, and a thread running on another core answers on for a moment after (a status
    /// request sent at once was answered in 0.8 ms on a loaded machine).
    pub fn pause(&self, i: usize) {
        self.signal(i, "STOP");
        let Some(pid) = self.pid(i) else { return };
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while !all_threads_stopped(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Thaws member `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.signal(i, "CONT");
    }

    /// The index of the current raft leader, asking each live member; `None` when none
    /// reports one.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.members.len() {
            if self.exited(i) {
                continue;
            }
            let Ok(mut client) = etcd_client::Client::connect([self.endpoint(i)], None).await
            else {
                continue;
            };
            let Ok(Ok(status)) =
                tokio::time::timeout(Duration::from_millis(500), client.status()).await
            else {
                continue;
            };
            let leader_id = status.leader();
            if leader_id == 0 {
                continue;
            }
            let Ok(Ok(members)) =
                tokio::time::timeout(Duration::from_millis(500), client.member_list()).await
            else {
                continue;
            };
            let leader_name = members
                .members()
                .iter()
                .find(|m| m.id() == leader_id)
                .map(|m| m.name().to_owned());
            if let Some(name) = leader_name {
                return self.members.iter().position(|m| m.name == name);
            }
        }
        None
    }

    /// Kills the current leader and returns its index.
    ///
    /// # Panics
    /// If no leader is known.
    pub async fn kill_leader(&self) -> usize {
        let leader = self.leader().await.expect("the cluster has a leader");
        self.kill(leader);
        leader
    }

    /// A client of member `i` alone, for the harness's own requests.
    pub(super) async fn admin(&self, i: usize) -> Result<etcd_client::Client, HarnessError> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(10));
        etcd_client::Client::connect([self.endpoint(i)], Some(options))
            .await
            .map_err(|e| HarnessError::Admin(format!("connect to member {i}: {e}")))
    }

    /// The first member that is running and answers, with a client of it.
    pub(super) async fn any_admin(
        &self,
        except: Option<usize>,
    ) -> Result<etcd_client::Client, HarnessError> {
        let mut last = HarnessError::Admin("no member runs".into());
        for i in (0..self.members.len()).filter(|i| Some(*i) != except && !self.exited(*i)) {
            match self.admin(i).await {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The members' ids by index, as etcd lists them (a member added but not started yet has
    /// no name and is left out).
    pub(super) async fn member_ids(&self) -> Result<Vec<(usize, u64)>, HarnessError> {
        let mut client = self.any_admin(None).await?;
        let list = client
            .member_list()
            .await
            .map_err(|e| HarnessError::Admin(format!("member list: {e}")))?;
        Ok(list
            .members()
            .iter()
            .filter_map(|m| {
                let i = self.members.iter().position(|x| x.name == m.name())?;
                Some((i, m.id()))
            })
            .collect())
    }

    pub(super) async fn learn_member_ids(&self) -> Result<(), HarnessError> {
        for (i, id) in self.member_ids().await? {
            self.isolation.learn(id, i);
        }
        Ok(())
    }

    /// Cuts member `i` off from the other members (a peer partition), while clients still
    /// reach it: it loses its leader (or, as leader, its followers), answers `no leader` to
    /// requests that require one, and holds writes and linearizable reads. Needs
    /// [`EtcdClusterBuilder::peer_proxies`].
    ///
    /// # Panics
    /// If the cluster was built without peer proxies.
    pub fn isolate(&self, i: usize) {
        assert!(
            self.builder.peer_proxies,
            "EtcdCluster::isolate needs EtcdClusterBuilder::peer_proxies(true)"
        );
        self.isolation.set(Some(i));
    }

    /// Ends a peer partition made by [`isolate`](Self::isolate).
    pub fn rejoin(&self) {
        self.isolation.set(None);
    }

    /// Kills every member, then starts them all again on their data (a full cluster restart,
    /// as after a power cut), and waits until each is ready.
    pub async fn restart_all(&self) -> Result<(), HarnessError> {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        for i in 0..self.members.len() {
            self.spawn(i, false)?;
        }
        for i in 0..self.members.len() {
            self.wait_ready(i, Duration::from_secs(30)).await?;
        }
        Ok(())
    }

    /// Replaces member `i` as an operator replaces a failed machine: removes it from the
    /// cluster, kills it, wipes its data, adds it back under the same name and peer URL (a new
    /// member id), starts it empty, and waits until it has caught up and serves reads.
    pub async fn replace(&self, i: usize) -> Result<(), HarnessError> {
        let old = self
            .member_ids()
            .await?
            .into_iter()
            .find(|(x, _)| *x == i)
            .map(|(_, id)| id)
            .ok_or_else(|| HarnessError::Admin(format!("member {i} is not in the cluster")))?;
        let admin = self.any_admin(Some(i)).await?;
        reconfigure(format!("remove member {i}"), || {
            let mut admin = admin.clone();
            async move { admin.member_remove(old).await }
        })
        .await?;
        self.kill(i);
        let data = self.dir.path().join(&self.members[i].name);
        if data.exists() {
            std::fs::remove_dir_all(&data)?;
        }
        let url = format!("http://127.0.0.1:{}", self.members[i].peer_port);
        let added = reconfigure(format!("add member {i} back"), || {
            let (mut admin, url) = (admin.clone(), url.clone());
            async move { admin.member_add([url], None).await }
        })
        .await?;
        if let Some(m) = added.member() {
            self.isolation.learn(m.id(), i);
        }
        self.spawn(i, false)?;
        self.wait_ready(i, Duration::from_secs(30)).await
    }

    /// Asks the raft leader to hand leadership to member `to` (as `etcdctl move-leader`
    /// does). Returns whether it moved; `Ok(false)` when `to` already leads.
    pub async fn move_leader(&self, to: usize) -> Result<bool, HarnessError> {
        let leader = self
            .leader()
            .await
            .ok_or_else(|| HarnessError::Admin("no leader to move".into()))?;
        if leader == to {
            return Ok(false);
        }
        let target = self
            .member_ids()
            .await?
            .into_iter()
            .find(|(x, _)| *x == to)
            .map(|(_, id)| id)
            .ok_or_else(|| HarnessError::Admin(format!("member {to} is not in the cluster")))?;
        self.admin(leader)
            .await?
            .move_leader(target)
            .await
            .map_err(|e| HarnessError::Admin(format!("move leader to member {to}: {e}")))?;
        Ok(true)
    }

    /// Compacts the store at `revision` (as `etcdctl compact` does).
    pub async fn compact(&self, revision: coord_api::Revision) -> coord_api::Result<()> {
        self.store().await.compact(revision).await
    }

    /// Revokes a lease from outside the client that holds it (as `etcdctl lease revoke` does).
    pub async fn revoke(&self, lease: LeaseId) -> coord_api::Result<coord_api::Revision> {
        self.store().await.revoke(lease).await
    }
}

/// A membership change, tried again while etcd refuses it as unsafe: with its default strict
/// reconfiguration check, etcd refuses a change until the members that would remain have been
/// connected to each other for 5 s, which a cluster that just started or lost a member has not.
async fn reconfigure<T, F, Fut>(what: String, mut change: F) -> Result<T, HarnessError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let start = Instant::now();
    loop {
        match change().await {
            Ok(v) => return Ok(v),
            Err(e)
                if e.to_string().contains("unhealthy cluster")
                    && start.elapsed() < Duration::from_secs(15) =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(HarnessError::Admin(format!("{what}: {e}"))),
        }
    }
}
