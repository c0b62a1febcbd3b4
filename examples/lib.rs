//! Runnable programs for idem; see the `[[example]]` targets.
