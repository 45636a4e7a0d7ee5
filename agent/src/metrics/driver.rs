//! [`Measured`]: the configured driver behind the same [`Driver`] trait
//! ([`Wrapped`]), timing every operation into [`Metrics`]: its op, its result (`ok` or
//! the error's code) and how long it took. The exit feed is not timed: it runs for the
//! agent's life. The executor does not know it is there.

use super::Metrics;
use capstan_driver::decorate::{Around, Call, Operation, Wrapped};
use capstan_driver::{Driver, DriverError};
use std::sync::Arc;
use std::time::Instant;

/// Times the operations of the driver it wraps.
pub struct Measured {
    metrics: Arc<Metrics>,
}

impl Measured {
    pub fn wrap(inner: Arc<dyn Driver>, metrics: Arc<Metrics>) -> Arc<dyn Driver> {
        Arc::new(Wrapped::new(inner, Measured { metrics }))
    }
}

impl Around for Measured {
    /// Runs `call`, recording it whether it succeeds or fails. A call dropped before it
    /// ends (cancellation) is not recorded: it has no result.
    fn around<'a, T: Send + 'a>(&'a self, op: Operation, call: Call<'a, T>) -> Call<'a, T> {
        Box::pin(async move {
            let began = Instant::now();
            let result = call.await;
            let code = result.as_ref().err().map(DriverError::code);
            self.metrics.driver_op(op, code, began.elapsed());
            result
        })
    }
}
