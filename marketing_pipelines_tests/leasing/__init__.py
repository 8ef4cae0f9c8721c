"""Tests of the lease protocol both queues share (marketing_pipelines.leasing)."""
