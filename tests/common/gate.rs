//! One handler for "a batch in flight": it holds batches at a gate as told ([`Hold`]), says which
//! it holds, lets them go by lease or all at once, and records what it lets through.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use changefeed_operator::processor::{Batch, ChangeHandler, HandlerError};
use tokio::sync::watch;

use super::{Env, RecordingHandler, eventually};

/// How long [`GateHandler`]'s waits wait at most.
const WAIT: Duration = Duration::from_secs(10);

/// Which batches the gate holds (none once it is opened, nor those of a released lease).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Hold {
    /// None.
    #[default]
    Nothing,
    /// Every batch.
    Every,
    /// The next batch only (of any lease).
    Next,
    /// Every batch of a lease but its first.
    AfterFirst,
    /// The batch that carries the document with this id.
    Document(String),
}

#[derive(Debug, Default)]
struct GateState {
    hold: Hold,
    open: bool,
    released: BTreeSet<String>,
    /// The lease of each batch held now (one entry a batch).
    held_now: Vec<String>,
    held_ever: usize,
    first_passed: BTreeSet<String>,
}

impl GateState {
    fn lets_go(&self, lease: &str) -> bool {
        self.open || self.released.contains(lease)
    }

    /// Whether `batch` is held; counts it when it is.
    fn holds(&mut self, batch: &Batch<'_>) -> bool {
        let lease = batch.lease_token;
        if self.lets_go(lease) {
            return false;
        }
        let hold = match &self.hold {
            Hold::Nothing => false,
            Hold::Every => true,
            Hold::Next => {
                self.hold = Hold::Nothing;
                true
            }
            Hold::AfterFirst => !self.first_passed.insert(lease.to_owned()),
            Hold::Document(id) => batch.documents.iter().any(|d| d["id"] == id.as_str()),
        };
        if hold {
            self.held_now.push(lease.to_owned());
            self.held_ever += 1;
        }
        hold
    }
}

/// A handler that holds batches at a gate, then hands them to a [`RecordingHandler`] (or, without
/// one, succeeds).
pub struct GateHandler {
    inner: Option<Arc<RecordingHandler>>,
    state: watch::Sender<GateState>,
}

impl GateHandler {
    /// A gate holding `hold`, recording through `inner`.
    pub fn recording(hold: Hold, inner: Arc<RecordingHandler>) -> Arc<Self> {
        Self::new(hold, Some(inner))
    }

    /// A gate holding `hold` that records nothing.
    pub fn silent(hold: Hold) -> Arc<Self> {
        Self::new(hold, None)
    }

    fn new(hold: Hold, inner: Option<Arc<RecordingHandler>>) -> Arc<Self> {
        let state = GateState {
            hold,
            ..GateState::default()
        };
        Arc::new(Self {
            inner,
            state: watch::channel(state).0,
        })
    }

    /// Holds `hold` from now on (the batches held already stay held).
    pub fn hold(&self, hold: Hold) {
        self.state.send_modify(|s| s.hold = hold);
    }

    /// Lets every held batch go, and every later one through.
    pub fn open(&self) {
        self.state.send_modify(|s| s.open = true);
    }

    /// Lets the held batch of `lease` go, and its later ones through.
    pub fn release(&self, lease: &str) {
        self.state.send_modify(|s| {
            s.released.insert(lease.to_owned());
        });
    }

    /// The leases whose batch is held now.
    pub fn held(&self) -> Vec<String> {
        self.state.borrow().held_now.clone()
    }

    /// Waits (bounded) until a batch of each of `leases` is held; whether they were.
    pub async fn wait_held(&self, leases: &[String]) -> bool {
        self.wait_for(|s| leases.iter().all(|l| s.held_now.contains(l))).await
    }

    /// Waits (bounded) until `count` batches were held since the start; whether they were.
    pub async fn wait_held_count(&self, count: usize) -> bool {
        self.wait_for(|s| s.held_ever >= count).await
    }

    async fn wait_for(&self, done: impl FnMut(&GateState) -> bool) -> bool {
        let mut state = self.state.subscribe();
        let waited = tokio::time::timeout(WAIT, state.wait_for(done)).await;
        waited.is_ok_and(|r| r.is_ok())
    }
}

/// Once `instance` owns all `leases` of `env`, writes `documents` and holds a batch of every lease
/// at `gate`; the tokens of the leases held.
pub async fn hold_a_batch_of_every_lease(
    env: &Env,
    gate: &GateHandler,
    (instance, leases): (&str, usize),
    documents: std::ops::Range<usize>,
) -> Vec<String> {
    let owns_all = eventually(WAIT, || async { env.owners().await.get(instance) == Some(&leases) }).await;
    assert!(owns_all, "{:?}", env.owners().await);
    gate.hold(Hold::Every);
    env.write(documents).await;
    let tokens: Vec<String> = env.leases().await.into_iter().map(|l| l.lease_token).collect();
    assert!(gate.wait_held(&tokens).await, "held: {:?}", gate.held());
    tokens
}

#[async_trait::async_trait]
impl ChangeHandler for GateHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        if self.state.send_if_modified(|s| s.holds(&batch)) {
            let lease = batch.lease_token.to_owned();
            let mut state = self.state.subscribe();
            let _ = state.wait_for(|s| s.lets_go(&lease)).await;
            self.state.send_modify(|s| {
                if let Some(at) = s.held_now.iter().position(|l| *l == lease) {
                    s.held_now.remove(at);
                }
            });
        }
        match &self.inner {
            Some(inner) => inner.handle(batch).await,
            None => Ok(()),
        }
    }
}
