//! Hooks for tests only, compiled with the cargo feature `testing` (which only
//! capstan-tests' e2e tests enable, as a dev-dependency: no agent build has it). They
//! let a test act at a point a real race would hit only by chance, against the real
//! apiserver: between `stop`/`resume` reading the live Deployment and applying over
//! its resourceVersion.

use futures::future::BoxFuture;
use std::sync::{Arc, Mutex};

/// A hook: awaited where it is set.
pub type Hook = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// The driver's test hooks; none set by default.
#[derive(Default)]
pub struct TestHooks {
    between_read_and_write: Mutex<Option<Hook>>,
}

impl TestHooks {
    /// Runs `hook` in `stop` and `resume` after each read of the live Deployment,
    /// before the apply that carries its resourceVersion.
    pub fn set_between_read_and_write(&self, hook: Hook) {
        *self.between_read_and_write.lock().expect("test hooks") = Some(hook);
    }

    pub(crate) async fn between_read_and_write(&self) {
        let hook = self
            .between_read_and_write
            .lock()
            .expect("test hooks")
            .clone();
        if let Some(hook) = hook {
            hook().await;
        }
    }
}
