//! The unit files as text, rendered from a spec.
