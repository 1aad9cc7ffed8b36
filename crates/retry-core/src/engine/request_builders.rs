//! Chainable setters for [`OperationRequest`], so a request that differs from
//! [`OperationRequest::new`]'s defaults in its cursor, session or timeout reads as one expression.

use super::{CursorUse, OperationRequest, SessionHandle};
use crate::time::OperationTimeout;

impl OperationRequest {
    /// This request with its relation to a cursor: opening one, or a `getMore` or `killCursors`
    /// that goes where its cursor lives (SE-14, LB-10).
    #[must_use]
    pub fn with_cursor(mut self, cursor: CursorUse) -> OperationRequest {
        self.cursor = cursor;
        self
    }

    /// This request in the explicit session `session`, or in an implicit one for `None` (SE-9).
    #[must_use]
    pub fn with_session(mut self, session: impl Into<Option<SessionHandle>>) -> OperationRequest {
        self.session = session.into();
        self
    }

    /// This request with the CSOT timeout `timeout` (CS-4).
    #[must_use]
    pub fn with_timeout(mut self, timeout: OperationTimeout) -> OperationRequest {
        self.timeout = timeout;
        self
    }
}
