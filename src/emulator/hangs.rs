//! Change feed reads that never return: `POST /_emulator/hang?partition=ID` makes every change
//! feed read of physical partition `ID` (any container, or only `container=C`) wait unanswered
//! until `DELETE /_emulator/hang` — a hung request, as a stuck connection or a service-side
//! stall leaves it. Only a client that gives up (a timeout, a restart) gets out.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::watch;

/// One hung partition: its id and, optionally, the container it is in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Hung {
    partition: String,
    container: Option<String>,
}

/// The partitions whose change feed reads hang.
pub struct Hangs {
    hung: Mutex<BTreeSet<Hung>>,
    /// Bumped when hangs are lifted: waiting reads look again.
    lifted: watch::Sender<u64>,
    /// Reads held so far.
    held: std::sync::atomic::AtomicU64,
}

impl Default for Hangs {
    fn default() -> Self {
        Self {
            hung: Mutex::default(),
            lifted: watch::channel(0).0,
            held: Default::default(),
        }
    }
}

impl Hangs {
    /// Change feed reads of `partition` (in `container`, or any) hang from now on.
    pub fn hang(&self, partition: &str, container: Option<&str>) {
        let hung = Hung {
            partition: partition.to_owned(),
            container: container.map(str::to_owned),
        };
        self.hung
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(hung);
    }

    /// Every hang is lifted; the reads held are answered.
    pub fn lift(&self) {
        self.hung
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        self.lifted.send_modify(|n| *n += 1);
    }

    fn holds(&self, partition: &str, path: &str) -> bool {
        let hung = self.hung.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        hung.iter().any(|h| {
            h.partition == partition
                && h.container
                    .as_deref()
                    .is_none_or(|c| path.contains(&format!("/colls/{c}/")))
        })
    }

    /// Waits while a change feed read of `partition` at `path` is to hang.
    pub async fn wait(&self, partition: &str, path: &str) {
        if !self.holds(partition, path) {
            return;
        }
        self.held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tracing::debug!(partition, path, "holding a change feed read");
        let mut lifted = self.lifted.subscribe();
        while self.holds(partition, path) {
            if lifted.changed().await.is_err() {
                return;
            }
        }
    }

    /// What hangs, and how many reads were held.
    pub fn report(&self) -> serde_json::Value {
        let hung = self.hung.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        serde_json::json!({
            "partitions": hung.iter().map(|h| serde_json::json!({"partition": h.partition, "container": h.container})).collect::<Vec<_>>(),
            "held": self.held.load(std::sync::atomic::Ordering::SeqCst),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_read_of_a_hung_partition_waits_until_the_hang_is_lifted() {
        let hangs = std::sync::Arc::new(Hangs::default());
        hangs.hang("1", Some("items"));
        // Another partition, another container: answered at once.
        hangs.wait("0", "dbs/db/colls/items/docs").await;
        hangs.wait("1", "dbs/db/colls/other/docs").await;
        let held = tokio::spawn({
            let hangs = hangs.clone();
            async move { hangs.wait("1", "dbs/db/colls/items/docs").await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!held.is_finished(), "the read was answered");
        hangs.lift();
        tokio::time::timeout(Duration::from_secs(5), held)
            .await
            .expect("held after the hang was lifted")
            .expect("the wait ended");
        assert_eq!(hangs.report()["held"], 1);
    }
}
