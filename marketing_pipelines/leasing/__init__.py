"""The lease protocol both work queues share: its row-level SQL and lease keeper (`lease`), and what a
claiming sensor, the op of a run and a run-status sensor do with it (`claims`)."""
