//! The client session as a sans-IO state machine, shared by every runtime.
