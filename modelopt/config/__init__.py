"""A run's settings: `RunConfig`, the forms its options take, and the parts it assembles."""
